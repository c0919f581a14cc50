"""Killable child processes for model-controlled code, shared by the benchmark adapters.

A :class:`KillableChild` is a ``spawn``-ed process that serves requests over a pipe, one at a
time, and is killed when a request outlives its timeout (:class:`SandboxTimeout`), then restarted
on the next request; it dies with its parent (:mod:`rollout.core.fate`). tau2's
:class:`~rollout.benchmarks.tau2.sandbox.ToolSandbox` and tau-bench's
:class:`~rollout.benchmarks.tau_bench.sandbox.TauBenchToolSandbox` are its subclasses: a tool that
evaluates model text (``calculate``: Python's ``eval``) cannot hang the actor.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import logging
import multiprocessing as mp
import sys
import threading
from typing import Any

from rollout.core.environment import EnvironmentStepError
from rollout.core.fate import start_from_lasting_thread

logger = logging.getLogger(__name__)


class SandboxTimeout(Exception):
    """A request to a :class:`KillableChild` got no answer in time; the child was killed."""


_SPAWN_LOCK = threading.Lock()


@contextlib.contextmanager
def _spawn_without_main_script():
    """While a ``spawn`` child is started: keep it from re-running the parent's ``__main__`` script.

    ``multiprocessing``'s ``spawn`` makes the child import the parent's main module again (as
    ``__mp_main__``) when that module is a script file, so that functions defined there can be
    unpickled. In a Ray actor the script is Ray's ``default_worker.py``, which imports Ray: each
    sandbox child then held Ray's libraries, 55 MiB of its 131 MiB resident (measured here with
    ``/proc/PID/maps`` and ``python -m rollout.bench memory``). Our children's entry points live
    in importable modules, so the script is not needed: for the start only, the main module gets
    the spec name ``__main__``, for which the child's preparation imports nothing (CPython's
    ``multiprocessing.spawn._fixup_main_from_name`` returns at once for that name, as it does for
    a ``python -m pkg`` main). A main module run with ``-m`` (a spec already) or without a file is
    left as it is. Starts are serialised by a lock, so concurrent
    starts from several threads restore the main module correctly.
    """
    main = sys.modules.get("__main__")
    if main is None or getattr(main, "__spec__", None) is not None or not getattr(main, "__file__", None):
        yield
        return
    with _SPAWN_LOCK:
        main.__spec__ = importlib.machinery.ModuleSpec("__main__", None)
        try:
            yield
        finally:
            main.__spec__ = None


class KillableChild:
    """A ``spawn``-ed child process that serves requests over a pipe, one at a time, and is
    killed when a request outlives its timeout (restarted on the next request). Shared by
    tau2's :class:`~rollout.benchmarks.tau2.sandbox.ToolSandbox` and tau-bench's sandbox.

    Protocol: the child sends ``"ready"`` once started, then answers each request with
    ``("ok", result)`` or ``("exc", message)``. Subclasses give the child's entry point
    (:meth:`_child`) and a ``label`` for messages. The start-up is bounded by
    ``startup_timeout_s`` and not counted against any request.

    Args:
        startup_timeout_s: bound on the child's start-up, seconds.
    """

    label = "child process"

    def __init__(self, startup_timeout_s: float = 120.0):
        self.startup_timeout_s = startup_timeout_s
        self._ctx = mp.get_context("spawn")
        self._proc = None
        self._conn = None
        self._lock = threading.Lock()
        self.kills = 0

    def _child(self) -> tuple[Any, tuple, str]:
        """``(target, args after the pipe end, process name)`` of the child to start."""
        raise NotImplementedError

    @property
    def pid(self) -> int | None:
        """The child's process id (None before the first start and after a kill)."""
        return self._proc.pid if self._proc is not None else None

    def _ensure(self) -> None:
        """Start the child if needed and wait until it is ready (call it holding ``_lock``).

        Raises:
            EnvironmentStepError: the child did not start within ``startup_timeout_s`` or died
                starting (its exit code then in the message).
        """
        if self._proc is not None and self._proc.is_alive():
            return
        target, args, name = self._child()
        parent, child = self._ctx.Pipe()
        self._proc = self._ctx.Process(target=target, args=(child, *args), daemon=True, name=name)
        proc = self._proc

        def start() -> None:
            with _spawn_without_main_script():
                proc.start()

        # the child sets PR_SET_PDEATHSIG, which follows the thread that starts it: not this
        # (possibly short-lived executor) thread, but one that lives as long as the process
        start_from_lasting_thread(start)
        child.close()
        self._conn = parent
        try:
            ready = parent.poll(self.startup_timeout_s) and parent.recv() == "ready"
        except (EOFError, OSError):
            ready = False
        if not ready:
            self._proc.join(timeout=0.2)  # a child that died: its exit code
            code = self._proc.exitcode
            self.kill()
            if code is not None:
                raise EnvironmentStepError(f"{self.label} exited during its start-up (exit code {code})")
            raise EnvironmentStepError(f"{self.label} did not start within {self.startup_timeout_s:g}s")

    def _stop(self) -> bool:
        proc, self._proc = self._proc, None
        if proc is None or not proc.is_alive():
            return False
        proc.kill()
        proc.join(timeout=5)
        return True

    def kill(self) -> None:
        """Kill the child (a request ran too long or the pipe broke); counted in ``kills``."""
        self.kills += int(self._stop())

    def _request(self, request: Any, timeout_s: float) -> Any:
        """Send one request and wait up to ``timeout_s`` for its result (blocking).

        Raises:
            SandboxTimeout: no answer within ``timeout_s`` (the process is killed).
            EnvironmentStepError: the child did not start, or died.
            RuntimeError: the request raised in the child (the message says what).
        """
        with self._lock:
            self._ensure()
            try:
                self._conn.send(request)
                if self._conn.poll(timeout_s):
                    status, result = self._conn.recv()
                else:
                    self.kill()
                    raise SandboxTimeout()
            except (EOFError, OSError) as e:  # BrokenPipeError is an OSError
                self.kill()
                raise EnvironmentStepError(f"{self.label} died: {e!r}") from None
        if status != "ok":
            raise RuntimeError(result)
        return result
