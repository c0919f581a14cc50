"""Chat formats: rendering a conversation to token ids and deltas (:class:`ChatTemplate`, exact
delta tokenization with a model's own chat template) and parsing one assistant turn
(:func:`parse_turn`, the Qwen3 / Hermes ``<tool_call>`` format)."""

from rollout.core.formats.hermes import MAX_CALL_CHARS, ParsedTurn, ParseError, ToolCall, parse_turn
from rollout.core.formats.template import ChatTemplate, TemplateError, TemplateReport

__all__ = ["MAX_CALL_CHARS", "ChatTemplate", "ParseError", "ParsedTurn", "TemplateError", "TemplateReport", "ToolCall", "parse_turn"]
