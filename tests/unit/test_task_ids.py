"""Task ids in messages (rollout.core.tasks): the valid ids of a domain in a few words, and the
one-line error every benchmark and the pool raise for ids the domain lacks. Where it is raised
before anything starts: tests/e2e/test_bad_sources.py; by the pool: tests/ray/test_pool.py."""

from __future__ import annotations

import pytest

from rollout.core.config import ConfigError, TaskSelectionError
from rollout.core.tasks import check_known_task_ids, task_id_ranges, unknown_task_ids


def test_consecutive_ids_are_written_as_ranges_per_prefix():
    assert task_id_ranges([str(i) for i in range(114)]) == "0 to 113"
    assert task_id_ranges([f"train-{i}" for i in range(500)] + [f"test-{i}" for i in range(115)]) == "train-0 to train-499, test-0 to test-114"
    assert task_id_ranges(["0", "1", "2", "5", "7", "8"]) == "0 to 2, 5, 7 to 8"
    assert task_id_ranges(["01", "02", "03"]) == "01 to 03"  # a shared prefix "0"
    assert task_id_ranges(["a", "b"]) == "'a', 'b'"  # not numbered: quoted, one by one


def test_many_runs_show_the_first_two_and_the_count():
    ids = [f"[mms_issue]case{'abcdefgh'[i]}" for i in range(8)]
    assert task_id_ranges(ids) == "'[mms_issue]casea', '[mms_issue]caseb', ... (8 ids)"


def test_the_error_names_the_key_the_missing_ids_and_the_valid_ones():
    e = unknown_task_ids(["99999"], [str(i) for i in range(114)], "tau2 domain retail")
    assert isinstance(e, TaskSelectionError) and isinstance(e, ConfigError) and isinstance(e, KeyError)
    assert str(e) == "env.task_ids: 99999 is not a task of tau2 domain retail, whose 114 task ids are 0 to 113"
    many = unknown_task_ids([str(i) for i in range(200, 207)], ["0", "1"], "toy", hint="h", key="RolloutPool.submit")
    assert str(many) == "RolloutPool.submit: 200, 201, 202, 203, 204 and 2 more are not tasks of toy, whose 2 task ids are 0 to 1 (h)"


def test_known_ids_pass_and_unknown_ones_raise_once_each():
    check_known_task_ids(["1", "0"], ["0", "1"], "toy", key="k")
    check_known_task_ids(["x"], None, "toy", key="k")  # nothing known yet: nothing checked
    with pytest.raises(TaskSelectionError, match=r"^k: x, 7 are not tasks of toy, whose 2 task ids are 0 to 1$"):
        check_known_task_ids(["x", "0", "x", 7], ["0", "1"], "toy", key="k")
