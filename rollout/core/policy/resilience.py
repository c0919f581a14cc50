"""Resilience of an actor's ``/generate`` calls: the :class:`GenerationGate` that holds them during
a weight update (and tells a pause interruption from any other abort), and the
:class:`BackendBreaker` that makes them wait out a backend outage instead of spending their retries.
Both live in one event loop (the actor's), shared by its episodes; the
:class:`~rollout.core.policy.sglang.SGLangClient` drives them."""

from __future__ import annotations

import asyncio
import random
import time
from collections import deque
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

__all__ = ["BackendBreaker", "GenerationGate"]

OUTAGES_REMEMBERED = 8  # outages whose late-judged failures a breaker still excuses


class GenerationGate:
    """Holds an actor's ``/generate`` calls while the trainer updates weights.

    The pool closes the gate of every actor *before* it pauses the servers, and opens it after
    they continue. A call waits at the gate before each attempt is sent; an answer with
    ``finish_reason.type == "abort"`` is a pause interruption (``Generation.interrupted``) when the
    gate closed while the attempt was out, which tells it from an abort of any other origin. Lives
    in one event loop (the actor's); not thread-safe.

    Attributes:
        epoch: incremented at every close (an attempt compares it before and after).
        waiting: calls waiting at the closed gate now.
    """

    def __init__(self) -> None:
        self._open = asyncio.Event()
        self._open.set()
        self.epoch = 0  # incremented at every close
        self.waiting = 0

    @property
    def closed(self) -> bool:
        """Whether a weight update is in progress (calls wait)."""
        return not self._open.is_set()

    def close(self) -> None:
        """Hold new calls (idempotent; a new close increments :attr:`epoch`)."""
        if not self.closed:
            self.epoch += 1
            self._open.clear()

    def open(self) -> None:
        """Let held and new calls go."""
        self._open.set()

    async def wait_open(self) -> None:
        """Return once the gate is open (at once if it is); counted in :attr:`waiting` meanwhile."""
        if self._open.is_set():
            return
        self.waiting += 1
        try:
            await self._open.wait()
        finally:
            self.waiting -= 1


class BackendBreaker:
    """Circuit breaker for the policy backend, shared by every ``/generate`` call of one actor.

    *Closed* (normal): calls go out at once and a failed call spends its own retries.

    It *opens* on evidence that the backend is down for every call: a call failed at the
    transport level (connection refused or reset, 502/503 from the router) and no call succeeded
    between that failure and the end of the call's ordinary retry back-off (about a second); see
    :meth:`record_failure`. It is armed only once some call has succeeded: a backend that was
    never reached (a wrong ``router_url``) is not waited for; calls fail after their retries.
    :meth:`arm` counts a health check as such a success. A failure judged after the outage it
    belonged to has ended is still excused (:meth:`record_failure`): the outage may end, by a
    probe's success, within that failure's back-off.

    *Open*: calls do not spend retries on transport-level failures; they wait in
    :meth:`attempt`, one probe at a time going out after a jittered exponential back-off
    (``base_backoff_s * 2**k`` times a factor in [0.5, 1], capped at ``max_backoff_s``), the
    others waiting for the breaker to close (or for the probe to have been out ``probe_grace_s``,
    when each goes after its own back-off). The first success *closes* it. Once the outage has
    lasted ``outage_timeout_s`` (from its first failure) each call gets one more attempt and then
    raises (:class:`~rollout.core.policy.protocol.PolicyServerError` in
    :class:`~rollout.core.policy.sglang.SGLangClient`); a call that arrives later tries once, so
    the breaker still closes when the backend comes back.

    It logs nothing itself: the client that drives it logs the transitions, in its own words
    (:meth:`record_failure` opened it when :attr:`outages` grew; :meth:`record_success` returns
    the length of the outage it ended). Lives in one event loop (the actor's); not thread-safe.

    Args:
        outage_timeout_s: how long (seconds) calls wait for the backend, measured from the first
            failure of the outage (``policy.backend_outage_timeout_s``); ``0`` disables the breaker
            (every failure spends retries).
        max_backoff_s: cap on the back-off before a probe (seconds).
        base_backoff_s: back-off before the first probe of an outage (seconds).
        probe_grace_s: a probe out longer than this (seconds) no longer holds the other calls back
            (a probe that the backend answers slowly, e.g. a long generation); default
            ``2 * max_backoff_s``.

    Attributes:
        outages: how many times it opened.
        waited_s: seconds that calls spent waiting in :meth:`attempt` while it was open, summed
            over calls.
        successes: successful calls recorded (a sequence number, see :meth:`record_failure`).
        opened_at: ``time.monotonic()`` of the outage's first failure; ``None`` while closed.
    """

    def __init__(self, outage_timeout_s: float = 300.0, max_backoff_s: float = 5.0, base_backoff_s: float = 0.25,
                 probe_grace_s: float | None = None) -> None:
        if outage_timeout_s < 0 or max_backoff_s <= 0 or base_backoff_s <= 0:
            raise ValueError("outage_timeout_s must be >= 0, max_backoff_s and base_backoff_s > 0")
        self.outage_timeout_s = float(outage_timeout_s)
        self.max_backoff_s = float(max_backoff_s)
        self.base_backoff_s = float(base_backoff_s)
        self.probe_grace_s = 2 * self.max_backoff_s if probe_grace_s is None else float(probe_grace_s)
        self.outages = 0
        self.waited_s = 0.0
        self.successes = 0
        self.opened_at: float | None = None
        self._probe: object | None = None  # the attempt holding the probe slot
        self._probe_since = 0.0
        self._probes = 0  # probes of this outage (the back-off's exponent)
        # :attr:`successes` when each recent outage opened: the failures that belong to it
        self._opened_marks: deque[int] = deque(maxlen=OUTAGES_REMEMBERED)
        self._changed = asyncio.Event()

    def __repr__(self) -> str:
        return (f"BackendBreaker(open={self.is_open}, outages={self.outages}, waited_s={self.waited_s:.1f}, "
                f"outage_timeout_s={self.outage_timeout_s})")

    @property
    def enabled(self) -> bool:
        """False when ``outage_timeout_s == 0``."""
        return self.outage_timeout_s > 0

    @property
    def is_open(self) -> bool:
        """Whether an outage is in progress."""
        return self.opened_at is not None

    @property
    def outage_s(self) -> float:
        """Seconds since the current outage's first failure (0.0 while closed)."""
        return 0.0 if self.opened_at is None else time.monotonic() - self.opened_at

    def expired(self) -> bool:
        """Whether the current outage has lasted ``outage_timeout_s`` (False while closed)."""
        return self.opened_at is not None and self.outage_s >= self.outage_timeout_s

    def stats(self) -> dict[str, Any]:
        """``{"outages": int, "waited_s": float, "open": bool, "outage_s": float}`` for logs."""
        return {"outages": self.outages, "waited_s": round(self.waited_s, 3), "open": self.is_open, "outage_s": round(self.outage_s, 3)}

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def arm(self) -> None:
        """Record that the backend was seen answering (e.g. a health check when the actor
        started), so that an outage from the very first call is waited for too."""
        self.successes = max(self.successes, 1)

    def record_success(self) -> float | None:
        """A call succeeded (the backend answered 200): close the breaker if it was open.

        Returns:
            The length (seconds) of the outage this success ended; ``None`` if it was closed.
        """
        self.successes += 1
        if self.opened_at is None:
            return None
        ended = self.outage_s
        self.opened_at = None
        self._probes = 0
        self._notify()
        return ended

    def record_failure(self, successes_at_failure: int, failed_at: float) -> bool:
        """Judge a transport-level failure, some time after it happened.

        The failure belongs to an outage when the breaker is open now, when it opens it (no call
        succeeded since the failure), or when an outage opened while no call had succeeded since
        the failure, and has ended since (``successes_at_failure`` equals :attr:`successes` at
        that opening): the failure came inside that outage, or just before it with nothing
        getting through between. The judgement comes one back-off after the failure, and the
        outage's probe may succeed within it; counting such a failure as isolated would spend a
        retry of a call that only met the outage (with ``max_request_retries=0`` the call would
        fail). A success ends every outage, so the count at an opening marks one outage alone;
        the last :data:`OUTAGES_REMEMBERED` are remembered, far more than open and close within
        one back-off.

        Args:
            successes_at_failure: :attr:`successes` right after the call failed.
            failed_at: ``time.monotonic()`` when it failed (the outage's start if it opens one).

        Returns:
            True when the failure belongs to an outage: the breaker is open (it opens now if no
            call has succeeded since the failure and it is enabled and armed, and then
            :attr:`outages` grows by one), or the failure belongs to an outage that has ended
            (the breaker stays closed); the call must not count it against its retries.
            False: an isolated failure (or the breaker is disabled or not armed); the call spends
            a retry.
        """
        if not self.enabled:
            return False
        if self.opened_at is not None or successes_at_failure in self._opened_marks:
            return True
        if self.successes == 0 or self.successes != successes_at_failure:
            return False
        self.opened_at = failed_at
        self.outages += 1
        self._probes = 0
        self._opened_marks.append(self.successes)
        return True

    def _backoff(self) -> float:
        delay = min(self.max_backoff_s, self.base_backoff_s * 2 ** min(self._probes, 30)) * random.uniform(0.5, 1.0)
        self._probes += 1
        return delay

    @asynccontextmanager
    async def attempt(self) -> AsyncIterator[None]:
        """Wrap one attempt of a call: wait while the breaker is open, then let it go.

        While closed (or past ``outage_timeout_s``) it returns at once. While open, the attempt
        either takes the probe slot (it goes after a back-off) or waits until the breaker closes,
        the slot frees or the probe has been out ``probe_grace_s``; the slot is given back when
        the ``async with`` block ends. Cancellation-safe. Raises nothing of its own.
        """
        owner = object()
        t0 = time.monotonic()
        waited = False
        try:
            while self.opened_at is not None and not self.expired():
                waited = True
                now = time.monotonic()
                remaining = self.opened_at + self.outage_timeout_s - now
                stale = self._probe is not None and now - self._probe_since >= self.probe_grace_s
                if self._probe is None or stale:
                    if self._probe is None:
                        self._probe, self._probe_since = owner, now
                    await asyncio.sleep(max(0.0, min(self._backoff(), remaining)))
                    break
                changed = self._changed
                timeout = max(0.01, min(remaining, self._probe_since + self.probe_grace_s - now))
                try:
                    await asyncio.wait_for(changed.wait(), timeout)
                except asyncio.TimeoutError:
                    pass
        except BaseException:
            self._release(owner)
            raise
        finally:
            if waited:
                self.waited_s += time.monotonic() - t0
        try:
            yield
        finally:
            self._release(owner)

    def _release(self, owner: object) -> None:
        if self._probe is owner:
            self._probe = None
            self._notify()
