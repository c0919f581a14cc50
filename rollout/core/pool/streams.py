"""The pool's streams (pure; no Ray): raw results, training samples, GRPO groups, exclusions,
and dynamic sampling (:meth:`TrainingStreams.collect_step`).

Every stream is a pair of steps: ``ensure_*(timeout_s)`` delivers episodes (through the pool's
:class:`Feed`) until the next item is waiting in this part's buffers, and ``take_*()`` hands it
out. The pool runs ``ensure`` under its lock (in the caller's thread, or a worker thread for the
async API) and ``take`` right after; an item that was made and not taken (the awaiting task was
cancelled) stays in the buffer, and the next call of a stream of the same kind hands it out
first. Groups a stream or :meth:`TrainingStreams.collect_step` took from the assembler wait in
one buffer that every group stream and ``collect_groups`` read first; exclusions stay with the
:class:`~rollout.core.groups.GroupAssembler` until taken.

One :class:`~rollout.core.groups.TrainingPolicy` applies on every path (docs/design.md
invariant 4): what may not be trained goes to the exclusions.

Everything here works per episode, on each episode's ``trajectory`` sample; the samples of
``rollout.sample_mode`` (:mod:`rollout.core.export`) are made where they are handed out: the
sample stream yields each of an episode's samples, a group is every sample of its episodes (in
``sample_index`` order, each episode's in turn order), and an exclusion stays one episode sample.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import time
from typing import Callable, Iterator

from rollout.core.config import Config
from rollout.core.export import get_exporter
from rollout.core.groups import Excluded, GroupAssembler, Rerun, TrainingPolicy
from rollout.core.pool.ledger import Delivery
from rollout.core.records import EpisodeSpec, InteractionResult, TrainingSample
from rollout.core.telemetry.recorder import Recorder

logger = logging.getLogger(__name__)

# collect_groups logs a WARNING each time this many complete groups in a row were filtered
# (rollout.filter_groups) with none kept: with tasks the policy always (or never) solves, every
# group is filtered and collect_groups would wait for ever, silently.
FILTERED_WARN_EVERY = 50


@dataclasses.dataclass(frozen=True)
class Feed:
    """What the streams need from the pool.

    Attributes:
        next_delivery: ``(timeout_s) -> Delivery | None``: the next delivered episode, ``None``
            when nothing is outstanding; raises ``TimeoutError`` after ``timeout_s`` seconds
            without one (and the pool's :class:`~rollout.core.pool.errors.RunAborted` kinds).
        resubmit: submits group-member re-runs (already registered with the assembler).
        submit_tasks: ``(task_ids, n_samples_per_task) -> specs``, as
            :meth:`rollout.core.pool.RolloutPool.submit_tasks`.
        weight_version: ``() -> int``: the trainer's current weight version.
        num_outstanding: ``() -> int``: episodes submitted and not delivered.
    """

    next_delivery: Callable[[float | None], Delivery | None]
    resubmit: Callable[[list[Rerun]], None]
    submit_tasks: Callable[..., list[EpisodeSpec]]
    weight_version: Callable[[], int]
    num_outstanding: Callable[[], int]


class TrainingStreams:
    """The streams of one pool (see the module docstring).

    Args:
        cfg: the whole config (``rollout``: the training policy, group failures and filters,
            ``n_samples_per_task``; ``pool``: the capacity ``collect_groups`` keeps busy).
        feed: the pool's side (:class:`Feed`).
        recorder: where exclusions and group outcomes are recorded (the group assembler's;
            ``None``: nowhere).

    Attributes:
        policy: the training policy every stream applies.
    """

    def __init__(self, cfg: Config, feed: Feed, recorder: Recorder | None = None):
        r = cfg.rollout
        self.cfg = cfg
        self.policy = TrainingPolicy.from_config(r)
        self._assembler = GroupAssembler(self.policy, r.on_group_failure, r.max_member_reruns, r.filter_groups, recorder=recorder)
        self._feed = feed
        self._split = get_exporter(r.sample_mode, keep_messages=r.keep_messages).split  # episode sample -> the mode's samples
        self._results: collections.deque[Delivery] = collections.deque()  # delivered, not handed out as results
        self._samples: collections.deque[TrainingSample] = collections.deque()  # trainable, not handed out
        self._groups: collections.deque[list[TrainingSample]] = collections.deque()  # taken from the assembler, not handed out
        self._filtered_seen = 0
        self._filtered_streak = 0

    # -- bookkeeping -------------------------------------------------------------------------
    @property
    def counts(self) -> collections.Counter[str]:
        """The group totals (:data:`rollout.core.groups.GROUP_COUNTERS`, ``excluded_<reason>``)."""
        return self._assembler.counts

    def expect(self, specs: list[EpisodeSpec]) -> None:
        """Register the groups of one submission (a group's size is its number of specs here).

        Raises:
            ValueError: a group was submitted before.
        """
        for gid, n in collections.Counter(s.group_id for s in specs).items():
            self._assembler.expect(gid, n)

    def add(self, delivery: Delivery) -> None:
        """Take one delivered episode into the groups, re-running nothing (its group was abandoned)."""
        self._assembler.add(delivery.sample, self._feed.weight_version())

    def replay(self, sample: TrainingSample) -> list[Rerun]:
        """Take a journaled sample into the groups again; returns the re-runs it asks for
        (registered with the assembler, not submitted)."""
        reruns = self._assembler.add(sample, self._feed.weight_version())
        for rr in reruns:
            self._assembler.expect_rerun(rr)
        return reruns

    def abandon_open_groups(self) -> None:
        """Drop every open group (members go to the exclusions as ``group_cancelled``)."""
        self._assembler.abandon_open_groups()

    def _next(self, timeout_s: float | None) -> Delivery | None:
        return self._results.popleft() if self._results else self._feed.next_delivery(timeout_s)

    def _submit_reruns(self, reruns: list[Rerun]) -> None:
        for rr in reruns:
            self._assembler.expect_rerun(rr)
        if reruns:
            self._feed.resubmit(reruns)

    def pump(self, timeout_s: float | None) -> bool:
        """Deliver one episode into the groups (submitting the re-runs it asks for); False when
        nothing is outstanding.

        Raises:
            TimeoutError: no episode ended within ``timeout_s`` seconds.
        """
        d = self._next(timeout_s)
        if d is None:
            return False
        self._submit_reruns(self._assembler.add(d.sample, self._feed.weight_version()))
        return True

    def _pop_ready(self, limit: int | None = None) -> list[list[TrainingSample]]:
        out = self._assembler.pop_ready(self._feed.weight_version(), limit)
        self._submit_reruns(self._assembler.take_late_reruns())
        return out

    # -- raw results -------------------------------------------------------------------------
    def ensure_result(self, timeout_s: float | None) -> bool:
        """Deliver the next result unless one waits; False when none is left."""
        if not self._results:
            d = self._feed.next_delivery(timeout_s)
            if d is None:
                return False
            self._results.append(d)
        return True

    def take_result(self) -> InteractionResult | None:
        """The oldest result delivered and not handed out (``None``: none waits)."""
        return self._results.popleft().result if self._results else None

    # -- samples -----------------------------------------------------------------------------
    def ensure_sample(self, timeout_s: float | None) -> bool:
        """Deliver episodes until a trainable sample waits (no grouping, no re-runs; the others
        go to the exclusions); False when none is left."""
        while not self._samples:
            d = self._next(timeout_s)
            if d is None:
                return False
            s = d.sample
            self._assembler.forget_member(s.group_id)
            reason = self.policy.exclusion(s, self._feed.weight_version())
            if reason is None:
                self._samples.extend(self._split(s))
            else:
                self._assembler.exclude(s, reason)
        return True

    def take_sample(self) -> TrainingSample | None:
        """The oldest trainable sample not handed out (``None``: none waits); with
        ``rollout.sample_mode`` per_turn / merge_prefix an episode gives several, in order."""
        return self._samples.popleft() if self._samples else None

    # -- groups and exclusions ---------------------------------------------------------------
    def ensure_item(self, timeout_s: float | None, excluded: bool) -> bool:
        """Deliver episodes until a complete group (or, with ``excluded``, an exclusion) waits;
        False when none is left. Exclusions come before the groups handed over after them, as
        they were recorded."""
        while True:
            if self._groups or (excluded and self._assembler.excluded_waiting):
                return True
            ready = self._pop_ready()
            if ready:
                self._groups.extend(ready)
                continue
            if not self.pump(timeout_s):
                self._groups.extend(self._pop_ready())
                return bool(self._groups) or (excluded and self._assembler.excluded_waiting > 0)

    def take_item(self, excluded: bool) -> list[TrainingSample] | Excluded | None:
        """The oldest complete group not handed out, else (with ``excluded``) the oldest
        exclusion; ``None`` when none waits."""
        if self._groups:
            return self.mode_samples(self._groups.popleft())
        return self._assembler.take_excluded() if excluded else None

    def mode_samples(self, group: list[TrainingSample]) -> list[TrainingSample]:
        """Every sample of ``rollout.sample_mode`` of the episodes of ``group`` (episode samples),
        in order."""
        return [x for s in group for x in self._split(s)]

    def take_excluded(self) -> Excluded | None:
        """The oldest exclusion not taken yet, or ``None``."""
        return self._assembler.take_excluded()

    # -- dynamic sampling --------------------------------------------------------------------
    def prefetch(self, num_groups: int, task_source: Iterator[str], n_samples_per_task: int | None = None, in_flight: bool = False) -> int:
        """Submit tasks from ``task_source`` until ``num_groups`` groups are complete or on their
        way (see :meth:`rollout.core.pool.RolloutPool.prefetch`); returns the groups submitted."""
        asm = self._assembler

        def short() -> bool:
            if in_flight:
                return asm.open_groups < num_groups and asm.ready_groups < num_groups
            return asm.open_groups + asm.ready_groups < num_groups

        n = 0
        while short():
            tid = next(task_source, None)
            if tid is None:
                break
            self._feed.submit_tasks([tid], n_samples_per_task)
            n += 1
        return n

    def poll(self, timeout_s: float) -> int:
        """Deliver into the groups the episodes that end within ``timeout_s`` seconds; returns
        how many were delivered."""
        deadline = time.monotonic() + timeout_s
        n = 0
        while self._feed.num_outstanding():
            try:
                if not self.pump(max(0.0, deadline - time.monotonic())):
                    break
            except TimeoutError:
                break
            n += 1
            if time.monotonic() >= deadline:
                break
        return n

    def collect(self, num_groups: int, task_source: Iterator[str] | None, n_samples_per_task: int | None,
                max_outstanding_groups: int | None) -> Callable[[float | None], bool]:
        """The step of one ``collect_groups`` call: ``(timeout_s) -> done``, :meth:`collect_step`
        with these arguments; ``max_outstanding_groups`` defaults to the pool's capacity in groups
        (``num_actors * max_concurrent_episodes // n_samples_per_task``).

        Raises:
            ValueError: ``num_groups < 1``.
        """
        if num_groups < 1:
            raise ValueError(f"num_groups must be >= 1, got {num_groups}")
        if max_outstanding_groups is None:
            p = self.cfg.pool
            max_outstanding_groups = p.num_actors * p.max_concurrent_episodes // (n_samples_per_task or self.cfg.rollout.n_samples_per_task)
        return lambda t: self.collect_step(num_groups, task_source, n_samples_per_task, max_outstanding_groups, t)

    def collect_step(self, num_groups: int, task_source: Iterator[str] | None, n_samples_per_task: int | None,
                     max_outstanding_groups: int, timeout_s: float | None) -> bool:
        """One round of ``collect_groups``: take complete groups (until ``num_groups`` wait),
        submit from ``task_source`` (keeping ``max_outstanding_groups`` complete or on their
        way), deliver one episode. True when ``num_groups`` groups wait (:meth:`take_groups`) or
        no task is left to submit (logged).

        Raises:
            TimeoutError: no episode ended within ``timeout_s`` seconds.
        """
        need = num_groups - len(self._groups)
        popped = self._pop_ready(need) if need > 0 else []
        self._groups.extend(popped)
        if len(self._groups) >= num_groups:
            self._note_filtered(kept=True)
            return True
        if task_source is not None:
            self.prefetch(max(num_groups - len(self._groups), max_outstanding_groups), task_source, n_samples_per_task)
        if not self.pump(timeout_s) and not self._assembler.ready_groups:
            logger.warning("collect_groups: %d of %d groups kept and no task left to submit", len(self._groups), num_groups)
            return True
        self._note_filtered(kept=bool(popped) or self._assembler.ready_groups > 0, wanted=num_groups)
        return False

    def take_groups(self, n: int) -> list[list[TrainingSample]]:
        """Up to ``n`` of the groups waiting, oldest first."""
        return [self.mode_samples(self._groups.popleft()) for _ in range(min(n, len(self._groups)))]

    def _note_filtered(self, kept: bool, wanted: int = 0) -> None:
        """Count complete groups filtered in a row (none kept) and warn every
        :data:`FILTERED_WARN_EVERY` of them."""
        filtered = self._assembler.counts["groups_filtered"]
        new, self._filtered_seen = filtered - self._filtered_seen, filtered
        if kept:
            self._filtered_streak = 0
            return
        before, self._filtered_streak = self._filtered_streak, self._filtered_streak + new
        if self._filtered_streak // FILTERED_WARN_EVERY > before // FILTERED_WARN_EVERY:
            logger.warning("collect_groups: the last %d complete groups were all filtered (rollout.filter_groups=%s: equal rewards) "
                           "and none kept; %d of %d groups collected. If the policy solves every task always or never, this never "
                           "ends: check the task source, or set rollout.filter_groups=null",
                           self._filtered_streak, self.cfg.rollout.filter_groups, len(self._groups), wanted)
