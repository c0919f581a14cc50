"""The local server's control state: in-flight requests, pause / continue / abort, the model-update lock.

:class:`GenerationControl` is the state machine behind SGLang's ``/pause_generation``,
``/continue_generation``, ``/abort_request`` and the admission side of ``/update_weights_from_disk``
(semantics in :mod:`rollout.devtools.local.server`'s docstring). It is changed on the event loop
only; worker threads read the pause mode and wait on a condition variable while generation is
paused in place. Backend steps themselves are run by :class:`rollout.devtools.local.scheduler.StepScheduler`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable

logger = logging.getLogger(__name__)

PAUSE_MODES = ("abort", "retract", "in_place")


class InFlight:
    """One /generate request: tokens so far (written by the worker thread), its abort flag, and
    the weight version of its last backend step.

    Args:
        rid: the request id (several requests may share one).
        loop: the server's event loop (for :attr:`abort_future`).
        weight_version: the server's weight version now; the /generate endpoint sets it again on
            admission, and the worker at each step.
    """

    def __init__(self, rid: str, loop: asyncio.AbstractEventLoop, weight_version: str) -> None:
        self.rid = rid
        self.lock = threading.Lock()
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.aborted = False  # read by the worker thread under ``lock``
        self.abort_message = ""
        self.abort_future: asyncio.Future = loop.create_future()
        # The server's weight version when the request was admitted, then at each of its steps.
        self.weight_version = weight_version
        # Past the pause gate and holding a read share of the model-update lock (event loop only).
        self.admitted = False

    def abort(self, message: str) -> None:
        """Stop the request (event-loop thread only); the worker appends nothing after this."""
        with self.lock:
            if self.aborted:
                return
            self.aborted = True
            self.abort_message = message
        if not self.abort_future.done():
            self.abort_future.set_result(None)

    def snapshot(self) -> tuple[list[int], list[float], str]:
        """``(output ids, their log-probs, weight version of the last step)``, consistently."""
        with self.lock:
            return list(self.ids), list(self.logprobs), self.weight_version


class Waiters:
    """Coroutines waiting for a condition on the server's control state.

    That state (pause mode, model-update lock counts, in-flight set) is changed on the event loop
    only, so a predicate needs no lock; whoever changes it calls :meth:`notify`, and each waiter
    re-checks its predicate.
    """

    def __init__(self) -> None:
        self._futures: set[asyncio.Future] = set()

    def notify(self) -> None:
        """Wake every waiter (event-loop thread only)."""
        for fut in self._futures:
            if not fut.done():
                fut.set_result(None)
        self._futures.clear()

    async def wait_for(self, predicate: Callable[[], bool]) -> None:
        """Return once ``predicate()`` is true (checked now and after every :meth:`notify`)."""
        while not predicate():
            fut = asyncio.get_running_loop().create_future()
            self._futures.add(fut)
            try:
                await fut
            finally:
                self._futures.discard(fut)


class GenerationControl:
    """The in-flight requests, the pause mode and the model-update lock of one server.

    Every method but :meth:`wait_while_paused` runs on the event loop. The model-update lock is
    a writer-preferring readers-writer lock: every admitted /generate and chat request holds a
    read share (:meth:`admit` .. :meth:`release`) until it answers; a weight update holds the
    write side (:meth:`acquire_write` .. :meth:`release_write`).
    """

    def __init__(self) -> None:
        self.inflight: dict[str, set[InFlight]] = {}  # by rid
        # None, or the mode of the running pause (one of PAUSE_MODES); written on the event loop
        # under _pause_cv, whose notify_all wakes the worker threads paused in place.
        self.pause_mode: str | None = None
        self._pause_cv = threading.Condition()
        self._readers = 0
        self._writers_waiting = 0
        self._writer_active = False
        self._closing = False
        self._waiters = Waiters()

    # ---------------------------------------------------------------- in-flight registry
    def states(self) -> list[InFlight]:
        """Every /generate request in flight (held, admitted, or aborted and not yet answered)."""
        return [s for group in self.inflight.values() for s in group]

    def with_rid(self, rid: str) -> list[InFlight]:
        """The requests in flight with request id ``rid`` (empty when none)."""
        return list(self.inflight.get(rid, ()))

    def track(self, state: InFlight) -> None:
        """Register a new /generate request as in flight."""
        self.inflight.setdefault(state.rid, set()).add(state)

    def untrack(self, state: InFlight) -> None:
        """Forget a request that has answered, and wake whoever waits on the in-flight set."""
        group = self.inflight.get(state.rid)
        if group is not None:
            group.discard(state)
            if not group:
                del self.inflight[state.rid]
        self._waiters.notify()

    async def wait_for(self, predicate: Callable[[], bool]) -> None:
        """Return once ``predicate()`` (of the control state) is true."""
        await self._waiters.wait_for(predicate)

    # ---------------------------------------------------------------- abort and pause
    def abort(self, targets: list[InFlight], message: str) -> int:
        """Abort ``targets``: they answer at once; their workers stop stepping. Returns how many
        were not aborted already."""
        n = 0
        for s in targets:
            if not s.aborted:
                s.abort(message)
                n += 1
        if n:
            with self._pause_cv:  # wake the ones paused in place, so their threads end
                self._pause_cv.notify_all()
            self._waiters.notify()  # and the ones held at the pause gate
        return n

    def set_pause_mode(self, mode: str | None) -> None:
        """Pause generation in ``mode`` (one of :data:`PAUSE_MODES`), or continue it (None)."""
        with self._pause_cv:
            self.pause_mode = mode
            self._pause_cv.notify_all()
        self._waiters.notify()

    def num_paused_requests(self) -> int:
        """Requests that cannot step now because of the pause: paused in place, or held."""
        if self.pause_mode is None:
            return 0
        return sum(1 for s in self.states() if not s.aborted)

    def wait_while_paused(self, state: InFlight) -> bool:
        """Block the worker thread while generation is paused; False once ``state`` is aborted."""
        if self.pause_mode is not None and not state.aborted:
            with self._pause_cv:
                while self.pause_mode is not None and not state.aborted:
                    self._pause_cv.wait()
        return not state.aborted

    # ---------------------------------------------------------------- model-update lock
    async def admit(self, state: InFlight | None) -> bool:
        """Hold a request until generation is not paused and no weight update waits or runs,
        then take a read share of the model-update lock (give it back with :meth:`release`) and
        mark ``state`` admitted (``state`` None: a chat completion, not tracked).

        Returns False, holding nothing, if ``state`` was aborted while held or the server is
        shutting down.
        """
        def may_enter() -> bool:
            if self._closing or (state is not None and state.aborted):
                return True
            return self.pause_mode is None and not self._writer_active and not self._writers_waiting

        if not may_enter():
            logger.debug("request %s held (pause_mode=%s, weight update=%s)", state and state.rid,
                         self.pause_mode, self._writer_active or bool(self._writers_waiting))
        await self._waiters.wait_for(may_enter)
        if self._closing or (state is not None and state.aborted):
            return False
        self._readers += 1
        if state is not None:
            state.admitted = True
        return True

    def release(self) -> None:
        """Give back the read share taken by :meth:`admit`."""
        self._readers -= 1
        self._waiters.notify()

    @property
    def weight_update(self) -> str | None:
        """``"loading"`` while a weight update holds the model-update lock, ``"waiting"`` while
        one waits for the requests in flight, else None."""
        if self._writer_active:
            return "loading"
        return "waiting" if self._writers_waiting else None

    async def acquire_write(self) -> None:
        """Take the model-update lock: new requests wait from now on; returns once every
        admitted request has answered."""
        self._writers_waiting += 1
        try:
            await self._waiters.wait_for(lambda: not self._writer_active and self._readers == 0)
        finally:
            self._writers_waiting -= 1
            self._waiters.notify()
        self._writer_active = True

    def release_write(self) -> None:
        """Give back the model-update lock taken by :meth:`acquire_write`."""
        self._writer_active = False
        self._waiters.notify()

    # ---------------------------------------------------------------- shutdown
    def close(self) -> None:
        """Server shutdown: abort every request in flight and admit no more."""
        self._closing = True
        self.abort(self.states(), "server shutting down")
        self._waiters.notify()
