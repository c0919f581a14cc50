"""Two runs side by side by task (``python -m rollout view A --compare B``): which tasks changed reward.

A task is ``(domain, task_id)``. Its reward in a run is the mean over that run's episodes of the
task whose status is trainable in that run (``rollout.train_statuses``, as ``summary.json``
averages it): an infrastructure failure has no reward and is never averaged in as 0
(docs/design.md invariant 4). A task whose mean differs between the runs (by more than
:data:`TOLERANCE`), or that has a mean in one run only, *changed*.
"""

from __future__ import annotations

from typing import Any

from rollout.app.viewer.data import EpisodeRow, RunIndex

TOLERANCE = 1e-9


def _side(rows: list[EpisodeRow], trainable: set[str]) -> dict[str, Any]:
    """One run's figures for one task."""
    rewards = [r.reward for r in rows if r.status in trainable]
    statuses: dict[str, int] = {}
    for r in rows:
        statuses[r.status] = statuses.get(r.status, 0) + 1
    return {
        "episodes": len(rows), "rewarded": len(rewards), "mean_reward": sum(rewards) / len(rewards) if rewards else None,
        "statuses": statuses, "episode_ids": [r.episode_id for r in rows],
    }


def _task_key(key: tuple[str, str]) -> tuple[str, int, str]:
    domain, task = key
    return (domain, int(task) if task.isdigit() else -1, task)


def compare_runs(a: RunIndex, b: RunIndex) -> dict[str, Any]:
    """Compare the tasks of two runs (each as read by its last refresh).

    Returns:
        ``tasks``: one entry per task of either run, ``{"domain", "task_id", "a", "b", "delta",
        "changed", "only"}`` where ``a`` / ``b`` are ``{"episodes", "rewarded", "mean_reward"
        (None without a trainable episode), "statuses", "episode_ids"}`` (None when the run lacks
        the task), ``delta`` is ``b - a`` of the mean rewards (None unless both have one) and
        ``only`` is ``"a"`` / ``"b"`` / None; changed tasks first by ``|delta|``, then by domain
        and task id. ``counts``: ``tasks``, ``changed``, ``better`` (b higher), ``worse``,
        ``only_a``, ``only_b``. ``runs``: the two folders.
    """
    ta, tb = a.task_table(), b.task_table()
    ka, kb = set(a.train_statuses()), set(b.train_statuses())
    tasks = []
    for key in sorted(set(ta) | set(tb), key=_task_key):
        sa = _side(ta[key], ka) if key in ta else None
        sb = _side(tb[key], kb) if key in tb else None
        ma = sa["mean_reward"] if sa else None
        mb = sb["mean_reward"] if sb else None
        delta = mb - ma if ma is not None and mb is not None else None
        changed = (delta is not None and abs(delta) > TOLERANCE) or (sa is not None and sb is not None and (ma is None) != (mb is None))
        tasks.append({"domain": key[0], "task_id": key[1], "a": sa, "b": sb, "delta": delta, "changed": changed,
                      "only": "a" if sb is None else "b" if sa is None else None})
    tasks.sort(key=lambda t: (not t["changed"], -abs(t["delta"] or 0.0)))  # stable: task order within ties
    counts = {
        "tasks": len(tasks), "changed": sum(t["changed"] for t in tasks),
        "better": sum(1 for t in tasks if t["delta"] is not None and t["delta"] > TOLERANCE),
        "worse": sum(1 for t in tasks if t["delta"] is not None and t["delta"] < -TOLERANCE),
        "only_a": sum(t["only"] == "a" for t in tasks), "only_b": sum(t["only"] == "b" for t in tasks),
    }
    return {"tasks": tasks, "counts": counts, "runs": {"a": str(a.dir), "b": str(b.dir)}}
