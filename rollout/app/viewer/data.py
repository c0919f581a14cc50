"""A run's output folder as the viewer reads it, re-read as it grows.

:class:`RunIndex` indexes one ``rollout.output_dir`` (:mod:`rollout.core.journal`,
:mod:`rollout.core.output`):

* ``episodes.jsonl`` (the journal: one episode sample per delivered episode, in delivery order) gives
  the rows of the episode table, one :class:`EpisodeRow` per episode;
* ``samples.jsonl`` / ``failed.jsonl`` / ``filtered.jsonl`` give each episode's *outcome*
  (``trained``, ``failed``, ``filtered``, with ``metadata.excluded_reason``); an episode the journal
  holds but no result file yet (its group is not complete) is ``pending``. A folder without a
  journal (only result files) gets its rows from the result files;
* ``specs.jsonl`` counts the episodes submitted, ``run.json`` says whether the run is ``running``,
  ``summary.json`` is the end-of-run summary, ``config.yaml`` names the tokenizer and the trainable
  statuses, ``train_log.jsonl`` is the GRPO example's per-step log, ``eval.json`` the pass^k of an
  evaluation (``python -m rollout eval`` writes a run folder too, :mod:`rollout.app.evaluation`).

Only the bytes appended since the last :meth:`RunIndex.refresh` are read
(:class:`~rollout.app.viewer.tail.JsonlTail`); the index keeps each row's figures and where its line
is, and reads an episode's line back from disk when it is opened, so memory does not grow with the
tokens of the run. A malformed line is skipped with a warning. Every row carries the index's
*revision* when it last changed, so a page asks only for what changed since the revision it has.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import yaml

from rollout.app.viewer.tail import JsonlTail, NotRegularFileError, TailLine, TailRead, open_regular, read_line_at
from rollout.core.journal import EPISODES_FILE, SPECS_FILE, STATE_FILE
from rollout.core.records import DEFAULT_TRAIN_STATUSES

logger = logging.getLogger(__name__)

RESULT_FILES = ("samples.jsonl", "failed.jsonl", "filtered.jsonl")
OUTCOMES = {"samples.jsonl": "trained", "failed.jsonl": "failed", "filtered.jsonl": "filtered"}
TRAIN_LOG_FILE = "train_log.jsonl"
SUMMARY_FILE = "summary.json"
EVAL_FILE = "eval.json"  # rollout.app.evaluation.EVAL_FILE
CONFIG_FILE = "config.yaml"
# A folder holding none of these is not a run's output (the GRPO example's folder holds only its
# train log: launch/train_grpo_tiny.py).
RUN_MARKERS = (STATE_FILE, SPECS_FILE, EPISODES_FILE, *RESULT_FILES, SUMMARY_FILE, TRAIN_LOG_FILE)
# The largest whole-file document read (run.json, summary.json, eval.json, config.yaml; bytes):
# theirs are kilobytes, a larger one is not what the run wrote.
MAX_SMALL_FILE_BYTES = 32 * 1024 * 1024
# The page's JSON carries integers of 64 bits at most (orjson); a row's count beyond that marks
# its line malformed, so that it cannot make every answer holding the table fail.
_INT_MIN, _INT_MAX = -(2**63), 2**63 - 1


class NotARunError(ValueError):
    """The folder is not a run's output (one line, for the CLI)."""


def check_run_dir(path: str | Path) -> Path:
    """Return ``path`` as a :class:`~pathlib.Path` when it holds a run's output.

    Raises:
        NotARunError: the folder is missing, not a folder, or holds none of :data:`RUN_MARKERS`.
    """
    d = Path(path)
    if not d.exists():
        raise NotARunError(f"{d} does not exist")
    if not d.is_dir():
        raise NotARunError(f"{d} is not a folder")
    if not any((d / name).is_file() for name in RUN_MARKERS):
        raise NotARunError(f"{d} is not a run's output folder (it has none of {', '.join(RUN_MARKERS)})")
    return d


@dataclass
class LineRef:
    """Where one sample line is: a file of the run, its byte offset and length."""

    file: str
    offset: int
    length: int


@dataclass
class EpisodeRow:
    """One episode of the table (all figures from its episode sample).

    Attributes:
        episode_id: the sample's ``episode_id`` (``metadata.episode_id`` in a line written
            before it was a top-level field).
        order: delivery order, from 0 (the journal's line order).
        task_id / domain / group_id / sample_index / attempt: the spec's identifiers.
        status: the :class:`~rollout.core.records.EpisodeStatus` value.
        reward: what was trained (shaped with ``rollout.reward_shaping``; in [0, 1] for the built-in shapers).
        raw_reward: the benchmark's own reward (the sample's ``raw_reward``; ``reward`` in a line
            written before it existed).
        task_issues: the titles of the task's open issues (the sample's ``task_issues``).
        turns: assistant turns (``metadata.turns``).
        tokens: ``len(tokens)`` of the episode (prompt + response, every segment).
        generated: tokens with loss mask 1.
        segments: 1 + ``len(segment_starts)``.
        versions: the distinct weight versions of its ``/generate`` calls, in first-use order.
        duration_s: ``metadata.timings.total_s`` (seconds), None when not recorded.
        termination: ``metadata.termination_reason``.
        error: the first line of ``metadata.error`` (failures), else None.
        outcome: ``trained`` | ``failed`` | ``filtered`` | ``pending``; ``reason``: why it was
            kept out of training (``metadata.excluded_reason`` or the status), else None.
        samples: lines the episode has in the result files (several with ``per_turn``).
        rev: the index's revision when the row last changed.
    """

    episode_id: str
    order: int
    task_id: str
    domain: str
    group_id: str
    sample_index: int
    attempt: int
    status: str
    reward: float
    raw_reward: float
    task_issues: list[str]
    turns: int
    tokens: int
    generated: int
    segments: int
    versions: list[str]
    duration_s: float | None
    termination: str | None
    error: str | None
    outcome: str = "pending"
    reason: str | None = None
    samples: int = 0
    rev: int = 0
    journal: LineRef | None = None
    results: list[LineRef] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The row as the page gets it (without the line locations)."""
        d = {k: v for k, v in self.__dict__.items() if k not in ("journal", "results")}
        d["versions"] = list(self.versions)
        d["task_issues"] = list(self.task_issues)
        return d


def _count(value: Any, key: str) -> int:
    """``value`` (a number, or empty for 0) as an int within 64 bits.

    Raises:
        ValueError: not a number, or beyond 64 bits (the message names ``key``).
        TypeError: not a number or a string.
    """
    n = int(value or 0)
    if not _INT_MIN <= n <= _INT_MAX:
        raise ValueError(f"{key} is {value!r}, beyond 64 bits")
    return n


def row_from_sample(sample: dict[str, Any], order: int) -> EpisodeRow:
    """Build a row from one sample line (a dict of :meth:`TrainingSample.to_dict`'s shape).

    Missing keys read as empty (a line of another version still shows).

    Raises:
        ValueError, TypeError: a count (``sample_index``, ``metadata.attempt``, ``metadata.turns``,
            the sum of ``loss_mask``) is not a number or beyond 64 bits.
        AttributeError: ``metadata`` is not an object.
    """
    meta = sample.get("metadata") or {}
    timings = meta.get("timings") or {}
    versions: list[str] = []
    for v in sample.get("weight_versions") or []:
        if str(v) not in versions:
            versions.append(str(v))
    error = meta.get("error")
    total = timings.get("total_s") if isinstance(timings, dict) else None
    return EpisodeRow(
        episode_id=str(sample.get("episode_id") or meta.get("episode_id", "")), order=order, task_id=str(meta.get("task_id", "")),
        domain=str(meta.get("domain", "")), group_id=str(sample.get("group_id", "")),
        sample_index=_count(sample.get("sample_index"), "sample_index"), attempt=_count(meta.get("attempt"), "metadata.attempt"),
        status=str(sample.get("status", "")), reward=float(sample.get("reward") or 0.0),
        raw_reward=float(sample["raw_reward"] if sample.get("raw_reward") is not None else sample.get("reward") or 0.0),
        task_issues=[str(i.get("title", "")) for i in sample.get("task_issues") or [] if isinstance(i, dict)], turns=_count(meta.get("turns"), "metadata.turns"),
        tokens=len(sample.get("tokens") or []), generated=_count(sum(sample.get("loss_mask") or []), "the sum of loss_mask"),
        segments=1 + len(sample.get("segment_starts") or []), versions=versions,
        duration_s=float(total) if isinstance(total, (int, float)) else None,
        termination=meta.get("termination_reason"),
        error=str(error).strip().splitlines()[0] if error and str(error).strip() else None,
    )


class RunIndex:
    """The index of one run's output folder (see the module docstring). Thread-safe.

    Args:
        run_dir: the folder (checked with :func:`check_run_dir`).
        name: how the page calls this run (``a``, or ``b`` for ``--compare``).

    Raises:
        NotARunError: ``run_dir`` is not a run's output.
    """

    def __init__(self, run_dir: str | Path, name: str = "a"):
        self.dir = check_run_dir(run_dir)
        self.name = name
        self.revision = 0
        self.epoch = 0
        self._lock = threading.RLock()
        self._small: dict[str, tuple[tuple[float, int, int, int], Any]] = {}
        self._reset()

    def _reset(self) -> None:
        self._tails = {n: JsonlTail(self.dir / n) for n in (EPISODES_FILE, SPECS_FILE, TRAIN_LOG_FILE, *RESULT_FILES)}
        self._rows: dict[str, EpisodeRow] = {}
        self._specs: set[str] = set()
        self._train_log: list[dict[str, Any]] = []
        self.skipped_lines = 0
        self.revision += 1
        self.epoch += 1  # a page that saw another epoch drops its rows and asks for all of them

    # -- refreshing ------------------------------------------------------------------------------
    @staticmethod
    def _digest(value: dict[str, Any]) -> tuple[EpisodeRow, str | None]:
        """What the index keeps of a sample line: its row and ``metadata.excluded_reason``."""
        meta = value.get("metadata") or {}
        reason = meta.get("excluded_reason") if isinstance(meta, dict) else None
        return row_from_sample(value, 0), str(reason) if reason else None

    def refresh(self) -> bool:
        """Read what was appended to the run's files since the last call.

        Returns:
            True when a row, the spec count or the train log changed.

        Raises:
            OSError: a file of the run exists but cannot be read.
        """
        with self._lock:
            reads = self._read_all()
            if any(r.reset for r in reads.values()):  # the run was replaced: start again
                self._reset()
                reads = self._read_all()
            self.skipped_lines += sum(r.skipped for r in reads.values())
            rev = self.revision + 1
            changed = False
            for line in reads[EPISODES_FILE].lines:
                changed |= self._add_journal(line, rev)
            for name in RESULT_FILES:
                for line in reads[name].lines:
                    changed |= self._add_result(name, line, rev)
            for line in reads[SPECS_FILE].lines:
                eid = line.value.get("episode_id")
                if isinstance(eid, str) and eid not in self._specs:
                    self._specs.add(eid)
                    changed = True
            if reads[TRAIN_LOG_FILE].lines:
                self._train_log += [x.value for x in reads[TRAIN_LOG_FILE].lines]
                changed = True
            if changed:
                self.revision = rev
            return changed

    def _read_all(self) -> dict[str, TailRead]:
        samples = (EPISODES_FILE, *RESULT_FILES)
        return {n: t.read_new(self._digest if n in samples else None) for n, t in self._tails.items()}

    def _add_journal(self, line: TailLine, rev: int) -> bool:
        ref = LineRef(EPISODES_FILE, line.offset, line.length)
        row, _ = line.value
        row.order = len(self._rows)
        old = self._rows.get(row.episode_id)
        if old is not None and old.journal is not None:
            return False  # journaled again by a resumed session: the first one counts
        if old is not None:  # known from a result file of a run without a journal line yet
            row.order, row.outcome, row.reason, row.samples, row.results = old.order, old.outcome, old.reason, old.samples, old.results
        row.journal, row.rev = ref, rev
        self._rows[row.episode_id] = row
        return True

    def _add_result(self, name: str, line: TailLine, rev: int) -> bool:
        new, reason = line.value
        eid = new.episode_id
        row = self._rows.get(eid)
        if row is None:  # no journal line: the row comes from the result file
            row = new
            row.order = len(self._rows)
            self._rows[eid] = row
        elif row.journal is None and row.results and row.results[-1].file == name:
            row.tokens += new.tokens  # another sample of the same episode
            row.generated += new.generated
        row.outcome = OUTCOMES[name]
        row.reason = None if name == "samples.jsonl" else (reason or new.status)
        row.samples += 1
        row.results.append(LineRef(name, line.offset, line.length))
        row.rev = rev
        return True

    # -- reading ---------------------------------------------------------------------------------
    def rows(self, since: int = 0) -> list[dict[str, Any]]:
        """The rows (as :meth:`EpisodeRow.to_json`) that changed after revision ``since``, in
        delivery order (all of them for 0)."""
        with self._lock:
            return [r.to_json() for r in sorted(self._rows.values(), key=lambda r: r.order) if r.rev > since]

    def changes(self, since: int = 0) -> dict[str, Any]:
        """``{"revision", "epoch", "rows"}``: :meth:`rows` changed after ``since`` and the revision
        and epoch they are of, read together (a refresh in another thread cannot come between)."""
        with self._lock:
            return {"revision": self.revision, "epoch": self.epoch, "rows": self.rows(since)}

    def row(self, episode_id: str) -> EpisodeRow:
        """The row of one episode.

        Raises:
            KeyError: no such episode in the run.
        """
        with self._lock:
            return self._rows[episode_id]

    def episode(self, episode_id: str) -> dict[str, Any]:
        """The episode's sample as the page shows it: the journal's episode sample (else its first
        result line), with ``row`` (the table's row) and ``sample_lines`` (its lines in the result
        files); ``tokens``, ``loss_mask`` and ``rollout_log_probs`` left out (see
        :meth:`sample_parts`).

        Raises:
            KeyError: no such episode.
            OSError, ValueError: its line cannot be read back (the file was replaced meanwhile).
        """
        row = self.row(episode_id)
        ref = row.journal or row.results[0]
        sample = read_line_at(self.dir / ref.file, ref.offset, ref.length)
        for k in ("tokens", "loss_mask", "rollout_log_probs"):
            sample.pop(k, None)
        sample["row"] = row.to_json()
        sample["sample_lines"] = [{"file": r.file, "offset": r.offset} for r in row.results]
        return sample

    def sample_parts(self, episode_id: str) -> list[tuple[str, dict[str, Any]]]:
        """The token records of one episode, each ``(label, sample dict)``: the journal's episode
        sample alone (its ``segment_starts`` mark the segments), or, without a journal line, each of
        its result-file lines (``per_turn``: one per turn).

        Raises:
            KeyError: no such episode.
            OSError, ValueError: a line cannot be read back.
        """
        row = self.row(episode_id)
        if row.journal is not None:
            return [("episode sample (episodes.jsonl)", read_line_at(self.dir / EPISODES_FILE, row.journal.offset, row.journal.length))]
        return [(f"{r.file} line at byte {r.offset}", read_line_at(self.dir / r.file, r.offset, r.length)) for r in row.results]

    def _small_file(self, name: str, parse: Any) -> Any:
        """A small whole-file document (``run.json``, ``summary.json``, ``config.yaml``), parsed
        again only when its modification time or size changed; None when missing, unreadable, not
        a regular file (a FIFO, a link to a device: never opened for a blocking read) or larger
        than :data:`MAX_SMALL_FILE_BYTES` (each logged once as a warning)."""
        path = self.dir / name
        try:
            st = path.stat()
        except OSError:
            return None
        key = (st.st_mtime, st.st_size, st.st_ino, st.st_mode)
        cached = self._small.get(name)
        if cached is not None and cached[0] == key:
            return cached[1]
        try:
            f, _ = open_regular(path)
            with f:
                data = f.read(MAX_SMALL_FILE_BYTES + 1)
            if len(data) > MAX_SMALL_FILE_BYTES:
                raise ValueError(f"larger than {MAX_SMALL_FILE_BYTES} bytes, not read")
            value = parse(data)
        except NotRegularFileError:
            logger.warning("%s: not read (only regular files are)", path)
            value = None
        except (OSError, ValueError, yaml.YAMLError) as e:
            logger.warning("%s: cannot be read (%s)", path, str(e).splitlines()[0] if str(e) else type(e).__name__)
            value = None
        self._small[name] = (key, value)
        return value

    def state_file(self) -> dict[str, Any] | None:
        """``run.json`` (without its flattened ``config``), or None."""
        state = self._small_file(STATE_FILE, orjson.loads)
        return {k: v for k, v in state.items() if k != "config"} if isinstance(state, dict) else None

    def summary_file(self) -> dict[str, Any] | None:
        """``summary.json``, or None (a run still going has none)."""
        value = self._small_file(SUMMARY_FILE, orjson.loads)
        return value if isinstance(value, dict) else None

    def eval_file(self) -> dict[str, Any] | None:
        """``eval.json`` (an evaluation's pass^k, pass@k and mean reward per domain), or None."""
        value = self._small_file(EVAL_FILE, orjson.loads)
        return value if isinstance(value, dict) else None

    def config(self) -> dict[str, Any]:
        """``config.yaml`` as a plain dict (empty when missing)."""
        value = self._small_file(CONFIG_FILE, yaml.safe_load)
        return value if isinstance(value, dict) else {}

    def tokenizer_name(self) -> str | None:
        """``policy.tokenizer`` of the run's ``config.yaml``, or None."""
        name = (self.config().get("policy") or {}).get("tokenizer")
        return str(name) if name else None

    def train_statuses(self) -> tuple[str, ...]:
        """``rollout.train_statuses`` of the run (the default when not recorded)."""
        statuses = (self.config().get("rollout") or {}).get("train_statuses")
        return tuple(statuses) if isinstance(statuses, list) and statuses else DEFAULT_TRAIN_STATUSES

    def train_log(self) -> list[dict[str, Any]]:
        """The lines of ``train_log.jsonl`` read so far (empty without one)."""
        with self._lock:
            return list(self._train_log)

    def state(self) -> dict[str, Any]:
        """What the page's header and its refresh need: ``revision``, ``epoch`` (changes when the
        folder's run was replaced), ``status`` (``run.json``'s,
        or ``unknown``), ``episodes`` (rows), ``submitted`` (specs), ``pending`` (journaled, in no
        result file yet), ``skipped_lines``, ``has_train_log``, ``has_summary``, ``tokenizer``."""
        run = self.state_file() or {}
        with self._lock:
            rows = list(self._rows.values())
            return {
                "name": self.name, "dir": str(self.dir), "revision": self.revision, "epoch": self.epoch, "status": run.get("status", "unknown"),
                "reason": run.get("reason"), "episodes": len(rows), "submitted": len(self._specs),
                "pending": sum(r.outcome == "pending" for r in rows), "skipped_lines": self.skipped_lines,
                "has_train_log": bool(self._train_log), "has_summary": self.summary_file() is not None,
                "tokenizer": self.tokenizer_name(),
            }

    def live_summary(self) -> dict[str, Any]:
        """Counts over the rows read so far: ``status_counts``, ``outcome_counts``,
        ``excluded_counts`` (by reason), ``mean_reward_per_domain`` (over episodes whose status is
        trainable, as ``summary.json`` counts it) and ``mean_raw_reward_per_domain`` (the same
        episodes' benchmark reward, unshaped), ``episodes_with_task_issues``, ``episodes_per_domain``, ``mean_turns``,
        ``tokens``, ``generated_tokens``, ``errors`` (first lines, with counts, most common first)."""
        trainable = set(self.train_statuses())
        with self._lock:
            rows = list(self._rows.values())
        status: dict[str, int] = {}
        outcome: dict[str, int] = {}
        excluded: dict[str, int] = {}
        per_domain: dict[str, list[float]] = {}
        raw_per_domain: dict[str, list[float]] = {}
        episodes_per_domain: dict[str, int] = {}
        errors: dict[str, int] = {}
        for r in rows:
            status[r.status] = status.get(r.status, 0) + 1
            outcome[r.outcome] = outcome.get(r.outcome, 0) + 1
            episodes_per_domain[r.domain] = episodes_per_domain.get(r.domain, 0) + 1
            if r.reason:
                excluded[r.reason] = excluded.get(r.reason, 0) + 1
            if r.status in trainable:
                per_domain.setdefault(r.domain, []).append(r.reward)
                raw_per_domain.setdefault(r.domain, []).append(r.raw_reward)
            if r.error:
                key = f"{r.status}: {r.error[:160]}"
                errors[key] = errors.get(key, 0) + 1
        n = max(len(rows), 1)
        return {
            "episodes": len(rows), "status_counts": status, "outcome_counts": outcome, "excluded_counts": excluded,
            "mean_reward_per_domain": {d: sum(v) / len(v) for d, v in per_domain.items()},
            "mean_raw_reward_per_domain": {d: sum(v) / len(v) for d, v in raw_per_domain.items()},
            "episodes_with_task_issues": sum(bool(r.task_issues) for r in rows),
            "episodes_per_domain": episodes_per_domain, "mean_turns": sum(r.turns for r in rows) / n,
            "tokens": sum(r.tokens for r in rows), "generated_tokens": sum(r.generated for r in rows),
            "errors": [{"kind": k, "count": c} for k, c in sorted(errors.items(), key=lambda kv: -kv[1])],
            "train_statuses": sorted(trainable),
        }

    def task_table(self) -> dict[tuple[str, str], list[EpisodeRow]]:
        """The rows by ``(domain, task_id)``, each list in delivery order."""
        with self._lock:
            rows = sorted(self._rows.values(), key=lambda r: r.order)
        out: dict[tuple[str, str], list[EpisodeRow]] = {}
        for r in rows:
            out.setdefault((r.domain, r.task_id), []).append(r)
        return out
