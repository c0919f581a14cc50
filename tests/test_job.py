"""The main job: the CLI on the local stack, and `ray job submit` to a local `ray start --head`."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from rollout.output import read_samples

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
pytestmark = pytest.mark.slow


def _env():
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", LITELLM_LOCAL_MODEL_COST_MAP="True")
    env.pop("RAY_ADDRESS", None)
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_cli_runs_the_local_stack_end_to_end(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "rollout", "run", "--config", "configs/local.yaml", "--no-progress",
         "env.task_ids=[0,1]", "rollout.n_samples_per_task=2", "pool.num_actors=1", f"rollout.output_dir={out}"],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "mean reward (retail)" in proc.stdout
    lines = (out / "samples.jsonl").read_text().splitlines()
    assert len(lines) == 4
    assert [s.status for s in read_samples(out / "samples.jsonl")] == ["completed"] * 4
    sample = json.loads(lines[0])
    for key in ["tokens", "response_length", "loss_mask", "rollout_log_probs", "reward", "status", "group_id", "sample_index", "metadata"]:
        assert key in sample
    assert len(sample["loss_mask"]) == len(sample["rollout_log_probs"]) == sample["response_length"]
    for key in ["task_id", "domain", "turns", "termination_reason", "timings"]:
        assert key in sample["metadata"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status_counts"] == {"completed": 4}
    assert summary["mean_reward_per_domain"] == {"retail": 1.0}
    assert summary["episodes_per_s"] > 0
    assert (out / "failed.jsonl").read_text() == ""


def test_bad_config_exits_2_naming_the_key():
    proc = subprocess.run([sys.executable, "-m", "rollout", "run", "--config", "configs/local.yaml", "pool.num_actors=-1"],
                          cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "pool.num_actors" in proc.stderr


@pytest.mark.ray
def test_ray_job_submit_to_a_local_head(tmp_path):
    env = _env()
    gcs, dash = _free_port(), _free_port()
    ray_tmp = tempfile.mkdtemp(prefix="rj", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    env["RAY_TMPDIR"] = ray_tmp  # keep this cluster apart from the test session's
    # Ray >= 2.5x turns on token auth when ~/.ray/auth_token exists; this throwaway loopback
    # cluster runs without it so the test does not depend on the machine's home folder.
    env["RAY_AUTH_MODE"] = "disabled"
    start = subprocess.run(
        [str(BIN / "ray"), "start", "--head", f"--port={gcs}", "--num-cpus=2", "--node-ip-address=127.0.0.1",
         "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}", "--include-dashboard=true", "--disable-usage-stats"],
        env=env, capture_output=True, text=True, timeout=180,
    )
    assert start.returncode == 0, start.stdout + start.stderr
    out = tmp_path / "job_out"
    try:
        address = f"http://127.0.0.1:{dash}"
        deadline = time.time() + 60
        submit = None
        while time.time() < deadline:
            submit = subprocess.run(
                ["bash", "launch/submit.sh", "--address", address, "--", "--config", "configs/local.yaml",
                 "env.task_ids=[0,1]", "rollout.n_samples_per_task=1", "pool.num_actors=1", f"rollout.output_dir={out}"],
                cwd=ROOT, env=env, capture_output=True, text=True, timeout=400,
            )
            if "Connection refused" not in submit.stderr + submit.stdout:
                break
            time.sleep(2)  # the dashboard's job API can take a few seconds to come up
        assert submit is not None and submit.returncode == 0, submit.stdout[-3000:] + submit.stderr[-3000:]
        assert "succeeded" in (submit.stdout + submit.stderr).lower()
        summary = json.loads((out / "summary.json").read_text())
        assert summary["status_counts"] == {"completed": 2}
    finally:
        subprocess.run([str(BIN / "ray"), "stop", "--force"], env=env, capture_output=True, timeout=120)
        shutil.rmtree(ray_tmp, ignore_errors=True)
