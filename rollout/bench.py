"""Benchmarks users run against the local stack or their own router: ``python -m rollout.bench``.

``pause``: how long :meth:`rollout.pool.RolloutPool.pause` takes to stop all generation with
``--episodes`` episodes in flight, measured side by side with the same pool idle, and how long a
whole :meth:`~rollout.pool.RolloutPool.update_weights_from_disk` cycle takes in flight::

    python -m rollout.bench pause --config configs/local.yaml --episodes 256

On the local stack the defaults use the ``tiny`` backend (real generation, 512-token turns) so
that the servers are busy when the pause arrives; the latency is then about one backend step (a
tiny-model prefill of a 4.8k-token tau2 prompt is ~0.16 s here). Against your own router, pass
``local.enabled=false policy.router_url=...`` and, for the update cycle, ``--model-path`` (a
folder every worker can load; skipped without it).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from rollout.config import ConfigError, load_config

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
    from rollout.cli import open_pool

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
            from rollout.local.tiny import build_tiny_model, save_weights
            from rollout.tokenizer import load_tokenizer

            model_path = str(save_weights(build_tiny_model(len(load_tokenizer(cfg.policy.tokenizer)), cfg.local.tiny),
                                          Path(tempfile.mkdtemp(prefix="bench-weights-"))))
        if model_path is not None:
            out["update_cycle_s"] = _timed(lambda: pool.update_weights_from_disk(model_path, pool.weight_version + 1))
        pool.cancel_outstanding()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rollout.bench", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pause", help="pause latency with episodes in flight, side by side with idle")
    p.add_argument("--config", "-c", default="configs/local.yaml")
    p.add_argument("--episodes", type=int, default=256, help="episodes in flight")
    p.add_argument("--cycles", type=int, default=5, help="pauses measured in each condition")
    p.add_argument("--model-path", default=None, help="weights folder for the update cycle (default on the tiny stack: its own weights)")
    p.add_argument("overrides", nargs="*")
    from rollout.cli import parse_args_with_overrides
    from rollout.worker import setup_logging

    args = parse_args_with_overrides(parser, argv)
    try:
        probe = load_config(args.config, args.overrides)
        per_actor = -(-args.episodes // probe.pool.num_actors)
        cfg = load_config(args.config, PAUSE_DEFAULTS + [f"pool.max_concurrent_episodes={per_actor}"] + list(args.overrides))
    except (ConfigError, FileNotFoundError) as e:
        print(f"config error: {e}", file=sys.stderr)
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
    sys.exit(main())
