"""A turn cut at ``policy.sampling.max_new_tokens`` becomes what ``policy.on_length`` says, on
every path: ``truncate`` (the default) ends the episode ``truncated`` before the cut text reaches
the user; ``keep`` sends it on as the turn. Either way it is counted, per episode
(``metadata.length_finishes``) and in the run's summary (``length_cut_turns``), and the
conversation says which turn was cut.

Real tau2 retail environment and scripted user; a scripted policy server (tests/support/scripted_policy.py)
whose first reply is longer than the turn budget.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.scripted_policy import ScriptedPolicyServer

from rollout.core.config import EnvConfig, PolicyConfig, SamplingConfig, load_config
from rollout.core.output import RunStats
from rollout.core.records import EpisodeSpec, EpisodeStatus
from rollout.core.worker import RolloutWorker
from rollout.integrations.seed import TrainableAgent, make_env

ROOT = Path(__file__).resolve().parents[2]
BUDGET = 24
LONG_REPLY = "I am sorry to hear that. " * 20  # well over BUDGET tokens
GOODBYE = "Thank you, goodbye."


def _script(eid, step, input_ids):
    return (LONG_REPLY, "eos") if step == 0 else (GOODBYE, "eos")


async def _episode(tokenizer, on_length: str):
    async with ScriptedPolicyServer(tokenizer, _script) as server:
        cfg = load_config(None, [f"policy.router_url={server.url}", f"policy.on_length={on_length}", "env.max_steps=4",
                                 f"policy.sampling.max_new_tokens={BUDGET}"])
        worker = RolloutWorker(cfg.policy, cfg.env, cfg.logging, max_concurrent_episodes=1)
        try:
            return await worker.run(EpisodeSpec(f"len/{on_length}", "retail", "0", f"len/{on_length}", 0))
        finally:
            await worker.close()


def test_the_default_budget_fits_real_replies_and_cuts_are_truncated():
    policy = PolicyConfig()
    assert policy.sampling.max_new_tokens >= 2048  # GPT-4o's airline replies reach 546 tokens; thinking turns run to thousands
    assert policy.on_length == "truncate"
    for name in ("local.yaml", "retail_grpo.yaml"):  # the shipped configs
        cfg = load_config(ROOT / "configs" / name)
        assert cfg.policy.sampling.max_new_tokens >= 2048 and cfg.policy.on_length == "truncate", name


async def test_truncate_ends_the_episode_before_the_cut_text_reaches_the_user(tokenizer):
    res = await _episode(tokenizer, "truncate")
    assert res.status is EpisodeStatus.TRUNCATED and res.metadata["termination_reason"] == "turn_length", res.metadata
    assert res.metadata["length_finishes"] == 1 and res.metadata["requests"] == 1 and res.metadata["turns"] == 1
    assert res.reward == 0.0
    # the conversation ends with the cut turn, marked; no user turn answers it
    assert [m["role"] for m in res.messages] == ["system", "user", "assistant"]
    assert res.messages[-1]["finish_reason"] == "length"
    traj = res.trajectory
    assert traj.loss_mask.count(1) == BUDGET  # every sampled token kept, mask 1
    assert traj.response_ids[-len(traj.response_ids) + BUDGET:] == tokenizer.encode("<|im_end|>", add_special_tokens=False)  # closed, mask 0
    sample = res.to_sample()
    stats = RunStats()
    stats.add(sample)
    summary = stats.summary()
    assert summary["length_cut_turns"] == 1 and summary["episodes_ended_by_turn_length"] == 1


async def test_keep_sends_the_cut_text_on_as_the_turn(tokenizer):
    res = await _episode(tokenizer, "keep")
    assert res.status is EpisodeStatus.COMPLETED, res.metadata
    assert res.metadata["length_finishes"] == 1
    roles = [m["role"] for m in res.messages]
    assert roles[:4] == ["system", "user", "assistant", "user"]  # the user answered the cut turn
    assert res.messages[2]["finish_reason"] == "length"
    assert LONG_REPLY.startswith(res.messages[2]["content"]) and res.messages[2]["content"] != LONG_REPLY
    stats = RunStats()
    stats.add(res.to_sample())
    assert stats.summary()["length_cut_turns"] == 1 and stats.summary()["episodes_ended_by_turn_length"] == 0


@pytest.mark.parametrize("on_length, status", [("truncate", EpisodeStatus.TRUNCATED), ("keep", EpisodeStatus.COMPLETED)])
async def test_asolve_follows_the_agents_policy(tokenizer, retail, on_length, status):
    """The seed's ``asolve`` path takes ``on_length`` from the agent's ``PolicyConfig``."""
    async with ScriptedPolicyServer(tokenizer, _script) as server:
        env = make_env(retail, "0", env_cfg=EnvConfig(domain="retail"))
        agent = TrainableAgent(tokenizer=tokenizer, policy=PolicyConfig(on_length=on_length, sampling=SamplingConfig(max_new_tokens=BUDGET)))
        res = await agent.asolve(env, {"router_url": server.url}, {"max_new_tokens": BUDGET}, None, 4)
    assert res.episode_status is status and res.info["length_finishes"] == 1
