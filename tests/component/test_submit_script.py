"""launch/submit.sh's own decisions, with a stand-in ``ray`` (``RAY_BIN``) that prints what it was
given: which interpreter the job's entry point names, and when it sets ``RAY_AUTH_MODE=token``;
and what a user sees when Ray refuses the submission: the real ``ray job submit`` against a
stand-in dashboard that answers as a head whose job agent is down (its port held by another Ray
head) does, or against a port nobody listens on: one line, not Ray's traceback per try.
The real path (a head started from the venv without activating it, token authentication, the
job run and read back with Ray's own commands) is tests/e2e/test_job.py."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RAY = Path(sys.executable).parent / "ray"  # the real `ray`, beside this interpreter

# Prints the RAY_AUTH_MODE it sees, then its arguments one a line; answers as `ray job submit` does on success.
_STAND_IN_RAY = """#!/bin/sh
echo "RAY_AUTH_MODE=${RAY_AUTH_MODE-unset}"
for a in "$@"; do echo "arg=$a"; done
"""


def _submit(tmp_path: Path, *args: str, python_beside_ray: bool = True, **env_vars: str) -> tuple[subprocess.CompletedProcess, str, list[str]]:
    """Run ``launch/submit.sh ARGS`` with the stand-in ``ray`` in ``tmp_path/bin`` (and a ``python``
    beside it unless told not to) and ``HOME=tmp_path/home``. Returns the process, the
    ``RAY_AUTH_MODE`` the ``ray`` saw and the entry point it was given (the words after ``--``)."""
    bin_dir, home = tmp_path / "bin", tmp_path / "home"
    bin_dir.mkdir(exist_ok=True)
    home.mkdir(exist_ok=True)
    (bin_dir / "ray").write_text(_STAND_IN_RAY)
    (bin_dir / "ray").chmod(0o755)
    if python_beside_ray:
        (bin_dir / "python").write_text("#!/bin/sh\nexit 0\n")
        (bin_dir / "python").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(HOME=str(home), RAY_BIN=str(bin_dir / "ray"), **env_vars)
    proc = subprocess.run(["bash", "launch/submit.sh", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    lines = proc.stdout.splitlines()
    mode = next((line.split("=", 1)[1] for line in lines if line.startswith("RAY_AUTH_MODE=")), "")
    argv = [line[4:] for line in lines if line.startswith("arg=")]
    entry = argv[argv.index("--") + 1:] if "--" in argv else []
    return proc, mode, entry


def test_the_entry_point_names_the_python_beside_the_ray_it_runs(tmp_path):
    """Not ``python`` (the head's PATH decides which that is): the interpreter of the ``ray`` used,
    by its path, unresolved (a venv's ``python`` is a link out of the venv)."""
    proc, _, entry = _submit(tmp_path, "--address", "http://127.0.0.1:1", "--", "--config", "configs/local.yaml", "env.task_ids=[0,1]")
    assert proc.returncode == 0, proc.stderr
    assert entry == [str(tmp_path / "bin" / "python"), "launch/job.py", "--config", "configs/local.yaml", "env.task_ids=[0,1]"]
    proc, _, entry = _submit(tmp_path, "--python", "/opt/env/bin/python", "--entry", "launch/train_grpo_tiny.py", "--", "--steps", "1")
    assert proc.returncode == 0, proc.stderr
    assert entry == ["/opt/env/bin/python", "launch/train_grpo_tiny.py", "--steps", "1"]


def test_without_a_python_beside_ray_it_asks_for_one(tmp_path):
    proc, _, entry = _submit(tmp_path, "--", "--config", "configs/local.yaml", python_beside_ray=False)
    assert proc.returncode == 2 and entry == []
    assert "no python beside" in proc.stderr and "--python PATH" in proc.stderr


def test_token_authentication_follows_rays_own_rule(tmp_path):
    """``RAY_AUTH_MODE=token`` when it is unset and a token is found where ``ray start --head``
    looks (``~/.ray/auth_token``, ``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH``); a mode the user set
    is kept; no token, no mode."""
    assert _submit(tmp_path, "--")[1] == "unset"
    assert _submit(tmp_path, "--", RAY_AUTH_TOKEN="abc")[1] == "token"
    assert _submit(tmp_path, "--", RAY_AUTH_TOKEN_PATH=str(tmp_path / "token"))[1] == "token"
    (tmp_path / "home" / ".ray").mkdir()
    (tmp_path / "home" / ".ray" / "auth_token").write_text("abc")
    assert _submit(tmp_path, "--")[1] == "token"
    assert _submit(tmp_path, "--", RAY_AUTH_MODE="disabled")[1] == "disabled"


# Refuses the first submission as Ray does when the head has no job agent yet (its traceback's
# last lines), then answers as a successful submission that goes on to the job's own output.
_AGENT_LATE_RAY = """#!/bin/sh
if [ ! -f "$TRIES" ]; then
  touch "$TRIES"
  echo "Traceback (most recent call last):"
  echo '  File "ray/dashboard/modules/dashboard_sdk.py", line 305, in _raise_error'
  echo "RuntimeError: Request failed with status code 500: No available agent to submit job, please try again later.." >&2
  exit 1
fi
echo "Job 'raysubmit_1' submitted successfully"
echo "the job's own output"
"""


def _ray_stand_in(tmp_path: Path, script: str) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "ray").write_text(script)
    (bin_dir / "ray").chmod(0o755)
    return bin_dir / "ray"


def _run(tmp_path: Path, ray_bin: Path, address: str, **env_vars: str) -> subprocess.CompletedProcess:
    (tmp_path / "home").mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(HOME=str(tmp_path / "home"), RAY_BIN=str(ray_bin), RAY_TMPDIR=str(tmp_path / "raytmp"), **env_vars)
    return subprocess.run(["bash", "launch/submit.sh", "--address", address, "--python", sys.executable, "--no-wait", "--",
                           "--config", "configs/local.yaml"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_a_head_whose_agent_comes_late_is_tried_again_saying_so_once(tmp_path):
    ray_bin = _ray_stand_in(tmp_path, _AGENT_LATE_RAY)
    proc = _run(tmp_path, ray_bin, "http://127.0.0.1:8265", TRIES=str(tmp_path / "tried"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["Job 'raysubmit_1' submitted successfully", "the job's own output"]
    assert proc.stderr.splitlines() == ["submit.sh: the Ray head at http://127.0.0.1:8265 has no job agent yet; trying again for up "
                                        "to 60 s"]


class _AgentlessDashboard(http.server.BaseHTTPRequestHandler):
    """Ray's job API as a head whose job agent is down answers it (Ray 2.60's job_head.py):
    /api/version and the package upload work, a submission is refused with HTTP 500."""

    def _send(self, code: int, body: str, ctype: str = "text/plain") -> None:
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):  # noqa: N802  (http.server's name)
        if self.path.startswith("/api/version"):
            return self._send(200, json.dumps({"version": "4", "ray_version": "2.60.0", "ray_commit": "x", "session_name": "s"}),
                              "application/json")
        return self._send(404, "not found")

    def do_PUT(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        return self._send(200, "")

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        return self._send(500, "No available agent to submit job, please try again later.")

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def _dashboard():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _AgentlessDashboard)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


needs_ray = pytest.mark.skipif(not RAY.is_file(), reason=f"no ray CLI beside {sys.executable}")


@needs_ray
def test_a_head_whose_agent_is_down_is_one_line_naming_the_agents_log_and_port(tmp_path):
    """The real ``ray job submit`` prints a 42-line traceback per try against this head (five over
    60 s before); after the wait (0 s here) one line names the agent's log and the port."""
    with _dashboard() as address:
        proc = _run(tmp_path, RAY, address, SUBMIT_AGENT_WAIT_S="0")
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, lines
    log = tmp_path / "raytmp" / "ray" / "session_latest" / "logs" / "dashboard_agent.log"
    assert lines[0].startswith(f"submit.sh: the Ray head at {address} has no job agent after 0 s"), lines[0]
    assert str(log) in lines[0] and "52365" in lines[0] and "--dashboard-agent-listen-port" in lines[0], lines[0]


@needs_ray
def test_the_agents_port_is_named_from_its_log_when_the_head_is_this_machine(tmp_path):
    log = tmp_path / "raytmp" / "ray" / "session_latest" / "logs" / "dashboard_agent.log"
    log.parent.mkdir(parents=True)
    log.write_text("2026-12-07 21:00:00,000\tERROR http_server_agent.py:85 -- Agent port #52411 failed to bind after 4 attempts.\n")
    with _dashboard() as address:
        proc = _run(tmp_path, RAY, address, SUBMIT_AGENT_WAIT_S="0")
    assert proc.returncode == 1 and proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and "its dashboard agent could not bind port 52411" in lines[0] and str(log) in lines[0], lines


@needs_ray
def test_an_address_nobody_listens_on_is_one_line(tmp_path):
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens on it
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = _run(tmp_path, RAY, f"http://127.0.0.1:{port}")
    assert proc.returncode == 1 and proc.stdout == "", proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"submit.sh: no Ray head answers at http://127.0.0.1:{port}"), lines
