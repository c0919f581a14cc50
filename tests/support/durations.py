"""How long each test file takes, for the xdist scheduler to start the longest first
(``tests/conftest.py``'s ``pytest_xdist_make_scheduler``): with two workers, a long file that
starts last runs alone at the end while the other worker idles.

``tests/durations.json`` maps each test file (its path from the repository's root) to its seconds
in a full run under ``-n 2 --dist loadfile`` (setup, call and teardown of its tests, the module's
servers included). A file it does not list (a new one) is taken as long as the median file of its
folder (``tests/e2e/`` ...). Refresh it from a run's JUnit XML report::

    .venv/bin/python -m pytest -q -n 2 --dist loadfile --junitxml=/tmp/run.xml
    .venv/bin/python tests/support/durations.py refresh /tmp/run.xml

(files the report does not name keep their seconds; files that no longer exist are dropped).
``TAU_ROLLOUT_DURATIONS`` names another file for the scheduler to read (the suite's own test of the
order uses it).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FILE = ROOT / "tests" / "durations.json"


def load(path: Path | None = None) -> dict[str, float]:
    """``{test file: seconds}`` of ``path`` (default: ``$TAU_ROLLOUT_DURATIONS``, else
    ``tests/durations.json``); empty when the file is missing."""
    path = Path(path or os.environ.get("TAU_ROLLOUT_DURATIONS") or FILE)
    return json.loads(path.read_text()) if path.is_file() else {}


def file_of(nodeid: str) -> str:
    """The test file of a pytest node id (``tests/e2e/test_job.py::test_x[a]`` -> ``tests/e2e/test_job.py``)."""
    return nodeid.split("::", 1)[0]


def seconds(files: Iterable[str], known: dict[str, float]) -> float:
    """The expected seconds of the files together: each its own, or the median of its folder's."""
    total = 0.0
    for f in set(files):
        if f in known:
            total += known[f]
        else:
            folder = f.rpartition("/")[0]
            peers = [s for k, s in known.items() if k.rpartition("/")[0] == folder]
            total += statistics.median(peers) if peers else 0.0
    return total


def longest_first(scopes: dict[str, Iterable[str]], known: dict[str, float]) -> list[str]:
    """The scopes (work units: ``{scope: its test node ids}``) ordered by expected seconds, longest
    first; ties keep their order."""
    cost = {scope: seconds((file_of(n) for n in nodeids), known) for scope, nodeids in scopes.items()}
    return sorted(scopes, key=lambda s: -cost[s])


def _file_of_case(classname: str, root: Path) -> str | None:
    """The test file of a JUnit ``classname`` (``tests.e2e.test_job`` or ``tests.e2e.test_job.TestX``)."""
    parts = classname.split(".")
    for n in range(len(parts), 0, -1):
        candidate = "/".join(parts[:n]) + ".py"
        if (root / candidate).is_file():
            return candidate
    return None


def from_junitxml(report: Path, root: Path = ROOT) -> dict[str, float]:
    """``{test file: seconds}`` summed over the report's test cases (JUnit ``time``: setup, call
    and teardown)."""
    out: dict[str, float] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        f = _file_of_case(case.get("classname", ""), root)
        if f is not None:
            out[f] = out.get(f, 0.0) + float(case.get("time") or 0.0)
    return out


def refresh(report: Path, path: Path = FILE, root: Path = ROOT) -> dict[str, float]:
    """Merge a run's measured seconds into ``path`` (rounded to 0.1 s); returns what was written."""
    merged = {f: s for f, s in load(path).items() if (root / f).is_file()}
    merged.update({f: round(s, 1) for f, s in from_junitxml(report, root).items()})
    ordered = dict(sorted(merged.items()))
    path.write_text(json.dumps(ordered, indent=1) + "\n")
    return ordered


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "refresh" or not Path(argv[1]).is_file():
        print("usage: python tests/support/durations.py refresh JUNIT_XML", file=sys.stderr)
        return 2
    written = refresh(Path(argv[1]))
    print(f"{FILE}: {len(written)} files, {sum(written.values()):.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
