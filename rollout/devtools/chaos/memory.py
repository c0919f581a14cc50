"""Ray's memory monitor, made to kill a chosen actor deterministically without endangering a shared
machine (the ``actor_oom`` fault).

Ray's raylet kills workers when its node's memory usage passes ``RAY_memory_usage_threshold`` (read
from the raylet's environment; default 0.95), reading the usage from the cgroup at
``/sys/fs/cgroup/memory`` (v1: ``memory.usage_in_bytes`` less ``total_inactive_file``, against
``memory.limit_in_bytes``) when it has a limit, else from ``/proc/meminfo``. So the bench's cluster
helper runs in a mount namespace of its own, in a memory cgroup of its own (a child of the bench's
own cgroup, with a limit), bind-mounted over ``/sys/fs/cgroup/memory`` there: every raylet of the
throwaway cluster reads that cgroup's usage, which only the cluster's own processes make, whatever
the rest of the machine does; and the kernel keeps the whole cluster, pressure included, under the
limit. The node whose actor is the victim is started with a low ``RAY_memory_usage_threshold``
(the other keeps the default), and holds only that actor (one CPU, one actor a CPU); at the strike
a process of the helper's own, in the cgroup, allocates and touches the bytes that take the usage
past the victim node's threshold and well below the other's: that raylet kills its one busy
worker, the victim actor; the pressure is released as soon as the victim is dead.

Needs root (or a delegated cgroup v1 memory hierarchy) and ``unshare``; elsewhere the fault is
reported as not injected, saying why.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

MEMORY_ROOT = Path("/sys/fs/cgroup/memory")


def own_memory_cgroup() -> Path:
    """The cgroup v1 memory folder this process is in.

    Raises:
        RuntimeError: no cgroup v1 memory hierarchy here, or it is not writable.
    """
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            folder = MEMORY_ROOT / path.lstrip("/")
            if not os.access(folder, os.W_OK):
                raise RuntimeError(f"the memory cgroup {folder} is not writable (root, or a delegated hierarchy, is needed)")
            return folder
    raise RuntimeError("no cgroup v1 memory hierarchy (/proc/self/cgroup names no memory controller)")


def make_cgroup(limit: int) -> Path:
    """A new memory cgroup under this process's own, limited to ``limit`` bytes; returns its folder.

    Raises:
        RuntimeError: see :func:`own_memory_cgroup`; OSError: it could not be made.
    """
    folder = own_memory_cgroup() / f"rollout-chaos-{os.getpid()}"
    folder.mkdir()
    (folder / "memory.limit_in_bytes").write_text(str(limit))
    return folder


def usage(folder: Path = MEMORY_ROOT) -> tuple[int, int]:
    """``(used, limit)`` bytes of the memory cgroup at ``folder`` as Ray's memory monitor reads them
    (v1: ``memory.usage_in_bytes`` less ``total_inactive_file``)."""
    used = int((folder / "memory.usage_in_bytes").read_text())
    stat = dict(line.split() for line in (folder / "memory.stat").read_text().splitlines())
    return used - int(stat.get("total_inactive_file", 0)), int((folder / "memory.limit_in_bytes").read_text())


def available_on_machine() -> int:
    """``MemAvailable`` of the machine, bytes."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def start_pressure(nbytes: int) -> subprocess.Popen:
    """A process that allocates and touches ``nbytes`` (``b"\\x01" * n`` writes every page), prints
    ``held`` once it holds them, and holds them until its stdin closes; it inherits the caller's
    cgroup."""
    code = "import sys; d = b'\\x01' * int(sys.argv[1]); print('held', flush=True); sys.stdin.read()"
    proc = subprocess.Popen([sys.executable, "-c", code, str(nbytes)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    proc.stdout.readline()
    return proc


_KILLED = re.compile(r"Selected to kill: \((Actor\([0-9a-f]+\)|[^:]+):.*?pid=(\d+)")
_REASON = re.compile(r"OOM kill reason: (.*)")
_RAYLET = re.compile(r"^\[[^\]]* [IWE] (\d+) \d+\] \(raylet\)", re.MULTILINE)


def oom_kills(logs_dir: Path) -> dict:
    """The workers Ray's memory monitor killed, from the raylets' logs in ``logs_dir`` (each
    ``raylet*.out``): ``{"kills": [{"raylet_pid", "pid", "what", "reason"}]}`` (``what``: e.g.
    ``Actor(<id>)``; ``reason``: the monitor's ``OOM kill reason`` line)."""
    kills = []
    for path in sorted(logs_dir.glob("raylet*.out")):
        text = path.read_text(errors="replace")
        raylet = _RAYLET.search(text)
        reasons = _REASON.findall(text)
        for i, m in enumerate(_KILLED.finditer(text)):
            kills.append({"raylet_pid": int(raylet.group(1)) if raylet else None, "pid": int(m.group(2)), "what": m.group(1),
                          "reason": reasons[i] if i < len(reasons) else None})
    return {"kills": kills}
