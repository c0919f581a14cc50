"""The probed chat format for a tokenizer, built once per process: :func:`build_chat_format`.

Every place that runs episodes needs the same thing: the family ``policy.chat_format`` names
(``auto``: detected from the tokenizer), built for the tokenizer, the benchmark's tool schemas and
the chat-template arguments, and probed (:meth:`~rollout.core.formats.protocol.ChatFormat.probe`:
exact delta tokenization must work, docs/design.md invariant 1) before any episode uses it. The
worker builds it once per actor; the seed's agent and the trainer integrations (verl, AReaL) once
per process, from many coroutines, so the result is cached by (tokenizer object, family, factory,
tools, template arguments).
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from typing import Any

from rollout.core.formats.protocol import ChatFormat, TemplateError, TemplateReport
from rollout.core.formats.registry import AUTO, choose_chat_format, get_chat_format

__all__ = ["ProbedChatFormat", "build_chat_format"]

logger = logging.getLogger(__name__)

_LOCK = threading.Lock()
_CACHE: dict[tuple, tuple[Any, ProbedChatFormat]] = {}
_MAX_CACHED = 16  # distinct (tokenizer, family, tools, arguments) kept; the oldest goes first


@dataclass(frozen=True)
class ProbedChatFormat:
    """A chat format that passed its start-up probe.

    Attributes:
        name: the family it is (``auto`` resolved), e.g. ``"hermes"``.
        chat: the format, for :func:`rollout.core.episode.run_episode`.
        report: what its probe found (:class:`~rollout.core.formats.protocol.TemplateReport`; ``ok``).
    """

    name: str
    chat: ChatFormat
    report: TemplateReport


def build_chat_format(tokenizer: Any, tools: list[dict] | None = None, template_kwargs: dict[str, Any] | None = None, name: str = AUTO,
                      *, source: str = "") -> ProbedChatFormat:
    """The probed chat format ``name`` (``policy.chat_format``) for ``tokenizer``, built once per
    process per (tokenizer object, family, tools, template arguments). Blocking (the probe renders
    a few conversations: tens of milliseconds to seconds): call it in a thread from a coroutine.

    Args:
        tokenizer: the loaded tokenizer (kept alive by the cache, so its ``id`` stays its own).
        tools: OpenAI-style tool schemas the system prompt renders (the benchmark's
            ``tool_schemas``); ``None``: none.
        template_kwargs: chat-template arguments (e.g. ``{"enable_thinking": False}``); ``None``: none.
        name: a registered family, or ``auto`` (detected from the tokenizer, logged at INFO).
        source: what named the tokenizer (``policy.tokenizer``), for the messages; default its
            ``name_or_path``.

    Returns:
        A :class:`ProbedChatFormat` (the same object for the same arguments while it is cached).

    Raises:
        TemplateError: ``name`` is not registered, ``auto`` recognises no family (the message names
            ``policy.chat_format`` and the registered families), or the format cannot give exact
            delta tokenization with this tokenizer (the message carries the probe's summary).
    """
    source = source or str(getattr(tokenizer, "name_or_path", "") or "")
    family = choose_chat_format(name, tokenizer, source)
    factory = get_chat_format(family)
    key = (id(tokenizer), family, factory, json.dumps(tools, sort_keys=True, default=str),
           json.dumps(template_kwargs, sort_keys=True, default=str))
    with _LOCK:
        hit = _CACHE.get(key)
        if hit is not None and hit[0] is tokenizer:
            return hit[1]
    chat = factory(tokenizer, tools=tools, template_kwargs=template_kwargs)
    report = chat.probe()
    if not report.ok:
        raise TemplateError(f"tokenizer {source!r}: exact delta tokenization is impossible with chat format {family}:\n" + report.summary())
    logger.debug("chat format %s probe for %s:\n%s", family, source, report.summary())
    built = ProbedChatFormat(family, chat, report)
    with _LOCK:
        if len(_CACHE) >= _MAX_CACHED:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = (tokenizer, built)
    return built
