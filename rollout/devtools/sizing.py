"""Resident memory of one rollout actor against its concurrency (``python -m rollout.bench memory``).

For each domain and each concurrency ``c``, one actor (``pool.max_concurrent_episodes=c``) runs
``2 * c`` episodes (two of each of the first ``c`` tasks) while a thread samples, every 0.2 s, the
memory of the actor's process plus its children (the tool sandbox, which loads tau2 too, started
on the first database-free tool call, and multiprocessing's resource tracker), and once more after
the last episode. Each sample (:func:`sample_tree`) lists the processes of the tree once and reads,
for each, the resident set size (RSS) and the proportional set size (PSS, Linux: shared pages
divided among the processes that map them, so the actor and its sandbox do not both count the
shared libraries they map; the RSS sum does) from one read of ``/proc/PID/smaps_rollup``, so that
within a sample both are over the same processes at the same moment and PSS <= RSS.

Reported per row, in MiB: RSS and PSS when started and idle; the peak RSS over the samples, that
peak per concurrent episode above idle, and the PSS of that same (peak-RSS) sample; the peak PSS
over the samples (possibly from another sample; still at most the peak RSS); the number of
samples and of samples whose PSS exceeds their RSS (always 0 unless the kernel's figures are
inconsistent; :func:`check_rows` reports them and the bench then exits 1). Uses the local stack
(gold replay) unless ``local.enabled=false``.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import platform
import sys
import threading
import time
from typing import Any

import psutil

from rollout.core.config import Config

MIB = 2**20
SAMPLE_INTERVAL_S = 0.2

_LINUX = sys.platform.startswith("linux")
_PF_FORKNOEXEC = 0x40  # task flag (include/linux/sched.h): forked, has not called exec since
_KCMP_VM = 1  # kcmp(2) type: do the two processes share one address space?
_KCMP_SYSCALL = {"x86_64": 312, "aarch64": 272, "riscv64": 272}  # kcmp's syscall number per machine


@dataclasses.dataclass(frozen=True)
class ProcessMemory:
    """One process's memory in one :class:`TreeSample`.

    Attributes:
        pid: the process id.
        rss: resident set size, bytes.
        pss: proportional set size, bytes; None where it cannot be read (off Linux, or no access to
            ``/proc/PID/smaps*``).
        source: where both came from: ``"smaps_rollup"`` or ``"smaps"`` (one read of that
            ``/proc`` file gives both, so ``pss <= rss``), or ``"psutil"`` (RSS only).
    """

    pid: int
    rss: int
    pss: int | None
    source: str


@dataclasses.dataclass(frozen=True)
class TreeSample:
    """The memory of a process tree at one moment: one list of processes, each read once.

    Attributes:
        time: ``time.monotonic()`` when the sample started, seconds.
        processes: the processes counted, the root first (processes that exited while the sample
            was taken are left out).
        skipped: processes of the tree left out because they share the address space of their
            parent in the sample (a ``vfork`` child before its ``exec``, or a ``CLONE_VM`` child):
            their ``/proc`` figures are their parent's, which is already counted.
    """

    time: float
    processes: tuple[ProcessMemory, ...]
    skipped: tuple[int, ...] = ()

    @property
    def pids(self) -> tuple[int, ...]:
        """The pids counted in both :attr:`rss` and :attr:`pss`, root first."""
        return tuple(p.pid for p in self.processes)

    @property
    def rss(self) -> int:
        """RSS of the processes counted, bytes."""
        return sum(p.rss for p in self.processes)

    @property
    def pss(self) -> int | None:
        """PSS of the same processes, bytes; None if any of them has no PSS."""
        if any(p.pss is None for p in self.processes):
            return None
        return sum(p.pss for p in self.processes)  # type: ignore[misc]

    @property
    def ok(self) -> bool:
        """False when the PSS exceeds the RSS: impossible for figures read as documented."""
        return self.pss is None or self.pss <= self.rss

    def to_json(self, t0: float = 0.0) -> dict[str, Any]:
        """``{"t_s", "rss", "pss", "pids", "skipped", "sources"}``: bytes, seconds since ``t0``."""
        return {"t_s": round(self.time - t0, 3), "rss": self.rss, "pss": self.pss, "pids": list(self.pids),
                "skipped": list(self.skipped), "sources": sorted({p.source for p in self.processes})}


def _read_process(pid: int) -> ProcessMemory:
    """RSS and PSS of ``pid`` from one read of ``/proc/PID/smaps_rollup`` (``/proc/PID/smaps``
    where the former is missing or refuses, as it can for live processes), else psutil's RSS
    with no PSS (off Linux, or no read access).

    Raises:
        psutil.NoSuchProcess: the process is gone.
        psutil.AccessDenied: not even its RSS can be read.
    """
    if _LINUX:
        for name in ("smaps_rollup", "smaps"):
            try:
                with open(f"/proc/{pid}/{name}", "rb") as f:
                    data = f.read()
            except (FileNotFoundError, ProcessLookupError):
                continue
            except PermissionError:
                break
            rss = pss = 0
            for line in data.splitlines():
                if line.startswith(b"Rss:"):
                    rss += int(line.split()[1]) * 1024
                elif line.startswith(b"Pss:"):
                    pss += int(line.split()[1]) * 1024
            return ProcessMemory(pid, rss, pss, name)
    return ProcessMemory(pid, psutil.Process(pid).memory_info().rss, None, "psutil")


def _ppid_and_flags(pid: int) -> tuple[int, int] | None:
    """``(ppid, task flags)`` from ``/proc/PID/stat``; None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return int(fields[1]), int(fields[6])  # after the name: state, ppid, pgrp, session, tty_nr, tpgid, flags


@functools.lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL:
    """The C library of this process (for ``syscall``)."""
    return ctypes.CDLL(None, use_errno=True)


def _shares_address_space(a: int, b: int) -> bool:
    """Whether processes ``a`` and ``b`` share one address space: ``kcmp(KCMP_VM)`` where the
    kernel answers, else whether their ``/proc/PID/statm`` lines (the address space's counters)
    are equal, which a child that did ``fork`` rather than ``vfork`` does not match (``fork``
    does not copy the parent's file-backed page table entries, so its resident count is lower)."""
    nr = _KCMP_SYSCALL.get(platform.machine())
    if nr is not None:
        r = _libc().syscall(ctypes.c_long(nr), ctypes.c_int(a), ctypes.c_int(b), ctypes.c_int(_KCMP_VM), ctypes.c_long(0), ctypes.c_long(0))
        if r >= 0:
            return r == 0
    try:
        with open(f"/proc/{a}/statm", "rb") as fa, open(f"/proc/{b}/statm", "rb") as fb:
            return fa.read() == fb.read()
    except OSError:
        return False


def sample_tree(proc: psutil.Process) -> TreeSample:
    """One sample of ``proc`` and its descendants: their list is taken once, and each process's
    RSS and PSS come from one read (:class:`ProcessMemory`), so ``pss <= rss`` for each process
    and for the sum.

    A descendant that shares its parent's address space (``vfork`` before ``exec``: how
    ``subprocess`` and multiprocessing's ``spawn`` start children, for a moment) would count the
    parent's memory a second time; it is left out and named in :attr:`TreeSample.skipped`.

    Raises:
        psutil.NoSuchProcess: ``proc`` is gone.
        psutil.AccessDenied: the RSS of a process of the tree cannot be read.
    """
    t = time.monotonic()
    tree = [proc, *proc.children(recursive=True)]  # parents before their children
    counted: list[ProcessMemory] = []
    skipped: list[int] = []
    for p in tree:
        if _LINUX and p.pid != proc.pid:
            stat = _ppid_and_flags(p.pid)
            if stat is None:
                continue
            ppid, flags = stat
            if flags & _PF_FORKNOEXEC and any(c.pid == ppid for c in counted) and _shares_address_space(ppid, p.pid):
                skipped.append(p.pid)
                continue
        try:
            counted.append(_read_process(p.pid))
        except psutil.NoSuchProcess:
            if p.pid == proc.pid:
                raise
    return TreeSample(t, tuple(counted), tuple(skipped))


def summarize(idle: TreeSample, samples: list[TreeSample], concurrency: int) -> dict[str, Any]:
    """The memory fields of a :func:`measure` row from the idle sample and those taken while
    running (``samples`` non-empty), in MiB: ``idle_mib``, ``idle_pss_mib``, ``peak_mib`` (the
    largest RSS over ``samples``), ``per_episode_mib`` (``(peak - idle) / concurrency``),
    ``pss_at_peak_mib`` (the PSS of that peak-RSS sample), ``peak_pss_mib`` (the largest PSS over
    ``samples``), ``peak_pids``, ``n_samples``, ``pss_over_rss`` (how many samples, the idle one
    included, have PSS > RSS) and ``samples`` (each :meth:`TreeSample.to_json`, the idle one
    first). PSS fields are None where a sample has no PSS.

    Raises:
        ValueError: ``samples`` is empty.
    """
    if not samples:
        raise ValueError("no samples taken while running")
    peak = max(samples, key=lambda s: s.rss)
    psss = [s.pss for s in samples]
    mib = lambda b: None if b is None else round(b / MIB)  # noqa: E731
    return {
        "idle_mib": mib(idle.rss), "idle_pss_mib": mib(idle.pss), "peak_mib": mib(peak.rss),
        "per_episode_mib": round((peak.rss - idle.rss) / MIB / concurrency, 1), "pss_at_peak_mib": mib(peak.pss),
        "peak_pss_mib": None if None in psss else mib(max(psss)),  # type: ignore[type-var]
        "peak_pids": list(peak.pids), "n_samples": len(samples), "pss_over_rss": sum(not s.ok for s in [idle, *samples]),
        "samples": [s.to_json(idle.time) for s in [idle, *samples]],
    }


def check_rows(rows: list[dict[str, Any]]) -> list[str]:
    """One message per row with a sample whose PSS exceeds its RSS (none when all is well)."""
    out = []
    for r in rows:
        if r.get("pss_over_rss"):
            bad = [s for s in r.get("samples", []) if s["pss"] is not None and s["pss"] > s["rss"]]
            worst = max(bad, key=lambda s: s["pss"] - s["rss"], default=None)
            detail = "" if worst is None else (f"; worst at t={worst['t_s']} s: PSS {worst['pss'] / MIB:.1f} MiB > RSS "
                                               f"{worst['rss'] / MIB:.1f} MiB over pids {worst['pids']}")
            out.append(f"{r['domain']} concurrency {r['concurrency']}: PSS > RSS in {r['pss_over_rss']} of "
                       f"{r['n_samples'] + 1} samples{detail}")
    return out


def measure(cfg: Config, concurrencies: list[int]) -> list[dict[str, Any]]:
    """One row per concurrency for ``cfg.env.domain``: ``{"domain", "concurrency", "episodes",
    "wall_s"}`` plus the fields of :func:`summarize` (MiB; the samples in bytes).

    Raises:
        RuntimeError: the local stack or the actor failed to start.
        psutil.NoSuchProcess: the actor was gone before its idle sample.
    """
    from rollout.app.wiring import open_pool

    rows = []
    for c in concurrencies:
        pool_cfg = dataclasses.replace(cfg.pool, num_actors=1, max_concurrent_episodes=c)
        with open_pool(dataclasses.replace(cfg, pool=pool_cfg), log_dir_name="bench_stack_logs") as (_, pool, task_ids):
            proc = psutil.Process(pool.worker_infos()[0]["pid"])
            idle = sample_tree(proc)
            samples: list[TreeSample] = []
            stop = threading.Event()

            def watch() -> None:
                while True:
                    try:
                        samples.append(sample_tree(proc))
                    except psutil.NoSuchProcess:
                        return  # the actor is gone; what was sampled stays
                    if stop.wait(SAMPLE_INTERVAL_S):
                        return

            watcher = threading.Thread(target=watch, name="sizing-sampler", daemon=True)
            watcher.start()
            t0 = time.monotonic()
            n = 0
            pool.submit_tasks(task_ids[:c], n_samples_per_task=2)  # 2 * c episodes (fewer if the split is smaller)
            for _ in pool.results():
                n += 1
            wall = time.monotonic() - t0
            stop.set()
            watcher.join()
            try:
                samples.append(sample_tree(proc))  # after the last episode
            except psutil.NoSuchProcess:
                pass
            rows.append({"domain": cfg.env.domain, "concurrency": c, "episodes": n, "wall_s": round(wall, 1), **summarize(idle, samples, c)})
    return rows


def format_rows(rows: list[dict[str, Any]]) -> str:
    """The table ``python -m rollout.bench memory`` prints: one line per :func:`measure` row."""
    cols = [("domain", "domain", "<8"), ("concurrency", "concurrency", ">11"), ("episodes", "episodes", ">8"),
            ("idle RSS MiB", "idle_mib", ">12"), ("idle PSS MiB", "idle_pss_mib", ">12"), ("peak RSS MiB", "peak_mib", ">12"),
            ("RSS MiB/episode", "per_episode_mib", ">15"), ("PSS at peak RSS", "pss_at_peak_mib", ">15"),
            ("peak PSS MiB", "peak_pss_mib", ">12"), ("samples", "n_samples", ">7"), ("PSS>RSS", "pss_over_rss", ">7"),
            ("wall s", "wall_s", ">7")]
    head = " ".join(f"{title:{fmt}}" for title, _, fmt in cols)
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(" ".join(f"{'-' if r.get(key) is None else r[key]:{fmt}}" for _, key, fmt in cols))
    return "\n".join(lines)
