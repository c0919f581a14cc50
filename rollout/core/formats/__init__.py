"""Chat formats: a model family's rendering of a conversation to token ids and deltas, and its
reading of one assistant turn, behind the :class:`ChatFormat` Protocol (the seam the episode loop
and the worker use) and a registry of families (:func:`get_chat_format`).

Modules: :mod:`~rollout.core.formats.protocol` (the Protocol and the types every format shares),
:mod:`~rollout.core.formats.registry` (name -> factory, one :class:`rollout.core.registry.Registry`; ``hermes`` built in),
:mod:`~rollout.core.formats.build` (:func:`build_chat_format`: the probed format for a tokenizer,
built once per process: what the worker, the seed's agent and the trainer integrations use),
:mod:`~rollout.core.formats.template` (:class:`ChatTemplate`, exact delta tokenization with a
tokenizer's own chat template), :mod:`~rollout.core.formats.probe` (its start-up probe),
:mod:`~rollout.core.formats.codec` (GIL-free tokenizer calls), :mod:`~rollout.core.formats.hermes`
(:func:`parse_turn`, the Qwen3 / Hermes ``<tool_call>`` parser).
"""

from rollout.core.formats.build import ProbedChatFormat, build_chat_format
from rollout.core.formats.hermes import MAX_CALL_CHARS, parse_turn
from rollout.core.formats.protocol import ChatFormat, ParsedTurn, ParseError, TemplateError, TemplateReport, ToolCall, TurnParser
from rollout.core.formats.registry import (
    AUTO,
    CHAT_FORMATS,
    DEFAULT_CHAT_FORMAT,
    ChatFormatFactory,
    FormatInfo,
    chat_formats,
    choose_chat_format,
    detect_chat_format,
    format_info,
    format_infos,
    get_chat_format,
    register_chat_format,
    resolve_chat_format,
    unregister_chat_format,
)
from rollout.core.formats.template import ChatTemplate

__all__ = ["AUTO", "CHAT_FORMATS", "DEFAULT_CHAT_FORMAT", "MAX_CALL_CHARS", "ChatFormat", "ChatFormatFactory", "ChatTemplate", "FormatInfo", "ParseError",
           "ParsedTurn", "ProbedChatFormat", "TemplateError", "TemplateReport", "ToolCall", "TurnParser", "build_chat_format", "chat_formats",
           "choose_chat_format", "detect_chat_format", "format_info", "format_infos", "get_chat_format", "parse_turn", "register_chat_format",
           "resolve_chat_format", "unregister_chat_format"]
