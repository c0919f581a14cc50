"""What the benches that run the real command several ways share (``startup``, ``scale``): the
runs interleaved, each in a folder of its own, and the report printed and written as JSON."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

__all__ = ["report", "run_interleaved"]

K = TypeVar("K")


def run_interleaved(ways: Sequence[K], reps: int, prefix: str, run_one: Callable[[K, Path], dict[str, Any]],
                    describe: Callable[[K, int, dict[str, Any]], str]) -> list[dict[str, Any]] | None:
    """``run_one(way, folder)`` for every way, ``reps`` rounds, the order reversed every other
    round (so that a drift of the machine's load does not favour one way), each run in its own
    folder of a new temporary directory (removed afterwards); prints ``describe(way, round, run)``
    after each run.

    Returns:
        the runs in the order they ran, or None when one raised ``RuntimeError`` or
        ``subprocess.TimeoutExpired`` (the error is printed to stderr; the runs before it are
        dropped: a bench with a failed run reports nothing).
    """
    root = Path(tempfile.mkdtemp(prefix=prefix))
    runs: list[dict[str, Any]] = []
    try:
        for rep in range(reps):
            for i, way in enumerate(ways if rep % 2 == 0 else list(ways)[::-1]):
                run = run_one(way, root / f"{rep}-{i}")
                print(describe(way, rep, run), flush=True)
                runs.append(run)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        print(f"error: {e}", file=sys.stderr)
        return None
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return runs


def report(text: str, rows: list[dict[str, Any]], runs: list[dict[str, Any]], json_path: str | None) -> int:
    """Print ``text`` and the machine's cores and load; write ``{"rows", "runs"}`` to
    ``json_path`` when given. Returns the bench's exit status: 0 when every run's
    ``exit_code`` is 0, else 1."""
    print(text)
    print(f"({os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f} at the end)")
    if json_path:
        Path(json_path).write_text(json.dumps({"rows": rows, "runs": runs}, indent=1) + "\n")
        print(f"json: {json_path}")
    return 0 if all(r["exit_code"] == 0 for r in runs) else 1
