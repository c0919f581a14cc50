"""The guarded episode runner (rollout.core.runner.run_guarded_episode) and the one constructor of a
failed result (InteractionResult.failed): each guard gives its typed status, and a failed record's
JSON is the one every such record has always had."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import replace

import pytest

from rollout.core.config import PolicyConfig
from rollout.core.environment import UserSimulatorError
from rollout.core.formats import build_chat_format
from rollout.core.policy import PolicyServerError
from rollout.core.prompts import TokenizeTimeout
from rollout.core.records import EpisodeSpec, EpisodeStatus, InteractionResult, WorkerFields
from rollout.core.runner import run_guarded_episode
from rollout.core.settings import EpisodeSettings

SPEC = EpisodeSpec("ep-1", "toy", "t1", "g1", 0, seed=7)
TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Look up.", "parameters": {"type": "object", "properties": {}}}}]


class Opening:
    """An environment whose reset answers an opening (or waits ``delay_s`` first); never stepped here."""

    def __init__(self, delay_s: float = 0.0):
        self.delay_s = delay_s
        self.timings: dict[str, float] = {}

    async def reset(self, task_id: str):
        await asyncio.sleep(self.delay_s)
        return "Hello, I need help with my order.", {"task_id": task_id}

    async def step(self, action):  # pragma: no cover - the episodes here end before any step
        raise AssertionError("not stepped")


class FailingPolicy:
    """A policy client whose server is down: every call raises, and is counted."""

    def __init__(self):
        self.calls = 0

    async def generate(self, input_ids, max_new_tokens, rid, routing_key, seed=None):
        self.calls += 1
        raise PolicyServerError("router down")


@pytest.fixture(scope="module")
def chat(tokenizer):
    return build_chat_format(tokenizer, TOOLS, {}, "hermes").chat


@pytest.fixture(scope="module")
def settings():
    return EpisodeSettings.from_policy(PolicyConfig(), max_steps=4, system_prompt="You are an agent.", tool_names=["lookup"])


def _run(chat, settings, open_env, **kw):
    return asyncio.run(run_guarded_episode(SPEC, open_env, kw.pop("policy", None) or FailingPolicy(), chat, settings, **kw))


def test_a_failed_result_writes_the_json_every_failed_record_had():
    r = InteractionResult.failed(SPEC, "actor_lost", "actor_lost", "the actor died")
    assert r.status is EpisodeStatus.ACTOR_LOST and r.reward == 0.0 and r.trajectory is None and r.messages == []
    assert json.dumps(r.metadata) == '{"termination_reason": "actor_lost", "error": "the actor died"}'
    line = r.to_sample().to_dict()
    assert list(line["metadata"]) == ["termination_reason", "error", "episode_id", "task_id", "domain", "seed", "weight_version", "attempt"]
    assert line["tokens"] == [] and line["loss_mask"] == [] and line["status"] == "actor_lost"
    assert InteractionResult.failed(SPEC, EpisodeStatus.CANCELLED, "cancelled").metadata == {"termination_reason": "cancelled", "error": None}
    with pytest.raises(ValueError):
        InteractionResult.failed(SPEC, "no_such_status", "x")


def test_worker_fields_are_typed_and_land_in_metadata_where_they_always_were():
    r = InteractionResult.failed(SPEC, "timeout", "episode_timeout", "late")
    assert r.worker is None
    r.add_worker_fields(WorkerFields(4242, 1.25))
    assert list(r.metadata) == ["termination_reason", "error", "kv_held_s", "worker_pid"]
    assert r.worker == WorkerFields(worker_pid=4242, kv_held_s=1.25)
    r.add_worker_fields(WorkerFields(99))  # the first pid recorded stays; no wait: kv_held_s as it was
    assert r.metadata["worker_pid"] == 4242 and r.metadata["kv_held_s"] == 1.25
    q = InteractionResult.failed(SPEC, "timeout", "episode_timeout", "late")
    q.add_worker_fields(WorkerFields(7))  # an episode that never waited at the KV gate has no kv_held_s key
    assert q.metadata == {"termination_reason": "episode_timeout", "error": "late", "worker_pid": 7}
    assert q.worker == WorkerFields(7, None)


def test_a_user_simulator_that_cannot_be_set_up_is_user_error(chat, settings):
    seen = []

    def open_env():
        raise UserSimulatorError("OPENAI_API_KEY is not set")

    r = _run(chat, settings, open_env, timeout_s=5, on_user_error=seen.append)
    assert r.status is EpisodeStatus.USER_ERROR
    assert r.metadata == {"termination_reason": "user_setup", "error": "OPENAI_API_KEY is not set"}
    assert [str(e) for e in seen] == ["OPENAI_API_KEY is not set"]


def test_the_whole_episode_bound_is_timeout_naming_its_key(chat, settings):
    r = _run(chat, settings, lambda: Opening(delay_s=5), timeout_s=0.05)
    assert r.status is EpisodeStatus.TIMEOUT
    assert r.metadata == {"termination_reason": "episode_timeout", "error": "episode ran over 0.05s (pool.episode_timeout_s)"}
    r = _run(chat, settings, lambda: Opening(delay_s=5), timeout_s=0.05, timeout_key=None)  # a bound given by the caller (asolve)
    assert r.metadata["error"] == "episode ran over 0.05s"


def test_the_bound_covers_prepare(chat, settings):
    async def slow(env, st):
        await asyncio.sleep(5)
        return env, st

    r = _run(chat, settings, Opening, timeout_s=0.05, prepare=slow)
    assert r.status is EpisodeStatus.TIMEOUT and r.metadata["termination_reason"] == "episode_timeout"


def test_a_tokenizer_call_of_prepare_past_its_bound_is_policy_error(chat, settings):
    async def stuck(env, st):
        raise TokenizeTimeout("rendering the first prompt ran past policy.tokenize_timeout_s=1.0")

    r = _run(chat, settings, Opening, timeout_s=5, prepare=stuck)
    assert r.status is EpisodeStatus.POLICY_ERROR
    assert r.metadata == {"termination_reason": "tokenize_timeout", "error": "rendering the first prompt ran past policy.tokenize_timeout_s=1.0"}


def test_anything_else_is_env_error_crash_and_logged(chat, settings, caplog):
    def open_env():
        raise KeyError("no such task")

    with caplog.at_level(logging.ERROR, logger="rollout.core.runner"):
        r = _run(chat, settings, open_env, timeout_s=5)
    assert r.status is EpisodeStatus.ENV_ERROR and r.metadata == {"termination_reason": "crash", "error": "KeyError('no such task')"}
    assert "episode ep-1 crashed" in caplog.text and "KeyError" in caplog.text


def test_prepare_gives_the_environment_and_settings_the_loop_runs_with(chat, settings):
    wrapped = []

    async def bound(env, st):
        wrapped.append(env)
        return env, replace(st, max_context_tokens=8)  # far below the first prompt

    policy = FailingPolicy()
    r = _run(chat, settings, Opening, timeout_s=5, prepare=bound, policy=policy)
    assert len(wrapped) == 1 and isinstance(wrapped[0], Opening)
    assert r.status is EpisodeStatus.TRUNCATED and r.metadata["termination_reason"] == "context" and policy.calls == 0
    r = _run(chat, settings, Opening, timeout_s=5, policy=policy)  # unprepared: the first call is made, and fails
    assert r.status is EpisodeStatus.POLICY_ERROR and policy.calls == 1


class Entered(Opening):
    """An :class:`Opening` that sets ``entered`` once its reset is under way (then waits ``delay_s``)."""

    def __init__(self, delay_s: float = 0.0):
        super().__init__(delay_s)
        self.entered = asyncio.Event()

    async def reset(self, task_id: str):
        self.entered.set()
        return await super().reset(task_id)


def test_cancelling_the_episode_is_never_swallowed(chat, settings):
    async def main():
        env = Entered(delay_s=60)
        task = asyncio.ensure_future(run_guarded_episode(SPEC, lambda: env, FailingPolicy(), chat, settings, timeout_s=None))
        await asyncio.wait_for(env.entered.wait(), 120)  # the cancellation lands inside the episode, not before it starts
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
