"""The circuit breaker's transitions as its driver sees them (the client logs them: the breaker
logs nothing): a failure that opens it grows ``outages`` once, the success that closes it returns
the outage's length."""

from __future__ import annotations

import asyncio
import time

from rollout.core.policy import BackendBreaker, GenerationGate


def test_the_failure_that_opens_the_breaker_counts_one_outage_and_the_success_that_closes_it_says_how_long():
    b = BackendBreaker(60)
    assert b.record_success() is None  # closed: nothing ended (and it is armed now)
    mark, failed_at = b.successes, time.monotonic() - 1.5
    assert b.record_failure(mark, failed_at) is True and b.outages == 1 and b.is_open
    assert b.record_failure(mark, time.monotonic()) is True and b.outages == 1  # already open: the same outage
    ended = b.record_success()
    assert ended is not None and 1.5 <= ended < 60 and not b.is_open
    assert b.record_success() is None


def test_a_failure_is_isolated_when_a_call_succeeded_since_or_the_breaker_is_off_or_unarmed():
    b = BackendBreaker(60)
    b.arm()
    mark = b.successes
    b.record_success()  # another call got through after the failure
    assert b.record_failure(mark, time.monotonic()) is False and b.outages == 0
    assert BackendBreaker(60).record_failure(0, time.monotonic()) is False  # never saw the backend up
    off = BackendBreaker(0)
    off.arm()
    assert not off.enabled and off.record_failure(off.successes, time.monotonic()) is False


async def test_the_gate_counts_closes_and_lets_calls_go_when_open():
    gate = GenerationGate()
    await gate.wait_open()  # open: at once
    gate.close()
    gate.close()  # idempotent: one update, one epoch
    assert gate.closed and gate.epoch == 1
    held = asyncio.ensure_future(gate.wait_open())
    await asyncio.sleep(0)  # one loop step: the call is at the gate
    assert gate.waiting == 1 and not held.done()
    gate.open()
    await held
    assert gate.waiting == 0
    await gate.wait_open()
    gate.close()
    assert gate.epoch == 2
