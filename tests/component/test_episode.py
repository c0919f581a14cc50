"""Episodes on real tau2 tasks through the real sglang-router (no Ray).

The recording proxy sits between the policy client and the router and keeps every request's
input_ids and every answer's generated ids, so invariant 1 is checked on what crossed the wire.
"""

from __future__ import annotations

import asyncio

import pytest

from rollout.core.config import load_config
from rollout.core.pool import make_specs
from rollout.core.records import EpisodeStatus
from rollout.core.worker import RolloutWorker
from rollout.devtools.check import RecordingProxy


def _worker(router_url: str, domain: str, *overrides: str) -> RolloutWorker:
    cfg = load_config(None, [f"policy.router_url={router_url}", f"env.domain={domain}", *overrides])
    return RolloutWorker(cfg.policy, cfg.env, cfg.logging, max_concurrent_episodes=8)


async def _run(worker, task_ids, n=1):
    specs = make_specs(worker.domain.name, task_ids, n)
    try:
        return await asyncio.gather(*[worker.run(s) for s in specs])
    finally:
        await worker.close()


@pytest.mark.slow
async def test_invariant_1_on_real_episodes_through_the_router(retail_stack):
    async with RecordingProxy(retail_stack.router_url) as proxy:
        worker = _worker(proxy.url, "retail")
        ids = worker.domain.task_ids("base")[:6]
        results = await _run(worker, ids)
    assert len(results) == 6
    for res in results:
        assert res.status is EpisodeStatus.COMPLETED and res.reward == 1.0, res.metadata
        traj = res.trajectory
        # compact (array.array) while the episode ran, lists once it leaves the loop
        assert not traj.is_compact and {type(x) for x in (traj.prompt_ids, traj.response_ids, traj.loss_mask, traj.rollout_log_probs)} == {list}
        calls = proxy.calls[res.spec.episode_id]
        assert len(calls) == res.metadata["requests"] >= 2
        expected_mask = [0] * traj.response_length
        expected_lp = [0.0] * traj.response_length
        prev = None
        for inp, out, lps in calls:
            if prev is not None:  # each request extends the previous request's input + output
                assert inp[: len(prev)] == prev
            prev = inp + out
            assert traj.tokens[: len(prev)] == prev  # final tokens start with input + generated ids
            start = len(inp) - len(traj.prompt_ids)
            for k, (tok, lp) in enumerate(zip(out, lps)):
                expected_mask[start + k] = 1
                expected_lp[start + k] = lp
        assert inp[: len(traj.prompt_ids)] == traj.prompt_ids
        assert traj.loss_mask == expected_mask  # 1 exactly on generated ids
        assert traj.rollout_log_probs == expected_lp
        assert res.metadata["turn_boundary_repairs"] >= 1  # tool calls stop on "</tool_call>"


@pytest.mark.slow
async def test_airline_gold_replay_earns_full_reward(airline_stack):
    worker = _worker(airline_stack.router_url, "airline")
    ids = worker.domain.task_ids("base")[:4]
    results = await _run(worker, ids)
    assert [r.status for r in results] == [EpisodeStatus.COMPLETED] * 4
    assert [r.reward for r in results] == [1.0] * 4


@pytest.mark.slow
async def test_skipping_a_gold_write_action_earns_reward_zero(tmp_path_factory):
    from conftest import _stack

    stack = _stack("gold_replay_skip_write", "retail", tmp_path_factory)
    try:
        worker = _worker(stack.router_url, "retail")
        tid = worker.domain.task_ids("base")[0]
        (res,) = await _run(worker, [tid])
    finally:
        stack.stop()
    assert res.status is EpisodeStatus.COMPLETED
    assert res.reward == 0.0
    assert res.metadata["reward_info"]["db_match"] is False


@pytest.mark.slow
async def test_router_down_is_a_policy_error_not_a_crash(retail):
    worker = _worker("http://127.0.0.1:9", "retail", "policy.max_request_retries=1")
    (res,) = await _run(worker, [retail.task_ids("base")[0]])
    assert res.status is EpisodeStatus.POLICY_ERROR
    assert res.status.is_infrastructure_failure
    assert "attempts" in res.metadata["error"]


@pytest.mark.slow
async def test_llm_user_simulator_through_the_router(retail_stack):
    """The llm user simulator against the local server's /v1/chat/completions via the router."""
    worker = _worker(retail_stack.router_url, "retail", "env.user.kind=llm", "env.user.model=local",
                     f"env.user.base_url={retail_stack.router_url}/v1")
    ids = worker.domain.task_ids("base")[:2]
    results = await _run(worker, ids)
    for res in results:
        # The gold policy identifies the task from the user's opening, which an LLM user phrases
        # freely: the episode must end cleanly whatever the reward.
        assert not res.status.is_infrastructure_failure, res.metadata
        assert res.messages[1]["role"] == "user" and res.messages[1]["content"]


async def test_user_simulator_down_is_a_user_error(retail):
    cfg = load_config(None, ["policy.router_url=http://127.0.0.1:9", "env.user.kind=llm", "env.user.model=x",
                             "env.user.base_url=http://127.0.0.1:9/v1", "env.user.timeout_s=5"])
    worker = RolloutWorker(cfg.policy, cfg.env, cfg.logging)
    (res,) = await _run(worker, [retail.task_ids("base")[0]])
    assert res.status is EpisodeStatus.USER_ERROR and res.trajectory is None
