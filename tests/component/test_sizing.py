"""rollout.devtools.sizing: one sample of a process tree reads RSS and PSS over one list of processes, each
process once, so PSS <= RSS on every sample; a child sharing its parent's address space is not
counted twice; the bench's row takes the PSS of the peak-RSS sample and reports PSS > RSS."""

from __future__ import annotations

import ctypes
import platform
import subprocess
import sys

import psutil
import pytest

import rollout.devtools.sizing as sizing
from rollout.devtools.sizing import MIB, ProcessMemory, TreeSample, check_rows, sample_tree, summarize

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

SHARED_MIB = 32


def _tree_script() -> str:
    """Maps the file argv[1] shared and reads every page; as "root" (argv[2]) it starts the same
    script as "child", prints the child's pid once both hold the pages, and both wait for stdin."""
    return r"""
import mmap, subprocess, sys
code = sys.argv[3]
with open(sys.argv[1], "r+b") as f:
    m = mmap.mmap(f.fileno(), 0, mmap.MAP_SHARED)
touched = sum(m[i] for i in range(0, len(m), mmap.PAGESIZE))
assert touched == len(m) // mmap.PAGESIZE
if sys.argv[2] == "child":
    print("ready", flush=True)
    sys.stdin.readline()
    sys.exit(0)
child = subprocess.Popen([sys.executable, "-c", code, sys.argv[1], "child", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
assert child.stdout.readline().strip() == "ready"
print(child.pid, flush=True)
sys.stdin.readline()
child.stdin.close()
child.wait()
"""



def _stop(proc: subprocess.Popen) -> None:
    """End a helper process that exits when its stdin closes (killed if it has not within 30 s)."""
    proc.stdin.close()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    proc.stdout.close()

@pytest.fixture
def shared_tree(tmp_path):
    """A root process and its child, both mapping one 32 MiB file shared: ``(root pid, child pid)``."""
    path = tmp_path / "shared.bin"
    path.write_bytes(b"\1" * (SHARED_MIB * MIB))
    code = _tree_script()
    root = subprocess.Popen([sys.executable, "-c", code, str(path), "root", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = root.stdout.readline().strip()
        assert line.isdigit(), f"tree script failed: {line!r}"
        yield root.pid, int(line)
    finally:
        _stop(root)


@linux_only
def test_sample_is_one_list_of_processes_with_pss_at_most_rss(shared_tree):
    root_pid, child_pid = shared_tree
    root = psutil.Process(root_pid)
    samples = [sample_tree(root) for _ in range(5)]
    for s in samples:
        # RSS and PSS are sums over the same processes, read once each.
        assert s.pids == (root_pid, child_pid)
        assert s.skipped == ()
        assert {p.source for p in s.processes} <= {"smaps_rollup", "smaps"}
        for p in s.processes:
            assert p.pss is not None and 0 < p.pss <= p.rss
        assert s.pss is not None and s.pss <= s.rss and s.ok
        # Both hold the 32 MiB file: RSS counts it in each process, PSS once across the two.
        assert s.rss - s.pss >= SHARED_MIB * MIB
        assert min(p.rss for p in s.processes) >= SHARED_MIB * MIB


def test_sample_without_pss_counts_rss_only(shared_tree, monkeypatch):
    """Off Linux (or without access to smaps): RSS from psutil over the same list, PSS None."""
    monkeypatch.setattr(sizing, "_LINUX", False)
    root_pid, child_pid = shared_tree
    s = sample_tree(psutil.Process(root_pid))
    assert s.pids == (root_pid, child_pid)
    assert s.pss is None and s.ok
    assert all(p.source == "psutil" and p.rss >= SHARED_MIB * MIB for p in s.processes)


# Starts a forked child (its own copy, made before the 64 MiB ballast) and a child sharing this
# process's address space (clone(CLONE_VM), as vfork does until the child calls exec), both waiting
# in pause(); prints both pids.
CLONE_SCRIPT = r"""
import ctypes, os, signal, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.clone.restype = ctypes.c_int
libc.clone.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
stack = ctypes.create_string_buffer(1 << 20)
top = (ctypes.addressof(stack) + len(stack)) & ~15
forked = os.fork()  # before the ballast: a small copy
if forked == 0:
    signal.pause()
    os._exit(0)
ballast = bytearray(64 << 20)
for i in range(0, len(ballast), 4096):
    ballast[i] = 1
shared = libc.clone(ctypes.cast(libc.pause, ctypes.c_void_p), top, 0x100 | signal.SIGCHLD, None)  # CLONE_VM
if shared < 0:
    sys.exit("clone: " + os.strerror(ctypes.get_errno()))
print(shared, forked, flush=True)
sys.stdin.readline()
for pid in (shared, forked):
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
"""


def _kcmp_works() -> bool:
    nr = sizing._KCMP_SYSCALL.get(platform.machine())
    if nr is None:
        return False
    pid = psutil.Process().pid
    return ctypes.CDLL(None, use_errno=True).syscall(ctypes.c_long(nr), ctypes.c_int(pid), ctypes.c_int(pid), ctypes.c_int(1),
                                                     ctypes.c_long(0), ctypes.c_long(0)) == 0


@linux_only
@pytest.mark.parametrize("how", ["kcmp", "statm"])
def test_child_sharing_the_parents_address_space_is_not_counted_twice(how, monkeypatch):
    if how == "kcmp" and not _kcmp_works():
        pytest.skip("kcmp(2) not available here")
    if how == "statm":
        monkeypatch.setattr(sizing, "_KCMP_SYSCALL", {})
    helper = subprocess.Popen([sys.executable, "-c", CLONE_SCRIPT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        shared_pid, forked_pid = (int(x) for x in helper.stdout.readline().split())
        s = sample_tree(psutil.Process(helper.pid))
        helper_rss = s.processes[0].rss
        assert s.processes[0].pid == helper.pid and helper_rss >= 64 * MIB
        # Counting the clone would add the helper's whole RSS (and PSS) again.
        assert s.rss < 2 * helper_rss
        assert s.skipped == (shared_pid,)
        assert s.pids == (helper.pid, forked_pid)  # the forked child has its own pages: counted
        assert s.pss is not None and s.pss <= s.rss
    finally:
        _stop(helper)


def _sample(t: float, *procs: tuple[int, int, int | None]) -> TreeSample:
    return TreeSample(t, tuple(ProcessMemory(pid, rss, pss, "smaps_rollup") for pid, rss, pss in procs))


def test_row_takes_the_pss_of_the_peak_rss_sample_and_reports_pss_above_rss():
    idle = _sample(0.0, (1, 300 * MIB, 240 * MIB))
    samples = [
        _sample(0.2, (1, 320 * MIB, 270 * MIB)),
        _sample(0.4, (1, 330 * MIB, 260 * MIB), (2, 90 * MIB, 60 * MIB)),  # peak RSS 420, PSS 320
        _sample(0.6, (1, 325 * MIB, 280 * MIB), (2, 80 * MIB, 70 * MIB)),  # RSS 405, peak PSS 350
    ]
    row = {"domain": "airline", "concurrency": 10, **summarize(idle, samples, 10)}
    assert (row["idle_mib"], row["idle_pss_mib"], row["peak_mib"], row["pss_at_peak_mib"], row["peak_pss_mib"]) == (300, 240, 420, 320, 350)
    assert row["per_episode_mib"] == 12.0 and row["peak_pids"] == [1, 2] and row["n_samples"] == 3
    assert row["pss_over_rss"] == 0 and check_rows([row]) == []
    assert [s["t_s"] for s in row["samples"]] == [0.0, 0.2, 0.4, 0.6]

    bad = _sample(0.8, (1, 300 * MIB, 310 * MIB))
    assert not bad.ok
    row = {"domain": "airline", "concurrency": 10, **summarize(idle, [*samples, bad], 10)}
    assert row["pss_over_rss"] == 1
    (msg,) = check_rows([row])
    assert "airline concurrency 10: PSS > RSS in 1 of 5 samples" in msg and "t=0.8" in msg
    assert summarize(idle, [_sample(0.2, (1, 300 * MIB, None))], 1)["peak_pss_mib"] is None
    with pytest.raises(ValueError):
        summarize(idle, [], 1)
