"""Benchmarks users run against the local stack or their own router: ``python -m rollout.bench``.

``pause``: how long :meth:`rollout.core.pool.RolloutPool.pause` takes to stop all generation with
``--episodes`` episodes in flight, measured side by side with the same pool idle, and how long a
whole :meth:`~rollout.core.pool.RolloutPool.update_weights_from_disk` cycle takes in flight::

    python -m rollout.bench pause --config configs/local.yaml --episodes 256

On the local stack the defaults use the ``tiny`` backend (real generation, 512-token turns) so
that the servers are busy when the pause arrives; the latency is then about one backend step (a
tiny-model prefill of a 4.8k-token tau2 prompt is ~0.16 s here). Against your own router, pass
``local.enabled=false policy.router_url=...`` and, for the update cycle, ``--model-path`` (a
folder every worker can load; skipped without it).

``memory``: resident memory of one actor (its tool sandbox included) against
``pool.max_concurrent_episodes``, per domain (see :mod:`rollout.devtools.sizing`); RSS and PSS come from
the same samples, and it exits 1 if any sample has a PSS above its RSS::

    python -m rollout.bench memory --config configs/local.yaml --concurrency 8,32 [--json FILE]

``chaos``: the main job (``python -m rollout run`` in a subprocess) under faults (actor, server,
router, driver kills, a faulty server, a failing or dying user simulator, a node removal, a full
disk, a torn or corrupted journal, a half-done weight update, a straggler worker, an actor killed
by Ray's memory monitor, a network partition), one row per fault: what the fault injected against what it planned (each strike placed by the run's
progress, episodes delivered and outstanding, never by the clock), episodes submitted,
delivered, lost, duplicated, statuses, wall time and processes left behind (see
:mod:`rollout.devtools.chaos`). Exit codes: 0 every fault injected all it planned and every guarantee
held (0 lost, 0 duplicated, 0 left behind, its own checks passed); 1 some guarantee broke
(takes precedence); 5 every guarantee held but some fault could not be (fully) injected, so
the bench proved nothing for it; 2 a usage or config error::

    python -m rollout.bench chaos [--config configs/local.yaml] [--tasks 24] [--faults a,b] [--json FILE] [key=value ...]

``routing``: prefix-cache hit ratio against the ideal, prefill lost to retractions, load
imbalance and episodes/s for the router's policies and our routing keys, with and without
adaptive concurrency, on N local workers (:mod:`rollout.devtools.bench.routing`)::

    python -m rollout.bench routing [--workers 4] [--concurrency 512] [--n 8] [--json FILE] [--plot FILE.png]

``scale``: the main job's episode phase (actors ready to the last delivery) with each actor count,
side by side, each run a fresh ``python -m rollout run`` (:mod:`rollout.devtools.bench.scale`)::

    python -m rollout.bench scale [--actors 2,8] [--servers 4] [--reps 1] [--json FILE] [key=value ...]

``engine``: the pool's episodes/s on the real vLLM (started by the bench on the CPU behind
vllm-router) against a plain asyncio loop calling the same endpoint with the same episodes, the
ratio measured side by side in one run (:mod:`rollout.devtools.bench.engine`)::

    python -m rollout.bench engine [--engine vllm] [--episodes 16] [--concurrency 8] [--reps 1] [--json FILE] [key=value ...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from rollout.devtools.bench.cli import load_checked_config

# Applied before the user's overrides: long turns on the tiny model keep the servers generating.
PAUSE_DEFAULTS = ["local.backend=tiny", "env.max_steps=1", "policy.sampling.max_new_tokens=512", "pool.num_actors=2", "logging.level=WARNING"]


def _wait_running(pool, n: int, timeout_s: float) -> int:
    """Wait until ``n`` episodes run on the actors (or ``timeout_s``); returns how many run."""
    t0 = time.monotonic()
    while True:
        running = sum(i["running"] for i in pool.worker_infos())
        if running >= n or time.monotonic() - t0 > timeout_s:
            return running
        time.sleep(0.2)


def _timed(fn) -> float:
    t0 = time.monotonic()
    fn()
    return time.monotonic() - t0


def bench_pause(cfg, episodes: int, cycles: int, model_path: str | None) -> dict:
    """Measure pause latencies idle and with ``episodes`` in flight (see the module docstring).

    Returns:
        ``{"episodes_in_flight", "idle_s": [...], "busy_s": [...], "update_cycle_s": float | None}``
        (seconds).
    """
    from rollout.app.wiring import open_pool

    out: dict = {"update_cycle_s": None}
    with open_pool(cfg, log_dir_name="bench_stack_logs") as (cfg, pool, task_ids):
        out["idle_s"] = []
        for _ in range(cycles):
            out["idle_s"].append(_timed(lambda: pool.pause("abort")))
            pool.resume()
        per_task = -(-episodes // len(task_ids))
        pool.submit_tasks(task_ids[: -(-episodes // per_task)], n_samples_per_task=per_task)
        out["episodes_in_flight"] = _wait_running(pool, episodes, timeout_s=600)
        time.sleep(2.0)  # let the servers get busy
        busy = []
        for _ in range(cycles):
            busy.append(_timed(lambda: pool.pause("abort")))
            pool.resume()
            time.sleep(1.0)
        out["busy_s"] = busy
        out["episodes_still_running"] = sum(i["running"] for i in pool.worker_infos())
        if model_path is None and cfg.local.enabled and cfg.local.backend == "tiny":
            from rollout.core.tokenizer import load_tokenizer
            from rollout.devtools.local.tiny import build_tiny_model, save_weights

            model_path = str(save_weights(build_tiny_model(len(load_tokenizer(cfg.policy.tokenizer)), cfg.local.tiny),
                                          Path(tempfile.mkdtemp(prefix="bench-weights-"))))
        if model_path is not None:
            out["update_cycle_s"] = _timed(lambda: pool.update_weights_from_disk(model_path, pool.weight_version + 1))
        pool.cancel_outstanding()
    return out


def main_chaos(args) -> int:
    """``chaos``: run the faults, print the table, write ``--json``; returns
    :func:`rollout.devtools.chaos.exit_code` of the rows (0 all injected and held, 1 a guarantee broke,
    5 a fault not injected) or 2 for a usage or config error."""
    import json
    import logging

    from rollout.devtools.chaos import FAULTS, ChaosOptions, exit_code, format_table, run_chaos

    faults = [x.strip() for x in args.faults.split(",") if x.strip()] if args.faults else list(FAULTS)
    bad = [x for x in faults if x not in FAULTS]
    if bad or args.tasks < 1:
        print(f"error: unknown fault(s) {bad} (known: {', '.join(FAULTS)})" if bad else "error: --tasks must be >= 1", file=sys.stderr)
        return 2
    if load_checked_config(args.config, args.overrides) is None:
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    logging.getLogger("aiohttp").setLevel(logging.CRITICAL)  # the fault proxy's reset connections
    t0 = time.monotonic()
    opts = ChaosOptions(config=args.config, tasks=args.tasks, overrides=list(args.overrides),
                        out_dir=Path(args.out_dir) if args.out_dir else None, left_wait_s=args.left_wait)

    def write(rows: list[dict]) -> None:  # after each fault: a partial report survives an interrupted bench
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1, default=str) + "\n")

    try:
        rows = run_chaos(opts, faults, on_row=write)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(format_table(rows))
    code = exit_code(rows)
    broken = [r["fault"] for r in rows if r.get("verdict") == "broken"]
    not_injected = [r["fault"] for r in rows if r.get("verdict") == "not_injected"]
    print(f"chaos bench: {len(rows)} fault(s), {args.tasks} tasks each, {time.monotonic() - t0:.0f} s in all; "
          f"{sum(r['ok'] for r in rows)} passed; run folders under {Path(rows[0]['dir']).parent if rows else '-'}")
    if broken:
        print(f"a guarantee broke: {', '.join(broken)}")
    if not_injected:
        print(f"not (fully) injected, guarantees held: {', '.join(not_injected)} (inconclusive)")
    if args.json:
        write(rows)
        print(f"json: {args.json}")
    print(f"exit code {code}")
    return code


def main_memory(args) -> int:
    """``memory``: :mod:`rollout.devtools.sizing` for each domain, one table; 0 on success, 1 when a sample
    has a PSS above its RSS (:func:`rollout.devtools.sizing.check_rows`, printed to stderr), 2 on a config
    error."""
    import json

    from rollout.core.logs import setup_logging
    from rollout.devtools.sizing import check_rows, format_rows, measure

    rows = []
    for domain in [d.strip() for d in args.domains.split(",") if d.strip()]:
        cfg = load_checked_config(args.config, ["logging.level=WARNING", f"env.domain={domain}", *args.overrides])
        if cfg is None:
            return 2
        setup_logging(cfg.logging)
        rows += measure(cfg, [int(c) for c in args.concurrency.split(",")])
    print(format_rows(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
        print(f"json: {args.json}")
    problems = check_rows(rows)
    for line in problems:
        print(f"PSS above RSS: {line}", file=sys.stderr)
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    import importlib.util

    if importlib.util.find_spec("psutil") is None:  # the benches read process trees
        print("error: python -m rollout.bench needs psutil, which is not installed: pip install 'tau-rollout[bench]'", file=sys.stderr)
        return 2
    from rollout.app.args import plain_text

    parser = argparse.ArgumentParser(prog="python -m rollout.bench", description=plain_text(__doc__.split("\n\n")[0]))
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pause", help="pause latency with episodes in flight, side by side with idle")
    p.add_argument("--config", "-c", default="configs/local.yaml")
    p.add_argument("--episodes", type=int, default=256, help="episodes in flight")
    p.add_argument("--cycles", type=int, default=5, help="pauses measured in each condition")
    p.add_argument("--model-path", default=None, help="weights folder for the update cycle (default on the tiny stack: its own weights)")
    p.add_argument("overrides", nargs="*")
    from rollout.devtools.chaos import DEFAULT_TASKS, EXIT_BROKEN, EXIT_NOT_INJECTED, FAULTS, LEFT_WAIT_S

    c = sub.add_parser("chaos", help="the main job under faults: lost / duplicated episodes and processes left behind, per fault",
                       description="Runs the main job once per fault; each fault strikes at the run's progress (episodes "
                       "delivered and outstanding, read from its journal), never at a clock time (see rollout.devtools.chaos).",
                       epilog=f"exit codes: 0 every fault injected all it planned and every guarantee held; {EXIT_BROKEN} a "
                       f"guarantee broke (lost, duplicated, left behind, a check on the outcome; takes precedence); "
                       f"{EXIT_NOT_INJECTED} every guarantee held but some fault could not be (fully) injected "
                       "(inconclusive); 2 a usage or config error")
    c.add_argument("--config", "-c", default="configs/local.yaml")
    c.add_argument("--tasks", type=int, default=DEFAULT_TASKS, help="tasks per fault (the first N of env.task_split), one episode each")
    c.add_argument("--faults", default=None, help="comma-separated faults (default: all): " + ", ".join(FAULTS))
    c.add_argument("--json", default=None, metavar="FILE", help="write the rows as a JSON list")
    c.add_argument("--out-dir", default=None, help="where the runs go (default: a new temporary folder, kept)")
    c.add_argument("--left-wait", type=float, default=LEFT_WAIT_S, help="seconds to wait for a fault's processes to exit")
    c.add_argument("overrides", nargs="*")
    m = sub.add_parser("memory", help="resident memory of one actor (sandbox included) against its concurrency, per domain")
    m.add_argument("--config", "-c", default="configs/local.yaml")
    m.add_argument("--domains", default="retail,airline")
    m.add_argument("--concurrency", default="8,32", help="comma-separated pool.max_concurrent_episodes values")
    m.add_argument("--json", default=None, metavar="FILE", help="write the rows, each with its samples (bytes), as a JSON list")
    m.add_argument("overrides", nargs="*")
    # Sub-commands that live in their own modules: each adds its parser and sets ``run``.
    from rollout.devtools.bench import engine as bench_engine
    from rollout.devtools.bench import env as bench_env
    from rollout.devtools.bench import journal as bench_journal
    from rollout.devtools.bench import pool as bench_pool
    from rollout.devtools.bench import routing as bench_routing
    from rollout.devtools.bench import scale as bench_scale
    from rollout.devtools.bench import startup as bench_startup
    from rollout.devtools.bench import turns as bench_turns

    for module in (bench_env, bench_engine, bench_pool, bench_routing, bench_turns, bench_journal, bench_startup, bench_scale):
        module.add_parser(sub)
    from rollout.app.cli import parse_args_with_overrides
    from rollout.core.logs import setup_logging

    args = parse_args_with_overrides(parser, argv)
    if getattr(args, "run", None) is not None:
        return args.run(args)
    if args.command == "chaos":
        return main_chaos(args)
    if args.command == "memory":
        return main_memory(args)
    from rollout.devtools.bench.cli import load_checked_config

    probe = load_checked_config(args.config, args.overrides, check=False)
    if probe is None:
        return 2
    per_actor = -(-args.episodes // probe.pool.num_actors)
    cfg = load_checked_config(args.config, PAUSE_DEFAULTS + [f"pool.max_concurrent_episodes={per_actor}"] + list(args.overrides))
    if cfg is None:
        return 2
    setup_logging(cfg.logging)
    r = bench_pause(cfg, args.episodes, args.cycles, args.model_path)
    idle, busy = statistics.median(r["idle_s"]), statistics.median(r["busy_s"])
    print(f"pause (mode=abort), {args.cycles} cycles each, backend {cfg.local.backend if cfg.local.enabled else cfg.policy.router_url}:")
    print(f"  idle                        median {idle:.3f} s  max {max(r['idle_s']):.3f} s")
    print(f"  {r['episodes_in_flight']:>4} episodes in flight     median {busy:.3f} s  max {max(r['busy_s']):.3f} s  ({busy / idle:.1f}x idle)")
    print(f"  episodes still running after the pauses: {r['episodes_still_running']} (held, not ended)")
    if r["update_cycle_s"] is not None:
        print(f"  update_weights_from_disk cycle (pause, load, check, continue) in flight: {r['update_cycle_s']:.3f} s")
    return 0


if __name__ == "__main__":
    from rollout.core.pipes import pipe_safe

    sys.exit(pipe_safe(main))
