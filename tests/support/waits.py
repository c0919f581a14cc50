"""Waiting for a condition in a test instead of sleeping for a guessed time.

A test that needs something to have happened (a call to be held, a breaker to be open, a probe
to have sampled) polls for it with a deadline that only guards against a hang: generous, so that
a loaded machine never fails it, and failing with a message that names what never happened.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from typing import Any, Callable

HANG_GUARD_S = 120.0  # a deadline no loaded machine reaches for something that takes seconds


def wait_until(cond: Callable[[], object], what: str, timeout_s: float = HANG_GUARD_S, interval_s: float = 0.05) -> None:
    """Poll ``cond()`` every ``interval_s`` seconds until it is true.

    Raises:
        AssertionError: still false after ``timeout_s`` seconds (the message names ``what``).
    """
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out after {timeout_s:g} s waiting for {what}"
        time.sleep(interval_s)


async def until(cond: Callable[[], Any], what: str, timeout_s: float = HANG_GUARD_S, interval_s: float = 0.01) -> None:
    """Poll ``cond()`` (a plain or an async callable) every ``interval_s`` seconds on the running
    event loop until it is true.

    Raises:
        AssertionError: still false after ``timeout_s`` seconds (the message names ``what``).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        value = cond()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return
        assert time.monotonic() < deadline, f"timed out after {timeout_s:g} s waiting for {what}"
        await asyncio.sleep(interval_s)
