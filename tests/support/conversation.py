"""Checks of an episode's conversation record (``TrainingSample.messages``) against its tokens."""

from __future__ import annotations

import json

from rollout.core.records import TrainingSample


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
