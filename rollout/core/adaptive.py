"""The ``pool.adaptive_concurrency`` section of the config schema (:mod:`rollout.core.config`
holds the rest and re-exports it) and its checks; the gate itself is
:mod:`rollout.core.policy.kvgate`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from rollout.core.choices import KVSignal, Placement


@dataclass
class AdaptiveConcurrencyConfig:
    """KV-aware concurrency (``pool.adaptive_concurrency``; :mod:`rollout.core.policy.kvgate`): each
    actor reads the workers' KV usage (SGLang's ``sglang:token_usage`` on each worker's
    ``/metrics``) and holds back new episodes and new turns (before their ``/generate`` call)
    while it is above ``high_water``, until it falls below ``low_water``.
    ``pool.max_concurrent_episodes`` stays the upper bound."""

    enabled: bool = False
    high_water: float = 0.90  # share of the KV budget (sglang:token_usage) past which calls are held
    low_water: float = 0.75  # share below which held calls go on (hysteresis: < high_water)
    poll_interval_s: float = 0.5  # seconds between two reads of the workers' /metrics (one poller per actor)
    timeout_s: float = 2.0  # bound on one read of one worker's /metrics; a failed read counts as unknown (not held)
    # max = the fullest worker's usage (holds everything as soon as one worker is full); mean = the
    # mean over the workers read
    signal: KVSignal = KVSignal.MAX
    # Who picks each call's worker: router = the router (policy.routing's key; the gate sees the
    # workers as one KV pool, figure by `signal`); gate = the gate places each routing key on a
    # worker of the actor's own part of the workers that has KV room for it (the fewest keys
    # first; sticky) and sends its calls there directly, holding calls per worker (the router
    # still lists the workers and serves aborts and weight updates). `signal` is unused under gate.
    placement: Placement = Placement.GATE
    # Open, the cap on an actor's calls in flight (kvgate.py): it starts at this many calls per
    # worker at the first reading, grows by one per worker per poll below low_water, never below one
    start_calls_per_worker: int = 4
    decrease_factor: float = 0.5  # the cap's cut when the gate closes or the workers report new retractions; in (0, 1)
    # The workers whose /metrics are read (and, under placement=gate, to which calls are sent):
    # null = the workers the router lists (GET /workers at policy.router_url, re-read every 30
    # polls), or a list of http://host:port
    worker_urls: Optional[list[str]] = None


def adaptive_concurrency_problems(ac: AdaptiveConcurrencyConfig, prefix: str = "pool.adaptive_concurrency") -> list[tuple[str, str]]:
    """``[(full key, what is wrong)]`` for the section's values (empty when valid); no I/O.
    :func:`rollout.core.config.validate` raises the first as a ``ConfigError``."""
    out: list[tuple[str, str]] = []
    if not 0 < ac.high_water <= 1:
        out.append((f"{prefix}.high_water", f"must be in (0, 1] (a share of the KV budget), got {ac.high_water}"))
    if not 0 <= ac.low_water < ac.high_water:
        out.append((f"{prefix}.low_water", f"must be in [0, {prefix}.high_water={ac.high_water}), got {ac.low_water}"))
    if not ac.poll_interval_s > 0:
        out.append((f"{prefix}.poll_interval_s", f"must be > 0 (seconds), got {ac.poll_interval_s}"))
    if not ac.timeout_s > 0:
        out.append((f"{prefix}.timeout_s", f"must be > 0 (seconds), got {ac.timeout_s}"))
    if not (isinstance(ac.start_calls_per_worker, int) and ac.start_calls_per_worker >= 1):
        out.append((f"{prefix}.start_calls_per_worker", f"must be an integer >= 1, got {ac.start_calls_per_worker!r}"))
    if not 0 < ac.decrease_factor < 1:
        out.append((f"{prefix}.decrease_factor", f"must be in (0, 1), got {ac.decrease_factor}"))
    if ac.worker_urls is not None:
        if not ac.worker_urls:
            out.append((f"{prefix}.worker_urls", "must be null (the router's workers) or name at least one worker"))
        bad = [u for u in ac.worker_urls if not (isinstance(u, str) and u.startswith(("http://", "https://")))]
        if bad:
            out.append((f"{prefix}.worker_urls", f"each must start with http:// or https://, got {bad[0]!r}"))
    return out
