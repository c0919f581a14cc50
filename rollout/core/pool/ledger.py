"""The pool's exactly-once ledger (pure; no Ray): which episodes were submitted, which delivered,
which handed back undelivered, the journal they are recorded in, and the episode counters.

Every submitted episode id is delivered exactly once (docs/design.md invariant 2): the scheduler
asks :meth:`EpisodeLedger.is_delivered` before it delivers, so a late duplicate (an attempt that
answered after its retry) is dropped; :meth:`EpisodeLedger.hand_back` turns what an ended run
still held into the undelivered specs of a :class:`~rollout.core.pool.errors.RunAborted`.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Callable, Iterable

from rollout.core.groups import Rerun, rerun_episode_id
from rollout.core.metrics import EpisodeMetrics
from rollout.core.records import EpisodeSpec, EpisodeStatus, InteractionResult, TaskIssue, TrainingSample
from rollout.core.telemetry.probes import DeliveryMetrics
from rollout.core.telemetry.recorder import NULL_RECORDER, Recorder

# The running totals RolloutPool.stats() always has (0 until something is counted), besides one
# ``status_<status>`` per EpisodeStatus and the group assembler's totals.
POOL_COUNTERS = ("episodes_submitted", "episodes_delivered", "episodes_restored", "episodes_interrupted", "episodes_continued",
                 "episodes_restarted", "episode_retries", "episodes_cancelled_outstanding", "episodes_undelivered",
                 "weight_updates", "generate_calls_paused")


class Delivery:
    """One delivered episode: its ``result``, and its *episode sample* (made once, on first use,
    by the ledger's ``to_sample``: :meth:`InteractionResult.to_sample`, one per episode, the record
    the journal keeps and the training streams split by ``rollout.sample_mode``)."""

    __slots__ = ("result", "_to_sample", "_sample")

    def __init__(self, result: InteractionResult, to_sample: Callable[[InteractionResult], TrainingSample]):
        self.result = result
        self._to_sample = to_sample
        self._sample: TrainingSample | None = None

    @property
    def sample(self) -> TrainingSample:
        """The episode's sample (the same object on every use).

        Raises:
            rollout.core.trajectory.TrajectoryError: the episode's record is misaligned.
        """
        if self._sample is None:
            self._sample = self._to_sample(self.result)
        return self._sample


class EpisodeLedger:
    """Exactly-once bookkeeping of one pool (see the module docstring).

    Args:
        to_sample: turns a delivered result into its episode sample
            (:meth:`InteractionResult.to_sample`, the default; the pool passes
            ``rollout.keep_messages`` to it). The sample modes cut it later, where samples are
            handed out (:mod:`rollout.core.pool.streams`, :mod:`rollout.core.sample_modes`).
        recorder: where the episodes submitted and delivered are recorded
            (:class:`~rollout.core.telemetry.probes.DeliveryMetrics`: status, duration, turns,
            reward); ``None``: nowhere.
        weight_version: ``() -> int``, the trainer's current weight version, journaled with each
            delivered episode (what staleness is judged against: a replay reproduces it); ``None``:
            not journaled.
        task_issues: ``(task id) -> its open issues`` (or None), for delivered results that carry none yet
            (the pool's own ``actor_lost`` and ``cancelled`` records; the actors' results carry
            theirs); ``None``: they get none.

    Attributes:
        counts: the episode counters (every key of :data:`POOL_COUNTERS` and ``status_<status>``
            for every :class:`~rollout.core.records.EpisodeStatus`, 0 until counted).
    """

    def __init__(self, to_sample: Callable[[InteractionResult], TrainingSample] = InteractionResult.to_sample,
                 recorder: Recorder | None = None, weight_version: Callable[[], int] | None = None,
                 task_issues: Callable[[str], list[TaskIssue]] | None = None):
        self._to_sample = to_sample
        self._task_issues = task_issues
        self._metrics = DeliveryMetrics(recorder if recorder is not None else NULL_RECORDER)
        self._weight_version = weight_version
        self._submitted: set[str] = set()
        self._delivered: set[str] = set()
        self._restored: set[str] = set()
        self._member_spec: dict[tuple[str, int], EpisodeSpec] = {}
        self._journal = None
        self.counts: collections.Counter[str] = collections.Counter(dict.fromkeys(POOL_COUNTERS, 0))
        self.counts.update(dict.fromkeys((f"status_{st.value}" for st in EpisodeStatus), 0))

    # -- submission --------------------------------------------------------------------------
    @property
    def submitted_ids(self) -> frozenset[str]:
        """Every episode id submitted so far (re-runs and restored episodes included)."""
        return frozenset(self._submitted)

    @property
    def any_submitted(self) -> bool:
        """Whether any episode was submitted (or restored) yet."""
        return bool(self._submitted)

    def check_new(self, specs: list[EpisodeSpec]) -> None:
        """Refuse a submission that repeats an episode id (of an earlier submission or within it).

        Raises:
            ValueError: naming the first repeated episode id.
        """
        ids = [s.episode_id for s in specs]
        dup = [i for i in ids if i in self._submitted] or [i for i, n in collections.Counter(ids).items() if n > 1]
        if dup:
            raise ValueError(f"episode {dup[0]} was already submitted")

    def register(self, specs: Iterable[EpisodeSpec]) -> None:
        """Record ``specs`` as group members (the base of their re-runs) and journal them."""
        specs = list(specs)
        if self._journal is not None:
            self._journal.record_specs(specs)
        for s in specs:
            self._member_spec[(s.group_id, s.sample_index)] = s

    def submitted(self, spec: EpisodeSpec) -> None:
        """Count ``spec`` as submitted (it is queued to run)."""
        self._submitted.add(spec.episode_id)
        self.counts["episodes_submitted"] += 1
        self._metrics.submitted.record(1)

    def rerun_spec(self, rerun: Rerun, weight_version: int) -> EpisodeSpec:
        """The spec of group-member re-run ``rerun``: its member's spec with a new episode id,
        the first attempt and ``weight_version``.

        Raises:
            KeyError: the member was never registered.
        """
        base = self._member_spec[(rerun.group_id, rerun.sample_index)]
        return dataclasses.replace(base, episode_id=rerun_episode_id(base.episode_id, rerun.number), attempt=0, weight_version=weight_version)

    # -- delivery ----------------------------------------------------------------------------
    def is_delivered(self, episode_id: str) -> bool:
        """Whether ``episode_id`` was delivered (in this session, or before it by a restored journal)."""
        return episode_id in self._delivered

    def deliver(self, result: InteractionResult, journal: bool = True) -> Delivery:
        """Mark ``result``'s episode delivered, count it, and (with ``journal`` and a journal
        attached) journal its sample, durable at the next :meth:`commit`. The caller checked
        :meth:`is_delivered` first, and commits before it hands the delivery out.

        Raises:
            rollout.core.jsonl.OutputWriteError: the journal refused the line; the episode is not
                delivered (nothing counted).
        """
        d = Delivery(result, self._to_sample)
        if journal and self._journal is not None:  # durable at the next commit(), before it is handed out
            version = None if self._weight_version is None else self._weight_version()
            self._journal.record(d.sample, weight_version=version, sync=False)
        self._delivered.add(result.spec.episode_id)
        if result.task_issues is None:
            result.task_issues = list((self._task_issues(result.spec.task_id) if self._task_issues is not None else None) or [])
        c = self.counts
        c["episodes_delivered"] += 1
        c[f"status_{result.status.value}"] += 1
        m = EpisodeMetrics.from_metadata(result.metadata)
        if m.interruptions:
            c["episodes_interrupted"] += 1
        if m.continued_turns:
            c["episodes_continued"] += 1
        if m.restarted_turns:
            c["episodes_restarted"] += 1
        self._metrics.delivered(result)
        return d

    def commit(self) -> None:
        """Make every episode journaled so far durable (the journal's ``commit``: one ``fsync``
        for all of them; nothing without a journal or without new episodes). The pool calls it
        when each of its calls ends, before what the call delivered is handed out
        (:class:`rollout.core.pool.steps.StepRunner`)."""
        if self._journal is not None:
            self._journal.commit()

    def hand_back(self, specs: Iterable[EpisodeSpec]) -> list[EpisodeSpec]:
        """The undelivered ones of ``specs`` (what an ended run still held), each as its first
        attempt, counted as ``episodes_undelivered``."""
        undelivered = [dataclasses.replace(s, attempt=0) for s in specs if s.episode_id not in self._delivered]
        self.counts["episodes_undelivered"] += len(undelivered)
        return undelivered

    # -- the run journal ---------------------------------------------------------------------
    def attach_journal(self, journal) -> None:
        """Record into ``journal`` (a :class:`rollout.core.journal.RunJournal`) every spec
        registered and every episode delivered from now on."""
        self._journal = journal

    def journal_cancel(self, weight_version: int) -> None:
        """Journal that the trainer cancelled what is outstanding (at ``weight_version``), so that
        a replay hands back the same episodes at the same point (no-op without a journal)."""
        if self._journal is not None:
            self._journal.record_cancel(weight_version)

    def restore(self, journal, replay: Callable[[TrainingSample], list[Rerun]], weight_version: int) -> list[EpisodeSpec]:
        """Take a journaled run (a :class:`rollout.core.journal.RunJournal`): its specs are
        registered and submitted, its delivered samples delivered (``episodes_restored``) and
        replayed, in delivery order, through ``replay`` (the training streams; returns the
        group-member re-runs each asks for). Journals nothing.

        Returns:
            The specs to run, not counted as submitted yet: journaled specs not delivered, then
            the re-runs (at ``weight_version``) not delivered.
        """
        specs, delivered = journal.specs, journal.delivered  # delivered: episode id -> sample, in delivery order
        for s in specs:
            self._member_spec[(s.group_id, s.sample_index)] = s
            self._submitted.add(s.episode_id)
        reruns: dict[str, EpisodeSpec] = {}
        for sample in delivered.values():
            self._delivered.add(sample.episode_id)
            self._submitted.add(sample.episode_id)
            self._restored.add(sample.episode_id)
            self.counts["episodes_restored"] += 1
            for rr in replay(sample):
                spec = self.rerun_spec(rr, weight_version)
                self._submitted.add(spec.episode_id)
                reruns[spec.episode_id] = spec
        return [s for s in specs if s.episode_id not in delivered] + [s for i, s in reruns.items() if i not in delivered]

    def count(self, key: str, n: int = 1) -> None:
        """Add ``n`` to counter ``key`` (one of :data:`POOL_COUNTERS`)."""
        self.counts[key] += n
