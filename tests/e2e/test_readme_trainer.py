"""The README's trainer example runs as it is written: its first ``python`` block under "Using it
from a Ray-based trainer" is read from README.md and run in a fresh interpreter from the
folder holding a copy of the repository's ``configs/`` (so that what it writes stays in the test's
folder): the local stack (its own: the example updates its weights), gold replay, and Ray as a
trainer's cluster is found when ``pool.ray_address`` is null: ``RAY_ADDRESS``, here the session's
shared head; about 40 s here."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.ray]


def readme_trainer_snippet() -> str:
    """The first ``python`` code block of the README's trainer section, verbatim."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Using it from a Ray-based trainer"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_readme_trainer_snippet_runs_as_written(tmp_path, shared_ray):
    code = readme_trainer_snippet()
    assert "from rollout import" in code and "open_pool(cfg)" in code and "update_weights_from_disk" in code
    shutil.copytree(ROOT / "configs", tmp_path / "configs")
    env = dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True", RAY_ADDRESS=shared_ray.address)
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    steps = [line for line in proc.stdout.splitlines() if line.startswith("step ")]
    assert [s.split(":")[0] for s in steps] == ["step 0", "step 1", "step 2"], proc.stdout
    assert all("4 samples, mean reward 1.00" in s for s in steps), steps  # B=2 groups of 2, gold replay earns 1.0
    weights = tmp_path / "outputs" / "local" / "weights"  # configs/local.yaml's rollout.output_dir
    assert sorted(p.name for p in weights.iterdir()) == ["step_1", "step_2", "step_3"]  # each update passed (a failed one raises)
