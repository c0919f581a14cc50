"""The pytest session's one Ray head, shared by both xdist workers, their in-process pools (the
``ray_cluster`` fixture) and every CLI job or driver a test starts (``pool.ray_address=ADDRESS``).

Started on first use (:func:`address`) by whichever process of the session needs it first, under
the session's file lock (``support.session.locked``), so that the two xdist workers start one
between them; its address is kept in the session's folder (``ray.json``), where the other processes
read it. It is ``ray start --head --block`` on 127.0.0.1 in a process group of its own, under a small
supervisor (this file run as a script) that ends the group when the session's owner (the xdist
controller) is gone, also when that is SIGKILLed. The owner stops it at the end of the session
(:func:`stop`, from ``pytest_unconfigure``): SIGTERM to the group, SIGKILL to what is left after a
few seconds. Never ``ray stop``: it would take down every Ray on the machine, other people's too.

What the head's workers (the rollout actors among them) get: the environment of the process that
started it, less pytest's own variables: ``RAY_worker_niceness=0`` (``tests/conftest.py``) and the
session's ``PYTHONPATH`` among it. A job that needs more in its actors' environment (``tests/`` on
``PYTHONPATH`` for the suite's toy plugins) gives it as the job's runtime environment
(:func:`job_env`), not as a cluster of its own.

Tests whose subject is a cluster's own life (its head or a node lost, an actor OOM-killed in a
memory cgroup, Ray's start error, token authentication) start a head of their own
(``support.ray_head``); so does the one cold-start run (``tests/e2e/test_job.py``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

#: Logical CPUs of the shared head: enough that the two workers' pools and CLI jobs never wait for
#: each other's reservations (``pool.num_cpus_per_actor`` is 0.5 or 1 in the tests). It bounds no
#: real CPU use; the number of actors the tests create does.
NUM_CPUS = 16
_START_TIMEOUT_S = 240.0  # measured 22-30 s to "Ray runtime started" on the loaded 2-core machine
_STARTED = "Ray runtime started"  # what `ray start` prints once every process of the head is up
_TERM_GRACE_S = 5.0  # `ray start --block` lingers ~30 s after SIGTERM over children already gone
_START_TRIES = 3  # Ray gives its raylet a fixed 30 s to register: a busy machine misses it now and then


@dataclass(frozen=True)
class SharedRay:
    """The shared head: ``address`` (``host:port`` of its GCS) for ``ray.init(address=...)`` and
    ``pool.ray_address``."""

    address: str

    def override(self) -> str:
        """The CLI override that joins a job to it: ``pool.ray_address=<address>``."""
        return f"pool.ray_address={self.address}"


def job_env(env: dict[str, str], runtime_env: dict) -> dict[str, str]:
    """``env`` for a driver process (a CLI job, a script) whose job on the shared head runs with
    ``runtime_env``, e.g. ``{"env_vars": {"PYTHONPATH": ...}}`` for the job's actors only: the
    variable through which Ray's job manager hands a submitted job's config to its driver
    (``RAY_JOB_CONFIG_JSON_ENV_VAR``, read by ``ray.init``; the actors' own ``env_vars`` are merged
    into it)."""
    return dict(env, RAY_JOB_CONFIG_JSON_ENV_VAR=json.dumps({"runtime_env": runtime_env}))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _reachable(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=5):
            return True
    except OSError:
        return False


def _head_env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_") and k != "RAY_ADDRESS"}
    # loopback only: the head does not depend on a token in the machine's home folder
    return dict(env, RAY_TMPDIR=str(tmp), RAY_AUTH_MODE="disabled")


def _start(folder: Path, owner: int) -> dict:
    """Start the head under its supervisor; its record once it is up."""
    from rollout.core.pool.actors import RAY_START_TIMED_OUT  # (not at the top: this file is also the supervisor)

    tmp = folder / "ray"  # RAY_TMPDIR: short, Ray's socket paths must fit in 107 bytes
    tmp.mkdir(exist_ok=True)
    log_path = folder / "ray-head.log"
    gcs = _free_port()
    ports = [f"--{name}={_free_port()}" for name in ("ray-client-server-port", "dashboard-agent-listen-port",
                                                       "dashboard-agent-grpc-port", "runtime-env-agent-port", "metrics-export-port")]
    cmd = [str(Path(sys.executable).parent / "ray"), "start", "--head", "--block", f"--port={gcs}", f"--num-cpus={NUM_CPUS}",
           "--node-ip-address=127.0.0.1", "--include-dashboard=false", "--disable-usage-stats", *ports,
           # no idle workers prestarted for the first driver: NUM_CPUS of them would load 2 cores for nothing
           '--system-config={"prestart_worker_first_driver": false}']
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, __file__, "supervise", str(owner), "--", *cmd], env=_head_env(tmp),
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    record = {"address": f"127.0.0.1:{gcs}", "pgid": proc.pid, "tmp": str(tmp), "log": str(log_path)}
    deadline = time.monotonic() + _START_TIMEOUT_S
    while _STARTED not in log_path.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            _kill_group(proc.pid)
            text = log_path.read_text(errors="replace")
            error = _RayStartTimedOut if RAY_START_TIMED_OUT in text else RuntimeError
            raise error(f"the session's shared Ray head did not start ({'exited' if proc.poll() is not None else 'timed out'}); "
                        f"{log_path}:\n{text[-3000:]}")
        time.sleep(0.2)
    return record


def address() -> SharedRay:
    """The session's shared head, started on first use (by whichever process asks first).

    Raises:
        RuntimeError: it did not start (the message carries its log's tail), or it was started and
            no longer answers (a test broke it: the message says which head).
    """
    from support import session

    with session.locked("ray") as folder:
        path = folder / "ray.json"
        if path.exists():
            record = json.loads(path.read_text())
            if not _reachable(record["address"]):
                raise RuntimeError(f"the session's shared Ray head at {record['address']} no longer answers; log {record['log']}")
        else:
            record = _start_with_retries(folder, session.owner_pid())
            path.write_text(json.dumps(record))
    return SharedRay(record["address"])


class _RayStartTimedOut(RuntimeError):
    """Ray's own start-up bound passed (its raylet did not register in its fixed 30 s)."""


def _start_with_retries(folder: Path, owner: int) -> dict:
    """:func:`_start`, again when Ray's own start-up bound passed: the machine was busy, a
    precondition, not the product (each retry recorded: ``support.retries``)."""
    from support import retries

    for attempt in range(_START_TRIES):
        try:
            return _start(folder, owner)
        except _RayStartTimedOut as e:
            if attempt == _START_TRIES - 1:
                raise RuntimeError(str(e)) from None
            retries.record("session: the shared Ray head", "Ray's head starts", str(e).splitlines()[0])
    raise AssertionError("unreachable")


def group_members(pgid: int) -> list[int]:
    """The pids of process group ``pgid`` that still run (zombies, whose parent is gone too, do not count)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # exited meanwhile
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


def _group_alive(pgid: int) -> bool:
    return bool(group_members(pgid))


def _kill_group(pgid: int, grace_s: float = _TERM_GRACE_S) -> None:
    """SIGTERM to the process group, SIGKILL to what is left after ``grace_s``."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while _group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def stop() -> bool:
    """Stop the shared head if this session started one (the session's owner, at its end); whether
    there was one."""
    from support import session

    with session.locked("ray") as folder:
        path = folder / "ray.json"
        if not path.exists():
            return False
        record = json.loads(path.read_text())
        _kill_group(record["pgid"])
        path.unlink()
    return True


def _supervise(owner: int, cmd: list[str]) -> int:
    """Run ``cmd`` in this process's group; end the group when ``owner`` is gone or ``cmd`` exits."""
    child = subprocess.Popen(cmd)
    while child.poll() is None:
        try:
            os.kill(owner, 0)
        except ProcessLookupError:
            print(f"shared Ray head: the session's owner {owner} is gone; stopping", flush=True)
            break
        time.sleep(1.0)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # this process ends the group, itself last
    with contextlib.suppress(ProcessLookupError):
        os.killpg(os.getpgid(0), signal.SIGTERM)
    time.sleep(_TERM_GRACE_S)
    os.killpg(os.getpgid(0), signal.SIGKILL)
    return 0


if __name__ == "__main__":  # python shared_ray.py supervise OWNER_PID -- CMD...
    if len(sys.argv) < 5 or sys.argv[1] != "supervise" or sys.argv[3] != "--":
        sys.exit("usage: shared_ray.py supervise OWNER_PID -- CMD...")
    sys.exit(_supervise(int(sys.argv[2]), sys.argv[4:]))
