"""Every command that prints is pipe-safe: ``python -m rollout formats | head -n 1`` (issue 28)
ends without a ``BrokenPipeError`` traceback, as any reader that stops early. Each command runs as
a user runs it, in a subprocess; its reader is closed before it writes (the case a fast ``head``
only sometimes makes, so the test cannot pass by luck), and once through a real ``| head -n 1``.
In-process cases of rollout.core.pipes.pipe_safe: tests/unit/test_pipes.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(sys.executable).parent / "rollout"  # the console script pip installs
COMMANDS = {
    "formats": [sys.executable, "-m", "rollout", "formats"],
    "formats --json": [sys.executable, "-m", "rollout", "formats", "--json"],
    "config": [sys.executable, "-m", "rollout", "config", "--config", "configs/local.yaml"],
    "script formats": [str(SCRIPT), "formats"],
}


def _env() -> dict[str, str]:
    return dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True")


def _no_traceback(stderr: str) -> None:
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr and "Exception ignored" not in stderr, stderr[-3000:]


@pytest.mark.parametrize("name", COMMANDS)
def test_a_reader_that_is_gone_before_the_output_ends_the_command_quietly(name):
    if name.startswith("script") and not SCRIPT.is_file():
        pytest.skip(f"no console script at {SCRIPT}")
    proc = subprocess.Popen(COMMANDS[name], cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()  # the only reader: every write the command makes finds the pipe broken
    err = proc.stderr.read()
    rc = proc.wait(timeout=120)
    _no_traceback(err)
    assert rc == 141, (rc, err[-2000:])  # 128 + SIGPIPE, as a shell reports a command SIGPIPE ended


def test_formats_piped_into_head_prints_its_first_line_and_nothing_on_stderr():
    proc = subprocess.run(["bash", "-c", f"{sys.executable} -m rollout formats | head -n 1; echo \"status ${{PIPESTATUS[0]}}\""],
                          cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120)
    first, status = proc.stdout.splitlines()
    assert first.split()[:2] == ["format", "tokenizer"], proc.stdout
    assert status in ("status 0", "status 141"), status  # 0 when head read it all before it left
    _no_traceback(proc.stderr)
