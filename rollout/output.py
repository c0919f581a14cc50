"""Writing a run's results: ``samples.jsonl``, ``failed.jsonl`` and ``summary.json``.

Samples whose status is in ``rollout.train_statuses`` (by default the policy outcomes) go to
``samples.jsonl``, one :class:`~rollout.records.TrainingSample` per line. Infrastructure failures
go to ``failed.jsonl`` in the same format, so nothing is lost and nothing is silently trained as
reward 0 (DESIGN.md invariant 4). Lines are flushed as results arrive.
"""

from __future__ import annotations

import collections
import json
import time
from pathlib import Path
from typing import Any

from rollout.records import InteractionResult, TrainingSample


class RunStats:
    """Running totals for the summary (counts, rewards, tokens, timings)."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.status_counts: collections.Counter[str] = collections.Counter()
        self.reward_sum: collections.Counter[str] = collections.Counter()
        self.reward_n: collections.Counter[str] = collections.Counter()
        self.episodes = 0
        self.turns = 0
        self.tokens = 0
        self.generated_tokens = 0
        self.repairs = 0
        self.parse_errors = 0

    def add(self, s: TrainingSample) -> None:
        m = s.metadata
        self.episodes += 1
        self.status_counts[s.status] += 1
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
            "status_counts": dict(self.status_counts),
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
    """Streams results of one run into ``output_dir``.

    Args:
        output_dir: created if missing; existing result files are replaced.
        train_statuses: statuses written to ``samples.jsonl``.
    """

    def __init__(self, output_dir: str | Path, train_statuses: list[str]):
        self.dir = Path(output_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.train_statuses = set(train_statuses)
        self._samples = open(self.dir / "samples.jsonl", "w")
        self._failed = open(self.dir / "failed.jsonl", "w")
        self.stats = RunStats()

    def add(self, result: InteractionResult) -> TrainingSample:
        s = result.to_sample()
        f = self._samples if s.status in self.train_statuses else self._failed
        f.write(json.dumps(s.to_dict()) + "\n")
        f.flush()
        self.stats.add(s)
        return s

    def close(self, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """Close the files and write ``summary.json``; returns the summary."""
        self._samples.close()
        self._failed.close()
        summary = self.stats.summary()
        if extra:
            summary.update(extra)
        (self.dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        return summary


def read_samples(path: str | Path) -> list[TrainingSample]:
    """Load a ``samples.jsonl`` file."""
    with open(path) as f:
        return [TrainingSample.from_dict(json.loads(line)) for line in f if line.strip()]
