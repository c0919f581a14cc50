"""Task issues (``env.open_issues``, :mod:`rollout.core.tasks`, :class:`rollout.core.issues.TaskIssue`):
the tasks a run selects with a benchmark that records issues (skip leaves out exactly the tasks
with an open one; run keeps them), what the summary says was skipped, a benchmark without issues,
and the issues on a sample, its JSON line and the journal's."""

from __future__ import annotations

import json

import pytest

from rollout.core.config import TaskSelectionError, load_config
from rollout.core.issues import TaskIssue
from rollout.core.journal import sample_line
from rollout.core.records import EpisodeSpec, EpisodeStatus, InteractionResult, TrainingSample
from rollout.core.tasks import issues_by_task, open_task_issues, select_tasks, skipped_summary

OPEN4 = TaskIssue("i4", "expects a number the user never asks for")
OPEN7 = TaskIssue("i7", "the user does not know the order id", link="https://example.invalid/7")
RESOLVED = TaskIssue("i9", "fixed", status="resolved", resolution="reworded")


class ToyBenchmark:
    """Tasks 0-9; issues on 4, 7 (open) and 9 (resolved), 7's as a JSON object (a benchmark may answer either)."""

    tasks = {str(i): None for i in range(10)}

    def task_ids(self, split, ids=None):
        if split != "base":
            raise TaskSelectionError(f"env.task_split: no split {split!r}")
        return list(self.tasks) if ids is None else [str(i) for i in ids]

    def task_issues(self, task_id):
        return {"4": [OPEN4], "7": [OPEN7.to_dict()], "9": [RESOLVED]}[task_id] if task_id in ("4", "7", "9") else self.tasks[task_id] or []


class NoIssues(ToyBenchmark):
    task_issues = None  # a benchmark written before the seam had task_issues


def test_skip_leaves_out_exactly_the_tasks_with_an_open_issue_and_run_keeps_them():
    skip = select_tasks(ToyBenchmark(), "base", None, "skip")
    assert skip.task_ids == ["0", "1", "2", "3", "5", "6", "8", "9"]  # 9's issue is resolved: it runs
    assert skip.skipped == {"4": [OPEN4], "7": [OPEN7]} and skip.issues == {}
    assert skipped_summary(skip) == {"open_issues": 2, "task_ids": ["4", "7"],
                                     "issues": {"4": [OPEN4.title], "7": [OPEN7.title]}}
    run = select_tasks(ToyBenchmark(), "base", ["3", "4", "7"], "run")
    assert run.task_ids == ["3", "4", "7"] and run.skipped == {} and run.issues == {"4": [OPEN4], "7": [OPEN7]}
    assert skipped_summary(run)["open_issues"] == 0 and skipped_summary(None) == {"open_issues": 0, "task_ids": [], "issues": {}}
    assert select_tasks(NoIssues(), "base", None, "skip").task_ids == list(ToyBenchmark.tasks)
    assert issues_by_task(ToyBenchmark(), ToyBenchmark.tasks) == {"4": [OPEN4], "7": [OPEN7]}
    assert open_task_issues(ToyBenchmark(), "99") == [] and open_task_issues(None, "4") == []  # an unknown task, no benchmark


def test_nothing_left_to_run_and_a_bad_split_are_one_line_naming_the_key():
    with pytest.raises(TaskSelectionError) as e:
        select_tasks(ToyBenchmark(), "base", ["4", "7"], "skip")
    assert str(e.value) == ("env.task_ids: every selected task (4, 7) has an open issue and env.open_issues=skip leaves them out; "
                            "set env.open_issues=run to run them")
    with pytest.raises(TaskSelectionError, match="^env.task_split: no split 'train'"):
        select_tasks(ToyBenchmark(), "train", None, "skip")


def test_the_key_defaults_to_skip_and_takes_run():
    assert load_config(None, ["local.enabled=true"]).env.open_issues == "skip"
    assert load_config(None, ["local.enabled=true", "env.open_issues=run"]).env.open_issues == "run"


def test_a_samples_issues_reach_its_json_line_and_the_journal_and_come_back():
    res = InteractionResult(EpisodeSpec("e", "retail", "7", "g", 0), EpisodeStatus.COMPLETED, 1.0, None, task_issues=[OPEN7])
    sample = res.to_sample()
    assert sample.task_issues == [OPEN7]
    line = sample.to_dict()
    assert line["task_issues"] == [{"id": "i7", "title": OPEN7.title, "status": "open", "description": None, "resolution": None,
                                    "link": "https://example.invalid/7"}]
    assert json.loads(sample_line(sample)) == line  # the journal's line, as to_dict writes it
    back = TrainingSample.from_dict(json.loads(json.dumps(line)))
    assert back.task_issues == [OPEN7] and back.to_dict() == line
    assert InteractionResult(EpisodeSpec("e", "retail", "3", "g", 0), EpisodeStatus.COMPLETED, 1.0, None).to_sample().task_issues == []
    with pytest.raises(TypeError):
        TrainingSample.from_dict({**line, "task_issues": [{"id": "x", "title": "t", "severity": "high"}]})


def test_the_pools_own_records_get_their_tasks_issues_at_delivery():
    """actor_lost / cancelled records are made in the driver, which has no benchmark: the ledger
    gives them the issues the first actor reported (RolloutWorker.domain_open_issues)."""
    from rollout.core.pool.ledger import EpisodeLedger

    ledger = EpisodeLedger(task_issues={"7": [OPEN7]}.get)
    lost = InteractionResult.failed(EpisodeSpec("lost", "retail", "7", "g", 0), "actor_lost", "actor_lost", "died")
    assert lost.task_issues is None
    assert ledger.deliver(lost, journal=False).sample.task_issues == [OPEN7]
    other = InteractionResult.failed(EpisodeSpec("c", "retail", "3", "g", 1), "cancelled", "cancelled")
    assert ledger.deliver(other, journal=False).sample.task_issues == []
    ran = InteractionResult(EpisodeSpec("r", "retail", "7", "g", 2), EpisodeStatus.COMPLETED, 1.0, None, task_issues=[])
    assert ledger.deliver(ran, journal=False).sample.task_issues == []  # what the actor attached is kept
