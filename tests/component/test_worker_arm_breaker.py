"""An actor started before its router answered (the overlapped start-up, rollout.app.wiring) is
told afterwards that the backend is up: its circuit breaker is then armed as if it had seen the
router at its own start (an outage from the first call on is waited for)."""

from __future__ import annotations

import socket

from rollout.core.config import load_config
from rollout.core.worker import RolloutWorker


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_a_worker_that_did_not_see_the_router_is_armed_by_arm_breaker():
    cfg = load_config(None, [f"policy.router_url=http://127.0.0.1:{_closed_port()}"])
    worker = RolloutWorker(cfg.policy, cfg.env, cfg.logging, max_concurrent_episodes=1)
    try:
        assert worker.breaker.successes == 0  # nothing answered at its start: not armed
        stats = worker.arm_breaker()
        assert worker.breaker.successes == 1 and stats["open"] is False
        worker.arm_breaker()
        assert worker.breaker.successes == 1  # idempotent
    finally:
        await worker.close()
