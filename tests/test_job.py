"""The main job: the CLI on the local stack, and `ray job submit` to a local `ray start --head`."""

from __future__ import annotations

import json
import os
import shutil
import signal
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


@pytest.fixture(scope="module")
def ray_head():
    """A throwaway Ray head on loopback: ``ray start --head --block`` in its own session, so that
    stopping it is killing that process group, and nothing else (``ray stop`` kills every Ray
    process on the machine, other people's clusters included). Yields ``(dashboard address, env)``."""
    env = _env()
    ray_tmp = tempfile.mkdtemp(prefix="rj", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    env["RAY_TMPDIR"] = ray_tmp  # keep this cluster apart from the test session's
    # Ray >= 2.5x turns on token auth when ~/.ray/auth_token exists; this throwaway loopback
    # cluster runs without it so the test does not depend on the machine's home folder.
    env["RAY_AUTH_MODE"] = "disabled"
    dash = _free_port()
    log = open(Path(ray_tmp) / "head.log", "w")
    head = subprocess.Popen(
        [str(BIN / "ray"), "start", "--head", "--block", f"--port={_free_port()}", "--num-cpus=2", "--node-ip-address=127.0.0.1",
         f"--ray-client-server-port={_free_port()}", "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}",
         "--include-dashboard=true", "--disable-usage-stats"],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    try:
        yield f"http://127.0.0.1:{dash}", env
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait(timeout=30)
        log.close()
        shutil.rmtree(ray_tmp, ignore_errors=True)


def _submit(ray_head, *args: str) -> subprocess.CompletedProcess:
    """``launch/submit.sh --address HEAD ARGS`` once the dashboard's job API answers."""
    address, env = ray_head
    deadline = time.time() + 90
    while True:
        proc = subprocess.run(["bash", "launch/submit.sh", "--address", address, *args],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        out = proc.stdout + proc.stderr
        if not ("Connection refused" in out or "Failed to connect" in out) or time.time() > deadline:
            return proc
        time.sleep(2)  # the head and its job API take a few seconds to come up


@pytest.mark.ray
def test_ray_job_submit_to_a_local_head(ray_head, tmp_path):
    out = tmp_path / "job_out"
    submit = _submit(ray_head, "--", "--config", "configs/local.yaml", "env.task_ids=[0,1]", "rollout.n_samples_per_task=1",
                     "pool.num_actors=1", f"rollout.output_dir={out}")
    assert submit.returncode == 0, submit.stdout[-3000:] + submit.stderr[-3000:]
    assert "succeeded" in (submit.stdout + submit.stderr).lower()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status_counts"] == {"completed": 2}


@pytest.mark.ray
@pytest.mark.torch
def test_grpo_loop_through_ray_job_submit(ray_head, tmp_path):
    """launch/train_grpo_tiny.py as a Ray job: two steps, one weight update between them, every
    episode delivered exactly once and log-probs exact under the weights that sampled them."""
    pytest.importorskip("torch")
    out = tmp_path / "grpo"
    submit = _submit(ray_head, "--entry", "launch/train_grpo_tiny.py", "--", "--config", "configs/local.yaml", "local.backend=tiny",
                     "--steps", "2", "--groups-per-step", "1", "env.task_ids=[10,25]", "rollout.n_samples_per_task=2",
                     "policy.sampling.max_new_tokens=64", "pool.num_actors=1", f"rollout.output_dir={out}")
    assert submit.returncode == 0, submit.stdout[-3000:] + submit.stderr[-3000:]
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert [line["step"] for line in log] == [0, 1] and [line["weight_version"] for line in log] == [1, 2]
    assert all(line["groups_used"] == 1 and line["max_abs_logprob_diff"] <= 1e-3 for line in log)
    assert all(line["logprob_tokens_checked"] > 0 and line["update_norm"] > 0 for line in log)
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["exactly_once"] and summary["duplicates"] == summary["missing"] == 0
    assert summary["episodes_submitted"] == summary["episodes_delivered"] >= 4
