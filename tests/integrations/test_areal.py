"""The ``Tau2Workflow`` (rollout.integrations.areal) driven by AReaL's own classes: AReaL's
``RemoteSGLangEngine`` (its HTTP client of SGLang servers, its ``WorkflowExecutor`` and
``rollout_batch``, which resolves the workflow from its import path) talking to the local stack's
real sglang-router, on CPU.

Skipped where AReaL is not installed: ``bash tests/integrations/run_areal.sh`` makes an environment
with ``areal==1.0.4`` (installed without its dependencies, whose pins exclude the CPU torch) and runs
them."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("areal.api.workflow_api",
                    reason="AReaL is not installed here: bash tests/integrations/run_areal.sh builds a venv with areal and runs these")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from areal.api.cli_args import GenerationHyperparameters, InferenceEngineConfig  # noqa: E402
from areal.engine.sglang_remote import RemoteSGLangEngine  # noqa: E402
from support.fault_proxy import FaultProxy  # noqa: E402

from rollout.core.config import LocalConfig, TinyModelConfig, load_config  # noqa: E402
from rollout.core.records import EpisodeSpec  # noqa: E402
from rollout.core.worker import RolloutWorker  # noqa: E402
from rollout.integrations.areal import Tau2Workflow  # noqa: E402

pytestmark = [pytest.mark.slow]

TASKS = ["0", "16", "33"]
SEED = 4321
WORKFLOW = "rollout.integrations.areal.Tau2Workflow"


def _yaml(tmp_path, lines: list[str]):
    from omegaconf import OmegaConf

    path = tmp_path / f"tau-{len(list(tmp_path.glob('tau-*.yaml')))}.yaml"  # a new file: configs are cached by path
    path.write_text(OmegaConf.to_yaml(OmegaConf.from_dotlist(lines)))
    return path


def _engine(router_url: str) -> RemoteSGLangEngine:
    # AReaL's staleness manager admits (max_head_offpolicyness + 1) * consumer_batch_size rollouts per
    # weight version: the batch size must cover the items of one rollout_batch, or it waits for ever
    eng = RemoteSGLangEngine(InferenceEngineConfig(backend="sglang:d1", max_concurrent_rollouts=8, consumer_batch_size=8, setup_timeout=60,
                                                   request_retries=1, request_timeout=120))
    eng.initialize(addr=router_url.removeprefix("http://"))
    return eng


def _rows(results: list[dict]) -> list[dict]:
    out = []
    for r in results:
        for i in range(r["input_ids"].shape[0]):
            n = int(r["attention_mask"][i].sum())
            out.append({k: r[k][i][:n].tolist() for k in ("input_ids", "loss_mask", "logprobs", "versions")} | {"reward": float(r["rewards"][i])})
    return out


async def _ours(router_url: str, lines: list[str], task: str, seed: int):
    cfg = load_config(None, [*lines, f"policy.router_url={router_url}"])
    worker = RolloutWorker(cfg.policy, cfg.env, cfg.logging)
    try:
        return await worker.run(EpisodeSpec(f"ours/{task}", "retail", task, f"ours/{task}", 0, seed=seed))
    finally:
        await worker.close()


def test_gold_replay_through_areals_engine_equals_our_own_worker(retail_stack, tokenizer, tmp_path):
    """AReaL resolves the workflow from its import path and runs three retail tasks through its
    real SGLang client: reward 1.0 each; every token, mask and log-prob equal to our own worker's
    episode of the same task; versions -1 off the mask, the engine's version 0 on it."""
    tau = _yaml(tmp_path, ["env.domain=retail"])
    eng = _engine(retail_stack.router_url)
    try:
        results = eng.rollout_batch([{"task_id": t, "seed": SEED} for t in TASKS], workflow=WORKFLOW,
                                    workflow_kwargs={"tokenizer": tokenizer, "tau_rollout_config": str(tau)})
    finally:
        eng.destroy()
    rows = _rows(results)
    assert len(rows) == 3 and [r["reward"] for r in rows] == [1.0, 1.0, 1.0]
    assert {k: v.dtype for k, v in results[0].items()} == {"input_ids": torch.int32, "loss_mask": torch.int32, "logprobs": torch.float32,
                                                           "versions": torch.int32, "attention_mask": torch.bool, "rewards": torch.float32}
    ours = asyncio.run(_gather([_ours(retail_stack.router_url, ["env.domain=retail"], t, SEED) for t in TASKS]))
    by_tokens = {tuple(r["input_ids"]): r for r in rows}
    for res in ours:
        traj = res.trajectory
        assert res.status.value == "completed" and res.reward == 1.0
        row = by_tokens[tuple(traj.tokens)]  # the same tokens, whichever order AReaL returned them in
        p = len(traj.prompt_ids)
        assert row["loss_mask"] == [0] * p + traj.loss_mask
        assert row["logprobs"] == [0.0] * p + [float(np.float32(x)) for x in traj.rollout_log_probs]
        assert row["versions"] == [0 if m else -1 for m in row["loss_mask"]]


async def _gather(coros):
    return await asyncio.gather(*coros)


@pytest.mark.torch
def test_tiny_model_log_probs_recompute_in_one_forward_pass(tmp_path_factory, tokenizer, tmp_path):
    """The tiny random model samples real tokens through AReaL's engine; each masked token's
    log-prob in AReaL's tensors equals one forward pass of the same weights over the row."""
    from rollout.devtools.check import recompute_masked_log_probs
    from rollout.devtools.local.stack import LocalStack
    from rollout.devtools.local.tiny import build_tiny_model

    stack = LocalStack(LocalConfig(enabled=True, backend="tiny"), "retail", "builtin:qwen3", log_dir=tmp_path_factory.mktemp("tiny-areal"))
    stack.start()
    try:
        eng = _engine(stack.router_url)
        tau = _yaml(tmp_path, ["env.domain=retail", "env.max_steps=2", "policy.sampling.max_new_tokens=24", "policy.on_length=keep"])
        try:
            results = eng.rollout_batch([{"task_id": "0"}, {"task_id": "1"}], workflow=Tau2Workflow(
                tokenizer, GenerationHyperparameters(temperature=1.0, top_k=-1, top_p=1.0), tau_rollout_config=str(tau)))
        finally:
            eng.destroy()
    finally:
        stack.stop()
    model = build_tiny_model(len(tokenizer), TinyModelConfig())
    rows = _rows(results)
    assert len(rows) == 2
    masked = 0
    for row in rows:
        pos = [i for i, m in enumerate(row["loss_mask"]) if m]
        assert pos
        rec = recompute_masked_log_probs(model, row["input_ids"], pos, temperature=1.0)
        assert max(abs(a - row["logprobs"][i]) for a, i in zip(rec, pos)) < 1e-4
        masked += len(pos)
    assert masked >= 2 * 24


def test_an_infrastructure_failure_is_rejected_for_areal(retail_stack, tokenizer, tmp_path):
    """The router fails from the third call on: the episode ends policy_error, and the workflow
    answers None, which AReaL's rollout_batch drops (AReaL: rejected, not used for training)."""
    calls = []

    def rule(key, body):
        calls.append(key)
        return ("status", 500) if len(calls) >= 3 else None

    wf = Tau2Workflow(tokenizer, tau_rollout_config=str(_yaml(tmp_path, ["env.domain=retail"])))
    with FaultProxy(retail_stack.router_url, tokenizer, rule) as proxy:
        eng = _engine(proxy.url)
        try:
            results = eng.rollout_batch([{"task_id": "16"}], workflow=wf)
        finally:
            eng.destroy()
    assert results == []
    res = wf.last_result
    assert res.status.value == "policy_error" and "AReaL engine agenerate failed" in res.metadata["error"]
    assert sum(res.trajectory.loss_mask) > 0  # it had sampled two turns: nothing of them reaches AReaL


def test_per_turn_is_refused_unless_multiple_outputs_then_one_row_per_turn(retail_stack, tokenizer, tmp_path):
    tau = _yaml(tmp_path, ["env.domain=retail", "rollout.sample_mode=per_turn"])
    with pytest.raises(ValueError, match="rollout.sample_mode=per_turn gives one sample per assistant turn.*multiple_outputs=True"):
        Tau2Workflow(tokenizer, tau_rollout_config=str(tau))
    eng = _engine(retail_stack.router_url)
    try:
        results = eng.rollout_batch([{"extra_info": {"task_id": "16", "domain": "retail"}}],
                                    workflow=Tau2Workflow(tokenizer, tau_rollout_config=str(tau), multiple_outputs=True))
    finally:
        eng.destroy()
    (traj,) = results
    rows = _rows(results)
    assert traj["input_ids"].shape[0] == len(rows) >= 4 and {r["reward"] for r in rows} == {1.0}
    for a, b in zip(rows, rows[1:]):  # each turn's prompt extends the previous turn's row
        assert b["input_ids"][: len(a["input_ids"])] == a["input_ids"]
    for r in rows:  # a per_turn row ends at its last sampled token
        assert r["loss_mask"][-1] == 1


def test_importing_rollout_and_its_other_integrations_does_not_import_areal():
    import subprocess
    import sys

    mods = "rollout, rollout.integrations.seed, rollout.integrations.slime, rollout.integrations.episodes, rollout.integrations.verl_data"
    code = f"import sys, {mods}; print('areal' in sys.modules); import rollout.integrations.areal; print('areal' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "True"]
