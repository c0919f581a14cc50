"""The main job: the CLI on the local stack, and `ray job submit` to a local `ray start --head`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.ray_head import free_port as _free_port
from support.ray_head import ray_head as start_ray_head

from rollout.core.output import read_samples

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
pytestmark = pytest.mark.slow


def _env():
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", LITELLM_LOCAL_MODEL_COST_MAP="True")
    env.pop("RAY_ADDRESS", None)
    return env


def test_cli_runs_the_local_stack_end_to_end(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "rollout", "run", "--config", "configs/local.yaml", "--no-progress",
         "env.task_ids=[0,1]", "rollout.n_samples_per_task=2", "pool.num_actors=1", f"rollout.output_dir={out}"],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "mean reward (retail, trainable)" in proc.stdout
    lines = (out / "samples.jsonl").read_text().splitlines()
    assert len(lines) == 4
    assert [s.status for s in read_samples(out / "samples.jsonl")] == ["completed"] * 4
    sample = json.loads(lines[0])
    for key in ["tokens", "response_length", "loss_mask", "rollout_log_probs", "reward", "status", "group_id", "sample_index", "metadata"]:
        assert key in sample
    assert len(sample["loss_mask"]) == len(sample["rollout_log_probs"]) == sample["response_length"]
    for key in ["task_id", "domain", "turns", "termination_reason", "timings"]:
        assert key in sample["metadata"]
    # the conversation, in the result file and in the journal (tests/component/test_conversation.py checks it against the tokens)
    journaled = {json.loads(x)["metadata"]["episode_id"]: json.loads(x)["messages"] for x in (out / "episodes.jsonl").read_text().splitlines()}
    for line in lines:
        s = json.loads(line)
        roles = [m["role"] for m in s["messages"]]
        assert roles[:2] == ["system", "user"] and "assistant" in roles and "tool" in roles, roles
        assert journaled[s["metadata"]["episode_id"]] == s["messages"]
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
    """A throwaway Ray head on loopback (see tests/support/ray_head.py). Yields ``(dashboard address, env)``."""
    with start_ray_head(_env()) as head:
        yield head.dashboard_url, head.env


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
@pytest.mark.extended  # CI's budget: test_grpo_loop_through_ray_job_submit goes through the same submit.sh and ray job path
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
    """launch/train_grpo_tiny.py as a Ray job: two steps, one weight update between them that
    interrupts step 1's episodes, every episode delivered exactly once and log-probs exact under
    the weights that sampled them."""
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
    assert log[0]["update_interrupted_calls"] >= 1, log[0]  # the job exits 1 otherwise (no --allow-idle-updates)
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["exactly_once"] and summary["duplicates"] == summary["missing"] == 0
    assert summary["episodes_submitted"] == summary["episodes_delivered"] >= 4


def test_a_planted_api_key_is_required_used_and_written_nowhere(tmp_path):
    """policy.api_key_env: the local stack requires the key, the pool sends it, and the key is in
    no file of the output directory (stack logs included) nor in the job's output."""
    out = tmp_path / "run"
    key = "sk-planted-" + os.urandom(8).hex()
    env = dict(_env(), ROLLOUT_TEST_KEY=key)
    proc = subprocess.run(
        [sys.executable, "-m", "rollout", "run", "--config", "configs/local.yaml", "--no-progress", "env.task_ids=[0]",
         "rollout.n_samples_per_task=1", "pool.num_actors=1", "policy.api_key_env=ROLLOUT_TEST_KEY", "logging.level=DEBUG",
         f"rollout.output_dir={out}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert json.loads((out / "summary.json").read_text())["status_counts"] == {"completed": 1}
    assert "api_key_env: ROLLOUT_TEST_KEY" in (out / "config.yaml").read_text()
    files = [p for p in out.rglob("*") if p.is_file()]
    assert any("local_stack_logs" in str(p) for p in files)
    assert not [str(p) for p in files if key.encode() in p.read_bytes()]
    assert key not in proc.stdout and key not in proc.stderr
    # without the key the job refuses at once, naming the variable, never a value
    env.pop("ROLLOUT_TEST_KEY")
    t0 = time.time()
    bad = subprocess.run([sys.executable, "-m", "rollout", "run", "--config", "configs/local.yaml", "policy.api_key_env=ROLLOUT_TEST_KEY",
                          f"rollout.output_dir={tmp_path / 'nokey'}"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "ROLLOUT_TEST_KEY" in bad.stderr and time.time() - t0 < 60, bad.stderr[-2000:]


def test_preflight_fails_in_seconds_with_one_line(tmp_path):
    """A router URL nothing listens on, and an LLM user simulator whose key variable is unset:
    one line each, before any episode (a dead router used to cost 165 s of retries)."""
    cases = [
        ["local.enabled=false", f"policy.router_url=http://127.0.0.1:{_free_port()}"],
        ["env.user.kind=llm", "env.user.model=sim", "env.user.api_key_env=ROLLOUT_UNSET_USER_KEY"],
    ]
    for i, extra in enumerate(cases):
        t0 = time.time()
        proc = subprocess.run([sys.executable, "-m", "rollout", "run", "--config", "configs/local.yaml", "--no-progress",
                               f"rollout.output_dir={tmp_path / str(i)}", *extra], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120)
        took = time.time() - t0
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
        assert proc.returncode == 2 and len(errors) == 1, proc.stderr[-3000:]
        assert took < 80, f"{extra}: {took:.0f}s"  # about 5 s (a process start); retrying a dead router took 165 s
        assert "Traceback" not in proc.stderr
    assert "ROLLOUT_UNSET_USER_KEY" in errors[0]
