"""Bounds on tau-bench's synchronous code: the phases of one call and their clocks, the guarded
user simulator and tools that tell tau-bench's failures apart, and the killable tool sandbox.

tau-bench is synchronous: its calls run in threads, which cannot be stopped. The waiting coroutine
(:class:`rollout.benchmarks.tau_bench.episode.TauBenchEnvironment`) watches the phase the thread is
in (:class:`PhaseClock`: environment code, a tool, the user simulator, the reward, each with its
own bound); :class:`GuardedUser` and :class:`GuardedTool` time those phases and carry our errors
out of tau-bench's ``step`` (:class:`Escape`); the tools in :data:`SANDBOXED_TOOLS` run in
:class:`TauBenchToolSandbox`, a child process killed past its bound.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from rollout.benchmarks.process import KillableChild, SandboxTimeout
from rollout.benchmarks.tau_bench.child import child_main
from rollout.core.environment import EnvironmentStepError, ToolTimeoutError, UserSimulatorError

logger = logging.getLogger(__name__)

SANDBOXED_TOOLS = frozenset({"calculate"})  # tools that evaluate model text with eval: run in a killable process


# -- phases of one call, and their bounds ------------------------------------------------------------
class Escape(BaseException):
    """Carries one of our errors out of tau-bench's ``step``, whose ``except Exception`` around tool
    calls would turn it into an observation."""

    def __init__(self, error: Exception):
        super().__init__(str(error))
        self.error = error


@dataclass
class Phase:
    kind: str  # env | tool | user | reward
    detail: str
    limit: float  # seconds
    start: float  # time.monotonic()
    nested: float = 0.0  # seconds spent in phases inside this one


class PhaseClock:
    """Which phase the thread running tau-bench is in, since when, and for how long it may last.

    Phases nest (a user turn inside ``env.step``); the innermost one is timed. Nothing nests in
    a ``reward`` phase: tau-bench's reward replays the gold actions through ``step``, and those
    tool calls belong to the reward (bounded by its limit, their failures are the reward's).
    ``spent`` has the seconds spent in each kind of phase, nested phases not counted twice.
    """

    def __init__(self) -> None:
        self._stack: list[Phase] = []
        self._lock = threading.Lock()
        self.spent: dict[str, float] = defaultdict(float)

    def sealed(self) -> bool:
        """Whether the thread is inside the reward (where phases do not nest)."""
        with self._lock:
            return bool(self._stack) and self._stack[-1].kind == "reward"

    @contextlib.contextmanager
    def phase(self, kind: str, limit: float, detail: str = "") -> Iterator[None]:
        with self._lock:
            sealed = bool(self._stack) and self._stack[-1].kind == "reward"
            if not sealed:
                ph = Phase(kind, detail, limit, time.monotonic())
                self._stack.append(ph)
        if sealed:
            yield
            return
        try:
            yield
        finally:
            with self._lock:
                self._stack.remove(ph)
                took = time.monotonic() - ph.start
                self.spent[kind] += took - ph.nested
                if self._stack:
                    self._stack[-1].nested += took

    def top(self) -> tuple[Phase, float] | None:
        """The innermost phase and the seconds since it started, or None outside any."""
        with self._lock:
            if not self._stack:
                return None
            ph = self._stack[-1]
            return ph, time.monotonic() - ph.start


POLL_S = 0.25  # the waiting coroutine re-reads the phase at least this often (a nested phase may have a shorter bound)


# -- the sandbox for tools that evaluate model text (its child: rollout.benchmarks.tau_bench.child) -------------
class TauBenchToolSandbox(KillableChild):
    """A child process that runs tau-bench's :data:`SANDBOXED_TOOLS` (``calculate``, which
    evaluates its argument with ``eval``) and is killed when a call outlives its timeout, so a
    runaway expression cannot hold the actor. One per actor; calls are serialised; started with
    the ``spawn`` method on first use (its start-up, a tau-bench import, is not counted against
    any call) and restarted after a kill. The child dies with the actor (``rollout.core.fate``).

    Args:
        tool_classes: ``"module:QualName"`` of each tool class to load at start-up.
        startup_timeout_s: bound on the start-up, seconds.
    """

    label = "tau-bench tool sandbox"

    def __init__(self, tool_classes: list[str], startup_timeout_s: float = 120.0):
        super().__init__(startup_timeout_s)
        self.tool_classes = list(tool_classes)

    def _child(self) -> tuple[Any, tuple, str]:
        return child_main, (os.getpid(), self.tool_classes), "tau-bench-tool-sandbox"

    def start(self) -> None:
        """Start the child unless it runs (blocking, at most ``startup_timeout_s``).

        Raises:
            EnvironmentStepError: it did not start in time, or died starting.
        """
        with self._lock:
            self._ensure()

    def call(self, tool_class: str, kwargs: dict[str, Any], timeout_s: float, name: str = "") -> str:
        """Run ``tool_class.invoke(data={}, **kwargs)`` in the child; blocking (call it from a thread).
        ``name`` is the tool's name, for messages.

        Returns:
            The tool's output.

        Raises:
            ToolTimeoutError: no answer within ``timeout_s`` seconds (the child is killed).
            RuntimeError: the tool raised (its message; tau-bench's ``step`` turns it into
                ``"Error: <message>"``, as when the tool runs in-process).
            EnvironmentStepError: the child did not start or died.
        """
        t0 = time.monotonic()
        try:
            return self._request((tool_class, kwargs), timeout_s)
        except SandboxTimeout:
            name = name or tool_class.rpartition(":")[2]
            raise ToolTimeoutError(f"tool {name} ran longer than {timeout_s:g}s ({time.monotonic() - t0:.1f}s) and was killed") from None

    def close(self) -> None:
        """Stop the child (not counted in ``kills``)."""
        with self._lock:
            self._stop()


class GuardedUser:
    """tau-bench's user-simulator interface around the episode's user: each call is a ``user``
    phase, and what it raises leaves tau-bench's ``step`` as :class:`UserSimulatorError`."""

    def __init__(self, inner: Any, clock: PhaseClock, limit: float):
        self.inner = inner
        self.clock = clock
        self.limit = limit

    def _run(self, what: str, fn, *args, **kwargs):
        with self.clock.phase("user", self.limit, "tau-bench's user simulator"):
            try:
                return fn(*args, **kwargs)
            except Escape:
                raise
            except Exception as e:
                raise Escape(UserSimulatorError(f"tau-bench's user simulator failed ({what}): {type(e).__name__}: {' '.join(str(e).split())[:300]}")) from None

    def reset(self, instruction: str | None = None) -> str:
        return self._run("reset", self.inner.reset, instruction=instruction)

    def step(self, content: str) -> str:
        return self._run("step", self.inner.step, content)

    def get_total_cost(self) -> float:
        return self._run("get_total_cost", self.inner.get_total_cost)


class GuardedTool:
    """A tau-bench tool class's ``invoke`` / ``get_info``, timed as a ``tool`` phase; the
    :data:`SANDBOXED_TOOLS` run in the sandbox. Inside the reward (gold replay: trusted
    arguments) tools run as they are."""

    def __init__(self, name: str, cls: Any, path: str, clock: PhaseClock, limit: float, sandbox: TauBenchToolSandbox | None):
        self.name = name
        self.cls = cls
        self.path = path
        self.clock = clock
        self.limit = limit
        self.sandbox = sandbox if name in SANDBOXED_TOOLS else None

    def get_info(self) -> dict[str, Any]:
        return self.cls.get_info()

    def invoke(self, data: Any, **kwargs: Any) -> Any:
        if self.clock.sealed():
            return self.cls.invoke(data=data, **kwargs)
        if self.sandbox is None:
            with self.clock.phase("tool", self.limit, f"tool {self.name}"):
                return self.cls.invoke(data=data, **kwargs)
        # start-up (a spawn and an import) is not the call's time: bounded by the sandbox's own limit
        with self.clock.phase("env", self.sandbox.startup_timeout_s + 5.0, "tau-bench tool sandbox start-up"):
            try:
                self.sandbox.start()
            except EnvironmentStepError as e:
                raise Escape(e) from None
        # the sandbox kills the call ``limit`` seconds after it gets the child (a call of another
        # episode may hold it): the watcher's bound is only a net behind that
        with self.clock.phase("tool", self.limit + self.sandbox.startup_timeout_s + 5.0, f"tool {self.name} (sandboxed)"):
            try:
                return self.sandbox.call(self.path, kwargs, self.limit, name=self.name)
            except (ToolTimeoutError, EnvironmentStepError) as e:
                raise Escape(e) from None
