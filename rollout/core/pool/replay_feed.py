"""The feed of a replay: a finished run's journal delivered into the training streams again, in the
run's order, at the points the run delivered it (pure; no Ray, no server).

:class:`ReplayFeed` stands where the scheduler stands in a live pool: it hands
:class:`~rollout.core.pool.streams.TrainingStreams` one delivered episode at a time, through an
:class:`~rollout.core.pool.ledger.EpisodeLedger` (so every episode id is delivered once and the
counters are the live pool's). What it delivers and when:

* **Order**: ``episodes.jsonl``'s, each episode once (:func:`rollout.core.journal.load_run`).
* **Submission**: nothing is run or submitted from a task source. A group counts as submitted
  (registered with the streams and counted in ``episodes_submitted``), with every group the run
  submitted before it, when its first episode is delivered, or when a cancel of the run is
  replayed (every group the run had submitted by then): groups are registered in the run's order.
* **Re-runs of group members** are in the journal already and never run again. Into the group
  streams a journaled re-run is delivered once the streams ask for it (they excluded its member,
  as the run's did); one they never ask for (the trainer's calls differ from the run's) is
  skipped: logged and counted (``replay_skipped``). The raw streams (``results()``, ``samples()``:
  no groups) take every journaled episode (mode :data:`RAW`).
* **Weight versions**: the replay's weight version is the larger of the trainer's own (its
  ``rollout.weight_version``, then each ``update_weights_from_disk`` / ``set_weight_version``) and
  the run's trainer version at the latest episode delivered (journaled with each episode); every
  staleness check uses it. An episode the run delivered at version ``v`` is *due* once the
  trainer's own version reaches ``v``. :meth:`poll_due` delivers due episodes only; a stream that
  needs an episode takes the next one, due or not (a consumer that never updates weights, the CLI,
  follows the run's versions); a trainer's version change first delivers every episode the run
  delivered at the older versions (the run delivered them before its update). So a trainer that
  makes the run's calls (same groups per step, an update per step) meets every check at the
  version the run's trainer had: the same exclusions, the same groups, in the same order.
* **Cancels** (``events.jsonl``): the trainer's ``cancel_outstanding`` replays the run's next
  cancel once the trainer's version has reached the one the run cancelled at: the episodes the run
  delivered before it are delivered, the groups open then are abandoned, the episodes the run had
  queued and never started are delivered ``cancelled`` (the run did not journal them), and those
  it had running are delivered from the journal. A stream that reaches a cancel of the run replays
  it by itself. A cancel the run did not make returns 0 and hands nothing back.

A journal written before the delivery versions and ``events.jsonl`` were recorded still replays:
every episode is due at once (staleness is judged at the replay's version when it is delivered),
and no cancel is replayed (what a cancel handed back is delivered as journaled). Both are logged.
"""

from __future__ import annotations

import collections
import logging
from typing import Callable, TypeVar

from rollout.core.groups import Rerun
from rollout.core.journal import CancelEvent, RunRecord
from rollout.core.pool.ledger import Delivery, EpisodeLedger
from rollout.core.pool.streams import Feed, TrainingStreams
from rollout.core.records import EpisodeSpec, EpisodeStatus, InteractionResult, TrainingSample
from rollout.core.trajectory import Trajectory

logger = logging.getLogger(__name__)
T = TypeVar("T")

# What next_delivery may do in each mode (see ReplayFeed.next_delivery).
NEED = "need"  # a stream needs an episode: the next one, due or not; the run's cancels on the way are replayed
RAW = "raw"  # as NEED, re-runs not asked for included (results(), samples(): no groups to keep right)
POLL = "poll"  # due episodes only; stop at a cancel of the run and at a re-run not asked for
FLUSH = "flush"  # due episodes and the cancels of the run at due versions (before the trainer's version moves on)
UNTIL_CANCEL = "until_cancel"  # every episode before the run's next cancel (the trainer is replaying it)
DRAIN = "drain"  # only what the cancel being replayed handed back


def result_from_sample(sample: TrainingSample) -> InteractionResult:
    """The :class:`~rollout.core.records.InteractionResult` a journaled episode sample was made
    from (``to_sample`` of it gives the sample back): its spec from the metadata, its trajectory
    from the token fields (``None`` for an episode that failed before its first prompt).

    Raises:
        ValueError: the sample's status is not an :class:`~rollout.core.records.EpisodeStatus`.
    """
    m = sample.metadata
    spec = EpisodeSpec(episode_id=sample.episode_id, domain=str(m.get("domain", "")), task_id=str(m.get("task_id", "")),
                       group_id=sample.group_id, sample_index=sample.sample_index, seed=int(m.get("seed", 0)),
                       weight_version=int(m.get("weight_version", 0)), attempt=int(m.get("attempt", 0)))
    traj = None
    if sample.tokens:
        p = sample.prompt_length
        traj = Trajectory(prompt_ids=list(sample.tokens[:p]), response_ids=list(sample.tokens[p:]), loss_mask=list(sample.loss_mask),
                          rollout_log_probs=list(sample.rollout_log_probs), weight_versions=list(sample.weight_versions),
                          generation_spans=[(int(a), int(b)) for a, b in sample.generation_spans], segment_starts=list(sample.segment_starts))
    return InteractionResult(spec, EpisodeStatus(sample.status), float(sample.reward), traj, messages=list(sample.messages or []),
                             metadata=dict(m), raw_reward=float(sample.raw_reward), task_issues=list(sample.task_issues))


def _is_rerun(episode_id: str) -> bool:
    return "~r" in episode_id


class ReplayFeed:
    """Delivers a run's journal into one pool's training streams (see the module docstring).

    Args:
        record: the run (:func:`rollout.core.journal.load_run`).
        start_version: the trainer's weight version at start (``rollout.weight_version``).
        keep_messages: ``rollout.keep_messages``, for the samples of episodes the run cancelled
            before they started (the journaled ones are used as they are).

    Attributes:
        ledger: the exactly-once ledger every delivery goes through (its counters are the pool's).
        skipped: journaled re-runs skipped because the streams never asked for them.

    Call :meth:`attach` with the streams before the first delivery.
    """

    def __init__(self, record: RunRecord, start_version: int, keep_messages: bool = True):
        self._record = record
        self._entries = record.episodes
        self._pos = 0  # the next journal entry
        self._keep = keep_messages
        self._journaled_sample: dict[str, TrainingSample] = {}  # delivered, sample not taken by the ledger yet
        self.ledger = EpisodeLedger(self._to_sample)
        self._groups: dict[str, list[EpisodeSpec]] = {}  # group id -> its specs, in submission order
        self._first_spec: dict[str, int] = {}  # group id -> index of its first spec
        for i, s in enumerate(record.specs):
            self._groups.setdefault(s.group_id, []).append(s)
            self._first_spec.setdefault(s.group_id, i)
        self._order = list(self._groups)  # group ids in submission order
        self._next_group = 0  # groups before it in self._order are registered with the streams
        self._open_specs: dict[str, tuple[int, EpisodeSpec]] = {}  # registered, not delivered: id -> (spec index, spec)
        self._journaled = {s.episode_id for s, _ in self._entries}
        self._asked: dict[str, EpisodeSpec] = {}  # re-runs the streams asked for and not delivered, in order
        self._queue: collections.deque[Delivery] = collections.deque()  # made here (cancelled before they started)
        self._cancels: collections.deque[CancelEvent] = collections.deque(record.cancels or [])
        self._draining: set[str] = set()  # what the cancel being replayed handed back, not delivered yet
        self._own = int(start_version)
        self._seen: int | None = None  # the run's trainer version at the latest delivery
        self._mode = NEED
        self._streams: TrainingStreams | None = None
        self._warned: set[str] = set()
        self.skipped = 0

    def attach(self, streams: TrainingStreams) -> None:
        """The streams this feed delivers into (it registers groups and abandons them there)."""
        self._streams = streams

    def feed(self) -> Feed:
        """The :class:`~rollout.core.pool.streams.Feed` the streams are built with."""
        return Feed(next_delivery=self.next_delivery, resubmit=self.resubmit, submit_tasks=self.submit_tasks,
                    weight_version=self.weight_version, num_outstanding=self.num_outstanding)

    # -- what the streams ask ----------------------------------------------------------------
    def weight_version(self) -> int:
        """The replay's weight version: the larger of the trainer's own and the run's trainer
        version at the latest episode delivered (see the module docstring)."""
        return self._own if self._seen is None else max(self._own, self._seen)

    @property
    def own_version(self) -> int:
        """The trainer's own weight version (``rollout.weight_version``, then its updates)."""
        return self._own

    def num_outstanding(self) -> int:
        """Episodes the run still delivers here: journal entries not delivered yet, and episodes
        of a replayed cancel waiting to be handed back."""
        return len(self._entries) - self._pos + len(self._queue)

    def submit_tasks(self, *args, **kwargs) -> list[EpisodeSpec]:
        """Refused: a replay runs nothing; its groups are the run's.

        Raises:
            RuntimeError: always.
        """
        raise RuntimeError("a replay submits nothing: its groups are the journal's (task sources are not read)")

    def resubmit(self, reruns: list[Rerun]) -> None:
        """Group-member re-runs the streams ask for: their journaled episodes become deliverable
        (nothing runs). Counted as submitted, as in a live pool."""
        for rr in reruns:
            spec = self.ledger.rerun_spec(rr, self.weight_version())
            self.ledger.submitted(spec)
            self._asked[spec.episode_id] = spec
            logger.debug("replay: the streams ask for re-run %s", spec.episode_id)

    def next_delivery(self, timeout_s: float | None = None) -> Delivery | None:
        """The next episode for the streams (``timeout_s`` is not used: nothing is waited for), or
        ``None`` when the journal has nothing (more) to deliver in the current mode (see the
        module docstring and the mode constants)."""
        while True:
            if self._queue:
                return self._queue.popleft()
            cancel = self._cancels[0] if self._cancels else None
            if cancel is not None and self._pos >= cancel.delivered:
                if self._mode in (POLL, DRAIN, UNTIL_CANCEL) or (self._mode == FLUSH and cancel.weight_version > self._own):
                    return None
                logger.info("replay: the run cancelled what was outstanding here (after %d episodes); replaying it", cancel.delivered)
                self._enact(self._cancels.popleft())
                continue
            if self._pos >= len(self._entries):
                return None
            sample, version = self._entries[self._pos]
            eid = sample.episode_id
            if self._mode == DRAIN and eid not in self._draining:
                return None
            if _is_rerun(eid) and eid not in self._asked and self._mode != RAW:
                if self._mode == POLL:
                    return None
                self._pos += 1
                self.skipped += 1
                self._log_once("skip", logging.WARNING, "replay: skipping %s and any later re-run the streams do not ask for (counted: "
                               "stats()['replay_skipped']): the run re-ran this group member, this replay's streams did not (samples() "
                               "never does; otherwise the trainer's calls differ from the run's)", eid)
                logger.debug("replay: skipping re-run %s (not asked for)", eid)
                continue
            if version is not None and version > self._own:
                if self._mode in (POLL, FLUSH):
                    return None
                self._log_once("ahead", logging.INFO, "replay: delivering episodes the run delivered at weight version %d while the trainer is at "
                                "version %d: the run's versions are followed", version, self._own)
            self._pos += 1
            return self._deliver(sample, version)

    # -- the trainer's calls -----------------------------------------------------------------
    def poll_due(self) -> int:
        """Deliver into the streams every due episode (see the module docstring), stopping at a
        cancel of the run and at a re-run not asked for; returns how many were delivered."""
        return self._pump(POLL)

    def advance(self, version: int) -> None:
        """The trainer's version becomes ``version``: first every episode the run delivered at
        the current version or before is delivered (with the run's cancels among them)."""
        if version > self._own:
            self._pump(FLUSH)
        self._own = int(version)

    def cancel(self) -> int:
        """Replay the run's next ``cancel_outstanding`` if the trainer's version has reached the
        one it was made at (see the module docstring); returns how many episodes it found
        outstanding (0 when the run made no cancel here)."""
        if self._record.cancels is None:
            self._log_once("cancels", logging.WARNING, "replay: %s predates the record of cancel_outstanding (events.jsonl): nothing is cancelled, "
                            "and the episodes the run's cancels handed back are delivered as journaled", self._record.dir)
            return 0
        cancel = self._cancels[0] if self._cancels else None
        if cancel is None or cancel.weight_version > self._own:
            logger.info("replay: cancel_outstanding: the run made no cancel here (trainer version %d); nothing is outstanding", self._own)
            return 0
        self._pump(UNTIL_CANCEL)
        n = self._enact(self._cancels.popleft())
        self._pump(DRAIN)
        return n

    def raw(self, fn: Callable[..., T]) -> Callable[..., T]:
        """``fn`` (a stream step) run in mode :data:`RAW`: every journaled episode, re-runs the
        streams did not ask for included (for the streams without groups)."""
        def call(*args):
            self._mode = RAW
            try:
                return fn(*args)
            finally:
                self._mode = NEED
        return call

    # -- internals ---------------------------------------------------------------------------
    def _pump(self, mode: str) -> int:
        assert self._streams is not None, "attach() the streams first"
        self._mode, n = mode, 0
        try:
            while self._streams.pump(None):
                n += 1
        finally:
            self._mode = NEED
        return n

    def _to_sample(self, result: InteractionResult) -> TrainingSample:
        sample = self._journaled_sample.pop(result.spec.episode_id, None)
        return sample if sample is not None else result.to_sample(messages=self._keep)

    def _expect_through(self, spec_index: int) -> None:
        """Register as submitted (with the streams and the ledger), in the run's order, every
        group whose first spec comes at or before ``spec_index``."""
        assert self._streams is not None, "attach() the streams first"
        while self._next_group < len(self._order) and self._first_spec[self._order[self._next_group]] <= spec_index:
            gid = self._order[self._next_group]
            specs = self._groups[gid]
            self._next_group += 1
            self.ledger.register(specs)  # the members' specs: the base of their re-runs
            for k, s in enumerate(specs):
                self.ledger.submitted(s)
                self._open_specs[s.episode_id] = (self._first_spec[gid] + k, s)
            self._streams.expect(specs)

    def _deliver(self, sample: TrainingSample, version: int | None) -> Delivery:
        eid = sample.episode_id
        self._expect_through(self._first_spec[sample.group_id])
        self._asked.pop(eid, None)
        self._open_specs.pop(eid, None)
        self._draining.discard(eid)
        if version is not None:
            self._seen = version if self._seen is None else max(self._seen, version)
        self._journaled_sample[eid] = sample
        return self.ledger.deliver(result_from_sample(sample), journal=False)

    def _enact(self, cancel: CancelEvent) -> int:
        """The run's ``cancel_outstanding`` (see the module docstring); returns how many episodes
        were outstanding."""
        assert self._streams is not None, "attach() the streams first"
        self._expect_through(cancel.specs - 1)
        self._streams.abandon_open_groups()
        specs = [s for i, s in self._open_specs.values() if i < cancel.specs] + list(self._asked.values())
        for spec in specs:
            if spec.episode_id in self._journaled:
                self._draining.add(spec.episode_id)
                continue
            self._asked.pop(spec.episode_id, None)
            self._open_specs.pop(spec.episode_id, None)
            result = InteractionResult.failed(spec, EpisodeStatus.CANCELLED, "cancelled")
            self._queue.append(self.ledger.deliver(result, journal=False))  # as the run did: never journaled
        self.ledger.count("episodes_cancelled_outstanding", len(specs))
        logger.info("replay: cancel_outstanding of the run: %d episode(s) outstanding (%d never started)", len(specs), len(self._queue))
        return len(specs)

    def _log_once(self, key: str, level: int, msg: str, *args) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.log(level, msg, *args)
