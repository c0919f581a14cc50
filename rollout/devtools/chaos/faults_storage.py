"""The storage faults: the output disk filling up mid-run (a real tmpfs of the bench's own, in a mount
namespace of its own), a journal torn by a crash mid-write and a journal line corrupted in the
middle (see the package docstring)."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Callable

from rollout.core.jsonl import read_lines
from rollout.devtools.chaos.faults import driver_stop_resume
from rollout.devtools.chaos.job import ROOT, Fault, Job, strike_text
from rollout.devtools.chaos.procs import stop_proc
from rollout.devtools.chaos.progress import Progress, mid_run, run_strikes

logger = logging.getLogger(__name__)

DISK_BYTES = 64 * 2**20  # disk_full: the tmpfs's size (a retail episode's journal line is ~80 KB, its result line as much)
EXIT_STOPPED = 4  # the CLI's exit code for a run that stopped and can be resumed
_CANNOT_WRITE = re.compile(r"cannot (?:write|make durable) (\S+): (.+?) \(errno (\d+)")


class TmpfsMount:
    """A tmpfs of ``size`` bytes on ``mountpoint``, in a mount namespace of its own: the holder
    process (``python -m rollout.devtools.chaos tmpfs``, started under ``unshare -m``, or ``unshare
    -Urm`` for a user without root) mounts it and keeps it while its stdin is open; nothing is
    mounted where any other process sees it, and it goes with the holder (which dies with the
    bench). Runs join the namespace with :attr:`prefix` (``nsenter``, which ``exec``s); the bench
    reads and writes the tmpfs through :attr:`view` (``/proc/<holder>/root/<mountpoint>``).

    Raises:
        RuntimeError: ``unshare`` / ``nsenter`` are missing, or the mount failed (no privilege:
            neither root nor unprivileged user namespaces); the message says which.
    """

    def __init__(self, f: Fault, mountpoint: Path, size: int):
        missing = [x for x in ("unshare", "nsenter") if shutil.which(x) is None]
        if missing:
            raise RuntimeError(f"{' and '.join(missing)} not found (util-linux)")
        mountpoint.mkdir(parents=True, exist_ok=True)
        root = os.geteuid() == 0
        ns = ["-m"] if root else ["-U", "-r", "-m"]
        self._log = open(f.dir / "tmpfs.log", "w")  # noqa: SIM115 (closed by stop())
        self.proc = subprocess.Popen(["unshare", *ns, "--propagation", "private", sys.executable, "-m", "rollout.devtools.chaos", "tmpfs",
                                      str(mountpoint), str(size)], cwd=ROOT, env=f.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._log, text=True, start_new_session=True)
        f.watcher.add(self.proc.pid)
        got: list[str] = []
        reader = threading.Thread(target=lambda: got.append(self.proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(30)
        if not got or not got[0].strip():
            self.stop()
            raise RuntimeError(f"the tmpfs holder did not mount it: {(f.dir / 'tmpfs.log').read_text()[-400:]!r}")
        self.info = json.loads(got[0])
        self.how = f"tmpfs of {size // 2**20} MiB in a mount namespace of its own (unshare {' '.join(ns)}, as {'root' if root else 'a user'})"
        # --wd: joining a mount namespace moves the working directory to its root
        self.prefix = ["nsenter", "-t", str(self.proc.pid), *(["-m"] if root else ["-U", "-m"]), f"--wd={ROOT}", "--"]
        self.view = Path(f"/proc/{self.proc.pid}/root") / mountpoint.relative_to(mountpoint.anchor)

    def stop(self) -> None:
        """Let the holder go (its namespace and the tmpfs with it)."""
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                stop_proc(self.proc)
        self._log.close()


def tmpfs_main(argv: list[str]) -> int:
    """``python -m rollout.devtools.chaos tmpfs MOUNTPOINT BYTES`` (run under ``unshare -m``):
    mount a tmpfs of ``BYTES`` on ``MOUNTPOINT``, print ``{"mounted", "bytes"}`` as one JSON line,
    and hold it until stdin closes or the parent dies."""
    from rollout.core.fate import set_parent_death_signal

    set_parent_death_signal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    mountpoint, size = argv[0], int(argv[1])
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", mountpoint], check=True)
    st = os.statvfs(mountpoint)
    print(json.dumps({"mounted": mountpoint, "bytes": st.f_blocks * st.f_frsize}), flush=True)
    sys.stdin.read()
    return 0


def fill_disk(path: Path) -> int:
    """Write zeros to ``path`` until the file system refuses (``ENOSPC``): big chunks, then 4 KiB
    ones; returns the bytes written."""
    n = 0
    with open(path, "wb", buffering=0) as fh:
        for chunk in (2**20, 4096, 1):
            block = bytes(chunk)
            while True:
                try:
                    n += fh.write(block)
                except OSError:
                    break
    return n


def _whole_lines(view: Path) -> dict[str, list]:
    """The damaged lines of the journal files in ``view`` (none means whole lines only)."""
    return {name: [str(d) for d in read_lines(view / name)[1]] for name in ("specs.jsonl", "episodes.jsonl", "events.jsonl")}


def fault_disk_full(f: Fault) -> None:
    """Fill the run's disk at 1 delivered / N/3 outstanding; the run must stop with a typed error
    naming the file, every journaled episode kept; ``--resume`` after freeing it finishes the run."""
    try:
        disk = TmpfsMount(f, f.out, DISK_BYTES)
    except (RuntimeError, OSError, ValueError) as e:
        f.run_without_fault("fills", 1, "no tmpfs of the bench's own could be mounted", e)
        return
    f.cleanups.append(disk.stop)
    view = disk.view
    cond = mid_run(f.n_episodes)
    caps = f.concurrency_for(cond)
    job = f.start(*caps, prefix=disk.prefix, view=view)

    def strike(k: int, p: Progress) -> dict | None:
        written = fill_disk(view / "filler")
        st = os.statvfs(view)
        return {"filled_bytes": written, "free_bytes": st.f_bavail * st.f_frsize}

    try:
        strikes, missed = run_strikes(cond, 1, progress=job.progress, running=job.running, strike=strike)
        f.inject("fills", len(strikes), 1, missed=missed, strikes=strikes, how=disk.how)
        f.notes.append(strike_text("disk filled", strikes, 1, missed, lambda s: f" ({s['filled_bytes']} bytes of zeros, {s['free_bytes']} left)")
                       + f"; {disk.how}")
        rc = f.finish(job, "run on the full disk")
        if strikes:
            _check_stopped(f, job, rc, strikes[0], view)
            (view / "filler").unlink()
            st = os.statvfs(view)
            f.notes.append(f"space freed ({st.f_bavail * st.f_frsize} bytes free), then --resume")
            again = f.start(*caps, resume=True, prefix=disk.prefix, view=view)
            f.finish(again, "resumed run")
            f.check_final(again)
            f.check("journal_whole_after_resume", not any(_whole_lines(view).values()), None)
        else:
            f.check_final(job)
    finally:
        (view / "filler").unlink(missing_ok=True)
        shutil.copytree(view, f.out, dirs_exist_ok=True, ignore=shutil.ignore_patterns("filler"))  # the run folder outlives the tmpfs
        disk.stop()


def _check_stopped(f: Fault, job: Job, rc: int, at: dict, view: Path) -> None:
    """The run on the full disk: stopped (exit 4, interrupted) with the error naming a file of the
    run folder, its journal whole lines only, every episode journaled before the fill kept."""
    log = job.log()
    m = _CANNOT_WRITE.search(log)
    named = m.group(1) if m else None
    f.extra["disk_full"] = {"rc": rc, "named": named, "error": m.group(0) if m else None}
    f.check("stopped_naming_the_file", rc == EXIT_STOPPED and m is not None and named.startswith(str(f.out)) and m.group(3) == "28",
            f"the run stopped with exit code {rc}: " + (f"{m.group(0)})" if m else "no 'cannot write <file>' error in its log")
            + f" (log {job.log_path})")
    damage = _whole_lines(view)
    kept = len(read_lines(view / "episodes.jsonl")[0])
    f.check("journal_whole_lines", not any(damage.values()), None if not any(damage.values()) else f"damaged journal lines: {damage}")
    f.check("journaled_kept", kept >= at["delivered"], f"{kept} episodes journaled and kept ({at['delivered']} when the disk filled), "
            f"the journal whole lines only: {not any(damage.values())}")


# -- a torn journal, a corrupted line ---------------------------------------------------------
def _lines(path: Path) -> list[bytes]:
    data = path.read_bytes()
    return data.split(b"\n")[:-1] if data.endswith(b"\n") else data.split(b"\n")


def _episode_id(line: bytes) -> str:
    d = json.loads(line)
    return str((d.get("metadata") or {}).get("episode_id") or d.get("episode_id"))


def _expect_repair(f: Fault, kind: str, line: int, episode: str | None) -> Callable[[Job], None]:
    """The check on the resumed run: it set exactly that line aside (its summary's
    ``journal_repairs``, its log's line), and the episode of a corrupted line ran again and is in
    the journal once."""

    def verify(again: Job) -> None:
        got = [(d.get("file"), d.get("line"), d.get("kind")) for d in again.summary().get("journal_repairs") or []]
        logged = f"episodes.jsonl:{line} {kind}" in again.log() or f"set aside line {line}, {kind}" in again.log()
        f.check("reported_with_line_number", got == [("episodes.jsonl", line, kind)] and logged,
                f"the resumed run set aside {got or 'nothing'} (expected episodes.jsonl:{line} {kind}; in its log: {logged})")
        ids = [_episode_id(x) for x in _lines(f.out / "episodes.jsonl") if x.strip()]
        if episode is not None:
            f.check("ran_again_once", ids.count(episode) == 1, f"episode {episode} (its line set aside) is in the journal "
                    f"{ids.count(episode)} time(s) after the resume")
        f.check("journal_whole_after_resume", not any(_whole_lines(f.out).values()), None)

    return verify


def _tear_last_line(f: Fault) -> Callable[[Job], None]:
    """What a crash mid-write leaves: the first half of the next episode's line, no newline (the
    line of an episode in flight: an undelivered spec's id in the bytes of the last line's shape)."""
    path = f.out / "episodes.jsonl"
    lines = _lines(path)
    delivered = {_episode_id(x) for x in lines if x.strip()}
    specs = [json.loads(x)["episode_id"] for x in _lines(f.out / "specs.jsonl") if x.strip()]
    victim = next(s for s in specs if s not in delivered)
    template = lines[-1].replace(_episode_id(lines[-1]).encode(), victim.encode())
    cut = template[: len(template) // 2]
    with open(path, "ab") as fh:
        fh.write(cut)
    f.inject("lines", 1, 1, kind="torn", line=len(lines) + 1, bytes=len(cut), episode=victim, strikes=(f.injected or {}).get("strikes"))
    f.notes.append(f"journal torn: line {len(lines) + 1} of episodes.jsonl, the first {len(cut)} bytes of episode {victim}'s line "
                   f"(in flight when the driver was killed), no newline, after {len(lines)} whole lines")
    return _expect_repair(f, "torn", len(lines) + 1, None)


def _corrupt_middle_line(f: Fault) -> Callable[[Job], None]:
    """A block of zeros over the middle of a line in the middle of the journal (bytes lost on the
    disk), its length unchanged."""
    path = f.out / "episodes.jsonl"
    lines = _lines(path)
    n = (len(lines) + 1) // 2  # 1-based
    victim = _episode_id(lines[n - 1])
    size = len(lines[n - 1])
    block = min(4096, size // 2)
    start = (size - block) // 2
    lines[n - 1] = lines[n - 1][:start] + bytes(block) + lines[n - 1][start + block:]
    path.write_bytes(b"".join(x + b"\n" for x in lines))
    f.inject("lines", 1, 1, kind="corrupt", line=n, bytes=block, episode=victim, strikes=(f.injected or {}).get("strikes"))
    f.notes.append(f"journal corrupted: {block} zero bytes over line {n} of {len(lines)} of episodes.jsonl (episode {victim}, "
                   f"delivered and in samples.jsonl before the kill)")
    return _expect_repair(f, "corrupt", n, victim)


def fault_journal_torn_tail(f: Fault) -> None:
    driver_stop_resume(f, signal.SIGKILL, damage=_tear_last_line)


def fault_journal_corrupt_line(f: Fault) -> None:
    driver_stop_resume(f, signal.SIGKILL, damage=_corrupt_middle_line)
