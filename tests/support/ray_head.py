"""A throwaway Ray head on loopback for tests: ``ray start --head --block`` in its own session, so
that stopping it is killing that process group and nothing else (Ray's own stop command would
take down every Ray process on the machine, other people's clusters included)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RayHead:
    gcs_address: str  # host:port, for ray.init / pool.ray_address
    dashboard_url: str  # for ray job submit
    env: dict[str, str]  # the environment clients of this head need
    proc: subprocess.Popen
    metrics_url: str  # Prometheus text of the node's metrics agent (--metrics-export-port)

    def kill(self) -> None:
        """SIGKILL the head's whole process group (the GCS and the raylet with it)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)


@contextlib.contextmanager
def ray_head(env: dict[str, str], num_cpus: int = 2, include_dashboard: bool = True,
             auth_mode: str | None = "disabled") -> Iterator[RayHead]:
    """Start a head with ``env`` (``RAY_TMPDIR`` gets a fresh short folder); stop it on exit.

    Args:
        include_dashboard: the dashboard (needed by ``ray job submit``; the metrics export port is
            served by the node's agent either way).
        auth_mode: ``RAY_AUTH_MODE`` for the head; ``"disabled"`` (the default: this loopback-only
            cluster then does not depend on the machine's home folder), or ``None``: unset, so
            that Ray decides as it does for a user's ``ray start --head`` (Ray >= 2.5x: token
            authentication when a token is found, e.g. ``$HOME/.ray/auth_token``). The head's
            ``env`` (``RayHead.env``) is the one its clients need, ``RAY_AUTH_MODE`` included."""
    env = dict(env)
    ray_tmp = tempfile.mkdtemp(prefix="rj", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    env["RAY_TMPDIR"] = ray_tmp
    if auth_mode is None:
        env.pop("RAY_AUTH_MODE", None)
    else:
        env["RAY_AUTH_MODE"] = auth_mode
    gcs_port, dash, metrics = free_port(), free_port(), free_port()
    log = open(Path(ray_tmp) / "head.log", "w")  # noqa: SIM115 (closed below)
    head = subprocess.Popen(
        [str(BIN / "ray"), "start", "--head", "--block", f"--port={gcs_port}", f"--num-cpus={num_cpus}", "--node-ip-address=127.0.0.1",
         f"--ray-client-server-port={free_port()}", "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}",
         # The agents' default ports (52365 and others) are taken by any other Ray on the machine,
         # e.g. the session's local cluster: the job agent then never comes up ("No available agent
         # to submit job"). Free ports for every one of them.
         f"--dashboard-agent-listen-port={free_port()}", f"--dashboard-agent-grpc-port={free_port()}",
         f"--runtime-env-agent-port={free_port()}", f"--metrics-export-port={metrics}",
         f"--include-dashboard={str(include_dashboard).lower()}", "--disable-usage-stats"],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    try:
        yield RayHead(f"127.0.0.1:{gcs_port}", f"http://127.0.0.1:{dash}", env, head, f"http://127.0.0.1:{metrics}/metrics")
    finally:
        # SIGTERM stops the head's processes at once, but `ray start --block` itself then lingers
        # ~30 s (measured) over children that are already gone; nothing of this throwaway head
        # needs more than a few seconds, so what is left after them is killed.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(timeout=5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(head.pid, signal.SIGKILL)
            head.wait(timeout=30)
        log.close()
        shutil.rmtree(ray_tmp, ignore_errors=True)
