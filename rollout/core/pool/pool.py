"""The driver-side pool of Ray rollout actors: :class:`RolloutPool`, a facade over parts with one
job each.

:class:`RolloutPool` spreads episodes (tasks x ``n_samples_per_task``) over ``pool.num_actors``
async actors, keeps at most ``pool.max_concurrent_episodes`` in flight per actor, streams results
as they finish (no barrier), and delivers exactly one result per episode id: an episode whose
actor died is re-run (``pool.max_episode_retries`` times, then delivered as ``actor_lost``), and a
late duplicate is dropped. The parts:

* :mod:`~rollout.core.pool.actors`: Ray start-up and the actor set (``ray.remote`` is applied to
  :class:`rollout.core.worker.RolloutWorker` there and nowhere else);
* :mod:`~rollout.core.pool.cluster`: whether the actors fit the cluster, their start's deadline, a
  new local cluster's addresses (127.0.0.1); :mod:`~rollout.core.pool.fingerprint`: what software
  the driver and each actor run (compared before any episode);
* :mod:`~rollout.core.pool.scheduler`: dispatch, health pings, head-loss detection, overdue
  reclaim, retries;
* :mod:`~rollout.core.pool.ledger`: exactly-once bookkeeping, the journal, the episode counters;
* :mod:`~rollout.core.pool.streams`: results, samples, groups, exclusions, dynamic sampling;
* :mod:`~rollout.core.pool.weights`: pause / resume / update_weights_from_disk;
* :mod:`~rollout.core.pool.steps`: the lock every call runs under, and the async slices;
* :mod:`~rollout.core.pool.aio`: the async counterparts of the calls (mixed into the pool).

Trainer API (one RL loop; see ``launch/train_grpo_tiny.py`` for a complete one)::

    pool = RolloutPool(cfg).start()                   # cfg.policy.router_url resolved
    tasks = itertools.cycle(task_ids)
    for step in range(steps):
        groups = pool.collect_groups(B, tasks, abort_surplus=False)   # B kept GRPO groups
        pool.prefetch(B, tasks)                       # the next step's episodes start now
        for ex in pool.excluded(): ...                # everything kept out of training, once
        train(groups); save(path)
        pool.update_weights_from_disk(path, weight_version=step + 1)  # pause, update, continue
    pool.cancel_outstanding()
    pool.shutdown()

A trainer running its own event loop uses the async counterparts (``await
pool.collect_groups_async(B, tasks)``, ``async for g in pool.groups_async(): ...``, ``await
pool.update_weights_from_disk_async(path, v)``): :mod:`rollout.core.pool.aio` gives their
contract (every call runs under one lock; async ones in a worker thread, in slices; cancelling
the awaiting task loses nothing).

Streams (use one kind per pool): :meth:`RolloutPool.results` (raw, every episode, all statuses),
and the training streams :meth:`~RolloutPool.samples`, :meth:`~RolloutPool.groups`,
:meth:`~RolloutPool.collect_groups` and :meth:`~RolloutPool.stream`, which apply one
:class:`~rollout.core.groups.TrainingPolicy` (``rollout.train_statuses``,
``rollout.max_staleness``): what may not be trained goes to :meth:`~RolloutPool.excluded` instead.

The weight-update cycle (:meth:`~RolloutPool.pause`, :meth:`~RolloutPool.resume`,
:meth:`~RolloutPool.update_weights_from_disk`) closes every actor's generation gate, then calls
SGLang's ``/pause_generation``, ``/continue_generation`` and ``/update_weights_from_disk`` on
every worker the router lists. In-flight episodes are held, not ended; a turn the pause
interrupted becomes what ``rollout.partial_rollout`` says.
"""

from __future__ import annotations

import itertools
import logging
from typing import Any, Iterable, Iterator

from rollout.core.config import Config
from rollout.core.environment import domain_key
from rollout.core.eventloop import ray_env_vars
from rollout.core.groups import Excluded, Rerun, TrainingPolicy
from rollout.core.pool.actors import ActorSet, RemoteRolloutWorker  # noqa: F401  (re-exported)
from rollout.core.pool.aio import AsyncPoolAPI
from rollout.core.pool.errors import NoHealthyActorError, RayHeadLostError, RunAborted, RunInterrupted  # noqa: F401
from rollout.core.pool.ledger import POOL_COUNTERS, EpisodeLedger  # noqa: F401
from rollout.core.pool.raymetrics import RayRecorder
from rollout.core.pool.scheduler import HEAD_LOST_AFTER_S, OVERDUE_GRACE_S, Scheduler  # noqa: F401
from rollout.core.pool.specs import episode_seed, make_specs  # noqa: F401
from rollout.core.pool.steps import END, StepRunner
from rollout.core.pool.streams import Feed, TrainingStreams
from rollout.core.pool.weights import PAUSE_MODES, PauseReport, WeightCycleAPI, WeightSync  # noqa: F401
from rollout.core.records import EpisodeSpec, EpisodeStatus, InteractionResult, TrainingSample
from rollout.core.tasks import TaskSelection, check_distinct_task_ids, check_known_task_ids
from rollout.core.telemetry.recorder import NULL_RECORDER

logger = logging.getLogger(__name__)


class RolloutPool(WeightCycleAPI, AsyncPoolAPI):
    """Ray actor pool running tau2 episodes (see the module docstring); the weight-update calls come
    from :class:`~rollout.core.pool.weights.WeightCycleAPI`, the async calls from :class:`~rollout.core.pool.aio.AsyncPoolAPI`.

    Args:
        cfg: the whole config; ``cfg.policy.router_url`` must be set (:func:`rollout.open_pool`
            resolves it from the local stack when ``local.enabled``).

    Attributes:
        cfg: the config.
        recorder: the driver's metrics (a ``RayRecorder`` tagged with the domain): episodes
            submitted, delivered by status, their duration, turns and reward, the queue, the
            episodes in flight per actor, retries, exclusions, groups, weight updates and
            pauses. Each actor records its own (docs/observability.md). With
            ``pool.metrics=false``, ``NULL_RECORDER`` here and in the actors: nothing is recorded.
        task_selection: the tasks :func:`rollout.open_pool` selected (run, skipped), else ``None``.

    Raises:
        ValueError: ``policy.router_url`` is not set.
    """

    def __init__(self, cfg: Config):
        if not cfg.policy.router_url:
            raise ValueError("policy.router_url must be resolved before starting the pool")
        self.cfg = cfg
        self.task_selection: TaskSelection | None = None  # set by open_pool
        # pool.metrics=false: the null recorder, here and in the actors
        self.recorder = RayRecorder({"domain": domain_key(cfg.env.benchmark, cfg.env.domain)}) if cfg.pool.metrics else NULL_RECORDER
        self._actors = ActorSet(cfg)
        keep = cfg.rollout.keep_messages
        self._ledger = EpisodeLedger(lambda result: result.to_sample(messages=keep), recorder=self.recorder,
                                     weight_version=lambda: self._weights.weight_version, task_issues=lambda t: self._actors.task_issues.get(t, []))
        self._weights = WeightSync(cfg, self._actors, healthy=lambda: self._scheduler.healthy(), recorder=self.recorder)
        self._scheduler = Scheduler(cfg.pool, self._actors, self._ledger, on_actor_back=self._weights.actor_back, recorder=self.recorder)
        self._streams = TrainingStreams(cfg, Feed(next_delivery=self._scheduler.next_delivery, resubmit=self._resubmit,
                                                  submit_tasks=self.submit_tasks, weight_version=lambda: self._weights.weight_version,
                                                  num_outstanding=lambda: self.num_outstanding), recorder=self.recorder)
        # every call commits the journal before it returns: what it delivered is durable first
        self._runner = StepRunner(progress=lambda: self._ledger.counts["episodes_delivered"], on_release=self._ledger.commit,
                                  on_write_error=self._scheduler.stop_on_write_error)
        self._batch_counter = itertools.count()
        self._launched = False  # the actors were created (start(wait=False))
        self._started = False  # ... and are ready

    @property
    def actors(self) -> list:
        """The Ray actor handles, in actor order (empty before :meth:`start` and after :meth:`shutdown`)."""
        return self._actors.actors

    @property
    def policy(self) -> TrainingPolicy:
        """The training policy every training stream applies."""
        return self._streams.policy

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self, wait: bool = True) -> "RolloutPool":
        """Connect to (or start) Ray and create the actors; returns once every actor is ready.

        Args:
            wait: ``False``: return as soon as the actors are created (they start in their own
                processes meanwhile); a later ``start()`` waits for them. :func:`rollout.open_pool`
                overlaps the local stack's start-up and the preflight checks with the actors' this way.

        Raises:
            rollout.core.startup.PreflightError: one line, before any episode (:meth:`ActorSet.launch`, :meth:`ActorSet.wait_ready`):
                a bad tokenizer or Ray address, a new local Ray that did not start, actors that cannot fit the cluster or
                are not ready within ``pool.actor_start_timeout_s``, or that run other software than the driver.
            RuntimeError: an actor failed to start (e.g. bad tokenizer or chat template), with
                the actor's error; or an actor runs another event loop than ``pool.event_loop``
                (uvloop missing on its node; the actors are stopped).
        """
        with self._runner.lock:
            if not self._started and not self._launched:
                self._actors.launch(ray_env_vars(self.cfg.pool.event_loop))
                self._launched = True
            if wait and not self._started:
                self._actors.wait_ready()
                self._scheduler.reset()
                self._weights.publish()  # Ray is up: the first records that reach it
                self._started = True
        return self

    def arm_breakers(self) -> None:
        """Tell every actor that the backend was seen answering (the preflight's router check
        passed after the actors started, :func:`rollout.open_pool`): an outage from the first
        call on is waited for, as when an actor sees the router up at its own start."""
        with self._runner.lock:
            self._actors.arm_breakers()

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Stop the actors within about ``timeout_s`` seconds: each cancels its running episodes
        (aborting their requests on the workers) and closes; then the actors are killed.
        Undelivered episodes are forgotten (see :meth:`abort_outstanding` to get them). Leaves
        Ray itself running."""
        with self._runner.lock:
            self._actors.close(timeout_s, graceful=self._started)  # created and not ready: killed at once
            self._scheduler.clear()
            self._weights.close()
            self._started = self._launched = False

    def __enter__(self) -> "RolloutPool":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.shutdown()

    # -- submission --------------------------------------------------------------------------
    def submit(self, specs: Iterable[EpisodeSpec]) -> list[EpisodeSpec]:
        """Queue episodes. All samples of a group must be submitted in one call (the group's size
        is the number of its specs here). Returns the specs.

        Specs are queued as they are: one whose task the domain lacks runs and is delivered as
        ``env_error`` (:meth:`submit_tasks` refuses such a task instead).

        Raises:
            ValueError: an episode id or a group id was already submitted (nothing is queued).
        """
        specs = list(specs)
        with self._runner.lock:
            self._ledger.check_new(specs)
            self._streams.expect(specs)  # raises on a group submitted before
            self._ledger.register(specs)
            for s in specs:
                self._queue(s)
            self._scheduler.dispatch()
        return specs

    def submit_tasks(self, task_ids: Iterable[str], n_samples_per_task: int | None = None, weight_version: int | None = None) -> list[EpisodeSpec]:
        """Queue ``n_samples_per_task`` episodes of each task (defaults from ``rollout``; the
        episodes' ``weight_version`` defaults to the trainer's current one).

        Each call gets a fresh group prefix so the same task can be submitted again later.

        Raises:
            ValueError: a task id listed more than once (one group per task per call: their group
                ids would collide), one line naming the ids; nothing is queued.
            rollout.core.config.TaskSelectionError: a task the domain lacks (checked once the
                actors are ready: they know its tasks), one line with the valid ids; nothing is
                queued (a ``ValueError`` and a ``KeyError``).
        """
        r = self.cfg.rollout
        task_ids = [str(t) for t in task_ids]
        check_distinct_task_ids(task_ids, key="RolloutPool.submit_tasks")
        check_known_task_ids(task_ids, self._actors.task_ids, f"{self.cfg.env.benchmark} domain {self.cfg.env.domain}",
                             key="RolloutPool.submit_tasks")
        with self._runner.lock:
            specs = make_specs(self.cfg.env.domain, task_ids, n_samples_per_task or r.n_samples_per_task, seed=r.seed,
                               weight_version=self.weight_version if weight_version is None else weight_version,
                               prefix=f"b{next(self._batch_counter)}:")
            return self.submit(specs)

    def _queue(self, spec: EpisodeSpec) -> None:
        self._ledger.submitted(spec)
        self._scheduler.enqueue(spec)

    def _resubmit(self, reruns: list[Rerun]) -> None:
        """Queue group-member re-runs (new episode ids, first attempts, the current version)."""
        for rr in reruns:
            spec = self._ledger.rerun_spec(rr, self.weight_version)
            logger.info("episode %s: re-running group member as %s", spec.episode_id.split("~r", 1)[0], spec.episode_id)
            self._queue(spec)
        self._scheduler.dispatch()

    @property
    def submitted_ids(self) -> frozenset[str]:
        """Every episode id submitted so far (re-runs included): each is delivered exactly once."""
        with self._runner.lock:
            return self._ledger.submitted_ids

    @property
    def num_outstanding(self) -> int:
        """Episodes submitted but not yet delivered."""
        return self._scheduler.num_outstanding

    def episodes_in_flight(self, actor: int | None = None) -> list[str]:
        """The ids of the episodes running on actor ``actor`` (``None``: on every actor)."""
        with self._runner.lock:
            return [spec.episode_id for spec, i, _ in self._scheduler.in_flight.values() if actor is None or i == actor]

    def interrupt(self, reason: str) -> None:
        """Ask the pool to stop: the stream call in progress (or the next one) cancels every
        undelivered episode on the actors (their requests are aborted on the workers) and raises
        :class:`RunInterrupted` with them, within about a second. Safe to call from a signal
        handler or another thread: it only sets a flag."""
        self._scheduler.interrupt(reason)

    # -- the streams -------------------------------------------------------------------------
    def results(self, timeout_s: float | None = None) -> Iterator[InteractionResult]:
        """Yield each submitted episode's result once, in completion order, until none is left.

        The raw stream: every status, no training policy (for the training streams see
        :meth:`samples` and :meth:`groups`).

        Args:
            timeout_s: give up after this long without any result (``None``: wait).

        Raises:
            TimeoutError: no result arrived within ``timeout_s``.
            RunAborted: the run cannot go on (its kinds: :class:`RunInterrupted`,
                :class:`NoHealthyActorError`, :class:`RayHeadLostError`), with the undelivered specs.
        """
        s = self._streams
        while (r := self._runner.next(s.ensure_result, s.take_result, timeout_s)) is not END:
            yield r

    def samples(self, timeout_s: float | None = None) -> Iterator[TrainingSample]:
        """Yield each trainable sample as soon as its episode ends (no grouping, no re-runs).

        A sample whose status is not in ``rollout.train_statuses``, or that is stale beyond
        ``rollout.max_staleness``, is not yielded: it goes to :meth:`excluded`. Raises as
        :meth:`results`.
        """
        s = self._streams
        while (x := self._runner.next(s.ensure_sample, s.take_sample, timeout_s)) is not END:
            yield x

    def groups(self, timeout_s: float | None = None) -> Iterator[list[TrainingSample]]:
        """Yield each complete, trainable group (all episodes of one task in one submission,
        sorted by ``sample_index``) as soon as it is complete: every sample of its episodes
        (``rollout.sample_mode``: one per episode, or several, each episode's together; a GRPO
        trainer computes one advantage per episode, :func:`rollout.core.groups.episode_advantages`).

        A member that may not be trained is re-run or its group dropped
        (``rollout.on_group_failure``), groups with equal rewards are dropped with
        ``rollout.filter_groups=zero_variance``; everything kept out goes to :meth:`excluded`.
        Raises as :meth:`results`.
        """
        yield from self.stream(timeout_s)  # type: ignore[misc]  (no Excluded without excluded=True)

    def stream(self, timeout_s: float | None = None, excluded: bool = False) -> Iterator[list[TrainingSample] | Excluded]:
        """Like :meth:`groups`, and with ``excluded=True`` also every :class:`Excluded` sample in
        delivery order (what the CLI writes to its files), until nothing is outstanding."""
        s = self._streams
        while (x := self._runner.next(lambda t: s.ensure_item(t, excluded), lambda: s.take_item(excluded), timeout_s)) is not END:
            yield x

    def excluded(self) -> Iterator[Excluded]:
        """Everything kept out of training since the last call, once each: infrastructure
        failures (reason = status), stale episodes, filtered, dropped and cancelled groups."""
        while (e := self._streams.take_excluded()) is not None:
            yield e

    # -- dynamic sampling --------------------------------------------------------------------
    def prefetch(self, num_groups: int, task_source: Iterator[str], n_samples_per_task: int | None = None, in_flight: bool = False) -> int:
        """Submit tasks from ``task_source`` (an iterator, e.g. ``itertools.cycle(task_ids)``)
        until at least ``num_groups`` groups are complete or on their way.

        With ``in_flight``, keep ``num_groups`` groups *running* as long as fewer than
        ``num_groups`` complete ones wait to be handed out: rollout goes on while a trainer
        trains, and the buffer of complete groups stays about one batch deep (fresh data; older
        groups are dropped at hand-over by ``rollout.max_staleness``). Returns how many groups
        were submitted.
        """
        return self._runner.call(self._streams.prefetch, num_groups, task_source, n_samples_per_task, in_flight)

    def poll(self, timeout_s: float = 0.0) -> int:
        """Deliver into the training streams the episodes that end within ``timeout_s`` seconds,
        dispatching queued ones as slots free up; returns how many were delivered.

        For trainers that overlap training with rollout: the pool dispatches only while it is
        called, so call this (with :meth:`prefetch`) while the trainer works, e.g. between polls
        of a training future; the groups then come from :meth:`collect_groups`.
        """
        return self._runner.call(self._streams.poll, timeout_s)

    def collect_groups(self, num_groups: int, task_source: Iterator[str] | None = None, *, n_samples_per_task: int | None = None,
                       abort_surplus: bool = True, max_outstanding_groups: int | None = None,
                       timeout_s: float | None = None) -> list[list[TrainingSample]]:
        """Return ``num_groups`` kept groups (as :meth:`groups` makes them), submitting tasks from
        ``task_source`` (an iterator) as long as fewer than ``max_outstanding_groups`` groups are
        complete or on their way: groups dropped by ``rollout.filter_groups`` or by failures are
        replaced (DAPO's dynamic sampling), and the actors are kept busy meanwhile (slime's
        over-sampling), so one slow group does not hold the batch up.

        Groups already submitted (e.g. by :meth:`prefetch`) are used first. With
        ``abort_surplus``, the episodes still running once ``num_groups`` are kept are cancelled
        (:meth:`cancel_outstanding`); otherwise they go on and count toward the next call.
        ``max_outstanding_groups`` defaults to the pool's capacity in groups
        (``num_actors * max_concurrent_episodes // n_samples_per_task``), and is never below the
        number of groups still needed. While every complete group is filtered, a WARNING is
        logged every :data:`~rollout.core.pool.streams.FILTERED_WARN_EVERY` of them.

        Returns:
            ``num_groups`` groups, or fewer when ``task_source`` ran out (logged).

        Raises:
            ValueError: ``num_groups < 1``.
            TimeoutError: no episode ended within ``timeout_s``.
        """
        return self._collect_groups(num_groups, task_source, n_samples_per_task, abort_surplus, max_outstanding_groups, timeout_s)

    def cancel_outstanding(self, timeout_s: float | None = 120.0) -> int:
        """Cancel every episode not delivered yet and deliver it (as ``cancelled`` unless it
        ended first); open groups are abandoned (their members go to :meth:`excluded` as
        ``group_cancelled``). Complete groups not handed out yet are kept. Returns how many
        episodes were outstanding.

        Raises:
            TimeoutError: an actor did not return a cancelled episode within ``timeout_s``.
        """
        with self._runner.lock:
            n = self.num_outstanding
            self._ledger.journal_cancel(self.weight_version)  # where a replay cancels (rollout.core.pool.replay)
            self._streams.abandon_open_groups()
            for spec in self._scheduler.take_pending():  # never started: cancelled here (not journaled: a resume runs them)
                r = InteractionResult.failed(spec, EpisodeStatus.CANCELLED, "cancelled")
                self._streams.add(self._ledger.deliver(r, journal=False))
            self._actors.cancel(self._scheduler.in_flight_by_actor())
            while self._streams.pump(timeout_s):
                pass
            self._ledger.count("episodes_cancelled_outstanding", n)
            return n

    def abort_outstanding(self, cancel_on_actors: bool = True, timeout_s: float = 5.0) -> list[EpisodeSpec]:
        """Stop every episode not delivered yet *without delivering it* (an interrupted run:
        SIGINT, SIGTERM, a lost Ray head): the actors cancel them and abort their requests on the
        workers (within ``timeout_s``), nothing is journaled, open groups stay open. Returns the
        undelivered specs (first attempts), for a later ``--resume`` or re-submission."""
        return self._runner.call(self._scheduler.abort, cancel_on_actors, timeout_s)

    # -- the run journal ---------------------------------------------------------------------
    def attach_journal(self, journal) -> None:
        """Record into ``journal`` (a :class:`rollout.core.journal.RunJournal`) every spec submitted
        and every episode delivered, as it happens, on every stream."""
        self._runner.call(self._ledger.attach_journal, journal)

    def restore(self, journal) -> list[EpisodeSpec]:
        """Resume a journaled run: the delivered samples go into the training streams again (in
        their delivery order, so groups, re-runs and filters come out as they would have), and
        every journaled spec not delivered is submitted. Call before any other submission.

        Returns:
            The specs submitted (the episodes that were in flight or queued when the run stopped,
            and re-runs of failed group members that had not been delivered).

        Raises:
            RuntimeError: the pool already submitted episodes.
        """
        with self._runner.lock:
            if self._ledger.any_submitted:
                raise RuntimeError("restore() must come before any submission")
            self._streams.expect(journal.specs)
            todo = self._ledger.restore(journal, self._streams.replay, self.weight_version)
            for s in todo:
                self._queue(s)
            self._scheduler.dispatch()
        logger.info("resumed from %s: %d episode(s) delivered before, %d to run", journal.dir, len(journal.delivered), len(todo))
        return todo

    @classmethod
    def replay(cls, output_dir: str, cfg: Config | None = None):
        """A :class:`rollout.core.pool.replay.ReplayPool`: this API over the finished run in
        ``output_dir`` (its journal), delivering the run's episodes through the same training
        streams, in the run's order, without Ray, a router or any episode running.

        Args:
            output_dir: the run's ``rollout.output_dir``.
            cfg: the config to replay with (``None``: the run's ``config.yaml``).

        Raises:
            rollout.core.journal.JournalError: ``output_dir`` is not a run folder.
        """
        from rollout.core.pool.replay import ReplayPool

        return ReplayPool.open(output_dir, cfg)

    # -- introspection -----------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Running totals: episodes submitted / delivered / outstanding, per status, interrupted
        and continued episodes, group outcomes (kept, filtered, dropped, cancelled, members
        re-run), exclusions by reason, weight updates, the current weight version.

        Every key of :data:`POOL_COUNTERS`, ``status_<status>`` for every status and the group
        totals (:data:`rollout.core.groups.GROUP_COUNTERS`) is present from the start, 0 until counted
        (a resumed run with nothing left to run has submitted nothing in this session)."""
        with self._runner.lock:
            out: dict[str, Any] = dict(self._ledger.counts)
            out.update(self._weights.counts)
            out.update(self._streams.counts)
            out.update(episodes_outstanding=self.num_outstanding, weight_version=self.weight_version)
            return out

    def worker_infos(self) -> list[dict]:
        """Each actor's :meth:`rollout.core.worker.RolloutWorker.info`, in actor order."""
        return self._actors.infos()

    def loop_lags(self, reset: bool = False, timeout_s: float | None = 60.0) -> list[dict]:
        """Each actor's event-loop lag, in actor order (:meth:`rollout.core.worker.RolloutWorker.loop_lag`:
        ``{"samples", "interval_ms", "p50_ms", "p99_ms", "max_ms", "mean_ms", "pid", "event_loop"}``, milliseconds;
        ``event_loop``: ``"uvloop"`` or ``"asyncio"``). The probes start at the first call (which returns no samples).

        Args:
            reset: each actor forgets its samples after reading them (starts a measured window).
            timeout_s: bound on the wait for the actors' answers, seconds.

        Raises:
            ray.exceptions.GetTimeoutError: an actor did not answer within ``timeout_s``.
            ray.exceptions.RayActorError: an actor is dead.
        """
        return self._actors.loop_lags(reset, timeout_s)
