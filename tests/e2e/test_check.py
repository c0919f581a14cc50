"""`python -m rollout.check exactness`: it passes on real tiny-model episodes and fails on
corrupted trajectories."""

from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.scripted_policy import ScriptedPolicyServer

from rollout.core.config import load_config
from rollout.core.records import EpisodeSpec
from rollout.core.worker import RolloutWorker
from rollout.devtools.check import (
    EpisodeCheck,
    ExactnessReport,
    RecordingProxy,
    id_mismatches,
    recompute_masked_log_probs,
    retokenized_baseline,
)

ROOT = Path(__file__).resolve().parents[2]


def _script(eid, step, input_ids):
    turns = [
        ("<think>\nI need the order id first.\n</think>\n\nWhat is your order id?", "eos"),
        ("<think>\nLook it up.\n</think>\n\n<tool_call>\n{\"name\": \"get_order_details\", \"arguments\": {\"order_id\": \"#W2378156\"}}\n</tool_call>", "stop"),
        ("<think>\nDone.\n</think>\n\nIt was delivered.", "eos"),
    ]
    return turns[min(step, 2)]


async def _recorded_episode(tokenizer):
    async with ScriptedPolicyServer(tokenizer, _script) as server:
        async with RecordingProxy(server.url) as proxy:
            cfg = load_config(None, [f"policy.router_url={proxy.url}"])
            worker = RolloutWorker(cfg.policy, cfg.env, cfg.logging)
            try:
                res = await worker.run(EpisodeSpec("chk", "retail", "0", "g", 0))
            finally:
                await worker.close()
    return res, proxy.calls["chk"], worker


async def test_id_check_finds_every_kind_of_corruption(tokenizer):
    res, calls, worker = await _recorded_episode(tokenizer)
    assert len(calls) == 3 and id_mismatches(res, calls) == 0
    p = len(res.trajectory.prompt_ids)
    # a generated token replaced (as a re-tokenizer would)
    bad = copy.deepcopy(res)
    k = len(calls[1][0]) - p
    bad.trajectory.response_ids[k] += 1
    assert id_mismatches(bad, calls) >= 1
    # a generated token masked 0
    bad = copy.deepcopy(res)
    bad.trajectory.loss_mask[k] = 0
    assert id_mismatches(bad, calls) == 1
    # a context token masked 1
    bad = copy.deepcopy(res)
    ctx = bad.trajectory.loss_mask.index(0)
    bad.trajectory.loss_mask[ctx] = 1
    assert id_mismatches(bad, calls) == 1
    # the seed's re-tokenizing baseline drops the first turn's <think> block (a user turn follows
    # it) and appends a newline after the last turn: it differs from what was sampled
    differing, delta = retokenized_baseline(res, tokenizer, worker.domain.tool_schemas, {})
    think_ids = len(tokenizer.encode("<think>\nI need the order id first.\n</think>\n\n"))
    assert differing >= think_ids and delta == 1 - think_ids


@pytest.mark.torch
def test_recompute_detects_wrong_log_probs(tokenizer):
    pytest.importorskip("torch")
    from rollout.devtools.local.tiny import build_tiny_model, recompute_log_probs

    model = build_tiny_model(len(tokenizer), {"seed": 3})
    tokens = tokenizer.encode("<|im_start|>user\nhello there, where is my order?<|im_end|>\n<|im_start|>assistant\n")
    positions = list(range(5, len(tokens)))
    fast = recompute_masked_log_probs(model, tokens, positions, 0.7)
    full = recompute_log_probs(model, tokens, 0.7)
    assert max(abs(a - full[p - 1]) for a, p in zip(fast, positions)) < 1e-5
    report = ExactnessReport([EpisodeCheck("e", 12, len(positions), 0.0, 0, 0, 0)])
    assert report.passed(1e-3, min_turns=10, min_episodes=1)
    assert not ExactnessReport([EpisodeCheck("e", 12, 5, 2e-3, 0, 0, 0)]).passed(1e-3, 10, 1)
    assert not ExactnessReport([EpisodeCheck("e", 12, 5, 0.0, 1, 0, 0)]).passed(1e-3, 10, 1)
    assert not ExactnessReport([EpisodeCheck("e", 9, 5, 0.0, 0, 0, 0)]).passed(1e-3, 10, 1)
    assert not ExactnessReport([EpisodeCheck("e", 12, 5, 0.0, 0, 0, 0)]).passed(1e-3, 10, 2)


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.parametrize("mode, history", [("trajectory", "append"), ("per_turn", "rerender"), ("merge_prefix", "rerender")])
def test_exactness_check_passes_on_tiny_model_episodes(tmp_path, mode, history):
    """Every sample's masked log-probs recomputed over its own tokens, in each sample mode; with
    ``rerender`` each prompt is the template's rendering, so the episode has several segments."""
    pytest.importorskip("torch")
    env = dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True")
    proc = subprocess.run(
        [sys.executable, "-m", "rollout.check", "exactness", "--config", "configs/local.yaml", "local.backend=tiny",
         "--episodes", "2", f"rollout.sample_mode={mode}", f"policy.history={history}", f"rollout.output_dir={tmp_path}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=400,
    )
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    assert "episodes checked                     2 (turns per episode: min 12, max 12)" in out
    assert "token ids differing from sampled     0" in out
    segments = int(re.search(r"segments (\d+) \(history (\w+)\)", out).group(1))
    assert (segments == 2) if history == "append" else (segments > 2), out
    append_only = int(re.search(r"append-only trajectories +(\d+)/2 episodes", out).group(1))
    assert append_only == (2 if history == "append" else 0), out
    samples = int(re.search(r"samples checked +(\d+)", out).group(1))
    # one per episode; one per turn; turns merged while the rendering extends the sample
    assert {"trajectory": samples == 2, "per_turn": samples == 24, "merge_prefix": 2 < samples < 24}[mode], out
    assert "re-tokenizing baseline (contrast)" in out and "PASS" in out
