"""A rollout actor's event-loop health: :class:`LoopLagProbe` (how late the loop wakes a sleeping
coroutine, the lag every episode of the actor waits through) and :func:`tune_actor_process` (the
process settings that keep that lag low once the actor has loaded what it keeps). Used by
:class:`rollout.core.worker.RolloutWorker` and the pool and turns benches."""

from __future__ import annotations

import asyncio
import collections
import gc
import math
import sys
import threading
import time
from typing import Any, Callable

__all__ = ["LoopLagProbe", "tune_actor_process"]


class LoopLagProbe:
    """Event-loop lag: how late the loop wakes a coroutine that asked to sleep.

    A probe coroutine sleeps ``interval_s`` in a loop and records, each time, how much later than
    asked it woke (``loop.time()`` after the sleep, minus the time before it, minus
    ``interval_s``; never below 0). Whatever keeps the loop from running callbacks (a blocking
    call on the loop, CPU-bound callbacks, a worker thread holding the GIL) shows up as lag. The
    floor is about 1 ms: the selector's timeout has millisecond resolution.

    On Linux it also reads the loop thread's scheduler statistics (``/proc/self/task/<tid>/
    schedstat``: nanoseconds on a CPU, nanoseconds runnable but waiting for one), so
    :meth:`stats` can tell the loop's own CPU time from time lost waiting for a core that other
    threads or processes hold.

    Args:
        interval_s: the probe's sleep, seconds (> 0).
        max_samples: samples kept; the oldest are dropped beyond it (about 17 minutes at 10 ms).
        on_sample: called on the loop with each sample (seconds of lag), e.g. a metric's
            :meth:`~rollout.core.telemetry.Instrument.record`; ``None``: nothing.

    Raises:
        ValueError: ``interval_s <= 0`` or ``max_samples < 1``.
    """

    def __init__(self, interval_s: float = 0.01, max_samples: int = 100_000, on_sample: Callable[[float], None] | None = None) -> None:
        if interval_s <= 0 or max_samples < 1:
            raise ValueError(f"LoopLagProbe needs interval_s > 0 and max_samples >= 1, got {interval_s}, {max_samples}")
        self.interval_s = float(interval_s)
        self._samples: collections.deque[float] = collections.deque(maxlen=max_samples)
        self._on_sample = on_sample
        self._task: asyncio.Task | None = None
        self._tid: int | None = None  # the loop thread's native id, once the probe runs
        self._sched0: tuple[float, float, float] | None = None  # (monotonic s, on-CPU s, waiting s) at start / reset

    @property
    def running(self) -> bool:
        """Whether the probe coroutine is running."""
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        """Start the probe on the running event loop (idempotent).

        Raises:
            RuntimeError: no running event loop in this thread.
        """
        if not self.running:
            self._task = asyncio.get_running_loop().create_task(self._probe(), name="loop-lag-probe")

    async def _probe(self) -> None:
        loop = asyncio.get_running_loop()
        self._tid = threading.get_native_id()
        self._sched0 = self._sched_now()
        while True:
            t0 = loop.time()
            await asyncio.sleep(self.interval_s)
            lag = max(0.0, loop.time() - t0 - self.interval_s)
            self._samples.append(lag)
            if self._on_sample is not None:
                self._on_sample(lag)

    def stats(self, reset: bool = False) -> dict[str, Any]:
        """Lag percentiles over the samples since the start or the last reset.

        Args:
            reset: forget the samples after reading them (the next call covers what follows).

        Returns:
            ``{"samples": int, "interval_ms": float, "p50_ms", "p99_ms", "max_ms", "mean_ms",
            "loop_cpu_share", "loop_wait_share"}``: milliseconds (nearest-rank percentiles; the
            four figures are None without samples), then the loop thread's seconds on a CPU and
            seconds runnable but waiting for a CPU, each per second of the same span (None where
            the kernel does not say: not Linux, or no ``schedstat``). A wait share that is large
            next to the CPU share means the lag comes from a busy machine, not from the loop's
            own work.
        """
        data = sorted(self._samples)
        now = self._sched_now()
        cpu_share = wait_share = None
        if now is not None and self._sched0 is not None and now[0] > self._sched0[0]:
            span = now[0] - self._sched0[0]
            cpu_share = round((now[1] - self._sched0[1]) / span, 4)
            wait_share = round((now[2] - self._sched0[2]) / span, 4)
        if reset:
            self._samples.clear()
            self._sched0 = now
        n = len(data)

        def pct(q: float) -> float | None:
            if not n:
                return None
            rank = math.ceil(round(q * n, 9))  # nearest rank (rounded: 0.99 * 100 is 99.00000000000001)
            return round(1e3 * data[min(n, max(1, rank)) - 1], 3)

        return {
            "samples": n,
            "interval_ms": round(1e3 * self.interval_s, 3),
            "p50_ms": pct(0.50),
            "p99_ms": pct(0.99),
            "max_ms": round(1e3 * data[-1], 3) if n else None,
            "mean_ms": round(1e3 * sum(data) / n, 3) if n else None,
            "loop_cpu_share": cpu_share,
            "loop_wait_share": wait_share,
        }

    def _sched_now(self) -> tuple[float, float, float] | None:
        """``(time.monotonic(), seconds on a CPU, seconds waiting for one)`` of the loop thread,
        or None (the probe has not run yet, or no ``schedstat``)."""
        if self._tid is None:
            return None
        try:
            with open(f"/proc/self/task/{self._tid}/schedstat") as f:
                on_cpu_ns, waiting_ns, _ = f.read().split()
        except (OSError, ValueError):
            return None
        return time.monotonic(), int(on_cpu_ns) / 1e9, int(waiting_ns) / 1e9

    def stop(self) -> None:
        """Cancel the probe coroutine (idempotent); the samples are kept."""
        if self._task is not None:
            self._task.cancel()
            self._task = None


def tune_actor_process(switch_interval_s: float = 0.001) -> dict[str, Any]:
    """Tune a rollout actor's process for a responsive event loop; call it once the process has
    loaded what it keeps (the domain's database and tasks, the tokenizer).

    * ``gc.freeze()`` moves every object alive now to a generation the collector never scans.
      Without it, each full collection walks the ~160k (retail) to ~200k (airline) objects of the
      parsed database and tasks: about 100 ms with the event loop stopped, measured here, a
      loop-lag spike every time one runs. (The idea is the one the ``gc.freeze`` documentation
      gives for long-lived servers.)
    * ``malloc_trim(0)`` (glibc only; skipped elsewhere) returns the free pages the loading left
      in the heap: about 20 MiB after the tokenizer's load, measured here.
    * ``sys.setswitchinterval(switch_interval_s)``: the event loop lets the GIL go at every
      system call (each socket read and write, each poll) and must then wait for a worker thread
      running Python (a tool call, a reward) to hand it back, at the latest after the switch
      interval: Python's default of 5 ms per system call adds up to the loop's lag under load
      (the GIL "convoy effect", D. Beazley, "Understanding the Python GIL", PyCon 2010).

    Args:
        switch_interval_s: the GIL switch interval, seconds (> 0).

    Returns:
        ``{"frozen": objects frozen, "trimmed": whether malloc_trim ran, "switch_interval_s"}``.
    """
    gc.collect()
    gc.freeze()
    trimmed = False
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
        trimmed = True
    except (OSError, AttributeError):  # not glibc
        pass
    sys.setswitchinterval(switch_interval_s)
    return {"frozen": gc.get_freeze_count(), "trimmed": trimmed, "switch_interval_s": sys.getswitchinterval()}

