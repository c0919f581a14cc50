"""``python -m rollout.integrations.verl_data`` without pyarrow (or pandas): one line saying to
install the ``verl`` extra, exit 2, before it loads a domain, instead of pandas' own traceback
(issue 28). pyarrow is kept out of the command's process by an import blocker, so the test means
the same where it is installed; where it is not (this project's venv), the command runs as is too.
With both installed, the file verl reads: tests/integrations/test_verl.py."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The command, with `import pyarrow` (and its submodules) failing as on a machine without it.
BLOCKED = """
import runpy, sys
class NoPyarrow:
    def find_spec(self, name, path=None, target=None):
        if name == "pyarrow" or name.startswith("pyarrow."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, NoPyarrow())
sys.argv[0] = "verl_data"
runpy.run_module("rollout.integrations.verl_data", run_name="__main__")
"""
ARGS = ["--domain", "retail", "--split", "train"]


def _run(cmd: list[str], out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*cmd, *ARGS, "--out", str(out)], cwd=ROOT, env=dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True"),
                          capture_output=True, text=True, timeout=120)


def _one_line_naming_the_extra(proc: subprocess.CompletedProcess, out: Path) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: ") and "pyarrow" in lines[0] and "pip install 'tau-rollout[verl]'" in lines[0], lines[0]
    assert not out.exists()


def test_without_pyarrow_it_says_to_install_the_verl_extra_in_one_line(tmp_path):
    proc = _run([sys.executable, "-c", BLOCKED], tmp_path / "retail_train.parquet")
    _one_line_naming_the_extra(proc, tmp_path / "retail_train.parquet")


@pytest.mark.skipif(importlib.util.find_spec("pyarrow") is not None, reason="pyarrow is installed here (the blocked case covers it)")
def test_as_a_user_runs_it_where_pyarrow_is_missing(tmp_path):
    proc = _run([sys.executable, "-m", "rollout.integrations.verl_data"], tmp_path / "retail_train.parquet")
    _one_line_naming_the_extra(proc, tmp_path / "retail_train.parquet")


def test_the_extra_it_names_exists_and_installs_verl():
    """The message's extra is in pyproject.toml and installs verl, whose 0.9.1 wheel requires pandas
    and pyarrow (its metadata: Requires-Dist pandas, pyarrow>=19.0.0)."""
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(req.startswith("verl==") for req in extras["verl"]), extras["verl"]
