"""How the pool's calls run: one lock, sync calls in the caller's thread, async calls in a worker
thread, in slices (pure; no Ray).

The pool's state is not thread-safe, and the pool makes progress only inside a call. So every
call holds :attr:`StepRunner.lock` (a re-entrant lock) while it works: synchronous calls in the
caller's thread, asynchronous ones in a worker thread (``asyncio.to_thread``), never both at once.
When the outermost hold of the lock ends, the runner's ``on_release`` runs first (the pool's:
commit the run journal, so that every episode a call delivered is durable before the call returns
it; one ``fsync`` per call, see :mod:`rollout.core.journal`). A journal write the operating system
refused (:class:`~rollout.core.jsonl.OutputWriteError`: the disk is full), in the call or in that
commit, is turned there, still under the lock, into the runner's ``on_write_error`` exception (the
pool's: stop the run, :class:`~rollout.core.pool.errors.JournalWriteError`).
An async stream or ``collect_groups`` runs its synchronous step in slices of at most
:data:`SLICE_S` seconds, so the lock is free between slices and another call (a pause, a weight
update, a submission) gets in within about that long.

Cancellation: a worker thread cannot be stopped, so when the task awaiting a slice is cancelled,
the slice runs to its end; what it delivered stays in the pool's buffers and the next call hands
it out (nothing is lost). A :class:`~rollout.core.pool.errors.RunAborted` that no caller saw
(its awaiting task was cancelled) is raised by the next stream call instead.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Callable, Generic, TypeVar

from rollout.core.jsonl import OutputWriteError
from rollout.core.pool.errors import RunAborted

# The longest one slice of an async stream holds the pool's lock waiting for an episode (seconds).
SLICE_S = 0.5

T = TypeVar("T")


class _End:
    def __repr__(self) -> str:
        return "END"


END: Any = _End()  # a stream has nothing left


class CommitLock:
    """A re-entrant lock that calls ``on_release()`` each time its outermost hold ends, still
    holding it (then releases it, also when ``on_release`` raises). Use it as ``with lock:``.

    Args:
        on_release: what to do before the lock is let go (``None``: nothing).
        on_write_error: when the outermost hold ends with an
            :class:`~rollout.core.jsonl.OutputWriteError` (raised in the ``with`` block or by
            ``on_release``), called with it, still holding the lock; the exception it returns is
            raised instead (``None``: the error propagates as it is).
    """

    def __init__(self, on_release: Callable[[], None] | None = None,
                 on_write_error: Callable[[OutputWriteError], BaseException] | None = None):
        self._lock = threading.RLock()
        self._depth = 0  # holds by the owning thread (only the owner changes it)
        self._on_release = on_release
        self._on_write_error = on_write_error

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        got = self._lock.acquire(blocking, timeout)
        if got:
            self._depth += 1
        return got

    def release(self) -> None:
        self._depth -= 1
        try:
            if self._depth == 0 and self._on_release is not None:
                self._on_release()
        finally:
            self._lock.release()

    def __enter__(self) -> "CommitLock":
        self.acquire()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._depth > 1 or self._on_write_error is None:
            self.release()
            return
        failure = exc if isinstance(exc, OutputWriteError) else None
        try:  # the outermost hold: commit, and turn a refused write into on_write_error's exception, under the lock
            if self._on_release is not None:
                try:
                    self._on_release()
                except OutputWriteError as e:
                    failure = failure or e
            if failure is not None:
                raise self._on_write_error(failure) from failure
        finally:
            self._depth -= 1
            self._lock.release()


class StepRunner:
    """Runs the pool's steps under one lock (see the module docstring).

    Args:
        progress: ``() -> int``, growing with every episode delivered: a slice that delivered
            one resets the caller's ``timeout_s`` clock.
        on_release: called, under the lock, whenever a call's outermost hold of it ends (the
            pool commits its journal there); ``None``: nothing.
        on_write_error: see :class:`CommitLock` (the pool stops the run there).
    """

    def __init__(self, progress: Callable[[], int], on_release: Callable[[], None] | None = None,
                 on_write_error: Callable[[OutputWriteError], BaseException] | None = None):
        self.lock = CommitLock(on_release, on_write_error)
        self._progress = progress
        self._unseen: RunAborted | None = None

    def _raise_unseen(self) -> None:
        if self._unseen is not None:
            e, self._unseen = self._unseen, None
            raise e

    def call(self, fn: Callable[..., T], *args, **kwargs) -> T:
        """``fn(*args, **kwargs)`` under the lock, in this thread."""
        with self.lock:
            return fn(*args, **kwargs)

    async def call_async(self, fn: Callable[..., T], *args, **kwargs) -> T:
        """``fn(*args, **kwargs)`` under the lock, in a worker thread. Cancelling the awaiting
        task does not stop ``fn``: it runs to its end and its result is dropped."""
        return await asyncio.to_thread(self.call, fn, *args, **kwargs)

    def next(self, ensure: Callable[[float | None], bool], take: Callable[[], T | None], timeout_s: float | None) -> T:
        """The next item of a stream, in this thread: ``ensure(timeout_s)`` then ``take()``,
        under the lock; :data:`END` when the stream has nothing left.

        Raises:
            TimeoutError: from ``ensure``.
            RunAborted: from ``ensure``, or unseen by a cancelled async call.
        """
        with self.lock:
            self._raise_unseen()
            return take() if ensure(timeout_s) else END

    def until(self, fn: Callable[[float | None], bool], timeout_s: float | None) -> None:
        """``fn(timeout_s)`` again and again under the lock, in this thread, until it returns true.

        Raises:
            TimeoutError: from ``fn``.
            RunAborted: from ``fn``, or unseen by a cancelled async call.
        """
        with self.lock:
            self._raise_unseen()
            while not fn(timeout_s):
                pass

    def _slice(self, fn: Callable[[float], T], slice_s: float) -> T:
        with self.lock:
            self._raise_unseen()
            try:
                return fn(slice_s)
            except RunAborted as e:
                self._unseen = e  # cleared by the awaiting task if it sees it
                raise

    async def run_sliced(self, fn: Callable[[float], T], timeout_s: float | None) -> T:
        """``fn(slice_s)`` in a worker thread under the lock, again after each slice that ends in
        ``TimeoutError``, until one returns; its value.

        Raises:
            TimeoutError: ``timeout_s`` seconds passed without an episode delivered.
            RunAborted: from ``fn``, or unseen by a cancelled call.
        """
        last, seen = time.monotonic(), self._progress()
        while True:
            left = None if timeout_s is None else timeout_s - (time.monotonic() - last)
            try:
                return await asyncio.to_thread(self._slice, fn, SLICE_S if left is None else max(0.0, min(SLICE_S, left)))
            except RunAborted:
                self._unseen = None  # seen here
                raise
            except TimeoutError:
                if (now := self._progress()) != seen:
                    seen, last = now, time.monotonic()
                elif timeout_s is not None and time.monotonic() - last >= timeout_s:
                    raise TimeoutError(f"no episode finished within {timeout_s}s") from None

    async def next_async(self, ensure: Callable[[float | None], bool], take: Callable[[], T | None], timeout_s: float | None) -> T:
        """The next item of a stream, for a caller on an event loop: ``ensure`` in slices (see
        :meth:`run_sliced`), then ``take()`` in the loop's thread (no await in between, so a
        cancellation cannot fall between them); :data:`END` when the stream has nothing left."""
        while True:
            if not await self.run_sliced(ensure, timeout_s):
                return END
            item = take()
            if item is not None:  # None: another caller took it meanwhile
                return item


class AsyncStream(Generic[T]):
    """An async iterator over one of the pool's streams (``async for item in stream``).

    Each ``__anext__`` is one :meth:`StepRunner.next_async`; after a cancelled ``__anext__`` the
    same iterator (or a new one of the same kind) goes on, handing out first what the cancelled
    step delivered.
    """

    def __init__(self, runner: StepRunner, ensure: Callable[[float | None], bool], take: Callable[[], T | None], timeout_s: float | None):
        self._runner, self._ensure, self._take, self._timeout_s = runner, ensure, take, timeout_s

    def __aiter__(self) -> "AsyncStream[T]":
        return self

    async def __anext__(self) -> T:
        item = await self._runner.next_async(self._ensure, self._take, self._timeout_s)
        if item is END:
            raise StopAsyncIteration
        return item
