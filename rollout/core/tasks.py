"""Task ids in messages: the valid ids of a domain in a few words, and the ``env.task_ids`` error
every benchmark raises for ids its domain lacks (one line naming the key and the valid ids); the
tasks a run selects (:func:`select_tasks`: ``env.task_split`` / ``env.task_ids`` and
``env.open_issues``) and a task's open issues (:func:`open_task_issues`), both read through the
benchmark seam."""

from __future__ import annotations

import collections
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rollout.core.config import OpenIssues, TaskSelectionError
from rollout.core.records import TaskIssue

__all__ = ["TaskSelection", "check_distinct_task_ids", "check_known_task_ids", "issues_by_task", "open_task_issues", "select_tasks", "skipped_summary",
           "task_id_ranges", "unknown_task_ids"]

logger = logging.getLogger(__name__)


def task_id_ranges(ids: Sequence[str], limit: int = 4) -> str:
    """``ids`` in a few words for a one-line message: runs of consecutive numbers that share a
    prefix as ``first to last`` (``"0 to 113"``; ``"train-0 to train-499, test-0 to test-114"``),
    in the given order; past ``limit`` runs, the first two and the count (``"'[mms_issue]a',
    '[mms_issue]b', ... (2285 ids)"``)."""
    runs: list[list[tuple[str, int | None, str]]] = []
    for tid in map(str, ids):
        m = re.fullmatch(r"(.*?)(0|[1-9][0-9]*)", tid)
        here = (m.group(1), int(m.group(2)), tid) if m else (tid, None, tid)
        last = runs[-1][-1] if runs else None
        if last is not None and here[1] is not None and last[1] is not None and last[0] == here[0] and here[1] == last[1] + 1:
            runs[-1].append(here)
        else:
            runs.append([here])
    quote = (lambda t: t) if all(r[0][1] is not None for r in runs) else repr
    text = [quote(r[0][2]) if len(r) == 1 else f"{quote(r[0][2])} to {quote(r[-1][2])}" for r in runs]
    return ", ".join(text) if len(text) <= limit else f"{', '.join(text[:2])}, ... ({len(ids)} ids)"


def unknown_task_ids(missing: Sequence[str], known: Sequence[str], where: str, hint: str = "",
                     key: str = "env.task_ids") -> TaskSelectionError:
    """The error for ``env.task_ids`` naming tasks the domain lacks: one line with the first of
    ``missing`` and the valid ids (``known``, the domain's every task, as :func:`task_id_ranges`).

    Args:
        missing: the ids asked for that are not tasks (in the order asked).
        known: every task id of the domain.
        where: the domain, as the message names it (``"tau2 domain retail"``).
        hint: appended to the message when set (how ids are written, say).
        key: what named the ids, first in the message (the config key, or the API call).
    """
    shown = ", ".join(map(str, missing[:5])) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
    verb = "is not a task" if len(missing) == 1 else "are not tasks"
    return TaskSelectionError(f"{key}: {shown} {verb} of {where}, whose {len(known)} task ids are "
                              f"{task_id_ranges(known)}{f' ({hint})' if hint else ''}")


def check_known_task_ids(task_ids: Iterable[str], known: Sequence[str] | None, where: str, key: str) -> None:
    """Every one of ``task_ids`` is in ``known`` (nothing is checked when ``known`` is ``None``).

    Raises:
        rollout.core.config.TaskSelectionError: :func:`unknown_task_ids` of those that are not.
    """
    if known is None:
        return
    have = set(known)
    missing = list(dict.fromkeys(str(t) for t in task_ids if str(t) not in have))
    if missing:
        raise unknown_task_ids(missing, known, where, key=key)


def check_distinct_task_ids(task_ids: Sequence[str], key: str) -> None:
    """Each of ``task_ids`` once: a submission makes one group per task, its id ``{domain}/{task
    id}`` (:func:`rollout.core.pool.make_specs`), so an id listed twice would be two groups, and
    their episodes, of one id.

    Raises:
        ValueError: one line, ``{key}: task ids 0, 3 are listed more than once ...`` (at most 5 shown).
    """
    repeated = [t for t, n in collections.Counter(map(str, task_ids)).items() if n > 1]
    if repeated:
        shown = ", ".join(repeated[:5]) + (f" and {len(repeated) - 5} more" if len(repeated) > 5 else "")
        raise ValueError(f"{key}: task {'id' if len(repeated) == 1 else 'ids'} {shown} listed more than once: a call makes one group "
                         "per task, so each id once (to sample a task more often, pass n_samples_per_task)")


def open_task_issues(benchmark: Any, task_id: str) -> list[TaskIssue]:
    """The open issues the benchmark records against ``task_id``: its optional
    ``task_issues(task_id)`` (:class:`rollout.core.environment.TaskIssueSource`), open ones only;
    ``[]`` for a benchmark without that method (one registered before it existed), for a task
    without issues and for a task the benchmark lacks (its episode fails on its own)."""
    read = getattr(benchmark, "task_issues", None)
    try:
        found = read(str(task_id)) if read is not None else None
    except KeyError:
        return []
    return [i for i in (TaskIssue.from_dict(x) for x in found or ()) if i.is_open]


@dataclass(frozen=True)
class TaskSelection:
    """The tasks a run selected (:func:`select_tasks`).

    Attributes:
        task_ids: what runs, in the benchmark's order.
        skipped: task id -> its open issues, for each task ``env.open_issues=skip`` left out (in the benchmark's order).
        issues: task id -> its open issues, for each task that runs although it has some
            (``env.open_issues=run``); their samples carry them.
    """

    task_ids: list[str]
    skipped: dict[str, list[TaskIssue]] = field(default_factory=dict)
    issues: dict[str, list[TaskIssue]] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """What ``summary.json`` records: ``{"open_issues": n, "task_ids": [...], "issues": {id:
        [titles]}}`` of the skipped tasks (``n`` 0 and empty lists when none was)."""
        return {"open_issues": len(self.skipped), "task_ids": list(self.skipped),
                "issues": {tid: [i.title for i in issues] for tid, issues in self.skipped.items()}}


def skipped_summary(selection: TaskSelection | None) -> dict[str, Any]:
    """``summary.json``'s ``skipped_tasks``: the tasks ``env.open_issues=skip`` left out of a run
    (:meth:`TaskSelection.summary`: ``open_issues`` (the count), ``task_ids``, ``issues``); a zero
    count for ``None`` (no selection: the pool did not start, or was not made by ``open_pool``)."""
    return selection.summary() if selection is not None else {"open_issues": 0, "task_ids": [], "issues": {}}


def select_tasks(benchmark: Any, split: str, ids: Sequence[str] | None, open_issues: OpenIssues | str = OpenIssues.SKIP) -> TaskSelection:
    """The tasks of ``split`` (or ``ids``, checked) that run, and those left out for an open issue.

    Args:
        benchmark: a loaded :class:`rollout.core.environment.Benchmark`.
        split, ids: ``env.task_split`` and ``env.task_ids`` (``None``: the whole split).
        open_issues: ``env.open_issues``: ``skip`` leaves tasks with an open issue out,
            ``run`` keeps them.

    Raises:
        rollout.core.config.TaskSelectionError: the benchmark's own (a split or ids it lacks); or
            every selected task has an open issue and ``env.open_issues=skip`` (nothing would run).
    """
    selected = [str(t) for t in benchmark.task_ids(split, list(ids) if ids is not None else None)]
    issues = {tid: found for tid in selected if (found := open_task_issues(benchmark, tid))}
    if OpenIssues(open_issues) == OpenIssues.RUN:
        return TaskSelection(selected, {}, issues)
    run = [tid for tid in selected if tid not in issues]
    if selected and not run:
        key = "env.task_ids" if ids is not None else "env.task_split"
        raise TaskSelectionError(f"{key}: every selected task ({task_id_ranges(selected)}) has an open issue and env.open_issues=skip "
                                 "leaves them out; set env.open_issues=run to run them")
    if issues:
        logger.info("env.open_issues=skip: %d task(s) with an open issue left out: %s", len(issues),
                    "; ".join(f"{tid}: {found[0].title}" for tid, found in issues.items()))
    return TaskSelection(run, issues, {})


def issues_by_task(benchmark: Any, task_ids: Iterable[str]) -> Mapping[str, list[TaskIssue]]:
    """``{task id: its open issues}`` for the tasks of ``task_ids`` that have some (what the pool
    keeps, to give its own records of those tasks their issues)."""
    return {str(t): found for t in task_ids if (found := open_task_issues(benchmark, str(t)))}
