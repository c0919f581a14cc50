"""SIGINT / SIGTERM during a run of the CLI (``python -m rollout run`` and ``eval``):
:class:`SignalStop` routes them to the pool, which stops cleanly and keeps its journal;
:class:`Interrupted` is what they raise before the pool runs."""

from __future__ import annotations

import signal
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rollout.core.pool import RolloutPool

__all__ = ["Interrupted", "SignalStop"]


class Interrupted(BaseException):
    """SIGINT or SIGTERM reached the run before the pool was running (a ``BaseException``, like
    ``KeyboardInterrupt``)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class SignalStop:
    """SIGINT / SIGTERM handling for a run, as a context manager (main thread only; a no-op
    elsewhere). While :attr:`pool` is set, a signal asks the pool to stop
    (:meth:`rollout.core.pool.RolloutPool.interrupt`: it cancels its in-flight episodes and raises
    ``RunInterrupted`` within about a second); before, it raises :class:`Interrupted`. A second
    signal is ignored, so the clean-up cannot be cut short (SIGKILL still ends everything, and
    the journal keeps what was delivered). Previous handlers are restored on exit."""

    def __init__(self) -> None:
        self.pool: RolloutPool | None = None
        self.received: str | None = None
        self._old: dict = {}

    def _handle(self, signum, frame) -> None:
        if self.received is not None:
            return
        self.received = signal.Signals(signum).name
        if self.pool is not None:
            self.pool.interrupt(f"{self.received} received")
        else:
            raise Interrupted(signum)

    def __enter__(self) -> "SignalStop":
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.getsignal(sig)
            self._install()
        return self

    def _install(self) -> None:
        for sig in self._old:
            signal.signal(sig, self._handle)

    def attach(self, pool: "RolloutPool") -> None:
        """Route signals to ``pool`` from now on. Installs the handlers again: ``ray.init``
        replaces the SIGTERM handler with Ray's own, which aborts the process."""
        self.pool = pool
        self._install()

    def __exit__(self, *exc) -> None:
        for sig, h in self._old.items():
            signal.signal(sig, h)
