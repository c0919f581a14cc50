"""Fate sharing: a child process that exits when the process that started it dies, even when that
parent is SIGKILLed (no ``atexit``, no clean-up of its own). Used by the local stack's servers and
router and by the tool sandbox, so that nothing a run started outlives it.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

logger = logging.getLogger(__name__)

_PARENT_POLL_S = 0.5
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
T = TypeVar("T")


def set_parent_death_signal(sig: int = signal.SIGTERM) -> bool:
    """Ask Linux to send ``sig`` to this process when its parent *thread* exits
    (``prctl(PR_SET_PDEATHSIG)``; kept across ``execve``). Returns False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _default_on_parent_death() -> None:
    os.kill(os.getpid(), signal.SIGTERM)  # a graceful exit where the process handles SIGTERM
    time.sleep(10.0)
    os._exit(1)


def share_fate(parent_pid: int | None, pdeathsig: bool = False,
               on_parent_death: Callable[[], None] | None = None) -> None:
    """Make this process exit when its parent is gone.

    Args:
        parent_pid: the pid of the expected parent; a daemon thread polls ``os.getppid()`` twice a
            second and, once it differs (the parent died and this process was re-parented),
            calls ``on_parent_death``. If the parent is already gone, exits at once (code 1).
            None: no polling.
        pdeathsig: also ``prctl(PR_SET_PDEATHSIG, SIGTERM)`` (Linux); only correct when the
            parent started this process from a thread that lives as long as the parent.
        on_parent_death: default: SIGTERM to itself, then ``os._exit(1)`` 10 s later.
    """
    if pdeathsig:
        set_parent_death_signal(signal.SIGTERM)
    if parent_pid is None:
        return
    if os.getppid() != parent_pid:  # gone before we could watch it
        os._exit(1)
    action = on_parent_death or _default_on_parent_death

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(_PARENT_POLL_S)
        logger.warning("parent process %d is gone; exiting", parent_pid)
        action()

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


_starter: tuple[int, Any] | None = None  # (pid, executor): this process's starter thread
_starter_lock = threading.Lock()


def start_from_lasting_thread(start: Callable[[], T], timeout_s: float | None = None) -> T:
    """Run ``start()`` (typically ``multiprocessing.Process.start``) on a thread that lives as long
    as this process, and return its result (its exception is re-raised here).

    Linux's ``PR_SET_PDEATHSIG`` fires when the parent *thread* that created a child exits, not
    when the parent process does (``prctl(2)``: "the parent thread"). A child that sets it and is
    started from a short-lived thread (an executor thread of an event loop that ``asyncio.run``
    shuts down, a ``ThreadPoolExecutor`` that is closed) is killed as soon as that thread ends,
    while its parent still uses it. Starting every such child from one daemon thread per process,
    which never exits before the process does, ties the signal to the process.

    Starts are serialised on that thread. After a ``fork`` the child process gets a thread of its
    own on its first call.

    Args:
        start: a callable with no arguments, run on the starter thread.
        timeout_s: how long to wait for it, seconds (None: no bound).

    Raises:
        concurrent.futures.TimeoutError: ``start`` did not return within ``timeout_s``.
        Exception: whatever ``start`` raised.
    """
    global _starter
    from concurrent.futures import ThreadPoolExecutor

    with _starter_lock:
        if _starter is None or _starter[0] != os.getpid():
            # never shut down: a ThreadPoolExecutor's worker waits for work for the process's life
            _starter = (os.getpid(), ThreadPoolExecutor(max_workers=1, thread_name_prefix="child-starter"))
        executor = _starter[1]
    return executor.submit(start).result(timeout=timeout_s)
