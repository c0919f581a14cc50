"""What the Ray tier's pool tests share: a pool's config over a router on 127.0.0.1, and a wait
for a condition (tests/ray/)."""

from __future__ import annotations

import time
from typing import Callable

from rollout.core.config import Config, load_config


def pool_config(router_url: str, *overrides: str, num_actors: int = 1, max_concurrent_episodes: int = 4) -> Config:
    """The config of a small pool over ``router_url``: ``num_actors`` actors of half a CPU each
    (the shared test cluster has 2), each running up to ``max_concurrent_episodes`` episodes;
    ``overrides`` (``key=value``) are applied after these."""
    return load_config(None, [f"policy.router_url={router_url}", f"pool.num_actors={num_actors}",
                              f"pool.max_concurrent_episodes={max_concurrent_episodes}", "pool.num_cpus_per_actor=0.5", *overrides])


def wait_until(cond: Callable[[], object], what: str, timeout_s: float = 120.0) -> None:
    """Poll ``cond`` every 0.1 s until it is true.

    Raises:
        AssertionError: still false after ``timeout_s`` seconds (the message names ``what``).
    """
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
