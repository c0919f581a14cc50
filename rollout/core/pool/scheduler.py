"""Episode scheduling on the rollout actors: dispatch, health pings, head-loss detection, overdue
reclaim and retries.

:class:`Scheduler` keeps at most ``pool.max_concurrent_episodes`` episodes in flight per healthy
actor (the least loaded first) and turns each finished Ray task into one delivery through the
:class:`~rollout.core.pool.ledger.EpisodeLedger`. An attempt whose actor died, restarted, lost
its object or stopped answering (:data:`OVERDUE_GRACE_S` past ``pool.episode_timeout_s``) is
re-queued with a new ``attempt`` number, up to ``pool.max_episode_retries`` times, then delivered
as ``actor_lost``; its actor gets no work until it answers a health ping. The run ends with a
:class:`~rollout.core.pool.errors.RunAborted` when no actor is healthy for
``pool.no_actor_timeout_s``, when the Ray head is unreachable for :data:`HEAD_LOST_AFTER_S`, or
when :meth:`Scheduler.interrupt` was called.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import re
import time
from typing import Callable

import ray
from ray.exceptions import OutOfMemoryError, RayActorError, RayTaskError

from rollout.core.config import PoolConfig
from rollout.core.jsonl import OutputWriteError
from rollout.core.pool import raycalls
from rollout.core.pool.actors import ActorSet
from rollout.core.pool.errors import JournalWriteError, NoHealthyActorError, RayHeadLostError, RunInterrupted
from rollout.core.pool.ledger import Delivery, EpisodeLedger
from rollout.core.records import EpisodeSpec, EpisodeStatus, InteractionResult
from rollout.core.telemetry import registry as R
from rollout.core.telemetry.recorder import NULL_RECORDER, Instrument, Recorder

logger = logging.getLogger(__name__)

_OOM = re.compile(r"low on memory|out of memory|OUT_OF_MEMORY", re.IGNORECASE)


def death_cause(e: BaseException) -> str:
    """The class name of a Ray error that ended an episode's task, and, when Ray's memory monitor
    killed the worker (Ray's message says its node ran low on memory), that cause."""
    if isinstance(e, OutOfMemoryError) or _OOM.search(str(e)):
        return f"{type(e).__name__} (killed by Ray's memory monitor: its node ran low on memory)"
    return type(e).__name__

# The Ray head (GCS) unreachable this long ends the run (Ray itself kills a driver whose GCS is
# gone for 60 s, gcs_rpc_server_reconnect_timeout_s, before it could write anything).
HEAD_LOST_AFTER_S = 10.0
# A task still out this long past pool.episode_timeout_s is treated as lost with its actor
# (the actor enforces the timeout itself; this covers an actor that stopped answering).
OVERDUE_GRACE_S = 120.0


class Scheduler:
    """Dispatch and retries of one pool's episodes (see the module docstring).

    Args:
        pool_cfg: the ``pool`` config section.
        actors: the actor set (started before anything is dispatched).
        ledger: the exactly-once ledger every delivery goes through.
        on_actor_back: called with an actor's index when a down actor answers its health ping
            again (e.g. to close its generation gate while the pool is paused).
        recorder: where the queue depth, the episodes in flight per actor and the retries are
            recorded (``None``: nowhere).
    """

    def __init__(self, pool_cfg: PoolConfig, actors: ActorSet, ledger: EpisodeLedger, on_actor_back: Callable[[int], None],
                 recorder: Recorder | None = None):
        self.cfg = pool_cfg
        self._actors = actors
        self._ledger = ledger
        self._on_actor_back = on_actor_back
        self._pending: collections.deque[EpisodeSpec] = collections.deque()
        self._inflight: dict[ray.ObjectRef, tuple[EpisodeSpec, int, float]] = {}  # ref -> (spec, actor, dispatched at)
        self._load: list[int] = []
        # Actors whose last task failed: index -> (health-ping ref or None, time of next ping).
        self._down: dict[int, tuple[ray.ObjectRef | None, float]] = {}
        self._late: collections.deque[InteractionResult] = collections.deque()  # reclaimed, out of retries
        self._no_actor_since: float | None = None
        self._head_unreachable_since: float | None = None
        self._head_checked_at = 0.0
        self._interrupt_reason: str | None = None
        self._recorder = recorder if recorder is not None else NULL_RECORDER
        self._queue_gauge = self._recorder.bind(R.QUEUE_DEPTH)
        self._retries = self._recorder.bind(R.EPISODE_RETRIES)
        self._load_gauges: list[Instrument] = []
        self._published: list[int] = []  # queue depth, then each actor's load, as last recorded (-1: never)

    def reset(self) -> None:
        """Size the per-actor loads to the actor set (after it started)."""
        self._load = [0] * len(self._actors.actors)
        self._load_gauges = [self._recorder.bind(R.EPISODES_IN_FLIGHT, actor=str(i)) for i in range(len(self._load))]
        self._published = [-1] * (1 + len(self._load))
        self._publish()

    def _publish(self) -> None:
        """Record the queue depth and the per-actor loads that changed since last recorded."""
        now = [len(self._pending), *self._load]
        if now == self._published:
            return
        for k, (n, was) in enumerate(zip(now, self._published)):
            if n != was:
                (self._queue_gauge if k == 0 else self._load_gauges[k - 1]).record(n)
        self._published = now

    # -- what is outstanding -----------------------------------------------------------------
    @property
    def num_outstanding(self) -> int:
        """Episodes queued, in flight, or ended and not delivered yet."""
        return len(self._pending) + len(self._inflight) + len(self._late)

    @property
    def in_flight(self) -> dict[ray.ObjectRef, tuple[EpisodeSpec, int, float]]:
        """A copy of the tasks out: ref -> (spec, actor index, ``time.monotonic()`` at dispatch)."""
        return dict(self._inflight)

    def in_flight_by_actor(self) -> dict[int, list[str]]:
        """Actor index -> the episode ids running there."""
        by_actor: dict[int, list[str]] = collections.defaultdict(list)
        for spec, i, _ in self._inflight.values():
            by_actor[i].append(spec.episode_id)
        return dict(by_actor)

    def healthy(self) -> list[int]:
        """The indices of the actors not marked down."""
        return [i for i in range(len(self._actors.actors)) if i not in self._down]

    # -- submission --------------------------------------------------------------------------
    def enqueue(self, spec: EpisodeSpec) -> None:
        """Queue ``spec`` behind the others (dispatched by :meth:`dispatch`)."""
        self._pending.append(spec)

    def take_pending(self) -> list[EpisodeSpec]:
        """Remove and return every queued spec (not dispatched yet)."""
        out = list(self._pending)
        self._pending.clear()
        self._publish()
        return out

    def dispatch(self) -> None:
        """Start queued episodes on the least-loaded healthy actors while one has a free slot."""
        try:
            self._dispatch()
        finally:
            self._publish()

    def _dispatch(self) -> None:
        cap = self.cfg.max_concurrent_episodes
        while self._pending and self._actors.actors:
            healthy = self.healthy()
            if not healthy:
                return
            i = min(healthy, key=lambda k: self._load[k])
            if self._load[i] >= cap:
                return
            spec = self._pending.popleft()
            ref = self._actors.run(i, spec, self.cfg.episode_timeout_s)
            self._inflight[ref] = (spec, i, time.monotonic())
            self._load[i] += 1

    # -- delivery ----------------------------------------------------------------------------
    def next_delivery(self, timeout_s: float | None = None) -> Delivery | None:
        """The next episode delivered (each episode id once, through the ledger), or ``None``
        when nothing is outstanding.

        Raises:
            TimeoutError: no episode ended within ``timeout_s`` seconds.
            RunInterrupted: :meth:`interrupt` was called (the episodes went back, undelivered).
            NoHealthyActorError: no actor was healthy for ``pool.no_actor_timeout_s``.
            RayHeadLostError: the Ray head stopped answering.
        """
        t0 = time.monotonic()
        while self._pending or self._inflight or self._late:
            if self._late:
                result = self._late.popleft()
                if self._ledger.is_delivered(result.spec.episode_id):
                    continue
                return self._deliver(result)
            self._check_interrupt()
            self.dispatch()
            self._check_health()
            self._ping_down_actors()
            pings = {ref: i for i, (ref, _) in self._down.items() if ref is not None}
            waitables = list(self._inflight) + list(pings)
            ready = []
            if waitables:
                wait_s = 1.0 if (self._down or timeout_s is None) else min(timeout_s, 1.0)
                try:
                    ready, _ = raycalls.wait(waitables, num_returns=1, timeout=wait_s)
                except Exception as e:  # Ray itself failing (e.g. the head going away)
                    logger.warning("ray.wait failed: %r", e)
                    time.sleep(0.5)
                    continue
            else:
                time.sleep(0.2)  # every actor is down and waiting for its next health ping
            for ref in ready:
                if ref in pings:
                    self._health_answer(pings[ref], ref)
                    continue
                if ref not in self._inflight:
                    continue
                spec, i, _ = self._inflight.pop(ref)
                self._load[i] -= 1
                self._publish()
                result = self._collect(ref, spec, i)
                if result is None:
                    continue
                if self._ledger.is_delivered(spec.episode_id):
                    logger.warning("episode %s: dropping a duplicate result", spec.episode_id)
                    continue
                return self._deliver(result)
            self._reclaim_overdue()
            if timeout_s is not None and time.monotonic() - t0 > timeout_s:
                raise TimeoutError(f"no episode finished within {timeout_s}s ({len(self._inflight)} in flight)")
        return None

    def _deliver(self, result: InteractionResult):
        """The ledger's delivery of ``result``; when the journal refuses its line, the result is
        kept back (so that :meth:`abort` hands its spec back) and the error propagates."""
        try:
            return self._ledger.deliver(result)
        except OutputWriteError:
            self._late.appendleft(result)
            raise

    def _collect(self, ref, spec: EpisodeSpec, actor_index: int) -> InteractionResult | None:
        """The result of a finished ``run`` task, or ``None`` when its attempt failed and was
        re-queued. Every Ray error is handled (the actor died or restarted, the object was lost,
        its owner died, the task was cancelled, a serialisation failure, ...)."""
        try:
            return raycalls.get(ref, timeout=60)
        except RayActorError as e:
            err = f"actor lost: {death_cause(e)}"
        except RayTaskError as e:  # RolloutWorker.run never raises; this is a serialisation or Ray failure
            err = f"actor task failed: {str(e)[:300]}"
        except Exception as e:  # ObjectLostError, OwnerDiedError, TaskCancelledError, GetTimeoutError, OutOfMemoryError, ...
            err = f"{death_cause(e)}: {str(e)[:300]}"
        return self._fail_attempt(spec, actor_index, err)

    def _fail_attempt(self, spec: EpisodeSpec, actor_index: int, err: str) -> InteractionResult | None:
        """Re-queue a failed attempt (a new ``attempt`` number gives its requests fresh ids; the
        dead attempt's requests were aborted by the servers when its connections closed), or
        type it ``actor_lost`` when the retries are spent."""
        if actor_index not in self._down:
            self._down[actor_index] = (None, time.monotonic())  # dispatch nothing to it until it answers a ping
        if spec.attempt < self.cfg.max_episode_retries:
            retry = dataclasses.replace(spec, attempt=spec.attempt + 1)
            logger.warning("episode %s: %s; retrying (attempt %d)", spec.episode_id, err, retry.attempt)
            self._ledger.count("episode_retries")
            self._retries.record(1)
            self._pending.appendleft(retry)
            return None
        logger.error("episode %s: %s; out of retries", spec.episode_id, err)
        return InteractionResult.failed(spec, EpisodeStatus.ACTOR_LOST, "actor_lost", err)

    def _reclaim_overdue(self) -> None:
        """An episode task out longer than ``pool.episode_timeout_s`` + :data:`OVERDUE_GRACE_S`
        is lost with its actor (the actor would have ended it itself): retried or typed."""
        limit = self.cfg.episode_timeout_s + OVERDUE_GRACE_S
        now = time.monotonic()
        for ref, (spec, i, t) in list(self._inflight.items()):
            if now - t > limit:
                del self._inflight[ref]
                self._load[i] -= 1
                self._publish()
                try:
                    ray.cancel(ref, force=False)
                except Exception as e:
                    logger.debug("ray.cancel: %r", e)
                result = self._fail_attempt(spec, i, f"no answer from actor {i} {limit:.0f}s after dispatch")
                if result is not None:
                    self._late.append(result)  # delivered by the next next_delivery

    # -- health ------------------------------------------------------------------------------
    def _ping_down_actors(self) -> None:
        now = time.monotonic()
        for i, (ref, when) in list(self._down.items()):
            if ref is None and now >= when:
                self._down[i] = (self._actors.ping(i), now)

    def _health_answer(self, i: int, ref) -> None:
        try:
            raycalls.get(ref, timeout=30)
        except Exception:  # any Ray error: not back yet
            self._down[i] = (None, time.monotonic() + 1.0)  # still restarting: ask again in 1 s
            return
        logger.info("actor %d is back", i)
        del self._down[i]
        self._on_actor_back(i)

    def _check_health(self) -> None:
        """End the run (raising :class:`RunAborted`) when no actor has been healthy for
        ``pool.no_actor_timeout_s`` or the Ray head has been unreachable for
        :data:`HEAD_LOST_AFTER_S`; the undelivered episodes go with the error."""
        now = time.monotonic()
        n_actors = len(self._actors.actors)
        if n_actors and len(self._down) >= n_actors:
            self._no_actor_since = self._no_actor_since or now
            if now - self._no_actor_since > self.cfg.no_actor_timeout_s:
                undelivered = self.abort(cancel_on_actors=False)
                raise NoHealthyActorError(
                    f"no rollout actor was healthy for {self.cfg.no_actor_timeout_s:.0f}s (pool.no_actor_timeout_s); "
                    f"{len(undelivered)} episode(s) not delivered", undelivered)
        else:
            self._no_actor_since = None
        if now - self._head_checked_at < (1.0 if self._down or self._head_unreachable_since else 5.0):
            return
        self._head_checked_at = now
        if self._actors.head_reachable():
            self._head_unreachable_since = None
            return
        self._head_unreachable_since = self._head_unreachable_since or now
        logger.warning("the Ray head (GCS %s) does not answer", self._actors.gcs_address)
        if now - self._head_unreachable_since > HEAD_LOST_AFTER_S:
            undelivered = self.abort(cancel_on_actors=False)
            self._actors.forget()
            raise RayHeadLostError(
                f"the Ray head (GCS {self._actors.gcs_address}) stopped answering for {HEAD_LOST_AFTER_S:.0f}s; "
                f"{len(undelivered)} episode(s) not delivered", undelivered)

    # -- stopping ----------------------------------------------------------------------------
    def interrupt(self, reason: str) -> None:
        """Make the delivery in progress (or the next) end the run with :class:`RunInterrupted`.
        Only sets a flag: safe from a signal handler or another thread."""
        self._interrupt_reason = reason

    def _check_interrupt(self) -> None:
        if self._interrupt_reason is not None:
            reason, self._interrupt_reason = self._interrupt_reason, None
            undelivered = self.abort()
            raise RunInterrupted(f"{reason}: {len(undelivered)} episode(s) not delivered", undelivered)

    def abort(self, cancel_on_actors: bool = True, timeout_s: float = 5.0) -> list[EpisodeSpec]:
        """Forget every episode not delivered yet, cancelling the running ones on their actors
        (within ``timeout_s`` seconds, best effort) unless ``cancel_on_actors`` is false; returns
        the undelivered specs (first attempts), counted by the ledger."""
        specs = [s for s in self._pending] + [s for s, _, _ in self._inflight.values()] + [r.spec for r in self._late]
        if cancel_on_actors and self._inflight and self._actors.actors:
            self._actors.cancel_within(self.in_flight_by_actor(), timeout_s)
        self._pending.clear()
        self._inflight.clear()
        self._late.clear()
        self._load = [0] * len(self._actors.actors)
        self._publish()
        return self._ledger.hand_back(specs)

    def stop_on_write_error(self, e: OutputWriteError) -> JournalWriteError:
        """The journal refused a write (``e``): stop the run, every undelivered episode cancelled
        on its actor (:meth:`abort`), and return the error that says so (the pool's runner raises
        it under its lock, :class:`~rollout.core.pool.steps.CommitLock`)."""
        undelivered = self.abort(cancel_on_actors=True)
        logger.error("the run journal cannot be written (%s): the run stops, %d episode(s) not delivered", e, len(undelivered))
        return JournalWriteError(f"{e}; the run stops with {len(undelivered)} episode(s) not delivered (every episode journaled "
                                 "before is kept): free space, then resume", undelivered, str(e.path), e.disk_full)

    def clear(self) -> None:
        """Forget the queued and running episodes (the actors are being shut down)."""
        self._inflight.clear()
        self._pending.clear()
        self._load = [0] * len(self._load)
        self._publish()
