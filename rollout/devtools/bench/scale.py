"""``python -m rollout.bench scale``: does the main job's episode phase shrink with more actors?
Issue 23's scaling figure, side by side in one run.

Each row runs the real command, ``python -m rollout run`` (:func:`rollout.app.cli.main`), on the
config (default: the embedded local stack, ``configs/local.yaml``) with ``pool.num_actors`` set to
one of ``--actors`` and ``local.num_servers`` to ``--servers``, in a fresh process (a new local Ray
cluster and a new local stack each time), and reads its ``summary.json``: ``episodes_phase_s``
(from every actor ready to the last delivery), ``startup_s`` (from the command to actors ready),
the episodes and their statuses. The actor counts run interleaved, ``--reps`` times each (the order
reversed every other round); the median is printed per count, then each count's episode phase
against the first count's (``x3.1``: 3.1 times faster).

Issue 23's target: 8 actors at least 3x faster than 2 actors with 4 servers, on a 16-core machine
(``--actors 2,8 --servers 4``, the defaults). On a 2-core machine the actors, the servers and the
router share two cores, so more actors cannot make the phase shorter: the bench then shows the
machine's bound, not the pool's (the pool bench's ``bound by`` column names the resource).

Exit status: 0 when every run exited 0, 1 when one did not (its output's last lines are printed),
2 on bad arguments.
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

TIMEOUT_S = 900  # bound on one run of the main job (seconds)


def run_once(actors: int, servers: int, config: str | None, overrides: list[str], folder: Path) -> dict[str, Any]:
    """One ``python -m rollout run`` with ``actors`` actors and ``servers`` local servers; its
    summary's figures, exit code and wall time.

    Raises:
        RuntimeError: the run wrote no ``summary.json`` (the message holds its output's last lines).
        subprocess.TimeoutExpired: it ran past :data:`TIMEOUT_S`.
    """
    out = folder / "run"
    args = ["run", "--no-progress", "--overwrite", *(["--config", config] if config else []),
            f"pool.num_actors={actors}", f"local.num_servers={servers}", f"rollout.output_dir={out}", *overrides]
    t = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "rollout", *args], capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    wall = time.monotonic() - t
    summary = out / "summary.json"
    if not summary.is_file():
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise RuntimeError(f"{actors} actors: the run wrote no summary (exit {proc.returncode}):\n{tail}")
    s = json.loads(summary.read_text())
    return {"actors": actors, "servers": servers, "exit_code": proc.returncode, "wall_s": round(wall, 3),
            "episodes": s.get("episodes"), "status_counts": s.get("status_counts"), "startup_s": s.get("startup_s"),
            "episodes_phase_s": s.get("episodes_phase_s"), "episodes_per_s": s.get("episodes_per_s")}


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per actor count (in the order first run): the median episode phase, start-up and
    episodes, and the speed-up of the episode phase against the first count
    (``first's phase / this phase``; None where a phase is missing or 0)."""
    rows: list[dict[str, Any]] = []
    for actors in dict.fromkeys(r["actors"] for r in runs):
        mine = [r for r in runs if r["actors"] == actors]
        phases = [r["episodes_phase_s"] for r in mine if r["episodes_phase_s"] is not None]
        starts = [r["startup_s"] for r in mine if r["startup_s"] is not None]
        rows.append({"actors": actors, "servers": mine[0]["servers"], "runs": len(mine),
                     "episodes": mine[0]["episodes"], "episodes_phase_s": statistics.median(phases) if phases else None,
                     "phase_min_s": min(phases, default=None), "phase_max_s": max(phases, default=None),
                     "startup_s": statistics.median(starts) if starts else None})
    base = rows[0]["episodes_phase_s"] if rows else None
    for r in rows:
        r["speedup"] = base / r["episodes_phase_s"] if base and r["episodes_phase_s"] else None
    return rows


def format_rows(rows: list[dict[str, Any]]) -> str:
    """The rows as a text table, then the speed-up of the last count against the first."""
    out = [f"{'actors':>6} {'servers':>7} {'episodes':>8} {'episode phase s (range)':>24} {'start-up s':>10} {'speed-up':>8}"]
    for r in rows:
        phase = "-" if r["episodes_phase_s"] is None else f"{r['episodes_phase_s']:.2f} ({r['phase_min_s']:.2f}-{r['phase_max_s']:.2f})"
        start = "-" if r["startup_s"] is None else f"{r['startup_s']:.2f}"
        speed = "-" if r["speedup"] is None else f"x{r['speedup']:.2f}"
        out.append(f"{r['actors']:>6} {r['servers']:>7} {str(r['episodes']):>8} {phase:>24} {start:>10} {speed:>8}")
    if len(rows) >= 2 and rows[-1]["speedup"] is not None:
        a, b = rows[0], rows[-1]
        out.append(f"episode phase, {b['actors']} actors against {a['actors']} (local.num_servers={a['servers']}): x{b['speedup']:.2f} "
                   f"({a['episodes_phase_s']:.2f} s -> {b['episodes_phase_s']:.2f} s; issue 23's target on 16 cores, 8 against 2: >= 3)")
    return "\n".join(out)


def add_parser(sub) -> None:
    """Add the ``scale`` sub-command to ``sub`` (argparse sub-parsers); it sets ``run``."""
    p = add_bench_parser(sub, "scale", "the main job's episode phase with each actor count, side by side", main_scale,
                         reps=1, reps_help="runs per actor count, interleaved (median reported)")
    p.add_argument("--actors", default="2,8", help="comma-separated pool.num_actors values (the first is the baseline)")
    p.add_argument("--servers", type=int, default=4, help="local.num_servers for every run")


def _actor_counts(args) -> list[int]:
    """The ``--actors`` values. Raises ValueError (bad arguments, see :func:`run_bench`)."""
    try:
        counts = [int(x) for x in args.actors.split(",") if x.strip()]
    except ValueError:
        counts = []
    if not counts or any(c < 1 for c in counts) or args.servers < 1 or args.reps < 1:
        raise ValueError("--actors is a comma-separated list of integers >= 1; --servers and --reps >= 1")
    return counts


def _describe(actors: int, rep: int, r: dict[str, Any]) -> str:
    return (f"  {actors} actors, run {rep + 1}: episode phase {r['episodes_phase_s']} s, start-up "
            f"{r['startup_s']} s (exit {r['exit_code']}, {r['wall_s']:.1f} s in all)")


def main_scale(args) -> int:
    """Run the ``scale`` benchmark (see the module docstring); 0, 1 when a run failed, 2 for bad arguments."""
    return run_bench(args, _actor_counts, "bench-scale-",
                     lambda a, actors, folder: run_once(actors, a.servers, a.config, list(a.overrides), folder),
                     _describe, summarize, format_rows)
