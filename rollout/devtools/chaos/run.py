"""Running the faults: one row per fault (:func:`run_fault`), all of them (:func:`run_chaos`)."""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import psutil

from rollout.devtools.chaos.job import BASE_OVERRIDES, ChaosOptions, Fault
from rollout.devtools.chaos.procs import cmdline, kill_tree, wait_gone
from rollout.devtools.chaos.report import tally, verdict
from rollout.devtools.chaos.scenarios import FAULTS, SCENARIOS

logger = logging.getLogger(__name__)

def run_fault(name: str, opts: ChaosOptions, root: Path, cfg, ray_tmp: str, task_ids: list[str]) -> dict[str, Any]:
    """Run one fault's scenario on ``task_ids`` and report it (a row of the table; see the module
    docstring)."""
    f = Fault(name, opts, root, cfg, ray_tmp, task_ids)
    t0 = time.monotonic()
    error = None
    try:
        SCENARIOS[name](f)
    except Exception as e:  # noqa: BLE001 (reported in the row: the bench goes on with the next fault)
        error = f"{type(e).__name__}: {e}"
        logger.exception("%s: the scenario failed", name)
    finally:
        for job in f.jobs:
            if job.running():
                kill_tree(job.pid)
                job.wait(30)
        wall = time.monotonic() - t0
        for fn in reversed(f.cleanups):
            try:
                fn()
            except Exception as e:  # noqa: BLE001
                f.notes.append(f"clean-up failed: {e!r}")
        f.watcher.scan()
        left, waited = wait_gone(f.watcher, opts.left_wait_s)
        f.watcher.close()
    left_desc = []
    for p in left:
        left_desc.append(f"{p.pid} {cmdline(p)[:100]}")
        try:
            p.kill()  # ours: recorded as a descendant of this fault's run
        except psutil.Error:
            pass
    counts = tally(f.out)
    notes = list(f.notes) + counts.pop("notes")
    if counts["reruns"]:
        notes.append(f"{counts['reruns']} group member(s) re-run under a new id (counted as submitted)")
    if counts["unexpected_ids"]:
        notes.append(f"delivered ids that were never submitted: {counts['unexpected_ids']}")
    if counts["lost_ids"]:
        notes.append(f"lost: {counts['lost_ids']}")
    if counts["duplicated_ids"]:
        notes.append(f"duplicated: {counts['duplicated_ids']}")
    if error:
        notes.append(f"scenario error: {error}")
    notes.append(f"processes recorded {len(f.watcher.seen)}, all gone {waited:.1f} s after the last run" if not left else
                 f"{len(left)} process(es) still alive {waited:.0f} s after the last run (killed now): {left_desc[:5]}")
    held = (error is None and counts["lost"] == 0 and counts["duplicated"] == 0 and not left and counts["submitted"] > 0
            and not counts["unexpected_ids"] and all(f.checks.values()))
    v = verdict(held, f.injected)
    if f.injected is None:
        notes.append("NOT INJECTED: the scenario recorded no injection")
    elif not f.injected["complete"]:
        unit = f.injected["unit"]
        notes.append(f"NOT INJECTED: {f.injected[unit]} of {f.injected['planned']} {unit} planned (why: above)")
    row = {"fault": name, "ok": v == "ok", "verdict": v, "guarantees_held": held, "injected": f.injected,
           "submitted": counts["submitted"], "delivered": counts["delivered"], "lost": counts["lost"],
           "duplicated": counts["duplicated"], "left_behind": len(left), "statuses": counts["statuses"], "wall_s": round(wall, 1),
           "left_wait_s": round(waited, 1), "checks": f.checks, "notes": notes, "left_processes": left_desc,
           "runs": [j.record() for j in f.jobs], "dir": str(f.dir), **f.extra}
    logger.info("%s: %s", name, {"ok": "ok", "broken": "FAILED (a guarantee broke)", "not_injected": "NOT INJECTED (guarantees held)"}[v])
    return row


def run_chaos(opts: ChaosOptions, faults: list[str], on_row: Callable[[list[dict[str, Any]]], None] | None = None) -> list[dict[str, Any]]:
    """Run each fault in turn (see the module docstring); returns one row per fault.

    Args:
        on_row: called with the rows so far after each fault (e.g. to write them out).

    Raises:
        ValueError: an unknown fault name, ``opts.tasks`` < 1, or more tasks than the configured
            split (``env.task_split`` / ``env.task_ids``) holds.
    """
    from rollout.benchmarks.tau2.environment import Tau2Domain
    from rollout.core.config import load_config

    bad = [x for x in faults if x not in SCENARIOS]
    if bad:
        raise ValueError(f"unknown fault(s) {bad}; known: {', '.join(FAULTS)}")
    if opts.tasks < 1:
        raise ValueError("--tasks must be >= 1")
    cfg = load_config(opts.config, [*BASE_OVERRIDES, *opts.overrides])
    task_ids = list(Tau2Domain(cfg.env.domain, tau2_log_level=cfg.logging.tau2_level).task_ids(cfg.env.task_split, cfg.env.task_ids))
    if len(task_ids) < opts.tasks:
        raise ValueError(f"--tasks {opts.tasks}: the {cfg.env.domain} split {cfg.env.task_split!r} holds {len(task_ids)} tasks")
    task_ids = task_ids[: opts.tasks]
    root = Path(opts.out_dir) if opts.out_dir else Path(tempfile.mkdtemp(prefix="rollout-chaos-"))
    root.mkdir(parents=True, exist_ok=True)
    ray_tmp = tempfile.mkdtemp(prefix="rc", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    logger.info("chaos bench: %d fault(s), %d tasks each, folders in %s", len(faults), opts.tasks, root)
    rows = []
    try:
        for name in faults:
            rows.append(run_fault(name, opts, root, cfg, ray_tmp, task_ids))
            if on_row is not None:
                on_row(rows)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    return rows
