"""Parsing one assistant turn in the Qwen / Hermes tool-call format.

A turn is optional reasoning (``<think>...</think>``), optional text, and at most one tool call
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (tau-bench allows one call per turn,
as in the seed's tool instruction). Anything else is a :class:`ParseError` with a short reason that
can be fed back to the model (``policy.on_parse_error=feedback``) or end the episode
(``policy.on_parse_error=abort``). The parser never raises anything but :class:`ParseError`.

This is the parser of the ``hermes`` chat format (:mod:`rollout.core.formats.registry`), the
format of Qwen2.5 / Qwen3 and of SGLang's and vLLM's ``hermes`` tool-call parser.
"""

from __future__ import annotations

import json
from typing import Iterable

from rollout.core.formats.protocol import ParsedTurn, ParseError, ToolCall

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
# Longest tool-call body accepted, in characters (a guard against runaway generations that
# happen to close the tag; tau2's longest gold arguments are well under 2 kB).
MAX_CALL_CHARS = 32_768
# How to reply or call a tool in this format (ChatFormat.call_hint; the end of the parse-error feedback).
CALL_HINT = 'Reply to the user in plain text, or call exactly one tool as <tool_call>{"name": ..., "arguments": {...}}</tool_call>.'

__all__ = ["CALL_CLOSE", "CALL_HINT", "CALL_OPEN", "MAX_CALL_CHARS", "THINK_CLOSE", "THINK_OPEN", "ParseError", "ParsedTurn", "ToolCall", "parse_turn"]


def _split_reasoning(text: str) -> tuple[str | None, str]:
    """Split ``<think>...</think>`` from the rest. Qwen3 templates may put the opening tag in
    the generation prompt, so a lone ``</think>`` closes reasoning that started at the turn start."""
    n_open, n_close = text.count(THINK_OPEN), text.count(THINK_CLOSE)
    if n_open > 1 or n_close > 1:
        raise ParseError("more than one <think> block")
    if n_open == 1 and n_close == 0:
        raise ParseError("unclosed <think> block")
    if n_close == 0:
        return None, text
    head, _, rest = text.partition(THINK_CLOSE)
    if n_open == 1:
        before, _, reasoning = head.partition(THINK_OPEN)
        if before.strip():
            raise ParseError("text before <think>")
    else:
        reasoning = head
    return reasoning.strip(), rest


def parse_turn(text: str, tool_names: Iterable[str] | None = None) -> ParsedTurn:
    """Parse the decoded text of one assistant turn (end-of-turn tokens already removed).

    Args:
        text: the generated text, special tokens kept (``<tool_call>`` is a special token in Qwen3).
        tool_names: the tools the environment offers; a call to another name is a ParseError.
            ``None`` skips that check.

    Returns:
        The parsed turn.

    Raises:
        ParseError: empty output, unclosed or nested tags, several calls, invalid JSON, a body that
            is not ``{"name": str, "arguments": object}``, or an unknown tool.
    """
    if not isinstance(text, str):
        raise ParseError("output is not text")
    reasoning, rest = _split_reasoning(text)
    n_open, n_close = rest.count(CALL_OPEN), rest.count(CALL_CLOSE)
    if n_open == 0 and n_close == 0:
        content = rest.strip()
        if not content:
            raise ParseError("empty response: reply to the user or call a tool")
        return ParsedTurn(content=content, reasoning=reasoning)
    if n_open > 1 or n_close > 1:
        raise ParseError("more than one tool call in one turn; call exactly one tool per turn")
    if n_open != n_close:
        raise ParseError("unclosed <tool_call> tag" if n_open > n_close else "</tool_call> without <tool_call>")
    before, _, tail = rest.partition(CALL_OPEN)
    body, _, after = tail.partition(CALL_CLOSE)
    if len(body) > MAX_CALL_CHARS:
        raise ParseError(f"tool call longer than {MAX_CALL_CHARS} characters")
    call = _parse_call_body(body, tool_names)
    content = (before.strip() + ("\n" + after.strip() if after.strip() else "")).strip()
    return ParsedTurn(content=content, tool_calls=(call,), reasoning=reasoning)


def _parse_call_body(body: str, tool_names: Iterable[str] | None) -> ToolCall:
    try:
        obj = json.loads(body)
    except (json.JSONDecodeError, RecursionError) as e:
        raise ParseError(f"tool call is not valid JSON ({e.__class__.__name__}: {str(e)[:80]})") from None
    if not isinstance(obj, dict):
        raise ParseError("tool call must be a JSON object with 'name' and 'arguments'")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        raise ParseError("tool call has no string 'name'")
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models emit arguments as a JSON string
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            raise ParseError(f"arguments of {name!r} are a string that is not a JSON object") from None
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise ParseError(f"arguments of {name!r} must be a JSON object")
    extra = set(obj) - {"name", "arguments", "parameters"}
    if extra:
        raise ParseError(f"unexpected keys in tool call: {sorted(extra)}")
    if tool_names is not None and name not in set(tool_names):
        raise ParseError(f"unknown tool {name!r}")
    return ToolCall(name=name, arguments=args)
