"""The README's vLLM line, its run part as written: ``.venv/bin/python -m rollout run --config
configs/vllm_cpu.yaml``, read from README.md and run from a folder holding a copy of the
repository's ``configs/`` (so that what it writes, the checkpoint and the run folder under
``outputs/``, stays in the test's folder), with the CI's installed venvs (this interpreter for
``.venv/bin/python``; vLLM from ``.venv-vllm``, the install half of the line).

It starts its own vLLM stack through the CLI (the config's ``local.enabled: true``: it writes the
random-weight checkpoint, starts a vLLM CPU server and vllm-router, and stops them), which is what
the line promises a new user; the session's ``vllm_stack`` fixture is a different stack and is not
used. Its file name holds ``vllm``, so it runs on the vLLM tier's worker."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.vllm_stack import require_vllm

from rollout.core.output import read_samples

ROOT = Path(__file__).resolve().parents[2]
POLICY_OUTCOMES = {"completed", "max_steps", "truncated", "parse_error", "tool_timeout"}
pytestmark = [pytest.mark.slow, pytest.mark.ray]


def readme_vllm_run() -> list[str]:
    """The run part (after the last ``&&``) of the README's command line that names
    ``configs/vllm_cpu.yaml``, as argv."""
    text = (ROOT / "README.md").read_text()
    lines = [line for block in re.findall(r"```bash\n(.*?)```", text, re.S) for line in block.splitlines() if "configs/vllm_cpu.yaml" in line]
    assert len(lines) == 1, lines
    return shlex.split(lines[0].rsplit("&&", 1)[1])


@pytest.mark.timeout(1800)
def test_the_readme_s_vllm_line_runs_the_pool_on_vllm_and_writes_every_episode(tmp_path):
    argv = readme_vllm_run()
    assert argv == [".venv/bin/python", "-m", "rollout", "run", "--config", "configs/vllm_cpu.yaml"], argv
    python = require_vllm()
    shutil.copytree(ROOT / "configs", tmp_path / "configs")
    env = dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True", TAU_ROLLOUT_VLLM_PYTHON=str(python))
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run([sys.executable, *argv[1:]], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1700)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-5000:]

    out = tmp_path / "outputs" / "vllm_cpu"  # the config's rollout.output_dir
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["undelivered"] == 0, summary
    assert summary["episodes"] == 8, summary  # task_ids [0, 1, 2, 3] x n_samples_per_task 2
    assert set(summary["status_counts"]) <= POLICY_OUTCOMES, summary["status_counts"]  # a random model's outcomes, no infrastructure failure
    samples = [s for f in ("samples.jsonl", "failed.jsonl", "filtered.jsonl") for s in read_samples(out / f)]
    assert sorted({s.episode_id for s in samples}) == sorted(json.loads(x)["episode_id"] for x in (out / "specs.jsonl").read_text().splitlines())
    for s in samples:
        n = s.response_length
        assert len(s.loss_mask) == len(s.rollout_log_probs) == n and sum(s.loss_mask) > 0
        assert all(lp <= 0.0 for lp in s.rollout_log_probs)
        assert s.weight_versions and set(s.weight_versions) == {"0"}  # the config's local.weight_version, reported by vLLM
    assert (tmp_path / "outputs" / "vllm_checkpoints").is_dir()  # the checkpoint the line writes
