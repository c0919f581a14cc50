"""EpisodeMetrics (rollout.core.metrics): the typed form of a record's metadata, with the same JSON;
run_episode's one mapping of a tokenizer timeout to a status; and the typed step result
(rollout.core.environment.StepResult) the loop reads: on a scripted policy and environment with
the real Qwen3 chat template."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time

import pytest

from rollout.core.environment import RESPOND, StepResult
from rollout.core.episode import run_episode
from rollout.core.formats import ChatTemplate
from rollout.core.metrics import UNSET, EpisodeMetrics
from rollout.core.output import RunStats
from rollout.core.policy import Generation
from rollout.core.records import EpisodeSpec, EpisodeStatus, TrainingSample
from rollout.core.settings import EpisodeSettings

# run_episode's metadata keys, in order, as recorded before EpisodeMetrics (the JSON of samples.jsonl).
COUNTS = ["turns", "requests", "parse_errors", "turn_boundary_repairs", "length_finishes", "tool_errors", "interruptions",
          "interrupted_turns", "continued_turns", "restarted_turns", "discarded_tokens", "termination_reason", "error"]
KEYS_COMPLETED = [*COUNTS, "reward_info", "timings", "prompt_tokens", "response_tokens", "generated_tokens"]
KEYS_ENDED = [*COUNTS, "timings", "prompt_tokens", "response_tokens", "generated_tokens"]
KEYS_NO_TRAJECTORY = [*COUNTS, "timings"]

GOODBYE = "Thank you, goodbye."
TOOL_CALL = '<tool_call>\n{"name": "lookup", "arguments": {"id": "7"}}\n</tool_call>'
TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Look up an order.",
          "parameters": {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}}}]


def test_round_trips_through_asdict_and_metadata():
    full = EpisodeMetrics(turns=3, requests=4, parse_errors=1, turn_boundary_repairs=2, length_finishes=1, tool_errors=1,
                          interruptions=2, interrupted_turns=1, continued_turns=1, discarded_tokens=5,
                          termination_reason="done", reward_info={"db_match": True}, timings={"generate_s": 0.5, "total_s": 1.0},
                          prompt_tokens=100, response_tokens=50, generated_tokens=30)
    assert EpisodeMetrics.from_metadata(dataclasses.asdict(full)) == full
    assert EpisodeMetrics.from_metadata(full.to_metadata()) == full
    assert list(full.to_metadata()) == KEYS_COMPLETED
    assert list(json.loads(json.dumps(full.to_metadata()))) == KEYS_COMPLETED
    bare = EpisodeMetrics(termination_reason="reset", timings={"total_s": 0.1})
    assert list(bare.to_metadata()) == KEYS_NO_TRAJECTORY and EpisodeMetrics.from_metadata(bare.to_metadata()) == bare
    ended = EpisodeMetrics(reward_info=None)  # the environment ended it without a breakdown: the key, null
    assert ended.to_metadata()["reward_info"] is None


def test_reading_a_record_made_elsewhere_ignores_other_keys_and_defaults_what_is_missing():
    # the pool's actor_lost (no counters), with the spec's identifiers InteractionResult.to_sample adds
    m = EpisodeMetrics.from_metadata({"termination_reason": "actor_lost", "error": "died", "episode_id": "e", "domain": "retail",
                                      "turns": None, "excluded_reason": "actor_lost"})
    assert (m.turns, m.requests, m.termination_reason, m.error) == (0, 0, "actor_lost", "died")
    assert m.reward_info is UNSET and m.timings is UNSET and m.prompt_tokens is UNSET and not UNSET
    assert m.to_metadata() == {**{k: 0 for k in COUNTS[:11]}, "termination_reason": "actor_lost", "error": "died"}


def test_the_run_summary_reads_records_through_it():
    stats = RunStats()
    meta = {**EpisodeMetrics(turns=4, turn_boundary_repairs=1, parse_errors=2, length_finishes=1, termination_reason="turn_length",
                             error=None).to_metadata(), "domain": "retail"}
    stats.add(TrainingSample([1, 2, 3], 2, [1, 0], [-0.1, 0.0], 1.0, "truncated", "g", 0, metadata=meta))
    stats.add(TrainingSample([1], 0, [], [], 0.0, "actor_lost", "g", 1, metadata={"termination_reason": "actor_lost", "error": "died 3 times"}),
              "actor_lost")
    s = stats.summary()
    assert (s["mean_turns"], s["turn_boundary_repairs"], s["parse_errors"], s["length_cut_turns"]) == (2.0, 1, 2, 1)
    assert s["episodes_ended_by_turn_length"] == 1 and s["mean_reward_per_domain"] == {"retail": 1.0}
    assert s["errors"] == [{"kind": "actor_lost: died N times", "count": 1}]


# -- run_episode on a scripted policy and environment ---------------------------------------------------
class _Policy:
    """Answers each /generate call with the next scripted ``(text, finish_type, interrupted)``."""

    def __init__(self, chat: ChatTemplate, script: list[tuple[str, str, bool]]):
        self.chat, self.script, self.calls = chat, list(script), 0

    async def generate(self, input_ids, max_new_tokens: int, rid: str, routing_key: str | None = None, seed: int | None = None):
        text, finish, interrupted = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        ids = self.chat.encode(text)[:max_new_tokens]
        return Generation(ids=ids, log_probs=[-0.5] * len(ids), finish_type=finish, weight_version="0", interrupted=interrupted)


class _Env:
    """Answers a tool call with a result, a reply to the user by ending the episode (reward 1)."""

    timings: dict[str, float] = {}

    async def reset(self, task_id: str):
        return "Where is my order?", {}

    async def step(self, action):
        if action.name == RESPOND:
            return StepResult("Bye.", role="user", done=True, reward=1.0, termination="user_stop", reward_info={"db_match": True})
        return StepResult('{"status": "shipped"}', role="tool")


class _SlowChat:
    """The chat template, with one blocking method made to run past any tokenizer timeout (and the
    short-call shortcuts off, so that every call goes to a thread)."""

    def __init__(self, chat: ChatTemplate, slow: str):
        self._chat, self._slow = chat, slow

    def __getattr__(self, name):
        attr = getattr(self._chat, name)
        if name == self._slow:
            def slow(*args, **kwargs):
                time.sleep(0.5)
                return attr(*args, **kwargs)
            return slow
        if name in ("try_decode_now", "try_delta_ids_now"):
            return lambda *a, **k: None
        return attr


@pytest.fixture(scope="module")
def chat(tokenizer):
    return ChatTemplate(tokenizer, TOOLS)


def _run(chat, script, *, partial_rollout="continue", timeout_s=60.0, env=None):
    settings = EpisodeSettings(max_steps=4, max_new_tokens=64, max_context_tokens=8192, on_parse_error="feedback",
                               system_prompt="You are an agent.", tool_names=("lookup",), partial_rollout=partial_rollout,
                               stop=("</tool_call>",), tokenize_timeout_s=timeout_s)
    policy = _Policy(getattr(chat, "_chat", chat), script)
    return asyncio.run(run_episode(EpisodeSpec("e1", "toy", "0", "g", 0), env or _Env(), policy, chat, settings))


def test_an_episode_s_metadata_keeps_its_keys_and_reads_back(chat):
    res = _run(chat, [(TOOL_CALL, "stop", False), (GOODBYE + "<|im_end|>", "stop", False)])
    assert res.status is EpisodeStatus.COMPLETED and res.reward == 1.0
    assert list(res.metadata) == KEYS_COMPLETED
    m = EpisodeMetrics.from_metadata(res.metadata)
    assert (m.turns, m.requests, m.turn_boundary_repairs, m.termination_reason, m.reward_info) == (2, 2, 1, "user_stop", {"db_match": True})
    assert m.prompt_tokens + m.response_tokens == len(res.trajectory.tokens) and m.generated_tokens == sum(res.trajectory.loss_mask)
    assert list(m.timings) == ["generate_s", "total_s"] and m.to_metadata() == res.metadata
    json.dumps(res.metadata)


@pytest.mark.parametrize("slow, script, keys", [
    ("prompt_ids", [(GOODBYE, "stop", False)], KEYS_NO_TRAJECTORY),  # the first prompt
    ("decode", [(GOODBYE, "stop", False)], KEYS_ENDED),  # a turn's text
    ("delta_ids", [(TOOL_CALL, "stop", False)], KEYS_ENDED),  # a tool result's delta
    ("delta_ids", [("no tool call <tool_call>{bad", "stop", False)], KEYS_ENDED),  # the parse-error feedback's delta
])
def test_a_tokenizer_call_past_its_bound_ends_the_episode_policy_error_wherever_it_is(chat, slow, script, keys):
    res = _run(_SlowChat(chat, slow), script, timeout_s=0.05)
    assert res.status is EpisodeStatus.POLICY_ERROR and res.metadata["termination_reason"] == "tokenize_timeout"
    assert "policy.tokenize_timeout_s" in res.metadata["error"] and list(res.metadata) == keys


def test_a_timeout_while_checking_a_continued_turn_counts_the_interrupted_turn_only(chat):
    res = _run(_SlowChat(chat, "decode"), [("Let me", "abort", True), (" check.", "stop", False)], timeout_s=0.05)
    assert res.status is EpisodeStatus.POLICY_ERROR and res.metadata["termination_reason"] == "tokenize_timeout"
    m = EpisodeMetrics.from_metadata(res.metadata)
    assert (m.requests, m.interruptions, m.interrupted_turns, m.continued_turns, m.turns) == (2, 1, 1, 0, 0)
    assert m.timings["generate_s"] > 0.04  # the check's wait is generation time, as before


# -- the typed step result ---------------------------------------------------------------------------
class _FailingTool(_Env):
    """A tool call answers a failed tool's message (an observation, not an error)."""

    async def step(self, action):
        if action.name == RESPOND:
            return await super().step(action)
        return StepResult("Error: no order 7", role="tool", tool_error=True)


class _UntypedEnv(_Env):
    """Answers a step as environments did before StepResult: an untyped tuple."""

    async def step(self, action):
        return "Bye.", 1.0, True, {"role": "user", "termination": "user_stop"}


def test_the_loop_reads_the_step_result_s_fields(chat):
    res = _run(chat, [(TOOL_CALL, "stop", False), (GOODBYE + "<|im_end|>", "stop", False)], env=_FailingTool())
    assert res.status is EpisodeStatus.COMPLETED and res.reward == 1.0 and res.metadata["termination_reason"] == "user_stop"
    assert res.metadata["tool_errors"] == 1 and res.metadata["reward_info"] == {"db_match": True}
    tool = next(m for m in res.messages if m["role"] == "tool")
    assert tool == {"role": "tool", "tool_call_id": "call_1", "name": "lookup", "content": "Error: no order 7", "error": True}
    assert res.messages[-1] == {"role": "user", "content": "Bye."}


def test_a_step_answer_that_is_not_a_step_result_ends_the_episode_env_error_naming_it(chat):
    res = _run(chat, [(GOODBYE + "<|im_end|>", "stop", False)], env=_UntypedEnv())
    assert res.status is EpisodeStatus.ENV_ERROR and res.metadata["termination_reason"] == "env_error"
    assert "Environment.step must return a StepResult, got tuple" in res.metadata["error"] and res.reward == 0.0


def test_a_step_result_s_role_is_tool_or_user():
    assert StepResult("hi", role="user") == StepResult("hi", "user", False, 0.0, False, None, None)
    with pytest.raises(ValueError, match="StepResult.role must be 'tool' or 'user', got 'assistant'"):
        StepResult("hi", role="assistant")
