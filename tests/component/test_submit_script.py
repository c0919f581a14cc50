"""launch/submit.sh's own decisions, with a stand-in ``ray`` (``RAY_BIN``) that prints what it was
given: which interpreter the job's entry point names, and when it sets ``RAY_AUTH_MODE=token``.
The real path (a head started from the venv without activating it, token authentication, the
job run and read back with Ray's own commands) is tests/e2e/test_job.py."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

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
