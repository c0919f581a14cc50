"""What the benches that run the real command several ways share (``startup``, ``scale``): the
runs interleaved, each in a folder of its own, and the report printed and written as JSON
(:func:`run_and_report`, the two in sequence; :func:`run_bench`, with the arguments checked first),
and the options they all take (:func:`add_bench_parser`)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

__all__ = ["add_bench_parser", "report", "run_and_report", "run_bench", "run_interleaved"]

K = TypeVar("K")


def add_bench_parser(sub, name: str, help: str, run: Callable[[argparse.Namespace], int], reps: int,
                     reps_help: str) -> argparse.ArgumentParser:
    """Add sub-command ``name`` to ``sub`` (argparse sub-parsers) with the options every such bench
    takes: ``--config`` (default: as ``python -m rollout run``), ``--reps`` (default ``reps``),
    ``--json`` and the ``key=value`` overrides applied to every run; ``run`` is set as its
    ``run``. Returns the sub-parser, for the bench's own options."""
    p = sub.add_parser(name, help=help)
    p.add_argument("--config", "-c", default=None, help="YAML config (default: configs/local.yaml, as python -m rollout run)")
    p.add_argument("--reps", type=int, default=reps, help=reps_help)
    p.add_argument("--json", default=None, metavar="FILE", help="write every run and the summary as JSON")
    p.add_argument("overrides", nargs="*", help="key=value config overrides for every run")
    p.set_defaults(run=run)
    return p


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


def run_and_report(ways: Sequence[K], reps: int, prefix: str, run_one: Callable[[K, Path], dict[str, Any]],
                   describe: Callable[[K, int, dict[str, Any]], str],
                   summarize: Callable[[list[dict[str, Any]]], list[dict[str, Any]]],
                   format_rows: Callable[[list[dict[str, Any]]], str], json_path: str | None) -> int:
    """Such a bench once its arguments are checked: :func:`run_interleaved` (the first five
    arguments), then ``rows = summarize(runs)`` and :func:`report` of ``format_rows(rows)``.

    Returns:
        the bench's exit status: 1 when a run failed (nothing reported), else :func:`report`'s.
    """
    runs = run_interleaved(ways, reps, prefix, run_one, describe)
    if runs is None:
        return 1
    rows = summarize(runs)
    return report(format_rows(rows), rows, runs, json_path)


def run_bench(args: argparse.Namespace, ways: Callable[[argparse.Namespace], Sequence[K]], prefix: str,
              run_one: Callable[[argparse.Namespace, K, Path], dict[str, Any]],
              describe: Callable[[K, int, dict[str, Any]], str],
              summarize: Callable[[list[dict[str, Any]]], list[dict[str, Any]]],
              format_rows: Callable[[list[dict[str, Any]]], str]) -> int:
    """A whole bench's ``run`` (``args`` from :func:`add_bench_parser`'s sub-parser): the ways to
    compare, ``ways(args)``, then :func:`run_and_report` with ``args.reps``,
    ``run_one(args, way, folder)`` and ``args.json``.

    Returns:
        the bench's exit status: 2 when ``ways(args)`` raised ``ValueError`` (bad arguments; its
        message is printed to stderr as ``error: <message>``), else :func:`run_and_report`'s.
    """
    try:
        chosen = ways(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return run_and_report(chosen, args.reps, prefix, lambda way, folder: run_one(args, way, folder), describe, summarize,
                          format_rows, args.json)
