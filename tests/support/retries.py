"""Retries of an environmental precondition: counted, reported, never silent.

A test whose scenario needs something the machine decides (a real CPU engine that may finish a call
before a pause reaches it) may run the scenario again, but only through :class:`Attempts`, and only
when the *precondition* was not met, never on a product outcome: the test's invariant checks run on
every attempt, before the precondition is looked at. Each retry is appended as one JSON line to the
file named by ``TAU_ROLLOUT_RETRY_LOG`` (``tests/conftest.py`` sets it once per pytest session, for
every xdist worker), and the session's terminal summary prints ``retries: N`` with one line each.

Usage::

    tries = Attempts(3, "the pause catches a running call")
    for _ in tries:
        result = scenario()
        check_invariants(result)            # on every attempt
        if not caught_while_running:
            tries.not_met("the call was done before the pause")  # records; fails on the last try
            continue
        break
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

ENV = "TAU_ROLLOUT_RETRY_LOG"

# The CLI's line when a new local Ray did not start: Ray gives its raylet a fixed 30 s to register
# (ray/_private/node.py), which a busy machine can miss before anything the test checks has run.
RAY_DID_NOT_START = "Ray's new local cluster did not start"


def record(test: str, what: str, reason: str) -> None:
    """Append one retry to the session's log (a no-op outside a pytest session that set the file)."""
    path = os.environ.get(ENV)
    if not path:
        return
    line = json.dumps({"test": test, "what": what, "reason": reason, "worker": os.environ.get("PYTEST_XDIST_WORKER", "main")})
    with open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")


def read(path: str | Path) -> list[dict]:
    """The retries recorded in ``path`` (none when it does not exist)."""
    p = Path(path)
    if not p.is_file():
        return []
    return [json.loads(line) for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]


class Attempts:
    """At most ``tries`` runs of a scenario whose precondition the machine decides.

    Iterate over it; call :meth:`not_met` when an attempt's precondition did not hold (the
    attempt's own checks must have run already). The last attempt's :meth:`not_met` fails the test
    naming the precondition, so a machine that never meets it is a failure, not a silent pass.
    """

    def __init__(self, tries: int, what: str) -> None:
        if tries < 1:
            raise ValueError("tries must be at least 1")
        self.tries, self.what = tries, what
        self.attempt = -1
        self.retried: list[str] = []

    def __iter__(self) -> Iterator[int]:
        for self.attempt in range(self.tries):
            yield self.attempt

    def not_met(self, reason: str) -> None:
        """Record that this attempt's precondition did not hold; fail on the last attempt.

        Raises:
            pytest.fail.Exception: on the last attempt.
        """
        if self.attempt >= self.tries - 1:
            pytest.fail(f"{self.what}: precondition not met in {self.tries} tries (last: {reason})")
        self.retried.append(reason)
        test = os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" (", 1)[0]
        record(test, self.what, reason)
