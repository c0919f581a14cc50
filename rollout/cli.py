"""Command line: ``python -m rollout {run,eval,config} --config configs/local.yaml [key=value ...]``.

``run`` resolves the endpoints (starting the local stack when ``local.enabled``), starts the Ray
pool, runs every task of the configured split ``rollout.n_samples_per_task`` times with a progress
bar, writes ``samples.jsonl`` / ``failed.jsonl`` / ``filtered.jsonl`` / ``summary.json`` to
``rollout.output_dir`` through the same training policy as the trainer API
(:meth:`rollout.pool.RolloutPool.stream`) and prints a summary table. ``eval`` runs the same
episodes and prints pass^k / pass@k (:mod:`rollout.evaluation`). ``config`` prints the merged
config. Exit status: 0 when every episode ended with a policy outcome, 3 when some ended with an
infrastructure failure, 2 on a bad config.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from rollout.config import Config, ConfigError, load_config
from rollout.records import INFRA_STATUSES

if TYPE_CHECKING:
    from rollout.pool import RolloutPool

logger = logging.getLogger(__name__)


def resolve_endpoints(cfg: Config, router_url: str | None) -> Config:
    """Fill ``policy.router_url`` (and the llm user's ``base_url``) from the local stack's router."""
    policy = cfg.policy
    user = cfg.env.user
    if router_url is not None:
        policy = dataclasses.replace(policy, router_url=router_url)
        if user.kind == "llm" and user.base_url is None:
            user = dataclasses.replace(user, base_url=router_url.rstrip("/") + "/v1", model=user.model or "local")
    env = dataclasses.replace(cfg.env, user=user)
    return dataclasses.replace(cfg, policy=policy, env=env)


def format_summary(summary: dict[str, Any]) -> str:
    """The end-of-run table."""
    rows = [("episodes", str(summary["episodes"]))]
    for st, n in sorted(summary["status_counts"].items()):
        rows.append((f"  {st}", str(n)))
    rows.append(("trained samples", str(summary.get("trained_samples", summary["episodes"]))))
    for reason, n in sorted(summary.get("excluded_counts", {}).items()):
        rows.append((f"  excluded: {reason}", str(n)))
    for d, r in sorted(summary["mean_reward_per_domain"].items()):
        rows.append((f"mean reward ({d})", f"{r:.4f}"))
    rows += [
        ("mean turns", f"{summary['mean_turns']:.2f}"),
        ("mean tokens / episode", f"{summary['mean_tokens']:.1f}"),
        ("generated tokens", str(summary["generated_tokens"])),
        ("turn-boundary repairs", str(summary["turn_boundary_repairs"])),
        ("parse errors", str(summary["parse_errors"])),
        ("wall time (s)", f"{summary['wall_s']:.1f}"),
        ("episodes / s", f"{summary['episodes_per_s']:.3f}"),
    ]
    w = max(len(k) for k, _ in rows)
    line = "-" * (w + 14)
    return "\n".join([line] + [f"{k:<{w}}  {v:>10}" for k, v in rows] + [line])


@contextlib.contextmanager
def open_pool(cfg: Config, log_dir_name: str = "local_stack_logs") -> Iterator[tuple[Config, "RolloutPool", list[str]]]:
    """Start what a job needs and stop it afterwards: the local stack (when ``local.enabled``) and
    the Ray pool.

    Yields:
        ``(cfg, pool, task_ids)``: the config with its endpoints resolved, the started pool, and
        the task ids of ``env.task_split`` / ``env.task_ids``.

    Raises:
        KeyError: ``env.task_ids`` names tasks the domain lacks, or the split does not exist.
        RuntimeError: the local stack or an actor failed to start.
    """
    from rollout.env.tau2_env import Tau2Domain
    from rollout.pool import RolloutPool

    stack = None
    pool = None
    try:
        domain = Tau2Domain(cfg.env.domain, tau2_log_level=cfg.logging.tau2_level)
        task_ids = domain.task_ids(cfg.env.task_split, cfg.env.task_ids)
        if cfg.local.enabled:
            from rollout.local.stack import LocalStack

            stack = LocalStack(cfg.local, cfg.env.domain, cfg.policy.tokenizer, log_dir=Path(cfg.rollout.output_dir) / log_dir_name)
            stack.start()
            cfg = resolve_endpoints(cfg, stack.router_url)
        pool = RolloutPool(cfg).start()
        logger.info("chat template probe (%s):\n%s", cfg.policy.tokenizer, pool.worker_infos()[0]["template_probe"])
        yield cfg, pool, task_ids
    finally:
        if pool is not None:
            pool.shutdown()
        if stack is not None:
            stack.stop()


def run_job(cfg: Config, progress: bool = True) -> dict[str, Any]:
    """Run the main job described by ``cfg``; returns the summary (also written to disk).

    Raises:
        KeyError: ``env.task_ids`` names tasks the domain lacks.
        RuntimeError: the local stack or an actor failed to start.
    """
    from tqdm import tqdm

    from rollout.groups import Excluded
    from rollout.output import RunWriter

    with open_pool(cfg) as (cfg, pool, task_ids):
        writer = RunWriter(cfg.rollout.output_dir)  # the clock starts here
        (Path(cfg.rollout.output_dir) / "config.yaml").write_text(cfg.to_yaml())
        specs = pool.submit_tasks(task_ids)
        bar = tqdm(total=len(specs), desc=f"{cfg.env.domain} episodes", unit="ep", disable=not progress, file=sys.stderr)
        for item in pool.stream(excluded=True):
            if isinstance(item, Excluded):
                writer.add_excluded(item)
                bar.update(1)
                bar.set_postfix(excluded=item.reason)
            else:
                writer.add_group(item)
                bar.update(len(item))
            bar.total = pool.stats()["episodes_submitted"]  # re-runs of failed group members
        bar.close()
        st = pool.stats()
        return writer.close({
            "domain": cfg.env.domain, "task_split": cfg.env.task_split, "tasks": len(task_ids),
            "n_samples_per_task": cfg.rollout.n_samples_per_task,
            "groups": {k: st.get(k, 0) for k in ("groups_kept", "groups_filtered", "groups_dropped", "members_rerun")},
        })


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rollout", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the rollout job")
    run.add_argument("--config", "-c", default=None, help="YAML config (default: configs/local.yaml if present)")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    run.add_argument("overrides", nargs="*", help="key=value overrides, e.g. pool.num_actors=4")
    ev = sub.add_parser("eval", help="run every task n times; print pass^k, pass@k and mean reward, write eval.json")
    ev.add_argument("--config", "-c", default=None, help="YAML config (default: configs/local.yaml if present)")
    ev.add_argument("--no-progress", action="store_true", help="no progress bar")
    ev.add_argument("overrides", nargs="*", help="key=value overrides, e.g. rollout.n_samples_per_task=4")
    show = sub.add_parser("config", help="print the merged config and exit")
    show.add_argument("--config", "-c", default=None)
    show.add_argument("overrides", nargs="*")
    args = parse_args_with_overrides(parser, argv)

    path = args.config
    if path is None and Path("configs/local.yaml").is_file():
        path = "configs/local.yaml"
    try:
        cfg = load_config(path, args.overrides)
    except (ConfigError, FileNotFoundError) as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    if args.command == "config":
        print(cfg.to_yaml())
        return 0

    from rollout.worker import setup_logging

    setup_logging(cfg.logging)
    try:
        if args.command == "eval":
            from rollout.evaluation import EVAL_FILE, format_eval, run_eval

            result = run_eval(cfg, progress=not args.no_progress)
        else:
            summary = run_job(cfg, progress=not args.no_progress)
    except KeyError as e:
        print(f"config error: {e.args[0]}", file=sys.stderr)
        return 2
    if args.command == "eval":
        print(format_eval(result))
        print(f"eval: {Path(cfg.rollout.output_dir) / EVAL_FILE}")
        return 3 if result["infrastructure_failures"] else 0
    print(format_summary(summary))
    out = Path(cfg.rollout.output_dir)
    print(f"samples: {out / 'samples.jsonl'}  (kept out of training: {out / 'failed.jsonl'}, {out / 'filtered.jsonl'})")
    infra = sum(n for st, n in summary["status_counts"].items() if st in {s.value for s in INFRA_STATUSES})
    return 3 if infra else 0


if __name__ == "__main__":
    sys.exit(main())
