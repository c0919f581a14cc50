"""Evaluation: pass^k, pass@k and mean reward per domain (``python -m rollout eval``).

The pure part (:func:`pass_at_k`, :func:`summarize`, :func:`format_eval`) turns episode outcomes
into a summary dict and a table; it needs no Ray and is unit-tested on its own. :func:`run_eval`
runs the episodes on the pool (:func:`rollout.app.wiring.open_pool`) and writes ``eval.json``.

Metrics, per domain, over the *valid trials* of each task (episodes that ended with a policy
outcome: ``completed``, ``truncated``, ``parse_error``, ``tool_timeout``):

* pass^k (Yao et al. 2024, "tau-bench", arXiv:2406.12045): the probability that k trials drawn
  without replacement from a task's n trials all succeed, ``C(c, k) / C(n, k)``; computed with
  tau2's own ``tau2.metrics.agent_metrics.pass_hat_k`` and averaged over tasks as tau2's
  ``compute_metrics`` does.
* pass@k (Chen et al. 2021, "Evaluating Large Language Models Trained on Code",
  arXiv:2107.03374, eq. 1): the unbiased estimator of the probability that at least one of k
  trials succeeds, ``1 - C(n - c, k) / C(n, k)``, averaged over tasks. tau2 has none.
* mean reward: the mean of tau2's reward over all valid trials (as tau2's ``avg_reward``).

Success is tau2's ``is_successful(reward)`` (reward 1 within 1e-6). Infrastructure failures
(:attr:`rollout.core.records.EpisodeStatus.is_infrastructure_failure`) and ``cancelled`` episodes are
left out of every denominator and counted beside them. A task with fewer valid trials than k is
left out of that k's average; the number of tasks counted per k is reported.

An evaluation is a run folder like the main job's (so ``python -m rollout view`` opens it, and
``run --replay`` reads it): the journal (``run.json``, ``specs.jsonl``, ``episodes.jsonl``: every
episode with its conversation and tokens, :mod:`rollout.core.journal`), ``config.yaml``,
``samples.jsonl`` (the valid trials, as ``rollout.sample_mode`` cuts them), ``failed.jsonl`` (the
episodes left out of the denominators), ``summary.json`` (:mod:`rollout.core.output`), and
``eval.json``.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

from rollout.core.records import EpisodeStatus, InteractionResult

if TYPE_CHECKING:
    from rollout.core.config import Config

EVAL_FILE = "eval.json"
# The statuses of valid trials (what pass^k counts): the policy outcomes. An evaluation writes
# these episodes to samples.jsonl and the others (infrastructure failures, cancelled) to failed.jsonl.
VALID_TRIAL_STATUSES = tuple(s.value for s in EpisodeStatus if not (s.is_infrastructure_failure or s is EpisodeStatus.CANCELLED))


@dataclass(frozen=True)
class Outcome:
    """The part of an episode result that evaluation needs.

    Attributes:
        domain: tau2 domain name.
        task_id: tau2 task id (a string).
        status: how the episode ended.
        reward: tau2's reward in [0, 1] (ignored unless ``status`` is a policy outcome): an
            episode's ``raw_reward``, never the shaped one (pass^k counts tau2's successes).
    """

    domain: str
    task_id: str
    status: EpisodeStatus
    reward: float

    @property
    def is_valid_trial(self) -> bool:
        """True for policy outcomes: neither an infrastructure failure nor ``cancelled``."""
        return not (self.status.is_infrastructure_failure or self.status is EpisodeStatus.CANCELLED)

    @classmethod
    def of(cls, item: "OutcomeLike") -> "Outcome":
        """An ``Outcome`` from an :class:`InteractionResult`, an ``Outcome`` or a tuple
        ``(domain, task_id, status, reward)`` (``status`` an :class:`EpisodeStatus` or its value).

        Raises:
            ValueError: ``status`` is not an :class:`EpisodeStatus` value, or a tuple does not
                have four items.
        """
        if isinstance(item, Outcome):
            return item
        if isinstance(item, InteractionResult):
            raw = item.reward if item.raw_reward is None else item.raw_reward  # tau2's, not rollout.reward_shaping's
            return cls(item.spec.domain, str(item.spec.task_id), EpisodeStatus(item.status), float(raw))
        if len(item) != 4:
            raise ValueError(f"expected (domain, task_id, status, reward), got {item!r}")
        domain, task_id, status, reward = item
        return cls(str(domain), str(task_id), EpisodeStatus(status), float(reward))


OutcomeLike = Union[Outcome, InteractionResult, tuple]


def _tau2_metrics():
    """tau2's ``(pass_hat_k, is_successful)``, imported with litellm kept offline (~2 s once)."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    from tau2.metrics.agent_metrics import is_successful, pass_hat_k

    return pass_hat_k, is_successful


def pass_at_k(num_trials: int, success_count: int, k: int) -> float:
    """Unbiased pass@k estimator of Chen et al. 2021, "Evaluating Large Language Models Trained
    on Code" (arXiv:2107.03374, eq. 1): ``1 - C(n - c, k) / C(n, k)``, the probability that a
    k-subset of the n trials, drawn without replacement, holds at least one success.

    Exact integer binomials (Python's ``int / int`` division rounds correctly), so no overflow.

    Args:
        num_trials: n >= 1, the valid trials of one task.
        success_count: c, ``0 <= c <= n``, successful trials.
        k: ``1 <= k <= n``.

    Returns:
        A probability in [0, 1].

    Raises:
        ValueError: ``num_trials < k`` (as tau2's ``pass_hat_k``), ``k < 1``, or ``success_count``
            outside ``[0, num_trials]``.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if num_trials < k:
        raise ValueError(f"Number of trials {num_trials} is less than k {k}.")
    if not 0 <= success_count <= num_trials:
        raise ValueError(f"success_count {success_count} is outside [0, {num_trials}]")
    return 1.0 - math.comb(num_trials - success_count, k) / math.comb(num_trials, k)


def _task_sort_key(task_id: str) -> tuple:
    return (0, int(task_id), "") if task_id.isdigit() else (1, 0, task_id)


def summarize(outcomes: Iterable[OutcomeLike], max_k: int | None = None) -> dict[str, Any]:
    """Per-domain pass^k, pass@k and mean reward from episode outcomes.

    Args:
        outcomes: one item per episode: :class:`InteractionResult`, :class:`Outcome` or
            ``(domain, task_id, status, reward)``.
        max_k: report k = 1..max_k (normally ``rollout.n_samples_per_task``); ``None``: up to the
            largest number of valid trials of any task of the domain.

    Returns:
        ``{"episodes": int, "infrastructure_failures": int, "cancelled": int, "domains": {domain:
        D}}`` where ``D`` is::

            {"tasks": int,                  # tasks with at least one episode
             "trials": int,                 # valid trials (policy outcomes) in all
             "episodes": int,               # all episodes, valid or not
             "infrastructure_failures": {status: int},   # left out of the denominators
             "cancelled": int,                           # left out too
             "status_counts": {status: int},
             "mean_reward": float | None,   # over valid trials; None without any
             "success_rate": float | None,  # successes / valid trials
             "pass_hat_k": {"k": float | None},  # mean over tasks with >= k valid trials
             "pass_at_k": {"k": float | None},   # same tasks; None when no task has k trials
             "tasks_counted": {"k": int},        # tasks with >= k valid trials
             "tasks_left_out": {"k": int},       # tasks with fewer than k valid trials
             "per_task": {task_id: {"trials": int, "successes": int,
                                    "rewards": [float],          # valid trials, in input order
                                    "excluded": {status: int}}}} # infra failures and cancelled

        k keys are strings (JSON object keys); per-task entries are ordered by task id (numeric
        ids numerically).

    Raises:
        ValueError: an item cannot be read (see :meth:`Outcome.of`), or ``max_k < 1``.
    """
    if max_k is not None and max_k < 1:
        raise ValueError(f"max_k must be >= 1, got {max_k}")
    pass_hat_k, is_successful = _tau2_metrics()
    per_domain: dict[str, dict[str, dict[str, Any]]] = {}
    n_episodes = 0
    for item in outcomes:
        o = Outcome.of(item)
        n_episodes += 1
        task = per_domain.setdefault(o.domain, {}).setdefault(o.task_id, {"trials": 0, "successes": 0, "rewards": [], "excluded": {}, "statuses": {}})
        task["statuses"][o.status.value] = task["statuses"].get(o.status.value, 0) + 1
        if o.is_valid_trial:
            task["trials"] += 1
            task["successes"] += int(is_successful(o.reward))
            task["rewards"].append(o.reward)
        else:
            task["excluded"][o.status.value] = task["excluded"].get(o.status.value, 0) + 1

    domains: dict[str, Any] = {}
    for domain in sorted(per_domain):
        tasks = per_domain[domain]
        status_counts: dict[str, int] = {}
        for t in tasks.values():
            for st, n in t.pop("statuses").items():
                status_counts[st] = status_counts.get(st, 0) + n
        infra = {st: n for st, n in sorted(status_counts.items()) if EpisodeStatus(st).is_infrastructure_failure}
        rewards = [r for t in tasks.values() for r in t["rewards"]]
        trials = len(rewards)
        successes = sum(t["successes"] for t in tasks.values())
        top = max_k if max_k is not None else max((t["trials"] for t in tasks.values()), default=0)
        hat, at, counted, left_out = {}, {}, {}, {}
        for k in range(1, top + 1):
            eligible = [t for t in tasks.values() if t["trials"] >= k]
            counted[str(k)] = len(eligible)
            left_out[str(k)] = len(tasks) - len(eligible)
            if eligible:
                hat[str(k)] = sum(pass_hat_k(t["trials"], t["successes"], k) for t in eligible) / len(eligible)
                at[str(k)] = sum(pass_at_k(t["trials"], t["successes"], k) for t in eligible) / len(eligible)
            else:
                hat[str(k)] = at[str(k)] = None
        domains[domain] = {
            "tasks": len(tasks),
            "trials": trials,
            "episodes": sum(status_counts.values()),
            "infrastructure_failures": infra,
            "cancelled": status_counts.get(EpisodeStatus.CANCELLED.value, 0),
            "status_counts": dict(sorted(status_counts.items())),
            "mean_reward": sum(rewards) / trials if trials else None,
            "success_rate": successes / trials if trials else None,
            "pass_hat_k": hat,
            "pass_at_k": at,
            "tasks_counted": counted,
            "tasks_left_out": left_out,
            "per_task": {tid: tasks[tid] for tid in sorted(tasks, key=_task_sort_key)},
        }
    return {
        "episodes": n_episodes,
        "infrastructure_failures": sum(sum(d["infrastructure_failures"].values()) for d in domains.values()),
        "cancelled": sum(d["cancelled"] for d in domains.values()),
        "domains": domains,
    }


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.4f}"


def format_eval(summary: dict[str, Any]) -> str:
    """The table ``python -m rollout eval`` prints: per domain, the counts, the mean reward and one
    row per k (pass^k, pass@k, tasks counted, tasks left out).

    Args:
        summary: what :func:`summarize` (or :func:`run_eval`) returns.
    """
    out: list[str] = []
    width = 44
    for domain, d in summary["domains"].items():
        out.append("-" * width)
        infra = sum(d["infrastructure_failures"].values())
        out.append(f"{domain}: {d['tasks']} tasks, {d['trials']} trials, {infra} infrastructure failures, {d['cancelled']} cancelled")
        for st, n in d["infrastructure_failures"].items():
            out.append(f"  {st}: {n}")
        out.append(f"mean reward {_fmt(d['mean_reward'])}")
        out.append(f"{'k':>3}  {'pass^k':>8}  {'pass@k':>8}  {'tasks':>6}  {'left out':>8}")
        for k in d["pass_hat_k"]:
            out.append(f"{k:>3}  {_fmt(d['pass_hat_k'][k]):>8}  {_fmt(d['pass_at_k'][k]):>8}  {d['tasks_counted'][k]:>6}  {d['tasks_left_out'][k]:>8}")
    out.append("-" * width)
    return "\n".join(out)


def run_eval(cfg: "Config", progress: bool = True, overwrite: bool = False) -> dict[str, Any]:
    """Run every task of ``env.task_split`` / ``env.task_ids`` ``rollout.n_samples_per_task``
    times on the pool, into a run folder at ``rollout.output_dir`` (see the module docstring),
    and write ``eval.json`` there.

    Args:
        progress: show a progress bar on stderr.
        overwrite: replace the run the folder holds (its journal, result files, summary and
            ``eval.json``); without it a folder that holds a run is refused.

    Returns:
        :func:`summarize`'s dict (k = 1..``n_samples_per_task``) plus ``"domain"``,
        ``"task_split"``, ``"tasks_requested"``, ``"skipped_tasks"`` (the tasks ``env.open_issues=skip`` left
        out: :func:`rollout.core.tasks.skipped_summary`), ``"n_samples_per_task"`` and ``"wall_s"``
        (seconds, from pool start to the last result); the same is written to ``eval.json``.

    Raises:
        rollout.core.journal.JournalError: ``rollout.output_dir`` holds a run and ``overwrite``
            is False (before anything starts).
        rollout.app.preflight.PreflightError: ``rollout.output_dir`` cannot be written, or a
            start-up check failed.
        rollout.core.config.TaskSelectionError: ``env.task_ids`` names tasks the domain lacks, or the split does not exist.
        RuntimeError: the local stack or an actor failed to start.
    """
    from tqdm import tqdm

    from rollout.app.preflight import check_output_dir
    from rollout.app.wiring import open_pool
    from rollout.core.export import get_exporter
    from rollout.core.groups import Excluded
    from rollout.core.journal import JournalError, RunJournal, holds_run
    from rollout.core.output import RunWriter
    from rollout.core.tasks import skipped_summary

    out_dir = Path(cfg.rollout.output_dir)
    check_output_dir(out_dir)
    if holds_run(out_dir) and not overwrite:
        raise JournalError(f"{out_dir} holds a run; an evaluation writes a run folder of its own: pass --overwrite to replace it, "
                           "or name another rollout.output_dir")
    journal = RunJournal.open(out_dir, cfg, overwrite=overwrite)
    (out_dir / EVAL_FILE).unlink(missing_ok=True)  # an earlier evaluation's, replaced
    writer = RunWriter(out_dir, VALID_TRIAL_STATUSES)
    exporter = get_exporter(cfg.rollout.sample_mode, keep_messages=cfg.rollout.keep_messages)
    n = cfg.rollout.n_samples_per_task
    outcomes: list[Outcome] = []
    status, reason, task_ids, wall_s, pool = "interrupted", "the evaluation stopped before it ended", [], 0.0, None
    try:
        with open_pool(cfg) as (rcfg, pool, task_ids):
            (out_dir / "config.yaml").write_text(cfg.to_yaml())  # names of key variables only, never keys
            pool.attach_journal(journal)  # every episode, with its conversation and tokens, into episodes.jsonl
            t0 = time.monotonic()
            specs = pool.submit_tasks(task_ids, n_samples_per_task=n)
            bar = tqdm(total=len(specs), desc=f"{cfg.env.domain} eval", unit="ep", disable=not progress, file=sys.stderr)
            reward_sum = 0.0
            for result in pool.results():
                o = Outcome.of(result)
                outcomes.append(o)
                if o.is_valid_trial:
                    writer.add_group(exporter.export(result))
                else:
                    writer.add_excluded(Excluded(result.to_sample(cfg.rollout.keep_messages), o.status.value))
                reward_sum += o.reward
                bar.update(1)
                bar.set_postfix(reward=f"{reward_sum / len(outcomes):.3f}", status=o.status.value)
            bar.close()
            wall_s = time.monotonic() - t0
            status, reason = "finished", None
    except BaseException as e:  # noqa: BLE001 (recorded in run.json and summary.json, then raised again)
        reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".rstrip(": ")
        raise
    finally:
        journal.close(status, reason)
        writer.close({"status": status, "reason": reason, "command": "eval", "domain": cfg.env.domain, "task_split": cfg.env.task_split,
                      "n_samples_per_task": n, "sample_mode": str(cfg.rollout.sample_mode), "eval": str(out_dir / EVAL_FILE),
                      "reward_shaping": list(cfg.rollout.reward_shaping.shapers), "open_issues": str(cfg.env.open_issues),
                      "skipped_tasks": skipped_summary(pool.task_selection if pool is not None else None), "wall_s": journal.wall_s})
    summary = {
        "domain": cfg.env.domain,
        "task_split": cfg.env.task_split,
        "tasks_requested": len(task_ids),
        "skipped_tasks": skipped_summary(pool.task_selection if pool is not None else None),
        "n_samples_per_task": n,
        "wall_s": wall_s,
        **summarize(outcomes, max_k=n),
    }
    (out_dir / EVAL_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    return summary
