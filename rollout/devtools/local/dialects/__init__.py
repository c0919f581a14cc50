"""How the local stack's gold-replay oracle reads and writes one model family's chat format.

The gold-replay backend (:mod:`rollout.devtools.local.gold`) sees only prompt token ids. A
:class:`Dialect` turns the decoded prompt back into messages (to find the task and how far the
episode has got) and writes the oracle's next assistant turn the way a model of the family would
generate it, so that the family's parser (:meth:`rollout.core.formats.ChatFormat.parse_turn`)
reads it back. One dialect per chat format (:mod:`rollout.core.formats.registry`), looked up by
the format's name with :func:`get_dialect` in :data:`DIALECTS` (a
:class:`rollout.core.registry.Registry`); each built-in lives in a module of this package named in
:data:`_MODULES`, which defines ``DIALECTS: dict[str, Dialect]``; one of your own is
:func:`register_dialect`, or an entry point in group ``tau_rollout.dialects``.
"""

from __future__ import annotations

import importlib
from typing import NamedTuple, Protocol

from rollout.core.registry import Registry

__all__ = ["DIALECTS", "Dialect", "Message", "dialect_names", "get_dialect", "register_dialect"]


class Message(NamedTuple):
    """One message of a decoded prompt.

    Attributes:
        role: ``system`` | ``user`` | ``assistant`` | ``tool`` (a tool result is its own message
            even where the format wraps results in a user turn, as Qwen3 does).
        content: its text (for an assistant turn, as generated: reasoning and calls included).
        closed: whether its end-of-turn was in the prompt (the open assistant turn of a
            generation prompt is not closed; a dialect may omit that turn).
        calls: the number of tool calls an assistant turn made (0 for other roles).
    """

    role: str
    content: str
    closed: bool
    calls: int = 0


class Dialect(Protocol):
    """One family's chat format as the gold-replay oracle reads and writes it.

    Attributes:
        split_token: a special token's text that opens every message, or None. The oracle cuts the
            prompt's ids before it and decodes (and caches) message by message; None decodes the
            whole prompt each time (slower, same result).
    """

    split_token: str | None

    def messages(self, text: str) -> list[Message]:
        """The messages of a decoded prompt (special tokens kept), in order. Must not raise on a
        prompt of this family; may return fewer messages for text it cannot read."""
        ...

    def assistant_text(self, content: str, calls: list[tuple[str, dict]], turn_key: int = 0) -> str:
        """The text a model of this family generates for one assistant turn with visible text
        ``content`` (may be "") and the tool calls ``calls`` (``(name, arguments)`` in order; may be
        empty), without the end-of-turn (the oracle appends the format's ``eot_ids``).
        ``turn_key`` differs between the turns of one conversation (the oracle passes the
        prompt's length): a family whose models write an id with each call (Mistral v3-v11)
        derives the ids from it, so that they are deterministic and differ from turn to turn;
        the others ignore it."""
        ...


# Modules defining DIALECTS: {chat format name: Dialect}.
_MODULES = (
    "rollout.devtools.local.dialects.hermes",
    "rollout.devtools.local.dialects.qwen35",
    "rollout.devtools.local.dialects.deepseek_v4",
    "rollout.devtools.local.dialects.mistral",
)


def _registered_builtins(reg: Registry) -> None:
    for module in _MODULES:
        try:
            found = importlib.import_module(module).DIALECTS
        except ModuleNotFoundError as e:
            if e.name == module:
                continue
            raise
        for name, dialect in found.items():
            reg.register(name, dialect)


# chat format name -> its Dialect (or the "module:attribute" path of one); entry points in group
# tau_rollout.dialects. The local stack's server process reads it: a dialect of your own reaches
# it through an entry point (a path registered in the driver reaches the Ray actors, not the stack).
DIALECTS: Registry[Dialect] = Registry("dialect", None, loaded=_registered_builtins)


def register_dialect(chat_format: str, dialect: Dialect | str, *, replace: bool = False) -> None:
    """Add the dialect of chat format ``chat_format`` (an object, or its ``"module:attribute"`` path).

    Raises:
        ValueError: the name is empty, holds a ``:`` or has a dialect already (and ``replace`` is false).
    """
    DIALECTS.register(chat_format, dialect, replace=replace)


def get_dialect(chat_format: str) -> Dialect:
    """The dialect of chat format ``chat_format``.

    Raises:
        rollout.core.registry.UnknownNameError: the local stack cannot speak that format (a
            ``KeyError``; the message lists the ones it can).
    """
    return DIALECTS.get(chat_format)


def dialect_names() -> tuple[str, ...]:
    """The chat formats the gold-replay oracle speaks, sorted."""
    return tuple(sorted(DIALECTS.names()))
