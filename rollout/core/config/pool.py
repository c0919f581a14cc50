"""The ``pool`` section: the Ray actor pool (:mod:`rollout.core.pool`) and its KV-aware concurrency
(``pool.adaptive_concurrency``; the gate itself is :mod:`rollout.core.policy.kvgate`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from rollout.core.config.base import Choice, Problems, bound_problems, setting


class EventLoop(Choice):
    """``pool.event_loop`` / ``local.event_loop`` (:mod:`rollout.core.eventloop`)."""

    UVLOOP = "uvloop"  # libuv in C (docs/performance.md)
    ASYNCIO = "asyncio"  # the standard library's loop


class KVSignal(Choice):
    """``pool.adaptive_concurrency.signal``: how the workers' KV usage readings become one figure."""

    MAX = "max"  # the fullest worker (holds back as soon as any worker is full)
    MEAN = "mean"  # the mean over the workers read


class Placement(Choice):
    """``pool.adaptive_concurrency.placement``: who picks the worker of each ``/generate`` call
    while the KV gate is on (:mod:`rollout.core.policy.kvgate`)."""

    ROUTER = "router"  # the router (by policy.routing's key); the gate sees the workers as one KV pool
    # the gate: each routing key is placed on a worker of the actor's own part that has KV room
    # for it (the fewest keys first), sticky, and its calls go to that worker directly; the gate
    # holds calls per worker, so one full worker holds only its own keys
    GATE = "gate"


@dataclass
class AdaptiveConcurrencyConfig:
    """``pool.adaptive_concurrency``: KV-aware concurrency (:mod:`rollout.core.policy.kvgate`): each
    actor reads the workers' KV usage (SGLang's ``sglang:token_usage`` on each worker's
    ``/metrics``) and holds back new episodes and new turns (before their ``/generate`` call)
    while it is above ``high_water``, until it falls below ``low_water``.
    ``pool.max_concurrent_episodes`` stays the upper bound."""

    enabled: bool = setting(False, doc="Turn the KV gate on (each actor polls the workers' /metrics and holds calls while the KV is full).")
    high_water: float = setting(0.90, doc="Share of the KV budget (sglang:token_usage, 0..1) past which calls are held.")
    low_water: float = setting(0.75, doc="Share below which held calls go on (hysteresis: < high_water).")
    poll_interval_s: float = setting(0.5, doc="Seconds between two reads of the workers' /metrics (one poller per actor).")
    timeout_s: float = setting(2.0, doc="Bound (seconds) on one read of one worker's /metrics; a failed read counts as unknown (not held).")
    signal: KVSignal = setting(KVSignal.MAX, doc="""
        How the workers' readings become one figure: max = the fullest worker's usage (holds everything as soon as one
        worker is full); mean = the mean over the workers read.""")
    placement: Placement = setting(Placement.GATE, doc="""
        Who picks each call's worker: router = the router (policy.routing's key; the gate sees the workers as one KV pool,
        figure by signal); gate = the gate places each routing key on a worker of the actor's own part of the workers that
        has KV room for it (the fewest keys first; sticky) and sends its calls there directly, holding calls per worker (the
        router still lists the workers and serves aborts and weight updates). signal is unused under gate.""")
    start_calls_per_worker: int = setting(4, doc="""
        Open, the cap on an actor's calls in flight (kvgate.py): it starts at this many calls per worker at the first
        reading, grows by one per worker per poll below low_water, never below one.""")
    decrease_factor: float = setting(0.5, doc="The cap's cut when the gate closes or the workers report new retractions; in (0, 1).")
    worker_urls: Optional[list[str]] = setting(None, doc="""
        The workers whose /metrics are read (and, under placement=gate, to which calls are sent): null = the workers the
        router lists (GET /workers at policy.router_url, re-read every 30 polls), or a list of http://host:port.""")

    def problems(self) -> Problems:
        """This section's bad values, as ``(key, message)``; no I/O."""
        prefix = "pool.adaptive_concurrency"
        if not 0 < self.high_water <= 1:
            yield f"{prefix}.high_water", f"must be in (0, 1] (a share of the KV budget), got {self.high_water}"
        if not 0 <= self.low_water < self.high_water:
            yield f"{prefix}.low_water", f"must be in [0, {prefix}.high_water={self.high_water}), got {self.low_water}"
        if not self.poll_interval_s > 0:
            yield f"{prefix}.poll_interval_s", f"must be > 0 (seconds), got {self.poll_interval_s}"
        if not self.timeout_s > 0:
            yield f"{prefix}.timeout_s", f"must be > 0 (seconds), got {self.timeout_s}"
        if not (isinstance(self.start_calls_per_worker, int) and self.start_calls_per_worker >= 1):
            yield f"{prefix}.start_calls_per_worker", f"must be an integer >= 1, got {self.start_calls_per_worker!r}"
        if not 0 < self.decrease_factor < 1:
            yield f"{prefix}.decrease_factor", f"must be in (0, 1), got {self.decrease_factor}"
        if self.worker_urls is not None:
            if not self.worker_urls:
                yield f"{prefix}.worker_urls", "must be null (the router's workers) or name at least one worker"
            bad = [u for u in self.worker_urls if not (isinstance(u, str) and u.startswith(("http://", "https://")))]
            if bad:
                yield f"{prefix}.worker_urls", f"each must start with http:// or https://, got {bad[0]!r}"


@dataclass
class PoolConfig:
    """``pool``: the Ray actor pool."""

    num_actors: int = setting(2, ge=1, doc="Ray rollout actors.")
    max_concurrent_episodes: int = setting(8, ge=1, doc="Episodes in flight per actor.")
    num_cpus_per_actor: float = setting(1.0, ge=0, doc="Ray CPU reservation per actor.")
    max_episode_retries: int = setting(2, ge=0, doc="""
        Re-runs of an episode whose actor died, restarted or stopped answering; past them it is delivered actor_lost.""")
    weight_update_retries: int = setting(2, ge=0, doc="""
        A weight update some workers took and others failed is sent again to those this many times (rolled forward); past
        them the others load their previous weights again (rolled back): every worker serves one version.""")
    episode_timeout_s: float = setting(3600.0, gt=0, doc="""
        Bound (seconds) on one whole episode, retries of requests included (then timeout).""")
    no_actor_timeout_s: float = setting(120.0, gt=0, doc="""
        With no healthy actor for this long (seconds) the run ends with an error; the episodes not delivered are recorded as
        undelivered (--resume runs them).""")
    actor_start_timeout_s: float = setting(600.0, gt=0, doc="""
        Bound (seconds) on the actors' start, from their creation until every one is ready; past it the pool stops them and
        raises one line (an autoscaling cluster may need longer). Actors that can never fit the cluster's CPUs are refused
        before any is created.""")
    ray_address: Optional[str] = setting(None, doc="""
        Ray address; null: RAY_ADDRESS, else the cluster ray start recorded on this machine if it answers, else a new local
        Ray (listening on 127.0.0.1 only).""")
    gil_switch_interval_ms: float = setting(1.0, gt=0, le=1000, doc="""
        The actors' sys.setswitchinterval, milliseconds (Python's default is 5): how long the event loop may wait for the
        GIL after each system call while a worker thread runs Python.""")
    event_loop: EventLoop = setting(EventLoop.UVLOOP, doc="""
        The actors' event loop: uvloop (C; faster where the CPU is the bound: docs/performance.md) | asyncio (the standard
        library's loop). Sets RAY_USE_UVLOOP in each actor's runtime_env (rollout.core.eventloop); the pool checks the loop
        each actor got.""")
    metrics: bool = setting(True, doc="""
        Record the pool's metrics through Ray's (ray.util.metrics, exported to Prometheus; the driver and every actor:
        docs/observability.md) | false: record nothing (their cost, side by side: python -m rollout.bench pool --baseline
        pool.metrics=false --baseline-rows all).""")
    adaptive_concurrency: AdaptiveConcurrencyConfig = field(default_factory=AdaptiveConcurrencyConfig)

    def problems(self) -> Problems:
        """This section's bad values (``pool.adaptive_concurrency``'s included), as ``(key, message)``:
        its keys' ranges, then ``adaptive_concurrency``'s rules; no I/O."""
        yield from bound_problems(self, "pool")
        yield from self.adaptive_concurrency.problems()
