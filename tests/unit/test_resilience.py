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


def test_a_failure_judged_after_its_outage_ended_still_belongs_to_it():
    """Call A fails at t0 and call B at t1 while the backend is down for everyone; A's judgement
    opens the outage (from t0), a probe succeeds at t2 and closes it; B's failure, judged only
    at t3, lay inside that outage: it is excused (no retry spent) without opening another."""
    b = BackendBreaker(60)
    b.arm()
    t0 = time.monotonic()
    mark_a, mark_b = b.successes, b.successes  # both failed with no success since
    assert b.record_failure(mark_a, t0) is True and b.outages == 1 and b.opened_at == t0
    assert b.record_success() is not None and not b.is_open  # t2: a probe got through
    assert b.record_failure(mark_b, t0 + 0.1) is True  # t3: judged after the outage ended
    assert b.outages == 1 and not b.is_open  # no second outage: the backend is up


def test_a_failure_just_before_the_outage_opened_with_no_success_between_belongs_to_it():
    """B fails first and is judged last (its back-off is longer): no call succeeded between its
    failure and the opening, so it was part of the same outage even after that has ended; a
    failure followed by a success before the opening stays isolated."""
    b = BackendBreaker(60)
    b.arm()
    now = time.monotonic()
    mark_early = b.successes
    b.record_success()  # someone got through after that failure: it was isolated
    mark_b = b.successes
    assert b.record_failure(b.successes, now) is True and b.opened_at == now  # A opens it, B failed before
    b.record_success()
    assert b.record_failure(mark_b, now - 0.2) is True
    assert b.record_failure(mark_early, now - 0.3) is False
    after = b.successes  # a failure after the outage ended, followed by a success, is isolated
    b.record_success()
    assert b.record_failure(after, time.monotonic()) is False and b.outages == 1


def test_a_failure_of_an_earlier_outage_is_excused_after_the_next_one_ended_too():
    """A flapping backend: two outages open and close within one failure's back-off; a failure
    in the first, judged after both, still belongs to the first."""
    b = BackendBreaker(60)
    b.arm()
    first = b.successes
    assert b.record_failure(first, time.monotonic()) is True
    b.record_success()
    assert b.record_failure(b.successes, time.monotonic()) is True and b.outages == 2
    b.record_success()
    assert b.record_failure(first, time.monotonic()) is True and b.outages == 2 and not b.is_open


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
