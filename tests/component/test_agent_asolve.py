"""The seed's agent interface (rollout.integrations.seed): ``await agent.asolve(env, rollout_args,
sampling_params, task_index, max_num_steps)`` on our episode loop, against the gold-replay server
behind the real sglang-router, with the scripted user."""

from __future__ import annotations

import argparse

import aiohttp
import pytest

from rollout.core.config import EnvConfig, PolicyConfig
from rollout.core.records import EpisodeStatus
from rollout.devtools.check import RecordingProxy
from rollout.integrations.seed import (
    SEED_STATUS,
    Status,
    TaskEnv,
    TrainableAgent,
    _PassthroughClient,
    make_env,
    policy_config,
    resolve_task_id,
    seed_status,
)

# SGLang's sampling_params, as the seed's agent sends them (stop added: one tool call per turn)
SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": 512, "stop": ["</tool_call>"]}


def _slime_args(router_url: str) -> argparse.Namespace:
    """slime's ``args`` as the seed reads them: router ip and port, the tokenizer's checkpoint."""
    host, port = router_url.rsplit(":", 1)
    return argparse.Namespace(sglang_router_ip=host.split("://", 1)[1], sglang_router_port=int(port), hf_checkpoint="builtin:qwen3")


def _check_fields(res, tokenizer, task_id: str) -> None:
    """The seed's fields are present and consistent, and ours are aligned with them."""
    assert res.status is Status.COMPLETED and res.episode_status is EpisodeStatus.COMPLETED, res.info
    assert res.reward == 1.0
    # the seed's fields
    assert res.prompt.endswith("<|im_start|>assistant\n")
    assert tokenizer.encode(res.prompt, add_special_tokens=False) == res.prompt_token_ids
    assert [m["role"] for m in res.messages[:2]] == ["system", "user"]
    assert res.info["task_id"] == task_id and res.info["status"] == "completed"
    assert res.response_length > 0 and len(res.loss_mask) == res.response_length
    assert res.tokens == res.prompt_token_ids + res.response_token_ids
    assert len(res.tokens) == len(res.prompt_token_ids) + res.response_length
    assert set(res.loss_mask) == {0, 1}  # sampled tokens and context (tool results, user turns)
    # ours: log-probs aligned with the mask, one weight version and span per /generate call
    assert len(res.rollout_log_probs) == res.response_length
    assert all(lp == 0.0 for lp, m in zip(res.rollout_log_probs, res.loss_mask) if m == 0)
    assert len(res.weight_versions) == len(res.generation_spans) == res.info["requests"] >= 2
    sampled = [i for a, b in res.generation_spans for i in range(a, b)]
    assert sampled == [i for i, m in enumerate(res.loss_mask) if m == 1]
    sample = res.to_sample()
    assert (sample.tokens, sample.loss_mask, sample.rollout_log_probs) == (res.tokens, res.loss_mask, res.rollout_log_probs)
    assert sample.status == "completed" and sample.reward == 1.0


@pytest.mark.slow
async def test_asolve_retail_earns_full_reward_and_is_token_exact_on_the_wire(retail_stack, retail, tokenizer):
    task_id = retail.task_ids("base")[1]
    env = make_env(retail, task_id, env_cfg=EnvConfig(domain="retail"))
    async with RecordingProxy(retail_stack.router_url) as proxy:
        agent = TrainableAgent(tools_info=env.tools_info, wiki=env.wiki)  # as the seed's agent_factory builds it
        res = await agent.asolve(env, _slime_args(proxy.url), dict(SAMPLING), task_id, 30)
    _check_fields(res, tokenizer, task_id)
    calls = proxy.calls[res.info["episode_id"]]
    assert len(calls) == res.info["requests"]
    assert calls[0][0] == res.prompt_token_ids  # the prompt is what the first request sent
    expected_mask = [0] * res.response_length
    expected_lp = [0.0] * res.response_length
    for inp, out, lps in calls:  # each request's input + output is a prefix of the final tokens
        assert res.tokens[: len(inp) + len(out)] == inp + out
        start = len(inp) - len(res.prompt_token_ids)
        expected_mask[start : start + len(out)] = [1] * len(out)
        expected_lp[start : start + len(out)] = lps
    assert res.loss_mask == expected_mask and res.rollout_log_probs == expected_lp


@pytest.mark.slow
async def test_asolve_airline_earns_full_reward(airline_stack, airline, tokenizer):
    # a task index into the split, as the seed's task_index; the env is bound to that task
    env = make_env(airline, 2, env_cfg=EnvConfig(domain="airline"))
    task_id = airline.task_ids("base")[2]
    assert isinstance(env, TaskEnv) and env.task_index == task_id
    agent = TrainableAgent(tokenizer=tokenizer)  # tools and wiki from the environment
    rollout_args = {"router_url": airline_stack.router_url}
    res = await agent.asolve(env, rollout_args, dict(SAMPLING), max_num_steps=30)
    _check_fields(res, tokenizer, task_id)
    assert res.info["domain"] == "airline"
    assert res.weight_versions == ["0"] * res.info["requests"]  # the local servers' --weight-version


@pytest.mark.slow
async def test_asolve_out_of_steps_is_the_seeds_truncated(retail_stack, retail, tokenizer):
    env = make_env(retail, retail.task_ids("base")[0], env_cfg=EnvConfig(domain="retail"))
    res = await TrainableAgent(tokenizer=tokenizer).asolve(env, {"router_url": retail_stack.router_url}, dict(SAMPLING), None, 1)
    assert res.episode_status is EpisodeStatus.MAX_STEPS and res.status is Status.TRUNCATED
    assert res.info["turns"] == 1 and res.reward == 0.0
    assert len(res.loss_mask) == len(res.rollout_log_probs) == res.response_length > 0


async def test_arguments_that_name_nothing_are_errors_before_any_request(retail, tokenizer):
    env = make_env(retail, "5", env_cfg=EnvConfig(domain="retail"))
    agent = TrainableAgent(tokenizer=tokenizer)
    with pytest.raises(ValueError, match="bound to task '5'"):
        await agent.asolve(env, {"router_url": "http://127.0.0.1:9"}, dict(SAMPLING), "6")
    with pytest.raises(ValueError, match="names no router"):
        await agent.asolve(env, {}, dict(SAMPLING))
    with pytest.raises(ValueError, match="no tokenizer"):
        await TrainableAgent().asolve(env, {"router_url": "http://127.0.0.1:9"}, dict(SAMPLING))
    with pytest.raises(ValueError, match="max_new_tokens"):
        await agent.asolve(env, {"router_url": "http://127.0.0.1:9"}, {"max_new_tokens": 0})
    with pytest.raises(ValueError, match="task_index is required"):
        await agent.asolve(env.env, {"router_url": "http://127.0.0.1:9"}, dict(SAMPLING))  # a bare Tau2Environment


def test_task_index_is_an_index_into_the_split_and_a_str_is_a_task_id(retail):
    test_ids = retail.task_ids("test")
    assert resolve_task_id(retail, "test", 3) == test_ids[3]
    assert resolve_task_id(retail, "test", test_ids[3]) == test_ids[3]
    with pytest.raises(IndexError):
        resolve_task_id(retail, "test", len(test_ids))
    with pytest.raises(KeyError):
        resolve_task_id(retail, "test", "no-such-task")
    with pytest.raises(TypeError):
        resolve_task_id(retail, "test", 1.5)


async def test_sampling_params_in_sglangs_shape_reach_the_request():
    sp = {"temperature": 0.7, "top_p": 0.9, "top_k": 50, "max_new_tokens": 64, "stop": "</tool_call>", "stop_token_ids": [151645],
          "repetition_penalty": 1.1, "skip_special_tokens": True, "no_stop_trim": False, "sampling_seed": 7, "min_new_tokens": None}
    args = argparse.Namespace(sglang_router_ip="10.0.0.1", sglang_router_port=30000, rollout_max_context_len=4096)
    policy, extra, seed = policy_config(PolicyConfig(), args, sp)
    assert policy.router_url == "http://10.0.0.1:30000" and policy.max_context_tokens == 4096
    assert (policy.sampling.temperature, policy.sampling.top_p, policy.sampling.top_k) == (0.7, 0.9, 50)
    assert policy.sampling.max_new_tokens == 64 and policy.sampling.stop == ["</tool_call>"] and seed == 7
    assert extra == {"stop_token_ids": [151645], "repetition_penalty": 1.1}  # None values are not sent
    async with aiohttp.ClientSession() as session:
        body = _PassthroughClient(policy, session, passthrough=extra).payload([1, 2, 3], 64, "e@0#0", 11)
    got = body["sampling_params"]
    assert body["input_ids"] == [1, 2, 3] and body["return_logprob"] is True
    # exactness settings are forced; the caller's extra keys are sent as given
    assert got["skip_special_tokens"] is False and got["no_stop_trim"] is True
    assert got["stop_token_ids"] == [151645] and got["repetition_penalty"] == 1.1 and got["sampling_seed"] == 11
    # the seed's defaults (no stop, no seed) keep ours
    policy, extra, seed = policy_config(PolicyConfig(), {"router_url": "http://h:1/"}, {"temperature": 0.0, "max_new_tokens": 512, "top_p": 0.9, "top_k": 50})
    assert policy.router_url == "http://h:1" and policy.sampling.stop == ["</tool_call>"] and seed is None and extra == {}


def test_every_status_has_the_seeds_name():
    assert set(SEED_STATUS) == set(EpisodeStatus)
    assert seed_status("completed") is Status.COMPLETED
    assert seed_status(EpisodeStatus.MAX_STEPS) is Status.TRUNCATED and seed_status("truncated") is Status.TRUNCATED
    assert {seed_status(s) for s in EpisodeStatus if s.is_infrastructure_failure} == {Status.ABORTED}
    assert seed_status("parse_error") is Status.ABORTED
    with pytest.raises(ValueError):
        seed_status("done")


@pytest.mark.slow
async def test_asolve_speaks_the_family_rollout_args_name(tmp_path):
    """The seed's agent with another family: ``rollout_args.tokenizer`` names DeepSeek-V4's offline
    vocabulary and ``chat_format`` is ``auto``; the local stack's oracle writes DSML tool calls, the
    episode earns 1.0, and the prompt and mask are the family's (its BOS, its end-of-turn)."""
    pytest.importorskip("renderers")
    from rollout.benchmarks.tau2.environment import Tau2Domain
    from rollout.core.config import LocalConfig
    from rollout.core.tokenizer import load_tokenizer
    from rollout.devtools.local.stack import LocalStack

    retail = Tau2Domain("retail")
    task_id = retail.task_ids("base")[1]
    tok = load_tokenizer("builtin:deepseek-v4")
    with LocalStack(LocalConfig(enabled=True, num_servers=1, startup_timeout_s=120), "retail", "builtin:deepseek-v4",
                    log_dir=tmp_path / "stack", chat_format="deepseek-v4") as stack:
        env = make_env(retail, task_id, env_cfg=EnvConfig(domain="retail"))
        res = await TrainableAgent().asolve(env, {"router_url": stack.router_url, "tokenizer": "builtin:deepseek-v4", "chat_format": "auto"},
                                           {**SAMPLING, "stop": []}, task_id, 30)
    assert res.status is Status.COMPLETED and res.reward == 1.0, res.info
    assert res.prompt_token_ids[0] == tok.bos_token_id and res.tokens == res.prompt_token_ids + res.response_token_ids
    assert any("DSML" in tok.decode(res.response_token_ids[a:b]) for a, b in res.generation_spans)
    sampled = [i for a, b in res.generation_spans for i in range(a, b)]
    assert sampled == [i for i, m in enumerate(res.loss_mask) if m == 1]
