"""The processes of a fault's runs: every descendant of each driver recorded while it runs
(:class:`ProcessWatcher`), waited for and stopped by pid or process group, never by name."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import psutil


def proc_key(p: psutil.Process) -> tuple[int, float] | None:
    try:
        return p.pid, p.create_time()
    except psutil.Error:
        return None


def cmdline(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())
    except psutil.Error:
        return ""


def alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class ProcessWatcher:
    """Records every process under some root pids, polling every ``interval_s`` seconds in a
    thread (a SIGKILLed driver's children are re-parented: they stay recorded).

    Attributes:
        seen: ``(pid, create time) -> psutil.Process`` of every process recorded (roots included).
        gone_at: ``(pid, create time) -> time.monotonic()`` of the poll that first found it gone.
    """

    def __init__(self, interval_s: float = 0.5):
        self.interval_s = interval_s
        self.seen: dict[tuple[int, float], psutil.Process] = {}
        self.gone_at: dict[tuple[int, float], float] = {}
        self._roots: list[psutil.Process] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="chaos-watcher", daemon=True)
        self._thread.start()

    def add(self, pid: int) -> None:
        """Watch ``pid`` and its descendants (recorded at once and then every poll)."""
        try:
            p = psutil.Process(pid)
        except psutil.Error:
            return
        with self._lock:
            self._roots.append(p)
        self.scan()

    def scan(self) -> None:
        """Record the roots' live descendants now."""
        with self._lock:
            roots = list(self._roots)
        for root in roots:
            found = [root]
            try:
                if root.is_running():
                    found += root.children(recursive=True)
            except psutil.Error:
                pass
            for p in found:
                k = proc_key(p)
                if k is not None:
                    with self._lock:
                        self.seen.setdefault(k, p)
        with self._lock:
            todo = [(k, p) for k, p in self.seen.items() if k not in self.gone_at]
        now = time.monotonic()
        for k, p in todo:
            if not alive(p):
                with self._lock:
                    self.gone_at[k] = now

    def gone_after(self, keys: list[tuple[int, float]], since: float) -> float | None:
        """Seconds from ``since`` (``time.monotonic()``) until every process of ``keys`` was
        found gone; ``None`` while one is still alive."""
        with self._lock:
            if any(k not in self.gone_at for k in keys):
                return None
            return max([self.gone_at[k] - since for k in keys] + [0.0])

    def descendants(self, pid: int) -> list[psutil.Process]:
        """Live descendants of ``pid`` now (not only recorded ones)."""
        try:
            return psutil.Process(pid).children(recursive=True)
        except psutil.Error:
            return []

    def alive(self) -> list[psutil.Process]:
        """Recorded processes still alive (zombies excepted)."""
        with self._lock:
            procs = list(self.seen.values())
        return [p for p in procs if alive(p)]

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.scan()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


def wait_gone(watcher: ProcessWatcher, timeout_s: float) -> tuple[list[psutil.Process], float]:
    """Wait up to ``timeout_s`` seconds for every recorded process to exit; returns what is
    still alive and the seconds waited."""
    t0 = time.monotonic()
    while True:
        left = watcher.alive()
        if not left or time.monotonic() - t0 >= timeout_s:
            return left, time.monotonic() - t0
        time.sleep(0.5)


def kill_tree(pid: int, sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` to ``pid``'s process group (it was started in a session of its own)."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop_proc(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
    """SIGTERM ``proc``'s process group, SIGKILL it after ``grace_s`` seconds."""
    if proc.poll() is None:
        kill_tree(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)
            proc.wait(10)
