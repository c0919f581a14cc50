"""Command line: ``python -m rollout run --config configs/local.yaml [key=value ...]``.

``run`` resolves the endpoints (starting the local stack when ``local.enabled``), starts the Ray
pool, runs every task of the configured split ``rollout.n_samples_per_task`` times with a progress
bar, writes ``samples.jsonl`` / ``failed.jsonl`` / ``summary.json`` to ``rollout.output_dir`` and
prints a summary table. Exit status: 0 when every episode ended with a policy outcome, 3 when some
ended with an infrastructure failure, 2 on a bad config.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from pathlib import Path
from typing import Any

from rollout.config import Config, ConfigError, load_config
from rollout.records import INFRA_STATUSES

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


def run_job(cfg: Config, progress: bool = True) -> dict[str, Any]:
    """Run the main job described by ``cfg``; returns the summary (also written to disk).

    Raises:
        KeyError: ``env.task_ids`` names tasks the domain lacks.
        RuntimeError: the local stack or an actor failed to start.
    """
    from tqdm import tqdm

    from rollout.env.tau2_env import Tau2Domain
    from rollout.output import RunWriter
    from rollout.pool import RolloutPool

    stack = None
    pool = None
    try:
        domain = Tau2Domain(cfg.env.domain, tau2_log_level=cfg.logging.tau2_level)
        task_ids = domain.task_ids(cfg.env.task_split, cfg.env.task_ids)
        if cfg.local.enabled:
            from rollout.local.stack import LocalStack

            stack = LocalStack(cfg.local, cfg.env.domain, cfg.policy.tokenizer, log_dir=Path(cfg.rollout.output_dir) / "local_stack_logs")
            stack.start()
            cfg = resolve_endpoints(cfg, stack.router_url)
        pool = RolloutPool(cfg).start()
        logger.info("chat template probe (%s):\n%s", cfg.policy.tokenizer, pool.worker_infos()[0]["template_probe"])
        writer = RunWriter(cfg.rollout.output_dir, cfg.rollout.train_statuses)  # the clock starts here
        (Path(cfg.rollout.output_dir) / "config.yaml").write_text(cfg.to_yaml())
        specs = pool.submit_tasks(task_ids)
        bar = tqdm(total=len(specs), desc=f"{cfg.env.domain} episodes", unit="ep", disable=not progress, file=sys.stderr)
        reward_sum, done = 0.0, 0
        for result in pool.results():
            s = writer.add(result)
            reward_sum, done = reward_sum + s.reward, done + 1
            bar.update(1)
            bar.set_postfix(reward=f"{reward_sum / done:.3f}", status=s.status)
        bar.close()
        return writer.close({"domain": cfg.env.domain, "task_split": cfg.env.task_split, "tasks": len(task_ids), "n_samples_per_task": cfg.rollout.n_samples_per_task})
    finally:
        if pool is not None:
            pool.shutdown()
        if stack is not None:
            stack.stop()


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
        summary = run_job(cfg, progress=not args.no_progress)
    except KeyError as e:
        print(f"config error: {e.args[0]}", file=sys.stderr)
        return 2
    print(format_summary(summary))
    print(f"samples: {Path(cfg.rollout.output_dir) / 'samples.jsonl'}")
    infra = sum(n for st, n in summary["status_counts"].items() if st in {s.value for s in INFRA_STATUSES})
    return 3 if infra else 0


if __name__ == "__main__":
    sys.exit(main())
