"""The driver-side pool of Ray rollout actors (the only package module that imports Ray).

``ray.remote`` is applied to :class:`rollout.worker.RolloutWorker` here and nowhere else.
:class:`RolloutPool` spreads episodes (tasks x ``n_samples_per_task``) over ``pool.num_actors``
async actors, keeps at most ``pool.max_concurrent_episodes`` in flight per actor, streams results
as they finish (no barrier), and delivers exactly one result per episode id: an episode whose
actor died is re-run (``pool.max_episode_retries`` times, then delivered as ``env_error``), and a
late duplicate is dropped.

Trainer API::

    pool = RolloutPool(cfg)            # cfg.policy.router_url resolved
    pool.start()
    pool.submit_tasks(task_ids)        # or pool.submit(specs)
    for group in pool.groups():        # or pool.results() / pool.samples()
        ...
    pool.shutdown()
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import logging
import time
from typing import Iterable, Iterator

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

from rollout.config import Config
from rollout.records import EpisodeSpec, EpisodeStatus, InteractionResult, TrainingSample
from rollout.worker import RolloutWorker

logger = logging.getLogger(__name__)

RemoteRolloutWorker = ray.remote(RolloutWorker)


def make_specs(domain: str, task_ids: Iterable[str], n_samples_per_task: int, seed: int = 0, weight_version: int = 0, prefix: str = "") -> list[EpisodeSpec]:
    """Episode specs for ``task_ids`` x ``n_samples_per_task``.

    Group ids are ``{prefix}{domain}/{task_id}``; episode ids ``{group_id}/{sample_index}``. The
    per-episode seed is derived from ``seed``, the task and the sample index.
    """
    specs = []
    for k, tid in enumerate(task_ids):
        gid = f"{prefix}{domain}/{tid}"
        for i in range(n_samples_per_task):
            specs.append(
                EpisodeSpec(
                    episode_id=f"{gid}/{i}",
                    domain=domain,
                    task_id=str(tid),
                    group_id=gid,
                    sample_index=i,
                    seed=(seed * 1_000_003 + k * 1009 + i) % (2**31 - 1),
                    weight_version=weight_version,
                )
            )
    return specs


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
        self.actors: list = []
        self._pending: collections.deque[EpisodeSpec] = collections.deque()
        self._inflight: dict[ray.ObjectRef, tuple[EpisodeSpec, int]] = {}
        self._load: list[int] = []
        # Actors whose last task failed: index -> (health-ping ref or None, time of next ping).
        self._down: dict[int, tuple[ray.ObjectRef | None, float]] = {}
        self._delivered: set[str] = set()
        self._submitted: set[str] = set()
        self._groups: dict[str, list[TrainingSample]] = collections.defaultdict(list)
        self._group_size: dict[str, int] = {}
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
        opts = dict(num_cpus=p.num_cpus_per_actor, max_concurrency=p.max_concurrent_episodes + 4, max_restarts=-1, max_task_retries=0)
        self.actors = [
            RemoteRolloutWorker.options(**opts).remote(self.cfg.policy, self.cfg.env, self.cfg.logging, p.max_concurrent_episodes)
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
        self._started = False

    def __enter__(self) -> "RolloutPool":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.shutdown()

    # -- submission --------------------------------------------------------------------------
    def submit(self, specs: Iterable[EpisodeSpec]) -> list[EpisodeSpec]:
        """Queue episodes. Group sizes are taken from the specs (all samples of a group must be
        submitted together).

        Raises:
            ValueError: an episode id was already submitted.
        """
        specs = list(specs)
        for s in specs:
            if s.episode_id in self._submitted:
                raise ValueError(f"episode {s.episode_id} was already submitted")
            self._submitted.add(s.episode_id)
            self._group_size[s.group_id] = self._group_size.get(s.group_id, 0) + 1
            self._pending.append(s)
        self._dispatch()
        return specs

    def submit_tasks(self, task_ids: Iterable[str], n_samples_per_task: int | None = None, weight_version: int | None = None) -> list[EpisodeSpec]:
        """Queue ``n_samples_per_task`` episodes of each task (defaults from ``rollout``).

        Each call gets a fresh group prefix so the same task can be submitted again later.
        """
        r = self.cfg.rollout
        prefix = f"b{next(self._batch_counter)}:"
        specs = make_specs(
            self.cfg.env.domain,
            task_ids,
            n_samples_per_task or r.n_samples_per_task,
            seed=r.seed,
            weight_version=r.weight_version if weight_version is None else weight_version,
            prefix=prefix,
        )
        return self.submit(specs)

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
    def num_outstanding(self) -> int:
        """Episodes submitted but not yet delivered."""
        return len(self._pending) + len(self._inflight)

    # -- results -----------------------------------------------------------------------------
    def results(self, timeout_s: float | None = None) -> Iterator[InteractionResult]:
        """Yield each submitted episode's result once, in completion order, until none is left.

        Args:
            timeout_s: give up after this long without any result (``None``: wait).

        Raises:
            TimeoutError: no result arrived within ``timeout_s``.
        """
        last_progress = time.monotonic()
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
            if timeout_s is not None and time.monotonic() - last_progress > timeout_s:
                raise TimeoutError(f"no episode finished within {timeout_s}s ({len(self._inflight)} in flight)")
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
                last_progress = time.monotonic()
                yield result

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

    def samples(self, timeout_s: float | None = None) -> Iterator[TrainingSample]:
        """Like :meth:`results`, as training samples."""
        for r in self.results(timeout_s):
            yield r.to_sample()

    def groups(self, timeout_s: float | None = None) -> Iterator[list[TrainingSample]]:
        """Yield each group (all samples of one task in one submission) once it is complete,
        sorted by ``sample_index``."""
        for r in self.results(timeout_s):
            s = r.to_sample()
            g = self._groups[s.group_id]
            g.append(s)
            if len(g) == self._group_size[s.group_id]:
                del self._groups[s.group_id]
                yield sorted(g, key=lambda x: x.sample_index)

    def run(self, task_ids: Iterable[str], n_samples_per_task: int | None = None) -> list[TrainingSample]:
        """Submit ``task_ids`` and wait for all of their samples (a convenience over :meth:`samples`)."""
        self.submit_tasks(task_ids, n_samples_per_task)
        return list(self.samples())

    def worker_infos(self) -> list[dict]:
        return ray.get([a.info.remote() for a in self.actors])
