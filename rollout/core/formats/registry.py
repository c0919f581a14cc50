"""The chat-format registry: model family name -> the factory of its :class:`ChatFormat`.

A factory is called once per actor as ``factory(tokenizer, tools=..., template_kwargs=...)`` and
returns the family's format bound to that tokenizer and the environment's tool schemas; the worker
probes it (:meth:`ChatFormat.probe`) and passes it to every episode.

Built in: ``hermes``, a :class:`~rollout.core.formats.template.ChatTemplate` (the tokenizer's own
chat template, exact delta tokenization) with the Hermes ``<tool_call>`` parser
(:func:`rollout.core.formats.hermes.parse_turn`): the format of Qwen2.5 and Qwen3. It is named
after the tool-call format (NousResearch's Hermes), as SGLang's and vLLM's tool-call parsers name
it (``--tool-call-parser hermes`` for Qwen3), not after a model: other models share it, and other
Qwen models do not (Qwen3-Coder writes its calls in XML).

Adding a family: a module under ``rollout/core/formats/`` with its parser (and a renderer of its
own when the tokenizer's chat template cannot give exact deltas, e.g. mistral-common), then one
entry in :data:`_FORMATS` below, or :func:`register_chat_format` from outside the package.
"""

from __future__ import annotations

from typing import Any, Protocol

from rollout.core.formats.hermes import parse_turn
from rollout.core.formats.protocol import ChatFormat
from rollout.core.formats.template import ChatTemplate

__all__ = ["DEFAULT_CHAT_FORMAT", "ChatFormatFactory", "chat_formats", "get_chat_format", "hermes_format", "register_chat_format"]

DEFAULT_CHAT_FORMAT = "hermes"


class ChatFormatFactory(Protocol):
    """Builds a family's :class:`ChatFormat` for one tokenizer.

    Raises:
        TemplateError: the tokenizer cannot be used with this format at all (e.g. no EOS token).
    """

    def __call__(self, tokenizer: Any, tools: list[dict] | None = None, template_kwargs: dict[str, Any] | None = None) -> ChatFormat:
        ...


def hermes_format(tokenizer: Any, tools: list[dict] | None = None, template_kwargs: dict[str, Any] | None = None) -> ChatTemplate:
    """The ``hermes`` format: the tokenizer's chat template with the Hermes ``<tool_call>`` parser.

    Args:
        tokenizer: a ``transformers`` tokenizer with a chat template.
        tools: OpenAI-style tool schemas (rendered into the system turn).
        template_kwargs: extra ``apply_chat_template`` arguments (e.g. ``{"enable_thinking": False}``).

    Raises:
        TemplateError: the tokenizer has no EOS token to close assistant turns with.
    """
    return ChatTemplate(tokenizer, tools=tools, template_kwargs=template_kwargs, parser=parse_turn)


_FORMATS: dict[str, ChatFormatFactory] = {"hermes": hermes_format}


def register_chat_format(name: str, factory: ChatFormatFactory) -> None:
    """Add a chat format: ``factory(tokenizer, tools=..., template_kwargs=...)`` builds it.

    Raises:
        ValueError: ``name`` is empty or already registered, or ``factory`` is not callable.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"a chat format needs a non-empty name, not {name!r}")
    if not callable(factory):
        raise ValueError(f"chat format {name!r}: the factory must be callable, not {type(factory).__name__}")
    if name in _FORMATS:
        raise ValueError(f"chat format {name!r} is already registered")
    _FORMATS[name] = factory


def get_chat_format(name: str) -> ChatFormatFactory:
    """The factory of chat format ``name``.

    Raises:
        KeyError: no such format (the message lists the registered ones).
    """
    try:
        return _FORMATS[name]
    except KeyError:
        raise KeyError(f"unknown chat format {name!r}; registered: {sorted(_FORMATS)}") from None


def chat_formats() -> tuple[str, ...]:
    """The registered chat formats' names, sorted."""
    return tuple(sorted(_FORMATS))
