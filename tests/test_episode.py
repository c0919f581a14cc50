"""Episodes on real tau2 tasks through the real sglang-router (no Ray).

The recording proxy sits between the policy client and the router and keeps every request's
input_ids and every answer's generated ids, so invariant 1 is checked on what crossed the wire.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses

import aiohttp
import pytest
from aiohttp import web

from rollout.config import load_config
from rollout.pool import make_specs
from rollout.records import EpisodeStatus
from rollout.worker import RolloutWorker


class RecordingProxy:
    """Forwards /generate to a router and records (input_ids, generated ids, log-probs) per episode."""

    def __init__(self, upstream: str):
        self.upstream = upstream.rstrip("/")
        self.calls: dict[str, list[tuple[list[int], list[int], list[float]]]] = collections.defaultdict(list)

    async def _generate(self, request: web.Request) -> web.Response:
        body = await request.json()
        assert isinstance(body.get("input_ids"), list), "every request must send input_ids"
        assert "text" not in body, "token in: no text prompts"
        async with self._session.post(self.upstream + "/generate", json=body) as r:
            data = await r.json()
        pairs = data["meta_info"]["output_token_logprobs"]
        eid = body["rid"].rsplit("#", 1)[0]
        self.calls[eid].append((body["input_ids"], [p[1] for p in pairs], [p[0] for p in pairs]))
        return web.json_response(data)

    async def __aenter__(self):
        self._session = aiohttp.ClientSession()
        app = web.Application(client_max_size=64 * 2**20)
        app.router.add_post("/generate", self._generate)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc):
        await self._runner.cleanup()
        await self._session.close()


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
    worker = RolloutWorker(cfg.policy, dataclasses.replace(cfg.env), cfg.logging)
    (res,) = await _run(worker, [retail.task_ids("base")[0]])
    assert res.status is EpisodeStatus.USER_ERROR and res.trajectory is None
