"""The driver's blocking Ray calls (``ray.get``, ``ray.wait``), with what a signal handler
raised while the driver waited given back as itself.

Ray's wait checks for signals from C++: a handler's ``KeyboardInterrupt`` comes out as
``KeyboardInterrupt``, but anything else a handler raises (``rollout.app.signals.Interrupted``
from the CLI's SIGINT / SIGTERM handler before the pool runs, pytest-timeout's ``Failed``, a
trainer's own) is left pending and comes out as a ``SystemError`` ("returned a result with an
exception set") whose ``__cause__`` is that exception (seen with Ray 2.x here: a test's 300 s
timeout inside ``RolloutPool.start``). The pool's loops catch ``Exception`` around Ray calls, so
such a ``SystemError`` was taken for a Ray failure and the run went on (a CI run's collect_groups
went on for 601 s past its test's timeout). Every blocking Ray call of the pool goes through
:func:`get` and :func:`wait`, which raise the handler's exception instead. A handler that must
stop a pool should raise a ``BaseException`` (as ``KeyboardInterrupt`` is), which the pool's
``except Exception`` clauses let through, or call ``RolloutPool.interrupt``.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterator

import ray
from ray.exceptions import GetTimeoutError

__all__ = ["SLICE_S", "get", "raised_by_signal_handler", "wait"]

#: Longest single Ray wait, in seconds: a signal handler's exception is only seen when Ray's
#: call returns (a bare ``ray.get`` of an actor still starting returns when the actor is ready),
#: so longer waits are made of slices this long.
SLICE_S = 1.0


def raised_by_signal_handler(error: BaseException) -> BaseException | None:
    """The exception a signal handler raised during a Ray call, when ``error`` is Ray's
    ``SystemError`` wrapping it (its ``__cause__``); ``None`` for any other error."""
    if isinstance(error, SystemError) and error.__cause__ is not None:
        return error.__cause__
    return None


def _call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except SystemError as e:
        cause = raised_by_signal_handler(e)
        if cause is None:
            raise
        raise cause from None


def _slices(timeout: float | None) -> Iterator[tuple[float, bool]]:
    """The slices of a wait bounded by ``timeout`` seconds (``None``: none), as ``(seconds,
    last)``: each at most :data:`SLICE_S`, the last one ending at the bound."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        if deadline is None:
            yield SLICE_S, False
        else:
            left = deadline - time.monotonic()
            yield max(0.0, min(SLICE_S, left)), left <= SLICE_S


def wait(refs: list, *, num_returns: int = 1, timeout: float | None = None) -> tuple[list, list]:
    """``ray.wait(refs, num_returns=num_returns, timeout=timeout)``: ``(ready, not ready)``,
    waited in slices of at most :data:`SLICE_S` (``timeout`` in seconds; ``None``: until
    ``num_returns`` are ready).

    Raises:
        BaseException: what a signal handler raised while waiting (see the module docstring),
            within about :data:`SLICE_S`; and whatever ``ray.wait`` raises otherwise.
    """
    for step, last in _slices(timeout):
        ready, rest = _call(ray.wait, refs, num_returns=num_returns, timeout=step)
        if len(ready) >= num_returns or last:
            return ready, rest
    raise AssertionError("unreachable")  # pragma: no cover (_slices never ends)


def get(refs: Any, *, timeout: float | None = None) -> Any:
    """``ray.get(refs, timeout=timeout)`` (one ref or a list; ``timeout`` in seconds, ``None``:
    no bound), waited for in slices of at most :data:`SLICE_S`; a ready object costs one
    ``ray.get``, as before.

    Raises:
        BaseException: what a signal handler raised while waiting (see the module docstring),
            within about :data:`SLICE_S`.
        ray.exceptions.GetTimeoutError: not every object was ready within ``timeout``.
        Whatever ``ray.get`` raises for a ready object (``RayActorError``, ``RayTaskError``, ...).
    """
    for step, last in _slices(timeout):
        try:
            return _call(ray.get, refs, timeout=step)
        except GetTimeoutError:
            if last:
                raise
    raise AssertionError("unreachable")  # pragma: no cover (_slices never ends)
