"""The main job: the CLI on the local stack, and `ray job submit` to a local `ray start --head`."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from support.ray_head import free_port as _free_port
from support.ray_head import ray_head as start_ray_head
from support.retries import RAY_DID_NOT_START, Attempts

from rollout.core.output import read_samples

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
pytestmark = pytest.mark.slow


def _env():
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", LITELLM_LOCAL_MODEL_COST_MAP="True")
    env.pop("RAY_ADDRESS", None)
    return env


def test_cli_runs_the_local_stack_end_to_end(tmp_path):
    """Also: the summary is the last thing the command writes, its log lines and the actors' (which
    Ray forwards) before it, as a terminal shows them (stdout and stderr in one stream, unbuffered).
    Two actors log the same start-up lines, which Ray's log deduplication holds back (here for the
    whole run) until the driver disconnects: at exit, after the summary, unless the command
    disconnects first."""
    tries = Attempts(3, "a new local Ray cluster starts within Ray's fixed 30 s")
    for n in tries:
        out = tmp_path / f"run{n}"
        proc = subprocess.run(
            [sys.executable, "-m", "rollout", "run", "--config", "configs/local.yaml", "--no-progress",
             "env.task_ids=[0,1]", "rollout.n_samples_per_task=2", "pool.num_actors=2", f"rollout.output_dir={out}"],
            cwd=ROOT, env=dict(_env(), PYTHONUNBUFFERED="1", RAY_DEDUP_LOGS_AGG_WINDOW_S="3600"),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300,
        )
        if proc.returncode == 2 and RAY_DID_NOT_START in proc.stdout:
            tries.not_met(proc.stdout.strip().splitlines()[-1])
            continue
        break
    assert proc.returncode == 0, proc.stdout[-6000:]
    assert "mean reward (retail, trainable)" in proc.stdout
    tail = proc.stdout.rstrip("\n").splitlines()
    assert tail[-1].startswith(f"samples: {out / 'samples.jsonl'}"), tail[-20:]
    picked = [line for line in tail if "RolloutWorker pid=" in line and "policy.chat_format=auto: chat format hermes" in line]
    assert len(picked) == 2, tail[-40:]  # each actor's line, the one Ray held back too (before the summary)
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


# What stands first on the head's PATH as ``python`` in these tests: on the machine this was reported
# from it was the system Python, without the project's dependencies (the job then failed with
# ``ModuleNotFoundError: omegaconf``); a job that runs it fails at once, saying so.
_WRONG_PYTHON = """#!/bin/sh
echo "$0: the python first on PATH ran; the job must name the project's interpreter" >&2
exit 97
"""


def _user_shell_env(home: Path, bin_dir: Path) -> dict[str, str]:
    """A user's shell on the head: the project's virtual environment not activated (none of its
    folders on ``PATH``, no ``VIRTUAL_ENV``), another ``python`` first on ``PATH`` (``bin_dir``),
    ``HOME`` holding ``.ray/auth_token`` (which any earlier local ``ray.init()`` of Ray >= 2.5x,
    e.g. the README's first command, leaves there) and no ``RAY_*`` variable set."""
    venv = {str(BIN), str(BIN.resolve())}
    path = [str(bin_dir)] + [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p not in venv]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_") and k != "VIRTUAL_ENV"}
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")  # the tokenizer caches stay where they are
    return dict(env, PATH=os.pathsep.join(path), HOME=str(home), XDG_CACHE_HOME=cache)


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory):
    """A throwaway Ray head on loopback started as a user starts one: by the virtual environment's
    own ``ray`` (``.venv/bin/ray start --head``) from a shell where that environment is not
    activated, with Ray choosing its authentication itself (token authentication: a token is in
    ``$HOME/.ray/auth_token``). See tests/support/ray_head.py. Yields ``(dashboard address, the
    user's shell environment)``, once the dashboard answers."""
    home = tmp_path_factory.mktemp("home")
    (home / ".ray").mkdir()
    (home / ".ray" / "auth_token").write_text(os.urandom(16).hex())
    (home / ".ray" / "auth_token").chmod(0o600)
    bin_dir = tmp_path_factory.mktemp("bin")
    for name in ("python", "python3"):
        (bin_dir / name).write_text(_WRONG_PYTHON)
        (bin_dir / name).chmod(0o755)
    env = _user_shell_env(home, bin_dir)
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never through a proxy
    with start_ray_head(env, auth_mode=None) as head:
        deadline = time.time() + 90
        while True:  # the head and its dashboard take a few seconds to come up
            try:
                with direct.open(f"{head.dashboard_url}/api/authentication_mode", timeout=5) as r:
                    mode = json.loads(r.read())["authentication_mode"]
                break
            except OSError:
                assert time.time() < deadline, (Path(head.env["RAY_TMPDIR"]) / "head.log").read_text()[-3000:]
                time.sleep(1)
        assert mode == "token", mode  # what a head on a machine with ~/.ray/auth_token runs with
        yield head.dashboard_url, env


def _shell(ray_head, command: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """``command`` as a line typed in the user's shell (``/bin/sh -c``) in the project's folder."""
    return subprocess.run(command, shell=True, cwd=ROOT, env=ray_head[1], capture_output=True, text=True, timeout=timeout)


@pytest.mark.ray
def test_ray_job_submit_as_documented_to_a_head_started_from_the_venv(ray_head, tmp_path):
    """launch/README.md's commands as a user types them, against a head started by the venv's own
    ``ray`` without activating the venv and using token authentication: ``launch/submit.sh``
    needs no ``RAY_AUTH_MODE`` (it enables token authentication where Ray's ``ray start`` does)
    and runs the job with the project's interpreter, not the ``python`` first on the head's PATH;
    the job's status and logs read back with Ray's own ``ray job`` commands, which need
    ``RAY_AUTH_MODE=token`` (as the README says)."""
    address, _ = ray_head
    out = tmp_path / "job_out"
    submit = _shell(ray_head, f"launch/submit.sh --address {address} -- --config configs/local.yaml env.task_ids=[0,1] "
                              f"rollout.n_samples_per_task=1 pool.num_actors=1 rollout.output_dir={out}")
    text = submit.stdout + submit.stderr
    assert submit.returncode == 0, text[-5000:]
    assert "the python first on PATH ran" not in text
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status_counts"] == {"completed": 2} and summary["mean_reward_per_domain"] == {"retail": 1.0}
    job_id = re.search(r"Job '(raysubmit_\w+)' submitted successfully", text).group(1)

    ray = BIN / "ray"
    denied = _shell(ray_head, f"{ray} job status --address {address} {job_id}", timeout=120)
    assert denied.returncode != 0 and "Authentication required" in denied.stdout + denied.stderr, denied.stdout + denied.stderr
    status = _shell(ray_head, f"RAY_AUTH_MODE=token {ray} job status --address {address} {job_id}", timeout=120)
    assert status.returncode == 0 and f"Job '{job_id}' succeeded" in status.stdout + status.stderr, status.stdout + status.stderr
    logs = _shell(ray_head, f"RAY_AUTH_MODE=token {ray} job logs --address {address} {job_id}", timeout=120)
    assert logs.returncode == 0, logs.stdout + logs.stderr
    assert re.search(r"Running entrypoint for job .*: \S*/python3? launch/job\.py --config configs/local\.yaml", logs.stdout), logs.stdout[-3000:]
    assert re.search(r"mean reward \(retail, trainable\) +1\.0000", logs.stdout), logs.stdout[-3000:]
    # where the files are, as an absolute path (a relative one would be Ray's copy of the project: the job warns then)
    assert f"samples: {out / 'samples.jsonl'}  (kept out of training: " in logs.stdout, logs.stdout[-3000:]
    assert "warning: rollout.output_dir=" not in logs.stdout


@pytest.mark.ray
@pytest.mark.torch
def test_grpo_loop_through_ray_job_submit(ray_head, tmp_path):
    """launch/train_grpo_tiny.py as a Ray job: two steps, one weight update between them that
    interrupts step 1's episodes, every episode delivered exactly once and log-probs exact under
    the weights that sampled them."""
    pytest.importorskip("torch")
    out = tmp_path / "grpo"
    args = ["--config", "configs/local.yaml", "local.backend=tiny", "--steps", "2", "--groups-per-step", "1", "env.task_ids=[10,25]",
            "rollout.n_samples_per_task=2", "policy.sampling.max_new_tokens=64", "pool.num_actors=1", f"rollout.output_dir={out}"]
    submit = _shell(ray_head, f"launch/submit.sh --address {ray_head[0]} --entry launch/train_grpo_tiny.py -- {shlex.join(args)}")
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
