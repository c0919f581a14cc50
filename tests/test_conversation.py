"""What the agent did is kept: every episode's conversation (OpenAI chat messages: the user's
turns, the assistant's replies and tool calls, the tool results) reaches the journal, the result
files and the trainer API's samples, and ``rollout.keep_messages=false`` leaves it out.

Gold replay on the local stack (real tau2 retail, the real sglang-router); the CLI's files are
checked in tests/test_job.py (kept) and tests/test_on_length.py (left out).
"""

from __future__ import annotations

import json

import pytest
from scripted_policy import ScriptedPolicyServer

from rollout.config import load_config
from rollout.journal import RunJournal
from rollout.pool import RolloutPool, make_specs
from rollout.records import EpisodeSpec, EpisodeStatus, TrainingSample
from rollout.worker import RolloutWorker


def check_conversation(messages: list[dict], tokenizer, sample: TrainingSample) -> None:
    """The conversation's shape, and that it says what the tokens say: every assistant turn's
    tool call (name and arguments) is in the text the policy sampled, every tool result answers
    the call it names, and every user and tool text is in the trajectory."""
    assert [m["role"] for m in messages[:2]] == ["system", "user"]
    text = tokenizer.decode(sample.tokens)
    sampled = tokenizer.decode([t for t, m in zip(sample.tokens[sample.prompt_length:], sample.loss_mask) if m])
    calls = {}
    for m in messages:
        assert m["role"] in ("system", "user", "assistant", "tool"), m
        if m["role"] == "assistant":
            for call in m.get("tool_calls", []):
                assert call["type"] == "function" and call["id"] not in calls
                args = json.loads(call["function"]["arguments"])  # a JSON string, as OpenAI sends it
                calls[call["id"]] = call["function"]["name"]
                assert f'"name": "{call["function"]["name"]}"' in sampled
                assert all(json.dumps(v, ensure_ascii=False) in sampled for v in args.values())
        elif m["role"] == "tool":
            assert calls.get(m["tool_call_id"]) == m["name"], m  # answers the call it names
            assert m["content"] in text
        elif m["role"] == "user" and m is not messages[-1]:
            assert m["content"] in text
    assert calls, "a gold replay calls tools"


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


@pytest.mark.ray
@pytest.mark.slow
def test_the_trainer_api_and_the_journal_carry_the_conversation(ray_cluster, retail_stack, tokenizer, tmp_path):
    for keep in (True, False):
        cfg = load_config(None, [f"policy.router_url={retail_stack.router_url}", "pool.num_actors=1", "pool.num_cpus_per_actor=0.5",
                                 f"rollout.keep_messages={str(keep).lower()}", f"rollout.output_dir={tmp_path / str(keep)}"])
        journal = RunJournal.open(cfg.rollout.output_dir, cfg)
        with RolloutPool(cfg) as pool:
            pool.attach_journal(journal)
            pool.submit(make_specs("retail", ["0", "1"], 1, prefix=f"{keep}:"))
            samples = list(pool.samples())
        journal.close("finished")
        lines = [json.loads(line) for line in (tmp_path / str(keep) / "episodes.jsonl").read_text().splitlines()]
        assert len(samples) == len(lines) == 2
        if keep:
            for s in samples:
                check_conversation(s.messages, tokenizer, s)
            assert sorted(json.dumps(x["messages"]) for x in lines) == sorted(json.dumps(s.messages) for s in samples)
        else:
            assert all(s.messages is None for s in samples) and all(x["messages"] is None for x in lines)
