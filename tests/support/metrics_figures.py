"""Figures of an episode that its metrics must equal, computed from its own record (the sample
and its conversation), for the metrics tests (tests/component/test_metrics_recording.py,
tests/ray/test_metrics.py)."""

from __future__ import annotations


def user_turns(messages: list[dict], termination_reason: str) -> int:
    """User-simulator turns of an episode: the opening and each reply (the loop's format
    feedback is not the user's; an agent that ends the conversation itself gets no reply)."""
    n = sum(1 for m in messages if m["role"] == "user" and not m.get("format_feedback"))
    return n - (termination_reason == "agent_stop")


def tool_calls(messages: list[dict]) -> int:
    """Agent tool calls that returned a result (each is one tool message)."""
    return sum(1 for m in messages if m["role"] == "tool")


def input_tokens(sample) -> int:
    """Token ids the episode's answered /generate calls sent: each call's input is the prompt
    plus the response before its span (one segment, the append history)."""
    return sum(sample.prompt_length + start for start, _ in sample.generation_spans)
