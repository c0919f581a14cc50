"""The ``tau2_agent`` loop (rollout.integrations.verl) driven by verl's own classes: verl's trainer
config composed from its YAML, its ``RLHFDataset`` and ``collate_fn`` on a Parquet file of tau2
task ids, its ``AgentLoopWorker`` (which finds our loop through the agent-loop YAML and builds it
with hydra), its ``LLMServerClient`` backed by the local stack's real sglang-router
(tests/support/verl_stack.py), its ``AgentLoopOutput`` and the ``DataProto`` batch it returns.

Skipped where verl is not installed (the project's own environment): ``bash
tests/integrations/run_verl.sh`` makes an environment with ``tau-rollout[verl]`` and runs them."""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("verl.experimental.agent_loop.agent_loop",
                    reason="verl is not installed here: bash tests/integrations/run_verl.sh builds a venv with tau-rollout[verl] and runs these")

import numpy as np  # noqa: E402
from support.fault_proxy import FaultProxy  # noqa: E402
from support.verl_stack import RouterLLMServerClient, model_folder, trainer_config  # noqa: E402
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, AgentLoopWorker, DictConfigWrap, _agent_loop_registry  # noqa: E402
from verl.protocol import DataProto  # noqa: E402
from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn  # noqa: E402

from rollout.core.config import LocalConfig, TinyModelConfig, load_config  # noqa: E402
from rollout.core.records import EpisodeSpec  # noqa: E402
from rollout.core.worker import RolloutWorker  # noqa: E402
from rollout.integrations import verl as tau_verl  # noqa: E402
from rollout.integrations.verl_data import write_dataset  # noqa: E402

pytestmark = [pytest.mark.slow]

TASKS = ["0", "16", "33"]  # retail tasks whose gold replay earns 1.0
SEED = 1234
PROMPT_LEN, RESPONSE_LEN = 8192, 8192  # retail's first prompts are ~4.9k tokens; gold replay of task 16 needs 4.5k more


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return model_folder(tmp_path_factory.mktemp("verl-model"))


def _yamls(tmp_path, lines: list[str], entry: dict | None = None):
    from omegaconf import OmegaConf

    tau = tmp_path / f"tau-{len(list(tmp_path.glob('tau-*.yaml')))}.yaml"  # our YAML, from key=value lines (a new file: the loop caches configs by path)
    tau.write_text(OmegaConf.to_yaml(OmegaConf.from_dotlist(lines)))
    entry = {"name": "tau2_agent", "_target_": "rollout.integrations.verl.Tau2AgentLoop", "tau_rollout_config": str(tau), **(entry or {})}
    loops = tmp_path / "agent_loops.yaml"
    loops.write_text(json.dumps([entry]))  # JSON is YAML
    return tau, loops


def _batch(worker: AgentLoopWorker, cfg, parquet) -> DataProto:
    """What verl's trainer hands the agent-loop workers for a step: the dataset's rows collated
    into a DataProto, with a ``uid`` per row (trainer/ppo/ray_trainer.py)."""
    ds = RLHFDataset(data_files=[str(parquet)], tokenizer=worker.tokenizer, config=cfg.data, processor=None)
    batch = DataProto.from_single_dict(collate_fn([ds[i] for i in range(len(ds))]))
    batch.non_tensor_batch["uid"] = np.array([f"uid-{i}" for i in range(len(batch))], dtype=object)
    return batch


def _rows(out: DataProto):
    """Per row: unpadded prompt, response, response mask, rollout log-probs (float32, as verl keeps them), reward."""
    rows = []
    for i in range(len(out)):
        am = out.batch["attention_mask"][i]
        p = out.batch["prompts"].shape[1]
        prompt = out.batch["prompts"][i][am[:p].bool()].tolist()
        n = int(am[p:].sum())
        rows.append({
            "prompt": prompt,
            "response": out.batch["responses"][i][:n].tolist(),
            "mask": out.batch["response_mask"][i][:n].tolist(),
            "mask_tail": out.batch["response_mask"][i][n:].tolist(),
            "logprobs": out.batch["rollout_log_probs"][i][:n].tolist(),
            "reward": float(out.batch["rm_scores"][i].sum()),
            "status": out.non_tensor_batch["tau2_status"][i],
            "trainable": out.non_tensor_batch["tau2_trainable"][i],
            "task": out.non_tensor_batch["tau2_task_id"][i],
        })
    return rows


async def _verl_step(tmp_path, model_dir, router_url: str, tau_lines: list[str], tasks: list[str], *, seeds=None, entry=None,
                     response_len: int = RESPONSE_LEN):
    _, loops = _yamls(tmp_path, tau_lines, entry)
    cfg = trainer_config(model_dir, loops, PROMPT_LEN, response_len)
    client = RouterLLMServerClient(cfg, router_url)
    worker = AgentLoopWorker(cfg, client)
    parquet = write_dataset(tmp_path / "tasks.parquet", "retail", tasks, seeds=seeds)
    try:
        out = await worker.generate_sequences(_batch(worker, cfg, parquet))
    finally:
        await client.server.close()
    return out, client


async def _our_worker(router_url: str, tau_lines: list[str], task: str, seed: int):
    cfg = load_config(None, [*tau_lines, f"policy.router_url={router_url}"])
    worker = RolloutWorker(cfg.policy, cfg.env, cfg.logging, partial_rollout=cfg.rollout.partial_rollout)
    try:
        return await worker.run(EpisodeSpec(f"ours/{task}", "retail", task, f"ours/{task}", 0, seed=seed))
    finally:
        await worker.close()


def test_importing_the_integration_registers_tau2_agent_with_verls_registry():
    assert _agent_loop_registry[tau_verl.AGENT_NAME] == {"_target_": "rollout.integrations.verl.Tau2AgentLoop"}
    assert issubclass(tau_verl.Tau2AgentLoop, __import__("verl").experimental.agent_loop.agent_loop.AgentLoopBase)


async def test_gold_replay_through_verls_worker_equals_our_own_worker(retail_stack, model_dir, tmp_path):
    """verl's worker runs three retail tasks on our loop: reward 1.0 each, through verl's reward
    path (rm_scores); every token, mask and log-prob equal to our own worker's episode of the
    same task and seed; verl's sticky-session id is one per episode."""
    lines = ["env.domain=retail", "env.max_steps=30"]
    seeds = [SEED + i for i in range(len(TASKS))]
    out, client = await _verl_step(tmp_path, model_dir, retail_stack.router_url, lines, TASKS, seeds=seeds)
    rows = _rows(out)
    assert [r["task"] for r in rows] == TASKS
    assert [r["status"] for r in rows] == ["completed"] * 3 and all(r["trainable"] for r in rows)
    assert [r["reward"] for r in rows] == [1.0, 1.0, 1.0]
    assert "rm_scores" in out.batch.keys() and out.meta_info["reward_extra_keys"] == ["tau2_reward", "tau2_trainable"]
    assert list(out.non_tensor_batch["tau2_reward"]) == [1.0, 1.0, 1.0]
    assert all(v == 0 for r in rows for v in r["mask_tail"])  # padding is masked
    ours = await asyncio.gather(*[_our_worker(retail_stack.router_url, lines, t, s)
                                  for t, s in zip(TASKS, seeds)])
    for row, res in zip(rows, ours):
        traj = res.trajectory
        assert res.status.value == "completed" and res.reward == 1.0
        assert row["prompt"] == traj.prompt_ids
        assert row["response"] == traj.tokens[len(traj.prompt_ids):]
        assert row["mask"] == traj.loss_mask and sum(row["mask"]) > 0
        assert row["logprobs"] == [float(np.float32(x)) for x in traj.rollout_log_probs]
        assert 0 < len(row["response"]) <= RESPONSE_LEN and len(row["prompt"]) <= PROMPT_LEN
    turns = [int(x) for x in out.non_tensor_batch["__num_turns__"]]
    assert all(t >= 3 for t in turns)
    # one sticky-session id per episode: every call of an episode goes to one verl server
    eids = list(out.non_tensor_batch["tau2_episode_id"])
    assert set(client.sticky_ids) == set(eids) and len(set(eids)) == 3
    assert sum(len(traj_calls) for traj_calls in [r.trajectory.generation_spans for r in ours]) == len(client.sticky_ids)
    # weight versions: verl's global_steps of each call, and the episode's min/max for verl's staleness checks
    assert all(v == ["0"] * len(v) for v in out.non_tensor_batch["weight_versions"])
    assert list(out.non_tensor_batch["min_global_steps"]) == [0, 0, 0] == list(out.non_tensor_batch["max_global_steps"])
    # stop strings went as stop_token_ids (verl's SGLang server runs without a detokenizer)
    body = client.server.requests[0]
    assert "stop" not in body["sampling_params"] and body["sampling_params"]["stop_token_ids"] == [151658]  # </tool_call>
    assert body["return_logprob"] is True and body["sampling_params"]["sampling_seed"] >= 0


async def test_verls_response_length_bounds_the_episode_exactly(retail_stack, model_dir, tmp_path):
    """With rollout.response_length=2048 a gold episode that needs more ends truncated (context)
    inside it, token for token the episode our own worker runs with policy.max_context_tokens =
    first prompt + 2048: verl's padding cuts nothing."""
    out, _ = await _verl_step(tmp_path, model_dir, retail_stack.router_url, ["env.domain=retail"], ["16"], seeds=[SEED], response_len=2048)
    (row,) = _rows(out)
    assert row["status"] == "truncated" and out.non_tensor_batch["tau2_termination"][0] == "context"
    assert 1024 < len(row["response"]) <= 2048
    ours = await _our_worker(retail_stack.router_url, ["env.domain=retail", f"policy.max_context_tokens={len(row['prompt']) + 2048}"], "16", SEED)
    assert ours.status.value == "truncated" and ours.trajectory.tokens == row["prompt"] + row["response"]
    assert ours.trajectory.loss_mask == row["mask"]


@pytest.mark.torch
async def test_tiny_model_log_probs_recompute_in_one_forward_pass(tmp_path_factory, model_dir, tmp_path):
    """The tiny random Qwen3 model behind the router samples real tokens; every masked token's
    rollout log-prob in verl's batch equals the log-prob that one forward pass of the same
    weights gives over the row's tokens."""
    pytest.importorskip("torch")
    from rollout.core.tokenizer import load_tokenizer
    from rollout.devtools.check import recompute_masked_log_probs
    from rollout.devtools.local.stack import LocalStack
    from rollout.devtools.local.tiny import build_tiny_model

    stack = LocalStack(LocalConfig(enabled=True, backend="tiny"), "retail", "builtin:qwen3", log_dir=tmp_path_factory.mktemp("tiny-verl"))
    stack.start()
    try:
        lines = ["env.domain=retail", "env.max_steps=2", "policy.sampling.max_new_tokens=24", "policy.on_length=keep"]
        out, _ = await _verl_step(tmp_path, model_dir, stack.router_url, lines, ["0", "1"])
    finally:
        stack.stop()
    model = build_tiny_model(len(load_tokenizer("builtin:qwen3")), TinyModelConfig())
    masked_total = 0
    for row in _rows(out):
        assert row["status"] in ("max_steps", "completed", "truncated", "parse_error"), row["status"]
        tokens = row["prompt"] + row["response"]
        pos = [i for i, m in enumerate(row["mask"]) if m]
        assert pos, "the model sampled nothing"
        rec = recompute_masked_log_probs(model, tokens, [len(row["prompt"]) + i for i in pos], temperature=1.0)
        diff = max(abs(a - row["logprobs"][i]) for a, i in zip(rec, pos))
        assert diff < 1e-4, diff
        assert all(row["logprobs"][i] == 0.0 for i, m in enumerate(row["mask"]) if not m)
        masked_total += len(pos)
    assert masked_total >= 2 * 24


async def test_a_policy_server_failure_mid_episode_is_kept_out_of_training(retail_stack, model_dir, tmp_path, tokenizer):
    """The router fails from the third /generate call on: the episode ends policy_error, and verl
    gets it with every response token masked 0 (its sampled tokens and log-probs kept, reward
    0.0) and tau2_trainable False, where our own mask has 1s."""
    calls = []

    def rule(key, body):
        calls.append(key)
        return ("status", 500) if len(calls) >= 3 else None

    with FaultProxy(retail_stack.router_url, tokenizer, rule) as proxy:
        out, _ = await _verl_step(tmp_path, model_dir, proxy.url, ["env.domain=retail", "policy.max_request_retries=0"], ["16"])
    (row,) = _rows(out)
    assert row["status"] == "policy_error" and row["trainable"] is False
    assert row["reward"] == 0.0 and out.non_tensor_batch["tau2_reward"][0] == 0.0
    assert set(row["mask"]) == {0} and len(row["logprobs"]) == len(row["response"])
    assert row["response"].count(151658) == 2  # the two tool calls it sampled (</tool_call>) are there, masked 0
    assert "verl server manager generate failed" in out.non_tensor_batch["tau2_error"][0]
    assert out.non_tensor_batch["tau2_metadata"][0]["generated_tokens"] > 0  # our own mask had sampled tokens


async def test_per_turn_is_refused_in_one_line_unless_the_entry_allows_several_outputs(retail_stack, model_dir, tmp_path):
    """verl's AgentLoopWorker takes one output per run: per_turn is refused when verl builds the
    loop; with multiple_outputs the loop returns one AgentLoopOutput per turn (verl's
    TransferQueue worker's shape), equal to our per_turn exporter's samples."""
    lines = ["env.domain=retail", "rollout.sample_mode=per_turn"]
    with pytest.raises(Exception, match="rollout.sample_mode=per_turn gives one sample per assistant turn.*multiple_outputs: true"):
        await _verl_step(tmp_path, model_dir, retail_stack.router_url, lines, ["16"])

    tau, loops = _yamls(tmp_path, lines, {"multiple_outputs": True})
    cfg = trainer_config(model_dir, loops, PROMPT_LEN, RESPONSE_LEN)
    client = RouterLLMServerClient(cfg, retail_stack.router_url)
    worker = AgentLoopWorker(cfg, client)
    loop = tau_verl.Tau2AgentLoop(trainer_config=DictConfigWrap(cfg), server_manager=client, tokenizer=worker.tokenizer, processor=None,
                                  dataset_cls=RLHFDataset, data_config=DictConfigWrap(cfg.data),
                                  tau_rollout_config=str(tau), multiple_outputs=True)
    try:
        outs = await loop.run({"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True},
                              extra_info={"task_id": "16", "seed": SEED}, uid="u0")
    finally:
        await client.server.close()
    assert isinstance(outs, list) and len(outs) >= 3 and all(isinstance(o, AgentLoopOutput) for o in outs)
    assert [o.extra_fields["tau2_turn_indices"] for o in outs] == [[i] for i in range(len(outs))]
    assert {o.reward_score for o in outs} == {1.0} and {o.extra_fields["tau2_status"] for o in outs} == {"completed"}
    for o in outs:  # per_turn: a response ends at its last sampled token; the next prompt extends this one
        assert o.response_mask[-1] == 1 and all(m == 1 for m in o.response_mask)
    for a, b in zip(outs, outs[1:]):
        assert b.prompt_ids[: len(a.prompt_ids) + len(a.response_ids)] == a.prompt_ids + a.response_ids

    # merge_prefix with the append-only history is one sample: accepted without multiple_outputs
    out, _ = await _verl_step(tmp_path, model_dir, retail_stack.router_url, ["env.domain=retail", "rollout.sample_mode=merge_prefix"], ["16"])
    assert _rows(out)[0]["reward"] == 1.0


def test_importing_rollout_and_its_other_integrations_does_not_import_verl():
    """verl loads with rollout.integrations.verl only (the helpers it uses import nothing of verl)."""
    import subprocess
    import sys

    mods = "rollout, rollout.integrations.seed, rollout.integrations.slime, rollout.integrations.episodes, rollout.integrations.verl_client, " \
           "rollout.integrations.verl_output, rollout.integrations.verl_data"
    code = f"import sys, {mods}; print('verl' in sys.modules); import rollout.integrations.verl; print('verl' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "True"]
