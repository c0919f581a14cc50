"""Writing a run's results: ``samples.jsonl``, ``failed.jsonl``, ``filtered.jsonl`` and ``summary.json``.

The files follow the same training policy as the trainer API (:mod:`rollout.core.groups`), because
they are written from :meth:`rollout.core.pool.RolloutPool.stream`:

* ``samples.jsonl``: the training data, complete kept groups, one
  :class:`~rollout.core.records.TrainingSample` per line;
* ``failed.jsonl``: episodes whose status is not in ``rollout.train_statuses`` (by default the
  infrastructure failures, docs/design.md invariant 4, and cancelled episodes), same format;
* ``filtered.jsonl``: trainable episodes held back from training: stale beyond
  ``rollout.max_staleness``, groups with equal rewards (``rollout.filter_groups``), groups dropped
  because a member failed; ``metadata.excluded_reason`` says which.

Every episode is in exactly one file: on one line (its ``trajectory`` sample), or, in
``samples.jsonl`` with ``rollout.sample_mode=per_turn`` / ``merge_prefix``, on consecutive lines
(one per sample, written with one write). ``failed.jsonl`` and ``filtered.jsonl`` hold one line per
episode in every mode. Each episode's lines reach the operating system as it arrives, whole or not
at all (:func:`rollout.core.jsonl.append_whole`: a full disk raises
:class:`~rollout.core.jsonl.OutputWriteError` naming the file, with the episode's lines taken
back). A resumed run (:mod:`rollout.core.journal`) sets damaged lines aside (a torn last line, a
corrupted one: :func:`rollout.core.jsonl.repair`), appends to the same files and skips the
episodes they already hold; an episode the journal holds and the files lack (the disk filled
between the two, or its line was set aside) is written then.

What the agent did is on the same line, under ``messages``: the conversation as OpenAI chat
messages (the user's turns, the assistant's replies and tool calls, the tool results; see
:class:`~rollout.core.records.TrainingSample` for the marks on cut and unparseable turns), also in the
journal's ``episodes.jsonl`` and on the trainer API's samples; ``null`` with
``rollout.keep_messages=false``. ``summary.json`` counts, besides statuses and rewards, the turns
cut at ``policy.sampling.max_new_tokens`` (``length_cut_turns``) and the episodes such a cut ended
(``episodes_ended_by_turn_length``, ``policy.on_length=truncate``), what graded the episodes
(``graded_by``: the benchmark package, its version and the task set, with the episodes each graded)
and the episodes graded on a reduced reward basis (``reward_basis_reduced``).
"""

from __future__ import annotations

import collections
import json
import os
import re
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rollout.core.fastjson import dumps_line
from rollout.core.groups import Excluded
from rollout.core.journal import DAMAGE_FILE
from rollout.core.jsonl import OutputWriteError, append_whole, read_lines, repair
from rollout.core.metrics import EpisodeMetrics
from rollout.core.records import DEFAULT_TRAIN_STATUSES, TrainingSample
from rollout.core.sample_modes import episode_groups


def error_kind(status: str, error: str | None) -> str:
    """A short key that groups repeated errors: the status and the error's first line with
    numbers, ids and addresses blanked (``policy_error: /generate failed after N attempts: ...``)."""
    text = (error or "").strip().splitlines()[0] if error else ""
    text = re.sub(r"\b(0x[0-9a-f]+|[0-9a-f]{16,}|\d+(\.\d+)?)\b", "N", text)[:120]
    return f"{status}: {text}" if text else status


class RunStats:
    """Running totals for the summary (counts, rewards, tokens, timings).

    Mean rewards are over trainable episodes only (status in ``train_statuses``): an
    infrastructure failure has no reward; it is counted in ``status_counts`` and ``errors``, never
    averaged in as 0. Counts are per episode; ``trained_samples``, ``samples``, ``tokens`` (prompt +
    response of every sample: per_turn counts each turn's prompt again) and ``generated_tokens``
    are over samples; ``sample_splits`` sums the episodes' merge_prefix splits, ``compactions``
    their context compactions (``policy.context_strategy``); ``max_sample_tokens`` is the longest
    sample's ``len(tokens)`` (at most ``policy.max_context_tokens``). ``mean_reward_per_domain``
    is over the samples' ``reward`` (what is trained: shaped with ``rollout.reward_shaping``),
    ``mean_raw_reward_per_domain`` over their ``raw_reward`` (the benchmark's own);
    ``episodes_with_task_issues`` counts episodes whose task has an open issue.

    Args:
        train_statuses: ``rollout.train_statuses``.
    """

    def __init__(self, train_statuses: tuple[str, ...] | list[str] = DEFAULT_TRAIN_STATUSES) -> None:
        self.t0 = time.monotonic()
        self.train_statuses = frozenset(train_statuses)
        self.errors: collections.Counter[str] = collections.Counter()
        self.status_counts: collections.Counter[str] = collections.Counter()
        self.excluded_counts: collections.Counter[str] = collections.Counter()
        self.reward_sum: collections.Counter[str] = collections.Counter()
        self.raw_reward_sum: collections.Counter[str] = collections.Counter()
        self.task_issue_episodes = 0
        self.reward_n: collections.Counter[str] = collections.Counter()
        self.episodes = 0
        self.trained = 0
        self.trained_episodes = 0
        self.samples = 0
        self.sample_splits = 0
        self.compactions = 0
        self.max_sample_tokens = 0
        self.turns = 0
        self.tokens = 0
        self.generated_tokens = 0
        self.repairs = 0
        self.parse_errors = 0
        self.length_cut_turns = 0
        self.ended_by_turn_length = 0
        # what graded the episodes (metadata.graded_by: the installed benchmark package, its version
        # and the task set), as a JSON string (a hashable key) -> episodes
        self.graded_by: collections.Counter[str] = collections.Counter()
        self.reduced_basis = 0  # episodes graded on a reduced reward basis (reward_info.reward_basis_reduced)

    def add(self, s: TrainingSample, excluded_reason: str | None = None) -> None:
        """Count one delivered episode of one sample (``excluded_reason``: why it was kept out of
        training, None when trained)."""
        self.add_episode([s], excluded_reason)

    def add_episode(self, samples: list[TrainingSample], excluded_reason: str | None = None) -> None:
        """Count one delivered episode given as its samples (one or more, same episode)."""
        s = samples[0]
        m = EpisodeMetrics.from_metadata(s.metadata)
        domain = s.metadata.get("domain", "?")  # the spec's, added by InteractionResult.to_sample
        self.episodes += 1
        self.samples += len(samples)
        self.sample_splits += m.sample_splits or 0
        self.compactions += m.compactions or 0
        self.max_sample_tokens = max([self.max_sample_tokens] + [len(x.tokens) for x in samples])
        self.status_counts[s.status] += 1
        if excluded_reason is None:
            self.trained += len(samples)
            self.trained_episodes += 1
        else:
            self.excluded_counts[excluded_reason] += 1
        if s.status in self.train_statuses:
            self.reward_sum[domain] += s.reward
            self.raw_reward_sum[domain] += s.raw_reward
            self.reward_n[domain] += 1
        self.task_issue_episodes += int(bool(s.task_issues))
        if m.error:
            self.errors[error_kind(s.status, m.error)] += 1
        self.turns += m.turns
        self.tokens += sum(len(x.tokens) for x in samples)
        self.generated_tokens += int(sum(sum(x.loss_mask) for x in samples))
        self.repairs += m.turn_boundary_repairs
        self.parse_errors += m.parse_errors
        self.length_cut_turns += m.length_finishes
        self.ended_by_turn_length += int(m.termination_reason == "turn_length")
        graded = s.metadata.get("graded_by")
        if graded:
            self.graded_by[json.dumps(graded, sort_keys=True)] += 1
        if isinstance(m.reward_info, dict) and m.reward_info.get("reward_basis_reduced"):
            self.reduced_basis += 1

    def summary(self) -> dict[str, Any]:
        wall = max(time.monotonic() - self.t0, 1e-9)
        n = max(self.episodes, 1)
        return {
            "episodes": self.episodes,
            "trained_samples": self.trained,
            "trained_episodes": self.trained_episodes,
            "samples": self.samples,
            "sample_splits": self.sample_splits,
            "compactions": self.compactions,
            "tokens": self.tokens,
            "max_sample_tokens": self.max_sample_tokens,
            "status_counts": dict(self.status_counts),
            "excluded_counts": dict(self.excluded_counts),
            "mean_reward_per_domain": {d: self.reward_sum[d] / self.reward_n[d] for d in self.reward_n},
            # the benchmark's own reward (samples' raw_reward): equal to the above without rollout.reward_shaping
            "mean_raw_reward_per_domain": {d: self.raw_reward_sum[d] / self.reward_n[d] for d in self.reward_n},
            # episodes whose task has an open issue (they ran: env.open_issues=run); skipped tasks: skipped_tasks
            "episodes_with_task_issues": self.task_issue_episodes,
            # what graded them (the benchmark package, its version, the task set): one entry per distinct one
            "graded_by": [{**json.loads(k), "episodes": n} for k, n in sorted(self.graded_by.items())],
            # episodes whose reward left part of the task's basis out (env.judge.kind=none: no NL assertions)
            "reward_basis_reduced": self.reduced_basis,
            "mean_turns": self.turns / n,
            "mean_tokens": self.tokens / n,
            "generated_tokens": self.generated_tokens,
            "turn_boundary_repairs": self.repairs,
            "parse_errors": self.parse_errors,
            # turns cut at policy.sampling.max_new_tokens or by the context window (policy.on_length),
            # and the episodes such a cut ended (status truncated, termination_reason turn_length)
            "length_cut_turns": self.length_cut_turns,
            "episodes_ended_by_turn_length": self.ended_by_turn_length,
            "errors": [{"kind": k, "count": n} for k, n in self.errors.most_common()],
            "wall_s": wall,
            "episodes_per_s": self.episodes / wall,
            "generated_tokens_per_s": self.generated_tokens / wall,
        }


class RunWriter:
    """Streams the results of one run into ``output_dir`` (see the module docstring).

    Args:
        output_dir: created if missing.
        train_statuses: ``rollout.train_statuses`` (what the mean reward is over).
        resume: append to the files an earlier session of the same run wrote, skip the episodes
            they hold, and count them in the summary; otherwise the files are started afresh.
    """

    FILES = ("samples.jsonl", "failed.jsonl", "filtered.jsonl")

    def __init__(self, output_dir: str | Path, train_statuses: tuple[str, ...] | list[str] = DEFAULT_TRAIN_STATUSES, resume: bool = False):
        self.dir = Path(output_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.stats = RunStats(train_statuses)
        self.written: set[str] = set()
        self.skipped = 0
        if resume:
            for name in self.FILES:
                path = self.dir / name
                if path.is_file():
                    repair(path, read_lines(path)[1], self.dir / DAMAGE_FILE)  # a line set aside is written again from the journal
                    for run in episode_groups(read_samples(path)):
                        s = run[0]
                        if s.episode_id not in self.written:
                            self.written.add(s.episode_id)
                            self.stats.add_episode(run, None if name == "samples.jsonl" else s.metadata.get("excluded_reason", s.status))
        # unbuffered: each episode's lines are one write (taken back whole if it fails)
        self._files = {name: open(self.dir / name, "ab" if resume else "wb", buffering=0) for name in self.FILES}  # noqa: SIM115 (closed by close())

    def _write(self, name: str, samples: list[TrainingSample], reason: str | None) -> None:
        """Write one episode's samples (consecutive lines, one write) unless it was written."""
        eid = samples[0].episode_id
        if eid in self.written:  # written by an earlier session of a resumed run
            self.skipped += 1
            return
        append_whole(self._files[name], b"".join(dumps_line(s.to_dict()) for s in samples))  # orjson; reads back as json.dumps' line would
        self.written.add(eid)
        self.stats.add_episode(samples, reason)

    def add_group(self, group: list[TrainingSample]) -> None:
        """Write a kept group's samples to ``samples.jsonl`` (each episode's together).

        Raises:
            OutputWriteError: the file could not be written (the disk is full): the episode being
                written was taken back, those before it are kept.
        """
        for run in episode_groups(group):
            self._write("samples.jsonl", run, None)

    def add_excluded(self, ex: Excluded) -> None:
        """Write an excluded episode's sample to ``failed.jsonl`` (its status is not trainable) or
        ``filtered.jsonl`` (held back for another reason). Raises as :meth:`add_group`."""
        self._write("failed.jsonl" if ex.reason == ex.sample.status else "filtered.jsonl", [ex.sample], ex.reason)

    def close(self, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """Close the files and write ``summary.json``; returns the summary (``extra`` keys
        override the computed ones, e.g. the journal's true ``wall_s``).

        Raises:
            OutputWriteError: ``summary.json`` could not be written (the files are closed); its
                ``summary`` attribute holds the summary.
        """
        for f in self._files.values():
            f.close()
        summary = self.stats.summary()
        summary["files"] = {name: os.path.abspath(self.dir / name) for name in self.FILES}  # where they are, whatever the working directory
        if extra:
            summary.update(extra)
            if "wall_s" in extra:
                summary["episodes_per_s"] = summary["episodes"] / max(extra["wall_s"], 1e-9)
                summary["generated_tokens_per_s"] = summary["generated_tokens"] / max(extra["wall_s"], 1e-9)
        path, tmp = self.dir / "summary.json", self.dir / "summary.json.tmp"
        try:
            tmp.write_text(json.dumps(summary, indent=2) + "\n")
            tmp.replace(path)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            err = OutputWriteError(path, e)
            err.summary = summary
            raise err from None
        return summary


def where_episodes_are(journaled: Iterable[str], written: set[str], undelivered: int) -> dict[str, int]:
    """A run's episodes by where they are, for its summary: ``episodes_in_open_groups``, journaled
    (delivered by the pool) but not in the result files because their group is not complete yet
    (a stopped run's; ``--resume`` completes them), and ``episodes_planned``, every episode
    submitted: journaled or ``undelivered``. So the files' ``episodes`` + ``episodes_in_open_groups``
    + ``undelivered`` == ``episodes_planned``.

    Args:
        journaled: the episode ids the journal holds as delivered (:attr:`rollout.core.journal.RunJournal.delivered`).
        written: the episode ids the result files hold (:attr:`RunWriter.written`).
        undelivered: episodes submitted and not delivered.
    """
    journaled = set(journaled)
    return {"episodes_in_open_groups": len(journaled - written), "episodes_planned": len(journaled) + undelivered}


def read_samples(path: str | Path, tolerate_torn_tail: bool = False) -> list[TrainingSample]:
    """Load a ``samples.jsonl`` (or ``failed.jsonl`` / ``filtered.jsonl``) file.

    Args:
        tolerate_torn_tail: ignore a last line cut short (a writer killed mid-line).

    Raises:
        json.JSONDecodeError: a malformed line (the last one too, unless ``tolerate_torn_tail``).
    """
    lines = [line for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    out = []
    for n, line in enumerate(lines):
        try:
            out.append(TrainingSample.from_dict(json.loads(line)))
        except json.JSONDecodeError:
            if tolerate_torn_tail and n == len(lines) - 1:
                continue
            raise
    return out
