"""``python -m rollout.bench startup``: the main job's start-up, from the command to actors ready,
the old way against the new, side by side in one run.

Each row runs the real command, ``python -m rollout run`` (:func:`rollout.app.cli.main`) on the
config (default: the embedded local stack, ``configs/local.yaml``) with ``--tasks`` tasks, in a
fresh process (a new local Ray cluster each time, nothing shared but the disk caches), and reads
the start-up timeline :func:`rollout.app.wiring.open_pool` records (a
:class:`rollout.app.wiring.StartupTimeline`): the seconds from the process's
start (the command) to every actor ready, and each phase's span. The ways:

* ``before``: as before issue 23: the serial order (``startup=serial``: checks, task ids, local
  stack, preflight, Ray, actors, one after the other), the tokenizer loaded in the driver for the
  checks (no facts cache), the new local Ray cluster prestarting its idle task workers;
* ``serial+cache``: the same order, with the tokenizer's facts from the cache
  (:func:`rollout.app.preflight.cached_tokenizer_facts`) and no idle workers prestarted
  (:data:`rollout.core.pool.actors.PRESTART_IDLE_WORKERS`);
* ``after``: the default now: ``startup=overlapped`` with both (the local stack starts in a
  thread while Ray and the actors start; the preflight runs while the actors load).

The ways run interleaved, ``--reps`` times each (the order reversed every other round); the
median and the range are printed, then the ratio ``after`` / ``before``. The figures depend on
how busy the machine is: run it on a quiet one, and compare only rows of one run.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rollout.devtools.bench.interleaved import add_bench_parser, run_bench

# way -> (open_pool's startup, the tokenizer facts cache and no prestarted idle workers)
WAYS: dict[str, tuple[str, bool]] = {"before": ("serial", False), "serial+cache": ("serial", True), "after": ("overlapped", True)}

# The child: the real command (rollout.app.cli.main), whose `run` calls rollout.app.wiring.open_pool;
# that name is bound here to open_pool with the way's start-up order and a StartupTimeline of ours,
# which the child writes out once the command returned.
_CHILD = """
import json, sys
from rollout.app import wiring
from rollout.app.preflight import tokenizer as tok
from rollout.app.cli import main
from rollout.core.pool import actors
mode, new, out = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
tok.FACTS_CACHE, actors.PRESTART_IDLE_WORKERS = new, not new
timeline, open_pool = wiring.StartupTimeline(), wiring.open_pool
wiring.open_pool = lambda cfg, *args, **kwargs: open_pool(cfg, *args, startup=mode, timeline=timeline, **kwargs)
rc = main(["run", "--no-progress", "--overwrite", *sys.argv[4:]])
with open(out, "w") as f:
    json.dump({"rc": rc, **timeline.as_dict()}, f)
"""


def run_once(way: str, config: str | None, tasks: int, overrides: list[str], folder: Path) -> dict[str, Any]:
    """One ``python -m rollout run`` the way ``way`` starts; its start-up timeline, exit code and wall time."""
    mode, cache = WAYS[way]
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / "startup.json"
    args = [f"rollout.output_dir={folder / 'run'}", f"env.task_ids=[{','.join(str(i) for i in range(tasks))}]",
            "rollout.n_samples_per_task=1", *overrides]
    if config:
        args = ["--config", config, *args]
    t = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", _CHILD, mode, "1" if cache else "0", str(out), *args],
                          capture_output=True, text=True, timeout=600, check=False)
    wall = time.monotonic() - t
    data = json.loads(out.read_text()) if out.is_file() else {}
    if data.get("process_start_to_ready_s") is None:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        raise RuntimeError(f"{way}: the run did not finish its start-up (exit {proc.returncode}):\n{tail}")
    data.update(way=way, wall_s=round(wall, 3), exit_code=proc.returncode)
    return data


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per way: median and range of the command-to-ready seconds, and the median span of each phase."""
    rows = []
    for way in WAYS:
        mine = [r for r in runs if r["way"] == way]
        if not mine:
            continue
        ready = [r["process_start_to_ready_s"] for r in mine]
        phases: dict[str, float] = {}
        for name in mine[0]["phases"]:
            spans = [r["phases"][name][1] - r["phases"][name][0] for r in mine if name in r["phases"]]
            phases[name] = round(statistics.median(spans), 2)
        rows.append({"way": way, "mode": mine[0]["mode"], "runs": len(mine), "ready_s": round(statistics.median(ready), 2),
                     "ready_min_s": min(ready), "ready_max_s": max(ready),
                     "before_open_pool_s": round(statistics.median(r["process_age_at_open_pool_s"] for r in mine), 2),
                     "phases_s": phases})
    return rows


def format_rows(rows: list[dict[str, Any]]) -> str:
    out = [f"{'way':<13} {'command -> actors ready':>24}   phases (median seconds; overlapped phases run at once)"]
    for r in rows:
        span = f"{r['ready_s']:.2f} s ({r['ready_min_s']:.2f}-{r['ready_max_s']:.2f})"
        phases = ", ".join(f"{k} {v:.2f}" for k, v in r["phases_s"].items())
        out.append(f"{r['way']:<13} {span:>24}   imports+config {r['before_open_pool_s']:.2f}, {phases}")
    by = {r["way"]: r for r in rows}
    if "before" in by and "after" in by:
        out.append(f"after / before: x{by['after']['ready_s'] / by['before']['ready_s']:.2f} "
                   f"({by['before']['ready_s']:.2f} s -> {by['after']['ready_s']:.2f} s, median of {by['after']['runs']} runs each)")
    return "\n".join(out)


def add_parser(sub) -> None:
    """Add the ``startup`` sub-command to ``sub`` (argparse sub-parsers); it sets ``run``."""
    p = add_bench_parser(sub, "startup", "the main job's start-up (command -> actors ready): the old order against the new, side by side",
                         main_startup, reps=3, reps_help="runs per way, interleaved (median reported)")
    p.add_argument("--tasks", type=int, default=2, help="tasks each run (one episode each: the start-up is what is measured)")
    p.add_argument("--ways", default=",".join(WAYS), help=f"comma-separated, of {', '.join(WAYS)}")


def _ways(args) -> list[str]:
    """The ``--ways`` values. Raises ValueError (bad arguments, see :func:`run_bench`)."""
    ways = [w.strip() for w in args.ways.split(",") if w.strip()]
    if not ways or any(w not in WAYS for w in ways) or args.reps < 1 or args.tasks < 1:
        raise ValueError(f"--ways of {', '.join(WAYS)}; --reps and --tasks >= 1")
    return ways


def _describe(way: str, rep: int, r: dict[str, Any]) -> str:
    return (f"  {way:<13} run {rep + 1}: actors ready {r['process_start_to_ready_s']:.2f} s after the command "
            f"(exit {r['exit_code']}, {r['wall_s']:.1f} s in all)")


def main_startup(args) -> int:
    """Run the ``startup`` benchmark (see the module docstring); 0, 1 when a run failed, 2 for bad arguments."""
    return run_bench(args, _ways, "bench-startup-", lambda a, way, folder: run_once(way, a.config, a.tasks, list(a.overrides), folder),
                     _describe, summarize, format_rows)
