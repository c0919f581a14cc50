"""The driver-side pool of Ray rollout actors (the only package module that imports Ray).

``ray.remote`` is applied to :class:`rollout.core.worker.RolloutWorker` here and nowhere else.
:class:`RolloutPool` spreads episodes (tasks x ``n_samples_per_task``) over ``pool.num_actors``
async actors, keeps at most ``pool.max_concurrent_episodes`` in flight per actor, streams results
as they finish (no barrier), and delivers exactly one result per episode id: an episode whose
actor died is re-run (``pool.max_episode_retries`` times, then delivered as ``env_error``), and a
late duplicate is dropped.

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

Streams (use one kind per pool): :meth:`results` (raw, every episode, all statuses), and the
training streams :meth:`samples`, :meth:`groups`, :meth:`collect_groups` and :meth:`stream`, which
apply one :class:`~rollout.core.groups.TrainingPolicy` (``rollout.train_statuses``,
``rollout.max_staleness``): what may not be trained goes to :meth:`excluded` instead.

The weight-update cycle (:meth:`pause`, :meth:`resume`, :meth:`update_weights_from_disk`) closes
every actor's generation gate, then calls SGLang's ``/pause_generation``, ``/continue_generation``
and ``/update_weights_from_disk`` on every worker the router lists. In-flight episodes are held,
not ended; a turn the pause interrupted becomes what ``rollout.partial_rollout`` says.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import hashlib
import itertools
import logging
import os
import socket
import threading
import time
from typing import Any, Callable, Iterable, Iterator

import aiohttp
import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

from rollout.core.config import Config
from rollout.core.eventloop import ray_env_vars
from rollout.core.export import get_exporter
from rollout.core.groups import Excluded, GroupAssembler, Rerun, TrainingPolicy, rerun_episode_id
from rollout.core.policy import RouterAdmin, api_key_from_env
from rollout.core.records import EpisodeSpec, EpisodeStatus, InteractionResult, TrainingSample
from rollout.core.worker import RolloutWorker

logger = logging.getLogger(__name__)

RemoteRolloutWorker = ray.remote(RolloutWorker)

PAUSE_MODES = ("abort", "in_place", "retract")
# The running totals RolloutPool.stats() always has (0 until something is counted), besides one
# ``status_<status>`` per EpisodeStatus and the group assembler's totals.
POOL_COUNTERS = ("episodes_submitted", "episodes_delivered", "episodes_restored", "episodes_interrupted", "episodes_continued",
                 "episodes_restarted", "episode_retries", "episodes_cancelled_outstanding", "episodes_undelivered",
                 "weight_updates", "generate_calls_paused")
# The Ray head (GCS) unreachable this long ends the run (Ray itself kills a driver whose GCS is
# gone for 60 s, gcs_rpc_server_reconnect_timeout_s, before it could write anything).
HEAD_LOST_AFTER_S = 10.0
# A task still out this long past pool.episode_timeout_s is treated as lost with its actor
# (the actor enforces the timeout itself; this covers an actor that stopped answering).
OVERDUE_GRACE_S = 120.0


def _ray_address(configured: str | None) -> str | None:
    """``pool.ray_address``, or, when it is null and ``RAY_ADDRESS`` is unset: ``None`` (Ray
    connects to the cluster ``ray start`` last recorded on this machine) when that cluster
    answers, else ``"local"``: a new local cluster (``ray.init()`` would wait for ever on a dead
    recorded one)."""
    if configured is not None or os.environ.get("RAY_ADDRESS"):
        return configured
    try:
        from ray._private.utils import read_ray_address

        recorded = read_ray_address()
    except Exception:  # a Ray without it: leave the choice to Ray
        return None
    if recorded and _gcs_reachable(recorded):
        return None
    if recorded:
        logger.warning("the Ray cluster recorded on this machine (%s) does not answer; starting a local one", recorded)
    return "local"


class RunAborted(RuntimeError):
    """The pool cannot go on; ``undelivered`` holds every episode submitted and not delivered
    (the pool forgets them: re-submit them, or ``rollout run --resume`` runs them)."""

    def __init__(self, message: str, undelivered: list[EpisodeSpec]):
        super().__init__(message)
        self.undelivered = list(undelivered)


class RunInterrupted(RunAborted):
    """:meth:`RolloutPool.interrupt` was called (e.g. from a SIGINT / SIGTERM handler); the
    in-flight episodes were cancelled on the actors and are not delivered."""


class NoHealthyActorError(RunAborted):
    """No rollout actor was healthy for ``pool.no_actor_timeout_s`` seconds."""


class RayHeadLostError(RunAborted):
    """The Ray head (GCS) stopped answering for :data:`HEAD_LOST_AFTER_S` seconds."""


def _gcs_reachable(address: str | None, timeout_s: float = 1.0) -> bool:
    """True when a TCP connection to the GCS ``host:port`` opens (``None``: unknown, True)."""
    if not address or ":" not in address:
        return True
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return True
    except OSError:
        return False


def episode_seed(seed: int, group_id: str, sample_index: int) -> int:
    """The sampling seed of one episode, in ``[0, 2**31 - 1)``: a stable hash of the run's
    ``seed``, the group id (unique per submission) and the sample index, so that the same task
    submitted again (a new group) samples new trajectories, and a run is reproducible."""
    digest = hashlib.blake2b(f"{seed}:{group_id}:{sample_index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % (2**31 - 1)


def make_specs(domain: str, task_ids: Iterable[str], n_samples_per_task: int, seed: int = 0, weight_version: int = 0, prefix: str = "") -> list[EpisodeSpec]:
    """Episode specs for ``task_ids`` x ``n_samples_per_task``.

    Group ids are ``{prefix}{domain}/{task_id}``; episode ids ``{group_id}/{sample_index}``; seeds
    from :func:`episode_seed`.
    """
    specs = []
    for tid in task_ids:
        gid = f"{prefix}{domain}/{tid}"
        for i in range(n_samples_per_task):
            specs.append(
                EpisodeSpec(
                    episode_id=f"{gid}/{i}",
                    domain=domain,
                    task_id=str(tid),
                    group_id=gid,
                    sample_index=i,
                    seed=episode_seed(seed, gid, i),
                    weight_version=weight_version,
                )
            )
    return specs


def _as_version(v: int | str) -> int:
    try:
        return int(str(v))
    except ValueError:
        raise ValueError(f"weight_version must be an integer (staleness is counted in versions), got {v!r}") from None


@dataclasses.dataclass(frozen=True)
class PauseReport:
    """What one :meth:`RolloutPool.pause` met (also each pause of
    :meth:`RolloutPool.update_weights_from_disk`).

    Attributes:
        mode: the pause mode (``abort`` | ``in_place`` | ``retract``).
        workers: the worker URLs paused.
        seconds: how long the pause took to return.
        episodes_running: episodes running on the actors when their gates closed.
        generate_calls_out: ``/generate`` calls under way when the gates closed: with ``abort``,
            the calls the pause interrupted (each then handled by ``rollout.partial_rollout``).
    """

    mode: str
    workers: list[str]
    seconds: float
    episodes_running: int
    generate_calls_out: int


class _AdminLoop:
    """A private event loop in a thread, for the pool's HTTP calls to the workers (the pool's own
    API is synchronous, and a trainer may call it from inside an event loop of its own)."""

    def __init__(self, router_url: str, timeout_s: float, api_key: str | None = None):
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="rollout-pool-admin", daemon=True)
        self._thread.start()

        async def make() -> RouterAdmin:
            return RouterAdmin(router_url, aiohttp.ClientSession(), timeout_s=timeout_s, api_key=api_key)

        self.admin = self.run(make)

    def run(self, fn: Callable[..., Any], *args, timeout: float | None = None):
        """Run coroutine function ``fn(*args)`` on the loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(fn(*args), self._loop).result(timeout)

    def close(self) -> None:
        try:
            self.run(self.admin.session.close, timeout=10)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop.close()


class RolloutPool:
    """Ray actor pool running tau2 episodes (see the module docstring).

    Args:
        cfg: the whole config; ``cfg.policy.router_url`` must be set (the CLI resolves it from the
            local stack when ``local.enabled``).

    Raises:
        ValueError: ``policy.router_url`` is not set.
    """

    def __init__(self, cfg: Config):
        if not cfg.policy.router_url:
            raise ValueError("policy.router_url must be resolved before starting the pool")
        self.cfg = cfg
        r = cfg.rollout
        self.actors: list = []
        self._pending: collections.deque[EpisodeSpec] = collections.deque()
        self._inflight: dict[ray.ObjectRef, tuple[EpisodeSpec, int, float]] = {}  # ref -> (spec, actor, dispatched at)
        self._load: list[int] = []
        # Actors whose last task failed: index -> (health-ping ref or None, time of next ping).
        self._down: dict[int, tuple[ray.ObjectRef | None, float]] = {}
        self._delivered: set[str] = set()
        self._submitted: set[str] = set()
        self._member_spec: dict[tuple[str, int], EpisodeSpec] = {}
        self.policy = TrainingPolicy.from_config(r)
        self._assembler = GroupAssembler(self.policy, r.on_group_failure, r.max_member_reruns, r.filter_groups)
        self._counts: collections.Counter[str] = collections.Counter(dict.fromkeys(POOL_COUNTERS, 0))
        self._counts.update(dict.fromkeys((f"status_{st.value}" for st in EpisodeStatus), 0))
        self._weight_version = _as_version(r.weight_version)
        self._paused: str | None = None
        self._admin_loop: _AdminLoop | None = None
        self._started = False
        self._batch_counter = itertools.count()
        self._late: collections.deque[InteractionResult] = collections.deque()
        self._journal = None
        self._restored: set[str] = set()
        self._no_actor_since: float | None = None
        self._head_unreachable_since: float | None = None
        self._head_checked_at = 0.0
        self._gcs_address: str | None = None
        self._interrupt_reason: str | None = None
        self.last_pause: PauseReport | None = None  # what the last pause() met
        self._exporter = get_exporter("trajectory", keep_messages=r.keep_messages)

    def _sample_of(self, result: InteractionResult) -> TrainingSample:
        """The training sample of a delivered episode (the sample-export seam,
        :mod:`rollout.core.export`; one sample per episode in the ``trajectory`` mode, the only
        mode the group streams take today)."""
        [sample] = self._exporter.export(result)
        return sample

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> "RolloutPool":
        """Connect to (or start) Ray and create the actors; returns once every actor is ready.

        Raises:
            rollout.app.preflight.PreflightError: ``policy.tokenizer`` names nothing loadable here, or
                ``pool.ray_address`` does not answer (one line, before any actor starts).
            RuntimeError: an actor failed to start (e.g. bad tokenizer or chat template), with
                the actor's error; or an actor runs another event loop than ``pool.event_loop``
                (uvloop missing on its node; the actors are stopped).
        """
        if self._started:
            return self
        from rollout.app.preflight import PreflightError, check_ray_address
        from rollout.core.tokenizer import TokenizerSourceError, check_tokenizer_source

        try:  # one line in seconds, where Ray would wait minutes or every actor fail to start
            check_tokenizer_source(self.cfg.policy.tokenizer)
        except TokenizerSourceError as e:
            raise PreflightError(str(e)) from None
        if not ray.is_initialized():
            check_ray_address(self.cfg.pool.ray_address)
            address = _ray_address(self.cfg.pool.ray_address)
            # Ray >= 2.5x turns token auth on for a new local cluster and warns that it did at
            # every start; the local cluster is ours and the behaviour is the one we want.
            quiet = logging.getLogger("ray._private.authentication.authentication_token_setup")
            level = quiet.level
            if address == "local" and "RAY_AUTH_MODE" not in os.environ:
                quiet.setLevel(logging.ERROR)
            try:
                ray.init(address=address, ignore_reinit_error=True, include_dashboard=False, log_to_driver=True)
            finally:
                quiet.setLevel(level)
        p = self.cfg.pool
        # the actors' event loop (pool.event_loop): Ray builds it, from RAY_USE_UVLOOP
        opts = dict(num_cpus=p.num_cpus_per_actor, max_concurrency=p.max_concurrent_episodes + 8, max_restarts=-1, max_task_retries=0,
                    runtime_env={"env_vars": ray_env_vars(p.event_loop)})
        self.actors = [
            RemoteRolloutWorker.options(**opts).remote(
                self.cfg.policy, self.cfg.env, self.cfg.logging, p.max_concurrent_episodes, self.cfg.rollout.partial_rollout,
                own_process=True, gil_switch_interval_ms=p.gil_switch_interval_ms,
            )
            for _ in range(p.num_actors)
        ]
        self._load = [0] * len(self.actors)
        try:
            self._gcs_address = ray.get_runtime_context().gcs_address
        except Exception:  # older Ray: no head-loss detection
            self._gcs_address = None
        try:
            answers = ray.get([a.info.remote() for a in self.actors] + [a.event_loop.remote() for a in self.actors])
            infos, loops = answers[:len(self.actors)], answers[len(self.actors):]
        except RayActorError as e:
            raise RuntimeError(f"a rollout actor failed to start: {e}") from None
        wrong = [(i["pid"], k) for i, k in zip(infos, loops) if k != p.event_loop]
        if wrong:
            self.shutdown(timeout_s=5.0)
            raise RuntimeError(f"pool.event_loop={p.event_loop}, but rollout actors (pid, loop) {wrong} run another loop: "
                               f"is uvloop installed on their nodes? (or set pool.event_loop=asyncio)")
        logger.info("%d rollout actors ready (pids %s, event loop %s)", len(infos), [i["pid"] for i in infos], p.event_loop)
        self._started = True
        return self

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Stop the actors within about ``timeout_s`` seconds: each cancels its running episodes
        (aborting their requests on the workers) and closes; then the actors are killed.
        Undelivered episodes are forgotten (see :meth:`abort_outstanding` to get them). Leaves
        Ray itself running."""
        if self.actors and _gcs_reachable(self._gcs_address):
            refs = []
            for a in self.actors:
                try:
                    refs.append(a.close.remote())
                except Exception:  # the actor may already be gone
                    pass
            try:
                ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
            except Exception as e:
                logger.debug("closing actors: %r", e)
            for a in self.actors:
                try:
                    ray.kill(a, no_restart=True)
                except Exception as e:
                    logger.debug("ray.kill: %r", e)
        self.actors = []
        self._inflight.clear()
        self._pending.clear()
        if self._admin_loop is not None:
            self._admin_loop.close()
            self._admin_loop = None
        self._started = False

    def __enter__(self) -> "RolloutPool":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.shutdown()

    # -- submission --------------------------------------------------------------------------
    def submit(self, specs: Iterable[EpisodeSpec]) -> list[EpisodeSpec]:
        """Queue episodes. All samples of a group must be submitted in one call (the group's size
        is the number of its specs here).

        Raises:
            ValueError: an episode id or a group id was already submitted (nothing is queued).
        """
        specs = list(specs)
        ids = [s.episode_id for s in specs]
        dup = [i for i in ids if i in self._submitted] or [i for i, n in collections.Counter(ids).items() if n > 1]
        if dup:
            raise ValueError(f"episode {dup[0]} was already submitted")
        sizes = collections.Counter(s.group_id for s in specs)
        for gid, n in sizes.items():
            self._assembler.expect(gid, n)  # raises on a group submitted before
        if self._journal is not None:
            self._journal.record_specs(specs)
        for s in specs:
            self._member_spec[(s.group_id, s.sample_index)] = s
            self._enqueue(s)
        self._dispatch()
        return specs

    def submit_tasks(self, task_ids: Iterable[str], n_samples_per_task: int | None = None, weight_version: int | None = None) -> list[EpisodeSpec]:
        """Queue ``n_samples_per_task`` episodes of each task (defaults from ``rollout``; the
        episodes' ``weight_version`` defaults to the trainer's current one).

        Each call gets a fresh group prefix so the same task can be submitted again later.
        """
        r = self.cfg.rollout
        prefix = f"b{next(self._batch_counter)}:"
        specs = make_specs(
            self.cfg.env.domain,
            task_ids,
            n_samples_per_task or r.n_samples_per_task,
            seed=r.seed,
            weight_version=self._weight_version if weight_version is None else weight_version,
            prefix=prefix,
        )
        return self.submit(specs)

    def _enqueue(self, spec: EpisodeSpec) -> None:
        self._submitted.add(spec.episode_id)
        self._counts["episodes_submitted"] += 1
        self._pending.append(spec)

    def _rerun_spec(self, rr: Rerun) -> EpisodeSpec:
        """The spec of re-run ``rr`` (a new episode id, first attempt, the current version),
        registered with the group assembler."""
        base = self._member_spec[(rr.group_id, rr.sample_index)]
        self._assembler.expect_rerun(rr)
        return dataclasses.replace(base, episode_id=rerun_episode_id(base.episode_id, rr.number), attempt=0, weight_version=self._weight_version)

    def _submit_reruns(self, reruns: list[Rerun]) -> None:
        for rr in reruns:
            spec = self._rerun_spec(rr)
            logger.info("episode %s: re-running group member as %s", spec.episode_id.split("~r", 1)[0], spec.episode_id)
            self._enqueue(spec)
        if reruns:
            self._dispatch()

    def _dispatch(self) -> None:
        cap = self.cfg.pool.max_concurrent_episodes
        while self._pending and self.actors:
            healthy = [k for k in range(len(self.actors)) if k not in self._down]
            if not healthy:
                return
            i = min(healthy, key=lambda k: self._load[k])
            if self._load[i] >= cap:
                return
            spec = self._pending.popleft()
            ref = self.actors[i].run.remote(spec, self.cfg.pool.episode_timeout_s)
            self._inflight[ref] = (spec, i, time.monotonic())
            self._load[i] += 1

    @property
    def submitted_ids(self) -> frozenset[str]:
        """Every episode id submitted so far (re-runs included): each is delivered exactly once."""
        return frozenset(self._submitted)

    @property
    def num_outstanding(self) -> int:
        """Episodes submitted but not yet delivered."""
        return len(self._pending) + len(self._inflight) + len(self._late)

    # -- the raw result stream ---------------------------------------------------------------
    def _next_result(self, timeout_s: float | None = None) -> InteractionResult | None:
        """The next episode result (each episode id once), or ``None`` when nothing is outstanding.

        Raises:
            TimeoutError: no result arrived within ``timeout_s``.
            NoHealthyActorError: no actor was healthy for ``pool.no_actor_timeout_s``.
            RayHeadLostError: the Ray head stopped answering.
        """
        t0 = time.monotonic()
        while self._pending or self._inflight or self._late:
            if self._late:
                result = self._late.popleft()
                if result.spec.episode_id in self._delivered:
                    continue
                self._deliver(result)
                return result
            self._check_interrupt()
            self._dispatch()
            self._check_health()
            self._ping_down_actors()
            pings = {ref: i for i, (ref, _) in self._down.items() if ref is not None}
            waitables = list(self._inflight) + list(pings)
            ready = []
            if waitables:
                wait_s = 1.0 if (self._down or timeout_s is None) else min(timeout_s, 1.0)
                try:
                    ready, _ = ray.wait(waitables, num_returns=1, timeout=wait_s)
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
                result = self._collect(ref, spec, i)
                if result is None:
                    continue
                if spec.episode_id in self._delivered:
                    logger.warning("episode %s: dropping a duplicate result", spec.episode_id)
                    continue
                self._deliver(result)
                return result
            self._reclaim_overdue()
            if timeout_s is not None and time.monotonic() - t0 > timeout_s:
                raise TimeoutError(f"no episode finished within {timeout_s}s ({len(self._inflight)} in flight)")
        return None

    def interrupt(self, reason: str) -> None:
        """Ask the pool to stop: the stream call in progress (or the next one) cancels every
        undelivered episode on the actors (their requests are aborted on the workers) and raises
        :class:`RunInterrupted` with them, within about a second. Safe to call from a signal
        handler or another thread: it only sets a flag."""
        self._interrupt_reason = reason

    def _check_interrupt(self) -> None:
        if self._interrupt_reason is not None:
            reason, self._interrupt_reason = self._interrupt_reason, None
            undelivered = self.abort_outstanding()
            raise RunInterrupted(f"{reason}: {len(undelivered)} episode(s) not delivered", undelivered)

    def _deliver(self, result: InteractionResult) -> None:
        self._delivered.add(result.spec.episode_id)
        self._count_result(result)
        if self._journal is not None:
            self._journal.record(self._sample_of(result))

    def _check_health(self) -> None:
        """End the run (raising :class:`RunAborted`) when no actor has been healthy for
        ``pool.no_actor_timeout_s`` or the Ray head has been unreachable for
        :data:`HEAD_LOST_AFTER_S`; the undelivered episodes go with the error."""
        now = time.monotonic()
        if self.actors and len(self._down) >= len(self.actors):
            self._no_actor_since = self._no_actor_since or now
            if now - self._no_actor_since > self.cfg.pool.no_actor_timeout_s:
                undelivered = self.abort_outstanding(cancel_on_actors=False)
                raise NoHealthyActorError(
                    f"no rollout actor was healthy for {self.cfg.pool.no_actor_timeout_s:.0f}s (pool.no_actor_timeout_s); "
                    f"{len(undelivered)} episode(s) not delivered", undelivered)
        else:
            self._no_actor_since = None
        if now - self._head_checked_at < (1.0 if self._down or self._head_unreachable_since else 5.0):
            return
        self._head_checked_at = now
        if _gcs_reachable(self._gcs_address):
            self._head_unreachable_since = None
            return
        self._head_unreachable_since = self._head_unreachable_since or now
        logger.warning("the Ray head (GCS %s) does not answer", self._gcs_address)
        if now - self._head_unreachable_since > HEAD_LOST_AFTER_S:
            undelivered = self.abort_outstanding(cancel_on_actors=False)
            self.actors = []
            raise RayHeadLostError(
                f"the Ray head (GCS {self._gcs_address}) stopped answering for {HEAD_LOST_AFTER_S:.0f}s; "
                f"{len(undelivered)} episode(s) not delivered", undelivered)

    def _reclaim_overdue(self) -> None:
        """An episode task out longer than ``pool.episode_timeout_s`` + :data:`OVERDUE_GRACE_S`
        is lost with its actor (the actor would have ended it itself): retried or typed."""
        limit = self.cfg.pool.episode_timeout_s + OVERDUE_GRACE_S
        now = time.monotonic()
        for ref, (spec, i, t) in list(self._inflight.items()):
            if now - t > limit:
                del self._inflight[ref]
                self._load[i] -= 1
                try:
                    ray.cancel(ref, force=False)
                except Exception as e:
                    logger.debug("ray.cancel: %r", e)
                result = self._fail_attempt(spec, i, f"no answer from actor {i} {limit:.0f}s after dispatch")
                if result is not None:
                    self._late.append(result)  # delivered by the next _next_result

    def _count_result(self, r: InteractionResult) -> None:
        c = self._counts
        c["episodes_delivered"] += 1
        c[f"status_{r.status.value}"] += 1
        m = r.metadata
        if m.get("interruptions"):
            c["episodes_interrupted"] += 1
        if m.get("continued_turns"):
            c["episodes_continued"] += 1
        if m.get("restarted_turns"):
            c["episodes_restarted"] += 1

    def results(self, timeout_s: float | None = None) -> Iterator[InteractionResult]:
        """Yield each submitted episode's result once, in completion order, until none is left.

        The raw stream: every status, no training policy (for the training streams see
        :meth:`samples` and :meth:`groups`).

        Args:
            timeout_s: give up after this long without any result (``None``: wait).

        Raises:
            TimeoutError: no result arrived within ``timeout_s``.
        """
        while (r := self._next_result(timeout_s)) is not None:
            yield r

    def _ping_down_actors(self) -> None:
        now = time.monotonic()
        for i, (ref, when) in list(self._down.items()):
            if ref is None and now >= when:
                self._down[i] = (self.actors[i].info.remote(), now)

    def _health_answer(self, i: int, ref) -> None:
        try:
            ray.get(ref, timeout=30)
        except Exception:  # any Ray error: not back yet
            self._down[i] = (None, time.monotonic() + 1.0)  # still restarting: ask again in 1 s
            return
        logger.info("actor %d is back", i)
        del self._down[i]
        if self._paused is not None:  # a restarted actor's gate is open: close it
            self._set_gates(False, [i])

    def _collect(self, ref, spec: EpisodeSpec, actor_index: int) -> InteractionResult | None:
        """The result of a finished ``run`` task, or ``None`` when its attempt failed and was
        re-queued. Every Ray error is handled (the actor died or restarted, the object was lost,
        its owner died, the task was cancelled, a serialisation failure, ...)."""
        try:
            return ray.get(ref, timeout=60)
        except RayActorError as e:
            err = f"actor lost: {e.__class__.__name__}"
        except RayTaskError as e:  # RolloutWorker.run never raises; this is a serialisation or Ray failure
            err = f"actor task failed: {str(e)[:300]}"
        except Exception as e:  # ObjectLostError, OwnerDiedError, TaskCancelledError, GetTimeoutError, ...
            err = f"{e.__class__.__name__}: {str(e)[:300]}"
        return self._fail_attempt(spec, actor_index, err)

    def _fail_attempt(self, spec: EpisodeSpec, actor_index: int, err: str) -> InteractionResult | None:
        """Re-queue a failed attempt (a new ``attempt`` number gives its requests fresh ids; the
        dead attempt's requests were aborted by the servers when its connections closed), or
        type it ``actor_lost`` when the retries are spent."""
        if actor_index not in self._down:
            self._down[actor_index] = (None, time.monotonic())  # dispatch nothing to it until it answers a ping
        if spec.attempt < self.cfg.pool.max_episode_retries:
            retry = dataclasses.replace(spec, attempt=spec.attempt + 1)
            logger.warning("episode %s: %s; retrying (attempt %d)", spec.episode_id, err, retry.attempt)
            self._counts["episode_retries"] += 1
            self._pending.appendleft(retry)
            return None
        logger.error("episode %s: %s; out of retries", spec.episode_id, err)
        return InteractionResult(spec, EpisodeStatus.ACTOR_LOST, 0.0, None, metadata={"termination_reason": "actor_lost", "error": err})

    # -- the training streams ----------------------------------------------------------------
    def _pump(self, timeout_s: float | None) -> bool:
        """Deliver one result into the group assembler (submitting the re-runs it asks for).
        False when nothing is outstanding."""
        r = self._next_result(timeout_s)
        if r is None:
            return False
        self._submit_reruns(self._assembler.add(self._sample_of(r), self._weight_version))
        return True

    def _pop_ready(self, limit: int | None = None) -> list[list[TrainingSample]]:
        out = self._assembler.pop_ready(self._weight_version, limit)
        self._submit_reruns(self._assembler.take_late_reruns())
        return out

    def samples(self, timeout_s: float | None = None) -> Iterator[TrainingSample]:
        """Yield each trainable sample as soon as its episode ends (no grouping, no re-runs).

        A sample whose status is not in ``rollout.train_statuses``, or that is stale beyond
        ``rollout.max_staleness``, is not yielded: it goes to :meth:`excluded`.
        """
        while (r := self._next_result(timeout_s)) is not None:
            s = self._sample_of(r)
            self._assembler.forget_member(s.group_id)
            reason = self.policy.exclusion(s, self._weight_version)
            if reason is None:
                yield s
            else:
                self._assembler.exclude(s, reason)

    def groups(self, timeout_s: float | None = None) -> Iterator[list[TrainingSample]]:
        """Yield each complete, trainable group (all samples of one task in one submission,
        sorted by ``sample_index``) as soon as it is complete.

        A member that may not be trained is re-run or its group dropped
        (``rollout.on_group_failure``), groups with equal rewards are dropped with
        ``rollout.filter_groups=zero_variance``; everything kept out goes to :meth:`excluded`.
        """
        for item in self.stream(timeout_s):
            if isinstance(item, list):
                yield item

    def stream(self, timeout_s: float | None = None, excluded: bool = False) -> Iterator[list[TrainingSample] | Excluded]:
        """Like :meth:`groups`, and with ``excluded=True`` also every :class:`Excluded` sample in
        delivery order (what the CLI writes to its files), until nothing is outstanding."""
        while True:
            if excluded:
                while self._assembler.excluded:
                    yield self._assembler.excluded.popleft()
            yield from self._pop_ready()
            if not self._pump(timeout_s):
                break
        yield from self._pop_ready()
        if excluded:
            while self._assembler.excluded:
                yield self._assembler.excluded.popleft()

    def excluded(self) -> Iterator[Excluded]:
        """Everything kept out of training since the last call, once each: infrastructure
        failures (reason = status), stale episodes, filtered, dropped and cancelled groups."""
        while self._assembler.excluded:
            yield self._assembler.excluded.popleft()

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
            self.submit_tasks([tid], n_samples_per_task)
            n += 1
        return n

    def poll(self, timeout_s: float = 0.0) -> int:
        """Deliver into the training streams the episodes that end within ``timeout_s`` seconds,
        dispatching queued ones as slots free up; returns how many were delivered.

        For trainers that overlap training with rollout: the pool dispatches only while it is
        called, so call this (with :meth:`prefetch`) while the trainer works, e.g. between polls
        of a training future; the groups then come from :meth:`collect_groups`.
        """
        deadline = time.monotonic() + timeout_s
        n = 0
        while self.num_outstanding:
            try:
                if not self._pump(max(0.0, deadline - time.monotonic())):
                    break
            except TimeoutError:
                break
            n += 1
            if time.monotonic() >= deadline:
                break
        return n

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
        number of groups still needed.

        Returns:
            ``num_groups`` groups, or fewer when ``task_source`` ran out (logged).

        Raises:
            ValueError: ``num_groups < 1``.
            TimeoutError: no episode ended within ``timeout_s``.
        """
        if num_groups < 1:
            raise ValueError(f"num_groups must be >= 1, got {num_groups}")
        if max_outstanding_groups is None:
            p = self.cfg.pool
            max_outstanding_groups = p.num_actors * p.max_concurrent_episodes // (n_samples_per_task or self.cfg.rollout.n_samples_per_task)
        kept: list[list[TrainingSample]] = []
        while True:
            kept += self._pop_ready(num_groups - len(kept))
            if len(kept) >= num_groups:
                break
            if task_source is not None:
                self.prefetch(max(num_groups - len(kept), max_outstanding_groups), task_source, n_samples_per_task)
            if not self._pump(timeout_s) and not self._assembler.ready_groups:
                logger.warning("collect_groups: %d of %d groups kept and no task left to submit", len(kept), num_groups)
                break
        if abort_surplus:
            self.cancel_outstanding(timeout_s=timeout_s)
        return kept

    def cancel_outstanding(self, timeout_s: float | None = 120.0) -> int:
        """Cancel every episode not delivered yet and deliver it (as ``cancelled`` unless it
        ended first); open groups are abandoned (their members go to :meth:`excluded` as
        ``group_cancelled``). Complete groups not handed out yet are kept. Returns how many
        episodes were outstanding.

        Raises:
            TimeoutError: an actor did not return a cancelled episode within ``timeout_s``.
        """
        n = self.num_outstanding
        self._assembler.abandon_open_groups()
        while self._pending:
            spec = self._pending.popleft()
            r = InteractionResult(spec, EpisodeStatus.CANCELLED, 0.0, None, metadata={"termination_reason": "cancelled", "error": None})
            self._delivered.add(spec.episode_id)
            self._count_result(r)
            self._assembler.add(self._sample_of(r), self._weight_version)
        by_actor: dict[int, list[str]] = collections.defaultdict(list)
        for spec, i, _ in self._inflight.values():
            by_actor[i].append(spec.episode_id)
        for i, ids in by_actor.items():
            try:
                ray.get(self.actors[i].cancel.remote(ids), timeout=30)
            except (RayActorError, RayTaskError, GetTimeoutError) as e:
                logger.warning("cancel on actor %d failed: %r", i, e)
        while self._pump(timeout_s):
            pass
        self._counts["episodes_cancelled_outstanding"] += n
        return n

    def abort_outstanding(self, cancel_on_actors: bool = True, timeout_s: float = 5.0) -> list[EpisodeSpec]:
        """Stop every episode not delivered yet *without delivering it* (an interrupted run:
        SIGINT, SIGTERM, a lost Ray head): the actors cancel them and abort their requests on the
        workers (within ``timeout_s``), nothing is journaled, open groups stay open. Returns the
        undelivered specs (first attempts), for a later ``--resume`` or re-submission."""
        specs = [s for s in self._pending] + [s for s, _, _ in self._inflight.values()] + [r.spec for r in self._late]
        if cancel_on_actors and self._inflight and self.actors:
            by_actor: dict[int, list[str]] = collections.defaultdict(list)
            for spec, i, _ in self._inflight.values():
                by_actor[i].append(spec.episode_id)
            refs = []
            for i, ids in by_actor.items():
                try:
                    refs.append(self.actors[i].cancel.remote(ids))
                except Exception as e:
                    logger.debug("cancel on actor %d: %r", i, e)
            try:
                ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
            except Exception as e:
                logger.debug("cancel: %r", e)
        self._pending.clear()
        self._inflight.clear()
        self._late.clear()
        self._load = [0] * len(self.actors)
        undelivered = [dataclasses.replace(s, attempt=0) for s in specs if s.episode_id not in self._delivered]
        self._counts["episodes_undelivered"] += len(undelivered)
        return undelivered

    # -- the run journal ---------------------------------------------------------------------
    def attach_journal(self, journal) -> None:
        """Record into ``journal`` (a :class:`rollout.core.journal.RunJournal`) every spec submitted
        and every episode delivered, as it happens, on every stream."""
        self._journal = journal

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
        if self._submitted:
            raise RuntimeError("restore() must come before any submission")
        specs = journal.specs
        delivered = journal.delivered  # episode id -> sample, in delivery order
        sizes = collections.Counter(s.group_id for s in specs)
        for gid, n in sizes.items():
            self._assembler.expect(gid, n)
        for s in specs:
            self._member_spec[(s.group_id, s.sample_index)] = s
            self._submitted.add(s.episode_id)
        rerun_specs: dict[str, EpisodeSpec] = {}
        for sample in delivered.values():
            self._delivered.add(sample.episode_id)
            self._submitted.add(sample.episode_id)
            self._restored.add(sample.episode_id)
            self._counts["episodes_restored"] += 1
            for rr in self._assembler.add(sample, self._weight_version):
                spec = self._rerun_spec(rr)
                self._submitted.add(spec.episode_id)
                rerun_specs[spec.episode_id] = spec
        todo = [s for s in specs if s.episode_id not in delivered] + [s for i, s in rerun_specs.items() if i not in delivered]
        for s in todo:
            self._counts["episodes_submitted"] += 1
            self._pending.append(s)
        self._dispatch()
        logger.info("resumed from %s: %d episode(s) delivered before, %d to run", journal.dir, len(delivered), len(todo))
        return todo

    # -- the weight-update cycle -------------------------------------------------------------
    @property
    def weight_version(self) -> int:
        """The trainer's current weight version (``rollout.weight_version`` at start, then the
        last successful :meth:`update_weights_from_disk`); staleness is counted against it."""
        return self._weight_version

    def set_weight_version(self, version: int) -> None:
        """Tell the pool the trainer's current version when weights are updated by other means.

        Raises:
            ValueError: ``version`` is not an integer.
        """
        self._weight_version = _as_version(version)

    def _admin(self) -> _AdminLoop:
        if self._admin_loop is None:
            self._admin_loop = _AdminLoop(self.cfg.policy.router_url, timeout_s=self.cfg.policy.request_timeout_s,
                                          api_key=api_key_from_env(self.cfg.policy.api_key_env))
        return self._admin_loop

    def _set_gates(self, open_: bool, indices: list[int] | None = None) -> list:
        """Open or close the generation gates of the actors ``indices`` (default: every healthy
        one); returns the answers of those that answered."""
        indices = [i for i in range(len(self.actors)) if i not in self._down] if indices is None else indices
        refs = {i: (self.actors[i].resume_generation if open_ else self.actors[i].pause_generation).remote() for i in indices}
        answers = []
        for i, ref in refs.items():
            try:
                answers.append(ray.get(ref, timeout=30))
            except (RayActorError, RayTaskError, GetTimeoutError) as e:
                # a dead actor's episodes are re-run elsewhere; a restarted one is gated when it answers a ping
                logger.warning("actor %d: could not %s its generation gate: %r", i, "open" if open_ else "close", e)
        return answers

    def pause(self, mode: str = "abort") -> list[str]:
        """Stop all generation; in-flight episodes are held, not ended.

        Every actor's gate closes first (new ``/generate`` calls wait), then every worker the
        router lists gets ``POST /pause_generation {"mode": mode}``. With ``abort`` the workers
        end their running calls at once; the episodes see an interruption and handle it by
        ``rollout.partial_rollout`` once :meth:`resume` is called. With ``in_place`` the calls wait
        on the servers. Returns once every worker has answered, i.e. no generation is running.

        Returns:
            The worker URLs paused.

        Raises:
            ValueError: unknown ``mode``.
            rollout.core.policy.sglang.WeightSyncError: a worker failed to pause (generation may be paused on
                the others: call :meth:`resume` or retry).
            rollout.core.policy.sglang.PolicyServerError: the router cannot list its workers.
        """
        if mode not in PAUSE_MODES:
            raise ValueError(f"mode must be one of {PAUSE_MODES}, got {mode!r}")
        t0 = time.monotonic()
        self._paused = mode
        gates = self._set_gates(False)
        urls = self._admin().run(lambda: self._admin().admin.pause(mode))
        self.last_pause = PauseReport(mode=mode, workers=list(urls), seconds=time.monotonic() - t0,
                                      episodes_running=sum(g["episodes_running"] for g in gates),
                                      generate_calls_out=sum(g["generate_calls_out"] for g in gates))
        self._counts["generate_calls_paused"] += self.last_pause.generate_calls_out
        logger.info("generation paused (%s) on %d worker(s) in %.3fs: %d episode(s) running, %d /generate call(s) under way",
                    mode, len(urls), self.last_pause.seconds, self.last_pause.episodes_running, self.last_pause.generate_calls_out)
        return urls

    def resume(self) -> list[str]:
        """``POST /continue_generation`` on every worker, then open every actor's gate: held
        episodes go on. Returns the worker URLs.

        Raises:
            rollout.core.policy.sglang.WeightSyncError: a worker failed to continue.
        """
        urls = self._admin().run(lambda: self._admin().admin.resume())
        self._set_gates(True)
        self._paused = None
        logger.info("generation resumed on %d worker(s)", len(urls))
        return urls

    @property
    def paused(self) -> str | None:
        """The pause mode while paused, else ``None``."""
        return self._paused

    def update_weights_from_disk(self, model_path: str, weight_version: int | str) -> dict[str, dict]:
        """Pause (``abort``), load ``model_path`` on every worker, check every answer, continue.

        Args:
            model_path: a folder every worker can read (e.g. written by the trainer with
                ``save_pretrained``).
            weight_version: the new version (an integer); the workers report it in every
                ``/generate`` answer from now on, and staleness is counted against it.

        Returns:
            Worker URL -> its answer (``success``, ``message``, ``num_paused_requests``).

        Raises:
            ValueError: ``weight_version`` is not an integer.
            rollout.core.policy.sglang.WeightSyncError: a worker failed the update, or reports another version
                afterwards. Generation then stays paused (the workers may hold different weights):
                retry the update, or :meth:`resume` knowingly.
        """
        version = _as_version(weight_version)
        t0 = time.monotonic()
        urls = self.pause("abort")
        admin = self._admin()
        answers = admin.run(lambda: admin.admin.update_weights_from_disk(model_path, str(version), urls))
        seen = admin.run(lambda: admin.admin.weight_versions(urls))
        wrong = {u: f"reports weight_version {v!r} after the update" for u, v in seen.items() if v != str(version)}
        if wrong:
            from rollout.core.policy import WeightSyncError

            raise WeightSyncError(f"update_weights_from_disk({model_path!r}, weight_version={version})", wrong)
        self._weight_version = version
        self._counts["weight_updates"] += 1
        self.resume()
        logger.info("weights updated to version %d from %s on %d worker(s) in %.2fs", version, model_path, len(urls), time.monotonic() - t0)
        return answers

    # -- introspection -----------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Running totals: episodes submitted / delivered / outstanding, per status, interrupted
        and continued episodes, group outcomes (kept, filtered, dropped, cancelled, members
        re-run), exclusions by reason, weight updates, the current weight version.

        Every key of :data:`POOL_COUNTERS`, ``status_<status>`` for every status and the group
        totals (:data:`rollout.core.groups.GROUP_COUNTERS`) is present from the start, 0 until counted
        (a resumed run with nothing left to run has submitted nothing in this session)."""
        out: dict[str, Any] = dict(self._counts)
        out.update(self._assembler.counts)
        out.update(episodes_outstanding=self.num_outstanding, weight_version=self._weight_version)
        return out

    def worker_infos(self) -> list[dict]:
        return ray.get([a.info.remote() for a in self.actors])

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
        return ray.get([a.loop_lag.remote(reset) for a in self.actors], timeout=timeout_s)
