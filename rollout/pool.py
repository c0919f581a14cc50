"""The driver-side pool of Ray rollout actors (the only package module that imports Ray).

``ray.remote`` is applied to :class:`rollout.worker.RolloutWorker` here and nowhere else.
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
apply one :class:`~rollout.groups.TrainingPolicy` (``rollout.train_statuses``,
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
import threading
import time
from typing import Any, Callable, Iterable, Iterator

import aiohttp
import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

from rollout.config import Config
from rollout.groups import Excluded, GroupAssembler, Rerun, TrainingPolicy, rerun_episode_id
from rollout.policy import RouterAdmin
from rollout.records import EpisodeSpec, EpisodeStatus, InteractionResult, TrainingSample
from rollout.worker import RolloutWorker

logger = logging.getLogger(__name__)

RemoteRolloutWorker = ray.remote(RolloutWorker)

PAUSE_MODES = ("abort", "in_place", "retract")


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


class _AdminLoop:
    """A private event loop in a thread, for the pool's HTTP calls to the workers (the pool's own
    API is synchronous, and a trainer may call it from inside an event loop of its own)."""

    def __init__(self, router_url: str, timeout_s: float):
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="rollout-pool-admin", daemon=True)
        self._thread.start()

        async def make() -> RouterAdmin:
            return RouterAdmin(router_url, aiohttp.ClientSession(), timeout_s=timeout_s)

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
        self._inflight: dict[ray.ObjectRef, tuple[EpisodeSpec, int]] = {}
        self._load: list[int] = []
        # Actors whose last task failed: index -> (health-ping ref or None, time of next ping).
        self._down: dict[int, tuple[ray.ObjectRef | None, float]] = {}
        self._delivered: set[str] = set()
        self._submitted: set[str] = set()
        self._member_spec: dict[tuple[str, int], EpisodeSpec] = {}
        self.policy = TrainingPolicy.from_config(r)
        self._assembler = GroupAssembler(self.policy, r.on_group_failure, r.max_member_reruns, r.filter_groups)
        self._counts: collections.Counter[str] = collections.Counter()
        self._weight_version = _as_version(r.weight_version)
        self._paused: str | None = None
        self._admin_loop: _AdminLoop | None = None
        self._started = False
        self._batch_counter = itertools.count()

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> "RolloutPool":
        """Connect to (or start) Ray and create the actors; returns once every actor is ready.

        Raises:
            RuntimeError: an actor failed to start (e.g. bad tokenizer or chat template), with
                the actor's error.
        """
        if self._started:
            return self
        if not ray.is_initialized():
            ray.init(address=self.cfg.pool.ray_address, ignore_reinit_error=True, include_dashboard=False, log_to_driver=True)
        p = self.cfg.pool
        opts = dict(num_cpus=p.num_cpus_per_actor, max_concurrency=p.max_concurrent_episodes + 8, max_restarts=-1, max_task_retries=0)
        self.actors = [
            RemoteRolloutWorker.options(**opts).remote(
                self.cfg.policy, self.cfg.env, self.cfg.logging, p.max_concurrent_episodes, self.cfg.rollout.partial_rollout
            )
            for _ in range(p.num_actors)
        ]
        self._load = [0] * len(self.actors)
        try:
            infos = ray.get([a.info.remote() for a in self.actors])
        except RayActorError as e:
            raise RuntimeError(f"a rollout actor failed to start: {e}") from None
        logger.info("%d rollout actors ready (pids %s)", len(infos), [i["pid"] for i in infos])
        self._started = True
        return self

    def shutdown(self) -> None:
        """Stop the actors (in-flight episodes are dropped); leaves Ray itself running."""
        for a in self.actors:
            try:
                ray.get(a.close.remote(), timeout=10)
            except Exception:  # the actor may already be gone
                pass
            ray.kill(a, no_restart=True)
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

    def _submit_reruns(self, reruns: list[Rerun]) -> None:
        for rr in reruns:
            base = self._member_spec[(rr.group_id, rr.sample_index)]
            spec = dataclasses.replace(base, episode_id=rerun_episode_id(base.episode_id, rr.number), attempt=0, weight_version=self._weight_version)
            logger.info("episode %s: re-running group member as %s", base.episode_id, spec.episode_id)
            self._assembler.expect_rerun(rr)
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
            self._inflight[ref] = (spec, i)
            self._load[i] += 1

    @property
    def submitted_ids(self) -> frozenset[str]:
        """Every episode id submitted so far (re-runs included): each is delivered exactly once."""
        return frozenset(self._submitted)

    @property
    def num_outstanding(self) -> int:
        """Episodes submitted but not yet delivered."""
        return len(self._pending) + len(self._inflight)

    # -- the raw result stream ---------------------------------------------------------------
    def _next_result(self, timeout_s: float | None = None) -> InteractionResult | None:
        """The next episode result (each episode id once), or ``None`` when nothing is outstanding.

        Raises:
            TimeoutError: no result arrived within ``timeout_s``.
        """
        t0 = time.monotonic()
        while self._pending or self._inflight:
            self._dispatch()
            self._ping_down_actors()
            pings = {ref: i for i, (ref, _) in self._down.items() if ref is not None}
            waitables = list(self._inflight) + list(pings)
            ready = []
            if waitables:
                ready, _ = ray.wait(waitables, num_returns=1, timeout=1.0 if self._down else timeout_s)
            else:
                time.sleep(0.2)  # every actor is down and waiting for its next health ping
            for ref in ready:
                if ref in pings:
                    self._health_answer(pings[ref], ref)
                    continue
                spec, i = self._inflight.pop(ref)
                self._load[i] -= 1
                result = self._collect(ref, spec, i)
                if result is None:
                    continue
                if spec.episode_id in self._delivered:
                    logger.warning("episode %s: dropping a duplicate result", spec.episode_id)
                    continue
                self._delivered.add(spec.episode_id)
                self._count_result(result)
                return result
            if timeout_s is not None and time.monotonic() - t0 > timeout_s:
                raise TimeoutError(f"no episode finished within {timeout_s}s ({len(self._inflight)} in flight)")
        return None

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
            ray.get(ref)
        except (RayActorError, RayTaskError):
            self._down[i] = (None, time.monotonic() + 1.0)  # still restarting: ask again in 1 s
            return
        logger.info("actor %d is back", i)
        del self._down[i]
        if self._paused is not None:  # a restarted actor's gate is open: close it
            self._set_gates(False, [i])

    def _collect(self, ref, spec: EpisodeSpec, actor_index: int) -> InteractionResult | None:
        try:
            return ray.get(ref)
        except (RayActorError, GetTimeoutError) as e:
            err = f"actor died: {e.__class__.__name__}"
        except RayTaskError as e:  # RolloutWorker.run never raises; this is a serialisation or Ray failure
            err = f"actor task failed: {str(e)[:300]}"
        if actor_index not in self._down:
            self._down[actor_index] = (None, time.monotonic())  # dispatch nothing to it until it answers a ping
        if spec.attempt < self.cfg.pool.max_episode_retries:
            retry = dataclasses.replace(spec, attempt=spec.attempt + 1)
            logger.warning("episode %s: %s; retrying (attempt %d)", spec.episode_id, err, retry.attempt)
            self._pending.appendleft(retry)
            return None
        logger.error("episode %s: %s; out of retries", spec.episode_id, err)
        return InteractionResult(spec, EpisodeStatus.ENV_ERROR, 0.0, None, metadata={"termination_reason": "actor_died", "error": err})

    # -- the training streams ----------------------------------------------------------------
    def _pump(self, timeout_s: float | None) -> bool:
        """Deliver one result into the group assembler (submitting the re-runs it asks for).
        False when nothing is outstanding."""
        r = self._next_result(timeout_s)
        if r is None:
            return False
        self._submit_reruns(self._assembler.add(r.to_sample(), self._weight_version))
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
            s = r.to_sample()
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
            self._assembler.add(r.to_sample(), self._weight_version)
        by_actor: dict[int, list[str]] = collections.defaultdict(list)
        for spec, i in self._inflight.values():
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
            self._admin_loop = _AdminLoop(self.cfg.policy.router_url, timeout_s=self.cfg.policy.request_timeout_s)
        return self._admin_loop

    def _set_gates(self, open_: bool, indices: list[int] | None = None) -> None:
        indices = [i for i in range(len(self.actors)) if i not in self._down] if indices is None else indices
        refs = {i: (self.actors[i].resume_generation if open_ else self.actors[i].pause_generation).remote() for i in indices}
        for i, ref in refs.items():
            try:
                ray.get(ref, timeout=30)
            except (RayActorError, RayTaskError, GetTimeoutError) as e:
                # a dead actor's episodes are re-run elsewhere; a restarted one is gated when it answers a ping
                logger.warning("actor %d: could not %s its generation gate: %r", i, "open" if open_ else "close", e)

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
            rollout.policy.WeightSyncError: a worker failed to pause (generation may be paused on
                the others: call :meth:`resume` or retry).
            rollout.policy.PolicyServerError: the router cannot list its workers.
        """
        if mode not in PAUSE_MODES:
            raise ValueError(f"mode must be one of {PAUSE_MODES}, got {mode!r}")
        t0 = time.monotonic()
        self._paused = mode
        self._set_gates(False)
        urls = self._admin().run(lambda: self._admin().admin.pause(mode))
        logger.info("generation paused (%s) on %d worker(s) in %.3fs", mode, len(urls), time.monotonic() - t0)
        return urls

    def resume(self) -> list[str]:
        """``POST /continue_generation`` on every worker, then open every actor's gate: held
        episodes go on. Returns the worker URLs.

        Raises:
            rollout.policy.WeightSyncError: a worker failed to continue.
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
            rollout.policy.WeightSyncError: a worker failed the update, or reports another version
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
            from rollout.policy import WeightSyncError

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
        re-run), exclusions by reason, weight updates, the current weight version."""
        out: dict[str, Any] = dict(self._counts)
        out.update(self._assembler.counts)
        out.update(episodes_outstanding=self.num_outstanding, weight_version=self._weight_version)
        return out

    def worker_infos(self) -> list[dict]:
        return ray.get([a.info.remote() for a in self.actors])
