"""The trainer integrations' one task runner (rollout.integrations.episodes.TaskRunner), driven the
way a new trainer integration drives it: a policy-client adapter (here our own SGLangClient to the
local stack's real sglang-router, standing in for a trainer's engine) and nothing else. Gold replay
on retail equals our own worker's episode token for token; the trainer's separate prompt and
response bounds, a failing engine, bad rows and several samples per episode each behave as the
verl and AReaL integrations document (their own tests: tests/integrations/, in venvs of their own).
"""

from __future__ import annotations

import logging
from dataclasses import replace

import aiohttp
import pytest

from rollout.core.config import load_config
from rollout.core.policy import PolicyServerError, SGLangClient
from rollout.core.records import EpisodeSpec, EpisodeStatus
from rollout.core.worker import RolloutWorker
from rollout.integrations.episodes import TaskRunner

pytestmark = [pytest.mark.slow]

TASK, SEED = "16", 1234  # a retail task whose gold replay earns 1.0 in several turns


class Down:
    """A trainer's engine that fails from its ``after``-th call on (as AReaL's or verl's does once its retries are spent)."""

    def __init__(self, inner, after: int):
        self.inner, self.after, self.calls = inner, after, 0

    async def generate(self, input_ids, max_new_tokens, rid, routing_key, seed=None):
        self.calls += 1
        if self.calls >= self.after:
            raise PolicyServerError("the trainer's engine failed")
        return await self.inner.generate(input_ids, max_new_tokens, rid, routing_key, seed=seed)


def _runner(*overrides: str, **kw) -> TaskRunner:
    return TaskRunner("test_loop", "test", None, ("env.domain=retail", *overrides), **kw)


async def _run(runner: TaskRunner, router_url: str, tokenizer, row: dict, down_after: int | None = None, **kw):
    async with aiohttp.ClientSession() as session:
        def client_for(chat, stop_ids):  # the adapter: the one thing an integration supplies besides its output conversion
            client = SGLangClient(replace(runner.cfg.policy, router_url=router_url), session)
            return client if down_after is None else Down(client, down_after)

        return await runner.run(row, tokenizer, client_for, **kw)


async def test_gold_replay_equals_our_own_worker_token_for_token(retail_stack, tokenizer):
    runner = _runner()
    ep = await _run(runner, retail_stack.router_url, tokenizer, {"task_id": TASK, "seed": SEED}, group_id="uid-7")
    res = ep.result
    assert res.status is EpisodeStatus.COMPLETED and res.reward == 1.0 and ep.trainable
    assert res.spec.episode_id.startswith(f"test/retail/{TASK}/") and res.spec.group_id == "uid-7" and res.spec.seed == SEED
    (sample,) = ep.samples
    assert sample.tokens == res.trajectory.tokens and sample.messages  # rollout.keep_messages (default true)
    cfg = load_config(None, ["env.domain=retail", f"policy.router_url={retail_stack.router_url}"])
    worker = RolloutWorker(cfg.policy, cfg.env, cfg.logging)
    try:
        ours = await worker.run(EpisodeSpec("ours", "retail", TASK, "ours", 0, seed=SEED))
    finally:
        await worker.close()
    assert ours.status is EpisodeStatus.COMPLETED
    assert ours.trajectory.tokens == res.trajectory.tokens and ours.trajectory.loss_mask == res.trajectory.loss_mask
    assert ours.trajectory.rollout_log_probs == res.trajectory.rollout_log_probs
    assert ours.worker is not None and res.worker is None  # the worker adds its fields; the runner leaves them to it


async def test_the_trainers_prompt_and_response_bounds_bound_the_context(retail_stack, tokenizer, caplog):
    runner = _runner()
    ep = await _run(runner, retail_stack.router_url, tokenizer, {"task_id": TASK, "seed": SEED}, prompt_limit=8192, response_limit=1024)
    res = ep.result
    p = len(res.trajectory.prompt_ids)
    assert res.status is EpisodeStatus.TRUNCATED and res.metadata["termination_reason"] == "context"
    assert 0 < res.trajectory.response_length <= 1024 and len(res.trajectory.tokens) <= p + 1024
    with caplog.at_level(logging.WARNING, logger="rollout.integrations.episodes"):
        ep = await _run(runner, retail_stack.router_url, tokenizer, {"task_id": TASK, "seed": SEED}, prompt_limit=100, response_limit=1024)
    assert ep.result.status is EpisodeStatus.TRUNCATED and ep.result.trajectory.response_length == 0  # ended before its first call
    assert "test_loop: task 16's first prompt has" in caplog.text and "more than the trainer's prompt length 100" in caplog.text


async def test_a_failing_engine_is_policy_error_and_not_trainable(retail_stack, tokenizer):
    runner = _runner()
    ep = await _run(runner, retail_stack.router_url, tokenizer, {"task_id": TASK}, down_after=3, keep_messages=False)
    res = ep.result
    assert res.status is EpisodeStatus.POLICY_ERROR and not ep.trainable and "the trainer's engine failed" in res.metadata["error"]
    assert sum(res.trajectory.loss_mask) > 0  # what it sampled before is kept, for the integration to mask
    (sample,) = ep.samples
    assert sample.status == "policy_error" and sample.messages is None


async def test_a_row_without_a_task_or_with_an_unknown_one_is_refused(retail_stack, tokenizer):
    runner = _runner()
    with pytest.raises(ValueError, match="test_loop: the row names no task"):
        await _run(runner, retail_stack.router_url, tokenizer, {"seed": 1})
    with pytest.raises(KeyError, match="test_loop: task 'no-such-task' is not a task of tau2 retail"):
        await _run(runner, retail_stack.router_url, tokenizer, {"task_id": "no-such-task"})


async def test_several_samples_per_episode_are_refused_unless_the_trainer_takes_them(retail_stack, tokenizer):
    with pytest.raises(ValueError, match="test_loop: rollout.sample_mode=per_turn gives one sample per assistant turn, take one"):
        _runner("rollout.sample_mode=per_turn", one_output_hint="take one")
    runner = _runner("rollout.sample_mode=per_turn", multiple_outputs=True)
    ep = await _run(runner, retail_stack.router_url, tokenizer, {"task_id": TASK, "seed": SEED})
    assert ep.result.status is EpisodeStatus.COMPLETED and len(ep.samples) == ep.result.metadata["turns"] > 1
    assert [s.turn_indices for s in ep.samples] == [[i] for i in range(len(ep.samples))]
