"""``python -m rollout.devtools.chaos trainer``: a trainer of the bench's own, for the faults that only
a trainer meets (the CLI neither updates weights nor works in steps): the trainer API
(:func:`rollout.open_pool`, :class:`rollout.core.pool.RolloutPool`) with the CLI's journal and
result files (:class:`~rollout.core.journal.RunJournal`, :class:`~rollout.core.output.RunWriter`),
so that the bench counts its episodes as it counts a run's.

Modes (``--mode``):

* ``weights``: every task once through :meth:`~rollout.core.pool.RolloutPool.stream`, with
  ``update_weights_from_disk(<out>/weights/v<k>, k)`` after every ``--update-every`` deliveries
  (a GRPO trainer's sync; the gold-replay servers read no folder); each update's
  :attr:`~rollout.core.pool.RolloutPool.last_weight_update` goes to ``weight_updates.jsonl``. An
  update rolled back (:class:`~rollout.core.pool.weight_repair.HalfDoneUpdateError`) is tried once
  more, then generation resumes on the version every worker serves.
* ``steps``: ``--steps`` training steps, each ``collect_groups(--groups, tasks,
  max_outstanding_groups=--outstanding)``: over-sampling, the surplus cancelled when the step has
  its groups (slime's); each step's wall time goes to ``steps.jsonl``.

Exit codes as ``python -m rollout run``'s: 0 / 3 finished, 2 a bad config, 4 the run stopped.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import sys
import time
from pathlib import Path

logger = logging.getLogger(__name__)


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m rollout.devtools.chaos trainer")
    p.add_argument("--config", "-c", default=None)
    p.add_argument("--no-progress", action="store_true", help="(accepted for the CLI's arguments; nothing is shown)")
    p.add_argument("--mode", choices=("weights", "steps"), default="weights")
    p.add_argument("--update-every", type=int, default=4, help="weights: deliveries between two weight updates")
    p.add_argument("--steps", type=int, default=4, help="steps: training steps")
    p.add_argument("--groups", type=int, default=2, help="steps: groups per step")
    p.add_argument("--outstanding", type=int, default=None, help="steps: max_outstanding_groups (default: the pool's capacity)")
    p.add_argument("overrides", nargs="*")
    return p.parse_args(argv)


def _append(path: Path, row: dict) -> None:
    with open(path, "a") as fh:
        fh.write(json.dumps(row, default=str) + "\n")


def _update(pool, out: Path, version: int) -> None:
    """One weight update, its report kept; a rolled-back one tried once more, then generation
    goes on (on the version every worker serves)."""
    from rollout.core.policy import WeightSyncError
    from rollout.core.pool.weight_repair import HalfDoneUpdateError

    for attempt in (1, 2):
        try:
            pool.update_weights_from_disk(str(out / "weights" / f"v{version}"), version)
            _append(out / "weight_updates.jsonl", {"attempt": attempt, **pool.last_weight_update.as_dict()})
            return
        except HalfDoneUpdateError as e:
            _append(out / "weight_updates.jsonl", {"attempt": attempt, **e.report.as_dict()})
        except WeightSyncError as e:
            _append(out / "weight_updates.jsonl", {"attempt": attempt, "version": version, "outcome": "failed", "failed": e.failures})
    pool.resume()


def _run(args: argparse.Namespace, cfg, pool, task_ids: list[str], journal, writer) -> None:
    from rollout.core.groups import Excluded

    out = Path(cfg.rollout.output_dir)
    if args.mode == "weights":
        pool.submit_tasks(task_ids)
        version = cfg.rollout.weight_version
        for item in pool.stream(excluded=True):
            writer.add_excluded(item) if isinstance(item, Excluded) else writer.add_group(item)
            if len(journal.delivered) // args.update_every > version - cfg.rollout.weight_version and pool.num_outstanding:
                version += 1
                _update(pool, out, version)
        return
    tasks = itertools.cycle(task_ids)
    for step in range(args.steps):
        t0 = time.monotonic()
        groups = pool.collect_groups(args.groups, tasks, max_outstanding_groups=args.outstanding)
        took = time.monotonic() - t0
        for g in groups:
            writer.add_group(g)
        excluded = list(pool.excluded())
        for ex in excluded:
            writer.add_excluded(ex)
        _append(out / "steps.jsonl", {"step": step, "seconds": round(took, 3), "groups": len(groups), "excluded": len(excluded),
                                      "delivered": len(journal.delivered)})
        logger.info("step %d: %d group(s) in %.2f s (%d kept out)", step, len(groups), took, len(excluded))
    pool.cancel_outstanding()
    for ex in pool.excluded():
        writer.add_excluded(ex)


def trainer_main(argv: list[str]) -> int:
    """The trainer (see the module docstring); returns the exit code."""
    from rollout.app.preflight import check_config
    from rollout.app.wiring import open_pool
    from rollout.core.config import ConfigError, load_config
    from rollout.core.journal import RunJournal
    from rollout.core.logs import setup_logging
    from rollout.core.output import RunWriter
    from rollout.core.pool import RunAborted
    from rollout.core.records import INFRA_STATUSES

    args = _parse(argv)
    try:
        cfg = load_config(args.config, args.overrides)
        check_config(cfg)
    except (ConfigError, FileNotFoundError) as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    setup_logging(cfg.logging)
    journal = RunJournal.open(cfg.rollout.output_dir, cfg)
    writer = RunWriter(cfg.rollout.output_dir, cfg.rollout.train_statuses)
    status, reason = "interrupted", None
    try:
        with open_pool(cfg) as (rcfg, pool, task_ids):
            pool.attach_journal(journal)
            try:
                _run(args, rcfg, pool, task_ids, journal, writer)
                status = "finished"
            except RunAborted as e:
                reason = str(e)
    finally:
        journal.close(status, reason)
        summary = writer.close({"status": status, "reason": reason, "wall_s": journal.wall_s})
    print(json.dumps({k: summary[k] for k in ("status", "reason", "episodes", "status_counts")}))
    infra = {s.value for s in INFRA_STATUSES}
    return 4 if status != "finished" else 3 if any(summary["status_counts"].get(s) for s in infra) else 0
