"""Command line: ``python -m rollout {run,eval,config} --config configs/local.yaml [key=value ...]``,
``python -m rollout view OUTPUT_DIR``, ``python -m rollout regrade RUN_DIR`` and ``python -m rollout formats``.

``run`` resolves the endpoints (starting the local stack when ``local.enabled``), starts the Ray
pool, runs every task of the configured split ``rollout.n_samples_per_task`` times with a progress
bar, writes ``samples.jsonl`` / ``failed.jsonl`` / ``filtered.jsonl`` / ``summary.json`` to
``rollout.output_dir`` through the same training policy as the trainer API
(:meth:`rollout.core.pool.RolloutPool.stream`) and prints a summary table. ``eval`` runs the same
episodes and prints pass^k / pass@k (:mod:`rollout.app.evaluation`). ``config`` prints the merged
config (``config --keys``: every key of the schema with its type, default and doc). ``view`` serves the trajectory viewer over a run's output folder
(:mod:`rollout.app.viewer`, docs/viewer.md) until SIGINT / SIGTERM. ``regrade`` grades a run's
journaled episodes again with the benchmark installed now and writes the old and new rewards per
task to ``RUN_DIR/regrade.json`` (:mod:`rollout.app.regrade`). A run is a journal (:mod:`rollout.core.journal`): ``--resume`` finishes a stopped run,
``--overwrite`` replaces one; ``--replay DIR`` runs nothing and replays the finished run in DIR
through the training streams into the same files (:mod:`rollout.app.replay`). Exit status: 0 when every episode ended with a policy outcome, 3
when some ended with an infrastructure failure, 2 on a bad config or an output directory that
holds a run, 4 when the run could not go on (no healthy actor, Ray head lost), 130 / 143 when
SIGINT / SIGTERM stopped it (the summary says ``interrupted``), 141 (128 + SIGPIPE) when the
reader of its output went away (``| head``; quietly, :func:`rollout.core.pipes.pipe_safe`). Exit 2
is for what the user can fix, each one line naming the key or the file, before anything starts: a
bad config value, a split or task the domain lacks (with the valid ids), a chat format that does
not fit the tokenizer, a file, folder, address or package a key names that cannot be had, a failed
preflight check, an output directory that holds a run (or files but no run, or, for ``--resume``, no run), a damaged
``run.json``; for ``view``, a folder that is not a run's output or an
address it cannot listen on. Anything else is a bug and ends with Python's
traceback (exit 1), never disguised as a config error.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from rollout.app.args import int_arg, one_line_errors, plain_text
from rollout.app.regrade import add_parser as add_regrade_parser
from rollout.app.signals import Interrupted, SignalStop
from rollout.app.summary import format_summary
from rollout.core import uptime
from rollout.core.config import Config, ConfigError, load_config
from rollout.core.pipes import pipe_safe
from rollout.core.records import INFRA_STATUSES

if TYPE_CHECKING:
    pass

logger = logging.getLogger(__name__)


def run_job(cfg: Config, progress: bool = True, resume: bool = False, overwrite: bool = False,
            started_at: float | None = None) -> dict[str, Any]:
    """Run the main job described by ``cfg`` as a journaled run (:mod:`rollout.core.journal`); returns
    the summary (also written to ``summary.json``, with ``status`` ``finished`` or
    ``interrupted`` and the ``reason``).

    Args:
        resume: finish the run ``rollout.output_dir`` holds (only its undelivered episodes run).
        overwrite: replace the run ``rollout.output_dir`` holds.
        started_at: ``time.monotonic()`` when the command started (``None``: now). This session's
            ``wall_s`` and ``startup_s`` (to every actor ready) count from it, so the start-up is
            part of the wall time.

    Raises:
        rollout.core.journal.JournalError: the output directory holds a run and neither flag was
            given, holds files but no run (without ``overwrite``), holds no run to ``resume``, or
            the config changed since (before anything starts, the first three before anything is
            created: :func:`rollout.core.journal.check_run_target`).
        rollout.core.config.TaskSelectionError: ``env.task_ids`` names tasks the domain lacks, or the split does not exist.
        RuntimeError: the local stack or an actor failed to start.
    """
    from tqdm import tqdm

    from rollout.app.preflight import check_output_dir
    from rollout.app.wiring import open_pool
    from rollout.core.groups import Excluded
    from rollout.core.journal import OutputWriteError, RunJournal, check_run_target
    from rollout.core.output import RunWriter, where_episodes_are
    from rollout.core.pool import RunAborted
    from rollout.core.tasks import skipped_summary

    started_at = time.monotonic() if started_at is None else started_at
    check_run_target(cfg.rollout.output_dir, resume=resume, overwrite=overwrite)  # one line, reading only: before anything is created
    check_output_dir(cfg.rollout.output_dir)  # one line, before the journal creates it
    journal = RunJournal.open(cfg.rollout.output_dir, cfg, resume=resume, overwrite=overwrite, session_start=started_at)
    writer = RunWriter(cfg.rollout.output_dir, cfg.rollout.train_statuses, resume=journal.resumed)
    status, reason, undelivered = "interrupted", "the run stopped before it started", 0
    pool = None
    ready_at = last_at = None  # time.monotonic() when the actors were ready, and at the last delivery
    try:
        with SignalStop() as signals, open_pool(cfg) as (rcfg, pool, task_ids):
            ready_at = time.monotonic()
            (Path(cfg.rollout.output_dir) / "config.yaml").write_text(cfg.to_yaml())  # names of key variables only, never keys
            pool.attach_journal(journal)
            signals.attach(pool)
            specs = pool.restore(journal) if journal.resumed else pool.submit_tasks(task_ids)
            already = len(journal.delivered) if journal.resumed else 0
            bar = tqdm(total=len(specs) + already, initial=already, desc=f"{cfg.env.domain} episodes", unit="ep",
                       disable=not progress, file=sys.stderr)
            try:
                for item in pool.stream(excluded=True):
                    if isinstance(item, Excluded):
                        writer.add_excluded(item)
                        bar.set_postfix(excluded=item.reason)
                    else:
                        writer.add_group(item)
                    last_at = time.monotonic()
                    bar.n = len(journal.delivered)
                    bar.total = max(bar.total, pool.stats()["episodes_submitted"] + already)  # re-runs of failed group members
                    bar.refresh()
                status, reason = "finished", None
            except RunAborted as e:  # RunInterrupted (a signal), no healthy actor, the Ray head lost, the journal's disk full
                reason, undelivered = str(e), len(e.undelivered)
                logger.warning("run stopped: %s (journaled; --resume runs the rest)", reason)
            except OutputWriteError as e:  # a result file's disk full: the journal holds what it lacks
                reason, undelivered = f"{e}; the run stops (the journal keeps every episode delivered): free space, then resume", \
                    len(pool.abort_outstanding())
                logger.warning("run stopped: %s", reason)
            finally:
                signals.pool = None
                bar.close()
    except Interrupted as e:  # during start-up or shut-down
        reason = f"{e} received"
    finally:
        try:
            journal.close(status, reason)
        except OutputWriteError as e:  # run.json could not be written: the run is not recorded as ended
            reason = f"{e}; free space, then resume" if status == "finished" else f"{reason}; and {e}"
            status = "interrupted"
        st = pool.stats() if pool is not None else {}
        undelivered = undelivered or len(journal.undelivered())
        summary = _close_writer(writer, {
            "status": status, "reason": reason, "undelivered": undelivered,
            **where_episodes_are(journal.delivered, writer.written, undelivered),
            "domain": cfg.env.domain, "task_split": cfg.env.task_split, "n_samples_per_task": cfg.rollout.n_samples_per_task,
            "sample_mode": str(cfg.rollout.sample_mode), "history": str(cfg.policy.history),
            "context_strategy": cfg.policy.context_strategy, "max_context_tokens": cfg.policy.max_context_tokens,
            "reward_shaping": list(cfg.rollout.reward_shaping.shapers), "open_issues": str(cfg.env.open_issues),
            "skipped_tasks": skipped_summary(pool.task_selection if pool is not None else None),
            "groups": {k: st.get(k, 0) for k in ("groups_kept", "groups_filtered", "groups_dropped", "members_rerun")},
            "resumed_sessions": journal.state.get("resumed", 0), "wall_s": journal.wall_s, "session_wall_s": journal.session_wall_s,
            # this session's start-up (from the command's start, started_at, to every actor ready)
            # and episode phase (from then to the last delivery), seconds, parts of wall_s; None
            # where it did not get there
            "startup_s": round(ready_at - started_at, 3) if ready_at is not None else None,
            "episodes_phase_s": round(last_at - ready_at, 3) if ready_at is not None and last_at is not None else None,
            # the damaged journal lines this session's resume set aside (file, line, kind; their episodes ran again)
            "journal_repairs": [d.as_dict() for d in journal.repairs],
        })
    return summary


def _close_writer(writer, extra: dict[str, Any]) -> dict[str, Any]:
    """``writer.close(extra)``; a ``summary.json`` that could not be written (a full disk) makes
    the run ``interrupted`` with that reason (the summary is still returned, for the CLI)."""
    from rollout.core.journal import OutputWriteError

    try:
        return writer.close(extra)
    except OutputWriteError as e:
        reason = f"{e}; free space, then resume"
        return {**e.summary, "status": "interrupted", "reason": reason if extra.get("status") == "finished" else extra.get("reason")}


def _port(text: str) -> int:
    """A TCP port number, 0 to 65535 (argparse type: a bad one is a usage error, exit 2)."""
    return int_arg(text, "a port number", 0, 65535)


def view(args: argparse.Namespace) -> int:
    """``python -m rollout view``: serve the viewer until SIGINT / SIGTERM; 2 (one line on stderr)
    for a folder that is not a run's output or an address it cannot listen on."""
    import asyncio

    from rollout.app.viewer import NotARunError, RunIndex, Viewer, bind_socket, is_loopback, serve
    from rollout.core.config import LoggingConfig
    from rollout.core.logs import setup_logging

    try:
        run = RunIndex(args.output_dir, "a")
        other = RunIndex(args.compare, "b") if args.compare else None
    except NotARunError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        sock = bind_socket(args.host, args.port)
    except OSError as e:
        print(f"error: cannot listen on {args.host}:{args.port}: {e.strerror or e}", file=sys.stderr)
        return 2
    setup_logging(LoggingConfig())
    host, port = sock.getsockname()[:2]
    url = f"http://{f'[{host}]' if ':' in host else host}:{port}/"
    if not is_loopback(args.host):
        print(f"warning: listening on {args.host}, not loopback: anyone who can reach it reads the run's conversations", file=sys.stderr)
    compared = f" compared with {other.dir}" if other else ""
    print(f"viewer: {url}  ({run.dir}{compared}; Ctrl-C stops it)", flush=True)
    asyncio.run(serve(Viewer(run, other, tokenizer=args.tokenizer), sock, host=args.host))
    return 0


def parse_args_with_overrides(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Parse ``argv``; ``key=value`` overrides may stand before or after options and end up in
    ``args.overrides`` (the parser must have a positional ``overrides`` with ``nargs="*"``).
    Anything else unknown is an error (exit 2)."""
    args, extra = parser.parse_known_args(argv)
    bad = [e for e in extra if e.startswith("-") or "=" not in e]
    if bad:
        parser.error(f"unrecognized arguments: {' '.join(bad)}")
    args.overrides = list(args.overrides) + extra
    return args


def _print_keys(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """``config --keys``: print every key of the schema, its type, default and doc
    (:func:`rollout.core.config.schema_keys`); exit status 0 (2 through ``parser.error`` when
    ``--config`` or overrides come with it)."""
    if args.config is not None or args.overrides:
        parser.error("config --keys prints the schema: it takes no --config or overrides")
    from rollout.core.config import schema_keys

    print("\n".join(k.describe() for k in schema_keys()))
    return 0


def build_parser() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """The command line's parser, and the ``config`` command's own (``config --keys`` reports its usage errors)."""
    parser = argparse.ArgumentParser(prog="python -m rollout", description=plain_text(__doc__.split("\n\n")[0]))
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the rollout job")
    run.add_argument("--config", "-c", default=None, help="YAML config (default: configs/local.yaml if present)")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    mode = run.add_mutually_exclusive_group()
    mode.add_argument("--resume", action="store_true", help="finish the run in rollout.output_dir: run only its undelivered episodes")
    mode.add_argument("--overwrite", action="store_true", help="replace the run in rollout.output_dir")
    run.add_argument("--replay", metavar="DIR", default=None,
                     help="run nothing: replay the finished run in DIR (its journal, its config unless --config) through the training "
                          "streams into rollout.output_dir (default DIR/replay); no Ray, router or local stack")
    run.add_argument("overrides", nargs="*", help="key=value overrides, e.g. pool.num_actors=4")
    ev = sub.add_parser("eval", help="run every task n times; print pass^k, pass@k and mean reward, write eval.json")
    ev.add_argument("--config", "-c", default=None, help="YAML config (default: configs/local.yaml if present)")
    ev.add_argument("--no-progress", action="store_true", help="no progress bar")
    ev.add_argument("--overwrite", action="store_true", help="replace the run in rollout.output_dir (an evaluation writes a run folder)")
    ev.add_argument("overrides", nargs="*", help="key=value overrides, e.g. rollout.n_samples_per_task=4")
    show = sub.add_parser("config", help="print the merged config and exit")
    show.add_argument("--config", "-c", default=None)
    show.add_argument("--keys", action="store_true", help="print every key of the schema instead: its type, default and doc")
    show.add_argument("overrides", nargs="*")
    fmts = sub.add_parser("formats", help="list the chat formats (model families): detection, offline vocabulary, tested")
    fmts.add_argument("--json", action="store_true", help="print a JSON list of objects (name, tokenizer, tested, ...)")
    fmts.add_argument("overrides", nargs="*", help=argparse.SUPPRESS)
    vw = sub.add_parser("view", help="serve the trajectory viewer (a local web page) over a run's output folder")
    vw.add_argument("output_dir", help="the run's rollout.output_dir (it may still be running)")
    vw.add_argument("--port", type=_port, default=8765, help="TCP port (default 8765; 0: any free port, printed)")
    vw.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1, loopback only)")
    vw.add_argument("--compare", metavar="OTHER_DIR", default=None, help="a second run's output folder: both side by side by task")
    vw.add_argument("--tokenizer", default=None, help="decode tokens with this tokenizer instead of the run's policy.tokenizer")
    vw.set_defaults(overrides=[])
    add_regrade_parser(sub)
    return parser, show


def main(argv: list[str] | None = None, started_at: float | None = None, job: bool = False) -> int:
    """The command ``argv`` (``None``: ``sys.argv[1:]``); returns its exit status (module
    docstring). ``started_at``: ``time.monotonic()`` when the command started, where ``run``'s wall
    time and start-up count from (``None``: this call; :func:`cli` passes the interpreter's start,
    :data:`rollout.core.uptime.STARTED_AT`). ``job``: the command runs as a Ray job
    (launch/job.py), whose working directory is Ray's copy of the project: a relative
    ``rollout.output_dir`` is warned about, naming where it lands."""
    started_at = time.monotonic() if started_at is None else started_at
    parser, show = build_parser()
    args = parse_args_with_overrides(parser, argv)
    if args.command == "regrade":
        return _regrade(args)
    if args.command == "view":
        if args.overrides:
            parser.error(f"unrecognized arguments: {' '.join(args.overrides)}")
        return view(args)
    if args.command == "run" and args.replay is not None:
        return _replay(args)
    if args.command == "config" and args.keys:
        return _print_keys(args, show)
    if args.command == "formats":
        from rollout.app.formats import format_table, formats_json

        print(formats_json() if args.json else format_table())
        return 0

    path = args.config
    if path is None and Path("configs/local.yaml").is_file():
        path = "configs/local.yaml"
    from rollout.app.preflight import check_config

    try:
        cfg = load_config(path, args.overrides)
        check_config(cfg)  # what the config names on this machine (a tau2 domain, uvloop): no I/O in load_config
    except (ConfigError, FileNotFoundError) as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    if args.command == "config":
        print(cfg.to_yaml())
        return 0
    if job and not os.path.isabs(cfg.rollout.output_dir):
        print(f"warning: rollout.output_dir={cfg.rollout.output_dir} is relative: in a Ray job it lands in Ray's copy of the project "
              f"on the head ({os.path.abspath(cfg.rollout.output_dir)}), not in the folder you submitted from; name an absolute "
              "folder (shared storage on a cluster)", file=sys.stderr, flush=True)

    from rollout.app.preflight import PreflightError
    from rollout.core.journal import JournalError
    from rollout.core.logs import setup_logging

    setup_logging(cfg.logging)
    ray_was_connected = ray_connected()  # a caller's own Ray (main called in-process) is left as it is
    try:
        if args.command == "eval":
            from rollout.app.evaluation import EVAL_FILE, format_eval, run_eval

            result = run_eval(cfg, progress=not args.no_progress, overwrite=args.overwrite)
        else:
            summary = run_job(cfg, progress=not args.no_progress, resume=args.resume, overwrite=args.overwrite, started_at=started_at)
    except ConfigError as e:  # found once the domain loads: env.task_split / env.task_ids
        print(f"config error: {e}", file=sys.stderr)
        return 2
    except (JournalError, PreflightError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not ray_was_connected:  # this command connected to Ray: the actors' last log lines before the summary, not after it
        disconnect_ray()
    if args.command == "eval":
        print(format_eval(result))
        print(f"eval: {os.path.abspath(Path(cfg.rollout.output_dir) / EVAL_FILE)}")
        return 3 if result["infrastructure_failures"] else 0
    print(format_summary(summary))
    files = summary["files"]
    print(f"samples: {files['samples.jsonl']}  (kept out of training: {files['failed.jsonl']}, {files['filtered.jsonl']})")
    if summary["status"] != "finished":
        print(f"resume with: python -m rollout run --resume <the same arguments>  (rollout.output_dir={cfg.rollout.output_dir})")
        reason = summary.get("reason") or ""
        return 130 if "SIGINT" in reason else 143 if "SIGTERM" in reason else 4
    infra = sum(n for st, n in summary["status_counts"].items() if st in {s.value for s in INFRA_STATUSES})
    return 3 if infra else 0


def _replay(args: argparse.Namespace) -> int:
    """``run --replay DIR`` (:mod:`rollout.app.replay`): exit codes as ``run``'s (2: a bad config,
    a folder that is not a run, an output folder that holds one)."""
    from rollout.app.preflight import PreflightError
    from rollout.app.replay import replay_config, replay_job
    from rollout.core.journal import JournalError
    from rollout.core.logs import setup_logging

    if args.resume:
        print("error: --replay runs nothing, so there is nothing to --resume", file=sys.stderr)
        return 2
    def work() -> dict[str, Any]:
        cfg = replay_config(args.replay, args.config, args.overrides)
        setup_logging(cfg.logging)
        return replay_job(args.replay, cfg, overwrite=args.overwrite)

    summary = one_line_errors(work, (JournalError, PreflightError))
    if summary is None:
        return 2
    print(format_summary(summary))
    files = summary["files"]
    print(f"replay of {args.replay}: samples: {files['samples.jsonl']}  (kept out of training: {files['failed.jsonl']}, {files['filtered.jsonl']})")
    infra = sum(n for st, n in summary["status_counts"].items() if st in {s.value for s in INFRA_STATUSES})
    return 3 if infra else 0


def _regrade(args: argparse.Namespace) -> int:
    """``regrade RUN_DIR`` (:mod:`rollout.app.regrade`): 0, 3 when some episode could not be re-graded, 2 (one
    line) for a bad config, a folder that is not a run, a run without conversations or a benchmark that cannot re-grade."""
    from rollout.app.preflight import check_config
    from rollout.app.regrade import RegradeRefused, format_regrade, regrade_run
    from rollout.core.journal import JournalError, check_run_folder, load_run_config
    from rollout.core.logs import setup_logging

    def work() -> dict[str, Any]:
        check_run_folder(args.run_dir)
        cfg = load_config(args.config, args.overrides) if args.config is not None else load_run_config(args.run_dir, args.overrides)
        check_config(cfg)  # env.domain in the installed benchmark, one line
        setup_logging(cfg.logging)
        return regrade_run(args.run_dir, cfg, out=args.out, workers=args.workers, progress=not args.no_progress)

    report = one_line_errors(work, (JournalError, RegradeRefused))
    if report is None:
        return 2
    print(format_regrade(report))
    print(f"regrade: {report['file']}")
    return 3 if report["errors"] else 0


def ray_connected() -> bool:
    """Whether this process is connected to Ray (``ray.init``), without importing Ray."""
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


def disconnect_ray() -> None:
    """Disconnect this process from Ray when it is connected and the head answers (a lost head is
    left to :func:`exit_process`), so that what Ray still holds of the actors' log lines is printed
    now: Ray's log deduplication keeps back an actor's line that repeats another actor's (5 s
    windows, ``RAY_DEDUP_LOGS_AGG_WINDOW_S``) and prints it when the driver disconnects, at exit
    otherwise, after the summary. A local cluster this process started stops with it, as at exit."""
    if not ray_connected():
        return
    import ray

    from rollout.core.pool.actors import head_lost

    if not head_lost():
        ray.shutdown()


def exit_process(code: int) -> NoReturn:
    """End ``python -m rollout`` with ``code``. When the process is connected to a Ray cluster
    whose head no longer answers (:func:`rollout.core.pool.actors.head_lost`: a run ended by the
    head's loss, exit 4), it ends at once, after flushing the logs and the standard streams
    (``os._exit``): Ray's own shutdown at exit waits for the head, and Ray's core worker ends the
    process with exit 1 once the head has been gone 60 s (a CI run saw it: exit 1 instead of 4,
    48 s after the summary was printed). The journal, the output files and the local stack are
    closed before :func:`main` returns."""
    if "ray" in sys.modules:  # only a command that connected to Ray can have lost its head
        from rollout.core.pool.actors import head_lost

        if head_lost():
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    sys.exit(code)


def cli() -> NoReturn:
    """The command's entry point (``python -m rollout`` and the ``rollout`` script): :func:`main`
    on ``sys.argv``, its times counted from the interpreter's start (:mod:`rollout.core.uptime`:
    not from the process id's creation, which a shell's ``exec`` keeps), pipe-safe
    (:func:`rollout.core.pipes.pipe_safe`: a reader that stops early, as ``| head``, ends it
    quietly with exit 141), then :func:`exit_process`."""
    exit_process(pipe_safe(lambda: main(started_at=uptime.STARTED_AT)))


if __name__ == "__main__":
    cli()
