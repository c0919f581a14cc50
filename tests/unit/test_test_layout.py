"""The test tree itself: pytest imports test modules by basename (rootdir-relative, no packages),
so two test files of one name in different tiers make the second one fail to collect (one CI run:
tests/unit/test_metrics.py beside tests/ray/test_metrics.py, 'import file mismatch')."""

from __future__ import annotations

import collections
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_every_test_module_has_a_basename_of_its_own():
    names = collections.defaultdict(list)
    for f in TESTS.rglob("test_*.py"):
        names[f.name].append(str(f.relative_to(TESTS)))
    assert len(names) > 50, "the tree walk found too few tests to be checking anything"
    clashes = {n: paths for n, paths in names.items() if len(paths) > 1}
    assert not clashes, f"test modules sharing a basename: {clashes}"
