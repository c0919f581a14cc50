"""What the agent did is kept: every episode's conversation (OpenAI chat messages: the user's
turns, the assistant's replies and tool calls, the tool results) reaches the journal, the result
files and the trainer API's samples, and ``rollout.keep_messages=false`` leaves it out.

Gold replay on the local stack (real tau2 retail, the real sglang-router); the CLI's files are
checked in tests/e2e/test_job.py (kept) and tests/component/test_on_length.py (left out).
"""

from __future__ import annotations

import json

from support.conversation import check_conversation
from support.scripted_policy import ScriptedPolicyServer

from rollout.core.config import load_config
from rollout.core.records import EpisodeSpec, EpisodeStatus, TrainingSample
from rollout.core.worker import RolloutWorker


async def test_the_episode_records_the_conversation_it_had(retail_stack, tokenizer):
    cfg = load_config(None, [f"policy.router_url={retail_stack.router_url}"])
    worker = RolloutWorker(cfg.policy, cfg.env, cfg.logging, max_concurrent_episodes=1)
    try:
        res = await worker.run(EpisodeSpec("conv/0", "retail", "0", "conv", 0))
    finally:
        await worker.close()
    assert res.status is EpisodeStatus.COMPLETED and res.reward == 1.0
    sample = res.to_sample()
    assert sample.messages == res.messages
    check_conversation(sample.messages, tokenizer, sample)
    assert TrainingSample.from_dict(json.loads(json.dumps(sample.to_dict()))).messages == sample.messages  # a journal line round trip
    assert res.to_sample(messages=False).messages is None


async def test_a_turn_that_does_not_parse_and_the_feedback_are_marked(tokenizer):
    """A malformed tool call is kept as the raw text the model wrote, marked with the parse error,
    and the loop's feedback is marked as the loop's, not the user's."""
    def script(eid, step, input_ids):
        return ('<tool_call>{"name": "find_user_id_by_zip", "arguments": {"zip": 1,}}</tool_call>', "stop") if step == 0 \
            else ("Thank you, goodbye.", "eos")

    async with ScriptedPolicyServer(tokenizer, script) as server:
        cfg = load_config(None, [f"policy.router_url={server.url}", "env.max_steps=3"])
        worker = RolloutWorker(cfg.policy, cfg.env, cfg.logging, max_concurrent_episodes=1)
        try:
            res = await worker.run(EpisodeSpec("conv/pe", "retail", "0", "conv/pe", 0))
        finally:
            await worker.close()
    bad, feedback = res.messages[2], res.messages[3]
    assert bad["role"] == "assistant" and bad["parse_error"] and '"zip": 1,}' in bad["content"] and "tool_calls" not in bad
    assert feedback["role"] == "user" and feedback["format_feedback"] is True and "[format error]" in feedback["content"]
    assert res.messages[4]["role"] == "assistant" and "parse_error" not in res.messages[4]
