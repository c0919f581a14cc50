"""Every model family end to end, as a user runs it: the main job on the local stack with the
family's offline vocabulary and chat format (the gold-replay oracle speaks the format: reward 1.0),
``policy.chat_format=auto`` picking the family from that vocabulary, and the exactness check on the
tiny model with that vocabulary (0 differing ids, max |dlogp| <= 1e-3).

CI runs one retail task per family; the whole retail split per family is ``extended`` (about a
minute per family on 2 cores, beyond CI's budget; the one-task runs cover the same path).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.cli import cli_env, run_cli, shared_overrides

ROOT = Path(__file__).resolve().parents[2]
FAMILIES = [  # (chat format, offline vocabulary, the package it needs)
    ("hermes", "builtin:qwen3", None),
    ("qwen3.6", "builtin:qwen3.6", "renderers"),
    ("deepseek-v4", "builtin:deepseek-v4", "renderers"),
    ("mistral", "builtin:mistral", "mistral_common"),
]
IDS = [f[0] for f in FAMILIES]


def _env() -> dict[str, str]:
    return dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True")


@pytest.fixture
def main_job(local_stacks, shared_ray):
    """The main job with a family's vocabulary and chat format, on the shared head and the shared
    gold-replay stack of that vocabulary and format: ``(summary, its output)``."""
    def _main_job(tmp_path: Path, vocabulary: str, chat_format: str, *extra: str) -> tuple[dict, str]:
        out = tmp_path / "run"
        proc = run_cli(["run", "--config", "configs/local.yaml", "--no-progress", f"policy.tokenizer={vocabulary}",
                        f"policy.chat_format={chat_format}", f"rollout.output_dir={out}", *extra], stack=local_stacks, ray=shared_ray, timeout=900)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
        return json.loads((out / "summary.json").read_text()), proc.stdout + proc.stderr
    return _main_job


def _check_call_ids(run: Path, chat_format: str, vocabulary: str) -> list[dict]:
    """The kept samples' call ids: each tool result carries the id of the call it answers. Mistral
    (v3): the ids the model wrote (the oracle writes one per call, as a v3 model does), 9 letters or
    digits, distinct, each in the sampled call and in its result's tokens; the other families: the
    loop's ``call_N`` (their models write no ids)."""
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    for s in samples:
        calls = [c["id"] for m in s["messages"] if m["role"] == "assistant" for c in m.get("tool_calls") or []]
        assert calls and [m["tool_call_id"] for m in s["messages"] if m["role"] == "tool"] == calls
        if chat_format == "mistral":
            from rollout.core.tokenizer import load_tokenizer

            text = load_tokenizer(vocabulary).decode(s["tokens"])
            assert len(set(calls)) == len(calls) and all(re.fullmatch("[A-Za-z0-9]{9}", c) for c in calls), calls
            assert all(f'"id": "{c}"}}' in text and f'"call_id": "{c}"}}' in text for c in calls), calls
        else:
            assert all(re.fullmatch(r"call_\d+(-\d+)?", c) for c in calls), calls
    return samples


@pytest.mark.parametrize("chat_format, vocabulary, package", FAMILIES, ids=IDS)
def test_the_main_job_earns_reward_1_on_a_retail_task_in_every_family(tmp_path, main_job, chat_format, vocabulary, package):
    if package:
        pytest.importorskip(package)
    summary, _ = main_job(tmp_path, vocabulary, chat_format, "env.task_ids=[0]", "pool.num_actors=1")
    assert summary["status_counts"] == {"completed": 2}
    assert summary["mean_reward_per_domain"] == {"retail": 1.0}
    assert len(_check_call_ids(tmp_path / "run", chat_format, vocabulary)) == 2


def test_mistral_rerender_keeps_the_call_ids_the_model_wrote_so_each_episode_stays_one_sequence(tmp_path, main_job):
    """policy.history=rerender re-encodes the kept conversation every turn; with the ids the model
    wrote kept, the re-encoding extends what was sampled, so merge_prefix keeps one sample per
    episode (before, every call's id was rewritten and each call turn started a new segment)."""
    pytest.importorskip("mistral_common")
    summary, _ = main_job(tmp_path, "builtin:mistral", "mistral", "env.domain=airline", "env.task_ids=[7]", "pool.num_actors=1",
                           "policy.history=rerender", "rollout.sample_mode=merge_prefix")
    assert summary["status_counts"] == {"completed": 2}
    assert summary["mean_reward_per_domain"] == {"airline": 1.0}
    samples = _check_call_ids(tmp_path / "run", "mistral", "builtin:mistral")
    assert len(samples) == 2 and all(len(s["messages"]) >= 10 for s in samples)


@pytest.mark.parametrize("chat_format, vocabulary, package", [f for f in FAMILIES if f[0] != "hermes"], ids=IDS[1:])
def test_auto_picks_the_family_from_its_vocabulary_and_says_so(tmp_path, main_job, chat_format, vocabulary, package):
    pytest.importorskip(package)
    summary, log = main_job(tmp_path, vocabulary, "auto", "env.task_ids=[1]", "pool.num_actors=1", "logging.level=INFO")
    assert summary["mean_reward_per_domain"] == {"retail": 1.0}
    assert f"policy.chat_format=auto: chat format {chat_format} for tokenizer {vocabulary}" in log


@pytest.mark.extended
@pytest.mark.parametrize("chat_format, vocabulary, package", FAMILIES, ids=IDS)
def test_the_main_job_earns_reward_1_on_every_retail_task_in_every_family(tmp_path, main_job, chat_format, vocabulary, package):
    """Extended (out of CI: the whole split, 228 episodes per family; the one-task test covers the path)."""
    if package:
        pytest.importorskip(package)
    summary, _ = main_job(tmp_path, vocabulary, chat_format)
    assert summary["status_counts"] == {"completed": 228}
    assert summary["mean_reward_per_domain"] == {"retail": 1.0}


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.parametrize("chat_format, vocabulary, package", [f for f in FAMILIES if f[0] != "hermes"], ids=IDS[1:])
def test_the_exactness_check_passes_with_every_familys_vocabulary(tmp_path, chat_format, vocabulary, package):
    """The tiny model with the family's vocabulary (hermes: tests/e2e/test_check.py)."""
    pytest.importorskip("torch")
    pytest.importorskip(package)
    proc = subprocess.run(
        [sys.executable, "-m", "rollout.check", "exactness", "--config", "configs/local.yaml", "local.backend=tiny",
         f"policy.tokenizer={vocabulary}", f"policy.chat_format={chat_format}", "--episodes", "2", f"rollout.output_dir={tmp_path}"],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600,
    )
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    assert re.search(r"episodes checked\s+2 \(turns per episode: min 1\d, max 1\d\)", out), out
    assert re.search(r"token ids differing from sampled\s+0\n", out), out
    diff = float(re.search(r"max \|rollout - recomputed\| log-prob\s+(\S+)", out).group(1))
    assert diff <= 1e-3 and "PASS" in out


TRAINER_OVERRIDES = ["env.task_ids=[0,1]", "rollout.n_samples_per_task=2", "pool.num_actors=1", "policy.tokenizer=builtin:deepseek-v4",
                     "policy.chat_format=auto"]
TRAINER_SCRIPT = """
import sys
from rollout import Batch, load_config, open_pool
cfg = load_config("configs/local.yaml", sys.argv[2:] + ["rollout.output_dir=" + sys.argv[1]])
with open_pool(cfg) as (cfg, pool, task_ids):
    groups = pool.collect_groups(2, iter(task_ids), abort_surplus=False)
    samples = [s for g in groups for s in g]
    batch = Batch.from_samples(samples, train_statuses=cfg.rollout.train_statuses)
    eos = 1  # DeepSeek-V4's <｜end▁of▁sentence｜>
    for s in samples:
        assert len(s.tokens) == len(s.loss_mask) + (len(s.tokens) - s.response_length) and len(s.loss_mask) == len(s.rollout_log_probs)
        assert s.tokens[0] == 0, s.tokens[:3]  # the renderer's BOS opens the prompt
        ends = [i for i, t in enumerate(s.tokens[len(s.tokens) - s.response_length:]) if t == eos]
        assert ends and all(s.loss_mask[i] in (0, 1) for i in ends)
    print("samples", len(samples), "mean reward", float(batch.rewards.mean()), "masked", sum(sum(s.loss_mask) for s in samples))
"""


@pytest.mark.slow
@pytest.mark.ray
def test_the_trainer_api_streams_a_familys_samples(tmp_path, local_stacks, shared_ray):
    """The trainer API (open_pool, collect_groups, Batch) with DeepSeek-V4's vocabulary, auto-detected:
    the same guarantee as the CLI (gold replay, reward 1.0), on samples a trainer receives."""
    pytest.importorskip("renderers")
    overrides = TRAINER_OVERRIDES + shared_overrides("configs/local.yaml", TRAINER_OVERRIDES, stack=local_stacks, ray=shared_ray)
    proc = subprocess.run([sys.executable, "-c", TRAINER_SCRIPT, str(tmp_path / "run"), *overrides], cwd=ROOT, env=cli_env(),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("samples "))
    n, reward = int(line.split()[1]), float(line.split()[4])
    assert n == 4 and reward == 1.0, line
