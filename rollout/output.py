"""Writing a run's results: ``samples.jsonl``, ``failed.jsonl``, ``filtered.jsonl`` and ``summary.json``.

The files follow the same training policy as the trainer API (:mod:`rollout.groups`), because
they are written from :meth:`rollout.pool.RolloutPool.stream`:

* ``samples.jsonl``: the training data, complete kept groups, one
  :class:`~rollout.records.TrainingSample` per line;
* ``failed.jsonl``: episodes whose status is not in ``rollout.train_statuses`` (by default the
  infrastructure failures, DESIGN.md invariant 4, and cancelled episodes), same format;
* ``filtered.jsonl``: trainable episodes held back from training: stale beyond
  ``rollout.max_staleness``, groups with equal rewards (``rollout.filter_groups``), groups dropped
  because a member failed; ``metadata.excluded_reason`` says which.

Every episode is on exactly one line of one file. Lines are flushed as results arrive.
"""

from __future__ import annotations

import collections
import json
import time
from pathlib import Path
from typing import Any

from rollout.groups import Excluded
from rollout.records import INFRA_STATUSES, TrainingSample

_FAILURE_STATUSES = {s.value for s in INFRA_STATUSES}


class RunStats:
    """Running totals for the summary (counts, rewards, tokens, timings).

    Mean rewards are over episodes with a policy outcome (an infrastructure failure has no
    reward; it is counted in ``status_counts``, never averaged in as 0).
    """

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.status_counts: collections.Counter[str] = collections.Counter()
        self.excluded_counts: collections.Counter[str] = collections.Counter()
        self.reward_sum: collections.Counter[str] = collections.Counter()
        self.reward_n: collections.Counter[str] = collections.Counter()
        self.episodes = 0
        self.trained = 0
        self.turns = 0
        self.tokens = 0
        self.generated_tokens = 0
        self.repairs = 0
        self.parse_errors = 0

    def add(self, s: TrainingSample, excluded_reason: str | None = None) -> None:
        m = s.metadata
        self.episodes += 1
        self.status_counts[s.status] += 1
        if excluded_reason is None:
            self.trained += 1
        else:
            self.excluded_counts[excluded_reason] += 1
        if s.status not in _FAILURE_STATUSES and s.status != "cancelled":
            self.reward_sum[m.get("domain", "?")] += s.reward
            self.reward_n[m.get("domain", "?")] += 1
        self.turns += int(m.get("turns", 0) or 0)
        self.tokens += len(s.tokens)
        self.generated_tokens += int(sum(s.loss_mask))
        self.repairs += int(m.get("turn_boundary_repairs", 0) or 0)
        self.parse_errors += int(m.get("parse_errors", 0) or 0)

    def summary(self) -> dict[str, Any]:
        wall = max(time.monotonic() - self.t0, 1e-9)
        n = max(self.episodes, 1)
        return {
            "episodes": self.episodes,
            "trained_samples": self.trained,
            "status_counts": dict(self.status_counts),
            "excluded_counts": dict(self.excluded_counts),
            "mean_reward_per_domain": {d: self.reward_sum[d] / self.reward_n[d] for d in self.reward_n},
            "mean_turns": self.turns / n,
            "mean_tokens": self.tokens / n,
            "generated_tokens": self.generated_tokens,
            "turn_boundary_repairs": self.repairs,
            "parse_errors": self.parse_errors,
            "wall_s": wall,
            "episodes_per_s": self.episodes / wall,
            "generated_tokens_per_s": self.generated_tokens / wall,
        }


class RunWriter:
    """Streams the results of one run into ``output_dir`` (see the module docstring).

    Args:
        output_dir: created if missing; existing result files are replaced.
    """

    FILES = ("samples.jsonl", "failed.jsonl", "filtered.jsonl")

    def __init__(self, output_dir: str | Path):
        self.dir = Path(output_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._files = {name: open(self.dir / name, "w") for name in self.FILES}  # noqa: SIM115 (closed by close())
        self.stats = RunStats()

    def _write(self, name: str, s: TrainingSample) -> None:
        f = self._files[name]
        f.write(json.dumps(s.to_dict()) + "\n")
        f.flush()

    def add_group(self, group: list[TrainingSample]) -> None:
        """Write a kept group's samples to ``samples.jsonl``."""
        for s in group:
            self._write("samples.jsonl", s)
            self.stats.add(s)

    def add_excluded(self, ex: Excluded) -> None:
        """Write an excluded sample to ``failed.jsonl`` (its status is not trainable) or
        ``filtered.jsonl`` (held back for another reason)."""
        self._write("failed.jsonl" if ex.reason == ex.sample.status else "filtered.jsonl", ex.sample)
        self.stats.add(ex.sample, ex.reason)

    def close(self, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """Close the files and write ``summary.json``; returns the summary."""
        for f in self._files.values():
            f.close()
        summary = self.stats.summary()
        if extra:
            summary.update(extra)
        (self.dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        return summary


def read_samples(path: str | Path) -> list[TrainingSample]:
    """Load a ``samples.jsonl`` (or ``failed.jsonl`` / ``filtered.jsonl``) file."""
    with open(path) as f:
        return [TrainingSample.from_dict(json.loads(line)) for line in f if line.strip()]
