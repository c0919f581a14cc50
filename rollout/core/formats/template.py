"""Exact delta tokenization with a model's chat template (docs/design.md invariant 1).

History is never re-rendered. The first prompt is the template's rendering of ``[system, user]``
with the tools and the generation prompt. After each assistant turn the trajectory grows by

* the generated ids, exactly as the server returned them (mask 1), then
* the end-of-turn token(s) if the server did not generate them, e.g. when generation stopped on
  the stop string ``</tool_call>`` (a *turn-boundary repair*, mask 0), then
* the *delta* of the next non-assistant messages (mask 0): everything the template renders after
  the end-of-turn token of the previous assistant turn, up to and including the next generation
  prompt. For Qwen3 that is ``"\\n<|im_start|>user\\n...<|im_end|>\\n<|im_start|>assistant\\n"``:
  it starts with the newline the server never generates (the lost-newline bug of verl #3720/#6501).

The delta is rendered after a fixed one-turn dummy conversation whose assistant content is a
marker, and cut right after the marker's end-of-turn text. It therefore does not depend on how the
template renders earlier turns (Qwen3 drops earlier ``<think>`` blocks once a new user turn
arrives, so re-rendering history is not prefix-stable). :meth:`ChatTemplate.probe` checks, for the
configured tokenizer, that this construction is sound and reports which renderings are prefix-stable
(:mod:`rollout.core.formats.probe`).

Per turn, the delta of one message is not rendered again: the template's text around a message's
content is probed once per role (rendering the delta of marker contents) and the delta is then
``prefix + content + suffix``, which is exactly what the template renders as long as it copies the
content verbatim. The probe checks that with several contents (surrounding whitespace, markup,
JSON, a stop signal); a role whose check fails, a message with keys other than ``role`` and
``content``, a non-string or blank content, and several messages at once are rendered with the
template as before. Each turn's tokenizer work is then the encoding of the new text alone.

A :class:`ChatTemplate` with a turn parser is a whole :class:`~rollout.core.formats.protocol.ChatFormat`:
the ``hermes`` format (:mod:`rollout.core.formats.registry`) is one with the Qwen3 / Hermes parser,
and a model family whose tokenizer's chat template can be used needs only a parser of its own.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Iterable

from rollout.core.formats.codec import gil_free_codec
from rollout.core.formats.hermes import CALL_HINT, parse_turn
from rollout.core.formats.probe import probe_template
from rollout.core.formats.protocol import ParsedTurn, TemplateError, TemplateReport, TurnParser

__all__ = ["INLINE_MAX_CHARS", "INLINE_MAX_IDS", "PROMPT_PREFIX_CACHE", "ChatTemplate", "TemplateError", "TemplateReport"]

logger = logging.getLogger(__name__)

_MARK = "ROLLOUT-DELTA-MARK-5c1e"
_CONTENT_MARK = "ROLLOUT-CONTENT-MARK-9d2a"  # stands for a message's content in the per-role probe
_DUMMY_SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
_DUMMY_USER = {"role": "user", "content": "Hello."}
# Bounds on the tokenizer work the event loop does itself (try_decode_now, try_delta_ids_now):
# about 0.1-0.2 ms at most, less than handing the call to a thread and back. Measured here with
# Qwen3's tokenizer: encoding costs 1.1-1.5 us per token (400 characters of JSON: ~150 tokens),
# decoding 512 ids about 70 us.
INLINE_MAX_IDS = 512
INLINE_MAX_CHARS = 400
PROMPT_PREFIX_CACHE = 16  # distinct prompt prefixes (system prompt + tools) kept per template


class ChatTemplate:
    """Renders prompts and message deltas to token ids with one tokenizer's chat template, and
    reads assistant turns with a turn parser: a :class:`~rollout.core.formats.protocol.ChatFormat`.

    Args:
        tokenizer: a ``transformers`` tokenizer with a chat template.
        tools: OpenAI-style tool schemas given to the template (rendered into the system turn).
        template_kwargs: extra keyword arguments for ``apply_chat_template`` (e.g.
            ``{"enable_thinking": False}`` for Qwen3).
        parser: reads one assistant turn (:meth:`parse_turn`); default: the Qwen3 / Hermes
            ``<tool_call>`` parser, :func:`rollout.core.formats.hermes.parse_turn`.
        call_hint: how to call a tool in the parser's format (:attr:`ChatFormat.call_hint`);
            default: the Hermes one.

    Raises:
        TemplateError: the tokenizer has no EOS token to close assistant turns with.
    """

    def __init__(self, tokenizer, tools: list[dict] | None = None, template_kwargs: dict[str, Any] | None = None,
                 parser: TurnParser = parse_turn, call_hint: str = CALL_HINT):
        self.tokenizer = tokenizer
        self.parser = parser
        self.call_hint = call_hint
        self.tools = tools or None
        self.template_kwargs = dict(template_kwargs or {})
        eot = getattr(tokenizer, "eos_token", None)
        if not eot:
            raise TemplateError("tokenizer has no eos_token: cannot tell where an assistant turn ends")
        self.end_of_turn: str = eot
        self.eot_ids: list[int] = tokenizer.encode(eot, add_special_tokens=False)
        if not self.eot_ids:
            raise TemplateError(f"end-of-turn text {eot!r} tokenizes to nothing")
        self._turn_tail: str | None = None
        # Episodes tokenize from worker threads; a Rust tokenizer shared across threads can fail
        # with "Already borrowed" if calls overlap, so calls into it are serialised. The event loop
        # never waits on this lock: it encodes and decodes in executor threads, or itself for a
        # short text when the lock is free (try_decode_now, try_delta_ids_now).
        self._lock = threading.Lock()
        # The Rust backend's batch calls, which release the GIL (see gil_free_codec), or None.
        self._codec = gil_free_codec(tokenizer)
        # prompt_ids: ids of shared prompt prefixes (system prompt + tools), and prefixes whose
        # halves did not tokenize apart; the special tokens a prompt may be cut before.
        self._prefix_ids: dict[str, list[int]] = {}
        self._prefix_refused: set[str] = set()
        self._cut_tokens: tuple[str, ...] = _cut_tokens(tokenizer)
        # role -> (prefix, suffix) of a one-message delta, or None where the template does not
        # copy the content verbatim (probed once per role, see verbatim_affixes).
        self._role_affixes: dict[str, tuple[str, str] | None] = {}

    # -- rendering ---------------------------------------------------------------------------
    def render(self, messages: list[dict], add_generation_prompt: bool, tools: bool = True) -> str:
        """The template's text of ``messages`` (with the tools unless ``tools`` is False, and the
        generation prompt if ``add_generation_prompt``). Blocking."""
        return self.tokenizer.apply_chat_template(
            messages,
            tools=self.tools if tools else None,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            **self.template_kwargs,
        )

    def encode(self, text: str) -> list[int]:
        """Tokenize template text (special tokens in the text become their ids; no BOS added).

        Blocking: it takes the tokenizer lock, which other threads hold while they encode (a
        6k-token prompt takes milliseconds). Async code calls it in a thread.
        """
        with self._lock:
            if self._codec is not None:
                return self._codec.encode(text)
            return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        """Decode generated ids keeping special tokens (``<tool_call>`` is one in Qwen3).

        Blocking: it takes the tokenizer lock (see :meth:`encode`). Async code calls it in a thread.
        """
        with self._lock:
            if self._codec is not None:
                return self._codec.decode(ids)
            return self.tokenizer.decode(ids, skip_special_tokens=False)

    def try_decode_now(self, ids: list[int]) -> str | None:
        """:meth:`decode` on the calling thread when that is cheap and cannot wait, else None.

        The event loop calls this before handing a decode to a thread: a turn's generated ids
        (tens to hundreds) decode in tens of microseconds, less than the hand-off itself. It
        decodes only with the Rust codec, at most :data:`INLINE_MAX_IDS` ids, and only when the
        tokenizer lock is free (never waits on a thread encoding a large prompt).
        """
        if self._codec is None or len(ids) > INLINE_MAX_IDS or not self._lock.acquire(blocking=False):
            return None
        try:
            return self._codec.decode_holding_gil(ids)
        finally:
            self._lock.release()

    def try_delta_ids_now(self, messages: list[dict]) -> list[int] | None:
        """:meth:`delta_ids` on the calling thread when that is cheap and cannot wait, else None:
        one message whose delta comes from the probed affixes (no template rendering), of at most
        :data:`INLINE_MAX_CHARS` characters, with the Rust codec and a free tokenizer lock (see
        :meth:`try_decode_now`)."""
        plain = _plain_message(messages)
        if self._codec is None or plain is None:
            return None
        role, content = plain
        if len(content) > INLINE_MAX_CHARS or role not in self._role_affixes:  # probing renders: a thread's job
            return None
        affixes = self._role_affixes[role]
        if affixes is None or not self._lock.acquire(blocking=False):
            return None
        try:
            return self._codec.encode_holding_gil(affixes[0] + content + affixes[1])
        finally:
            self._lock.release()

    @property
    def releases_gil(self) -> bool:
        """Whether :meth:`encode` and :meth:`decode` run in the Rust backend with the GIL released
        (see :func:`~rollout.core.formats.codec.gil_free_codec`); False means the ``transformers`` calls, which hold it."""
        return self._codec is not None

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        """Ids of ``messages`` rendered whole + the generation prompt: the first prompt (system and
        first user turn), or with ``policy.history=rerender`` the conversation so far.

        Every episode of a domain opens with the same system prompt and tool schemas (about 5k
        tokens on tau-bench) and differs from the turn of its last message on. That shared text
        is tokenized once per actor and its ids reused: the prompt is cut right before the
        special token that opens the last message's turn (``<|im_start|>`` for Qwen3), where a
        tokenizer splits anyway (special tokens are matched before any other rule, so no token
        spans the cut; tokens that strip whitespace on their left are never cut before). The
        first prompt with a given prefix is tokenized whole and compared with the two halves'
        ids; a prefix whose halves differ is never reused.

        Blocking (rendering and tokenizing): async code calls it in a thread.
        """
        text = self.render(messages, add_generation_prompt=True)
        cut = self._prompt_cut(text, messages)
        if cut <= 0:
            return self.encode(text)
        prefix = text[:cut]
        ids = self._prefix_ids.get(prefix)
        if ids is not None:
            return ids + self.encode(text[cut:])
        full = self.encode(text)
        if prefix not in self._prefix_refused and len(self._prefix_ids) < PROMPT_PREFIX_CACHE:
            head = self.encode(prefix)
            if head + self.encode(text[cut:]) == full:
                self._prefix_ids[prefix] = head
            else:
                logger.info("chat template: the prompt prefix does not tokenize apart from its rest; not reused")
                self._prefix_refused.add(prefix)
        return full

    def _prompt_cut(self, text: str, messages: list[dict]) -> int:
        """Where :meth:`prompt_ids` cuts ``text``: the start of the last cut token (a special
        token that does not strip on its left) in the 256 characters before the content of the
        message after the system message (the last message of a first prompt; the user's opening
        of a whole conversation, ``policy.history=rerender``, so the shared system prompt and tools
        are the cached part either way); 0 when there is none."""
        whole = len(messages) > 2 and messages[0].get("role") == "system"
        content = (messages[1] if whole else messages[-1]).get("content") if messages else None
        if not isinstance(content, str) or not content or not self._cut_tokens:
            return 0
        if whole:
            system = messages[0].get("content")
            at = text.find(system) if isinstance(system, str) and system else -1
            pos = text.find(content, at + len(system)) if at >= 0 else -1
        else:
            pos = text.rfind(content)
        if pos <= 0:
            return 0
        lo = max(0, pos - 256)
        return max((text.rfind(tok, lo, pos) for tok in self._cut_tokens), default=-1)

    def render_delta(self, messages: list[dict], after: dict | None = None) -> str:
        """The delta of ``messages`` as the template renders it (never from the probed affixes,
        unlike :meth:`delta_text`): its text from just after an assistant turn's end-of-turn
        through the next generation prompt, rendered after a one-turn dummy conversation.

        Args:
            messages: the non-assistant messages that follow the turn.
            after: the assistant turn they follow (the probe varies its shape: with reasoning,
                with a tool call); ``None``: a fixed turn, which must end with the EOS text.

        Raises:
            TemplateError: the template drops the turn's content, or does not close it with its
                EOS text.
        """
        prev = {"role": "assistant", "content": _MARK} if after is None else {**after, "content": (after.get("content") or "") + _MARK}
        base = [_DUMMY_SYSTEM, _DUMMY_USER, prev]
        full = self.render(base + list(messages), add_generation_prompt=True, tools=False)
        at = full.find(_MARK)  # the first: a message after it may hold the marker text too
        if at < 0:
            raise TemplateError("the chat template dropped the previous assistant turn's content")
        end = at + len(_MARK)
        if after is None:
            if not full.startswith(self.end_of_turn, end):
                raise TemplateError(
                    f"the chat template does not close an assistant turn with the EOS text {self.end_of_turn!r} "
                    f"(found {full[end:end + 20]!r}); exact delta tokenization needs it to"
                )
        else:  # probing: the turn may go on after the marker (e.g. a rendered tool call)
            end = full.find(self.end_of_turn, end)
            if end < 0:
                raise TemplateError("the chat template does not close the assistant turn with its EOS text")
        return full[end + len(self.end_of_turn) :]

    _delta_text = render_delta  # its earlier name (tests/unit/test_chat.py compares delta_text with it)

    # Contents the per-role probe renders: the template must copy each one verbatim.
    _PROBE_CONTENTS = (
        _CONTENT_MARK,
        f"  {_CONTENT_MARK} \n\n",
        f"\n<tool_response>\n{_CONTENT_MARK}\n</tool_response>",
        f'{{"order_id": "#W1", "items": [{{"price": 1.5}}]}} {_CONTENT_MARK} ok?',
        f"###STOP### {_CONTENT_MARK}",
    )

    def verbatim_affixes(self, role: str) -> tuple[str, str] | None:
        """``(prefix, suffix)`` such that the delta of ``{"role": role, "content": c}`` is
        ``prefix + c + suffix`` for every probed content, or None (probed once per role, by
        rendering; blocking the first time).

        Raises:
            TemplateError: the template does not close assistant turns with its EOS text.
        """
        if role in self._role_affixes:
            return self._role_affixes[role]
        found: tuple[str, str] | None = None
        try:
            text = self.render_delta([{"role": role, "content": _CONTENT_MARK}])
            if text.count(_CONTENT_MARK) == 1:
                at = text.index(_CONTENT_MARK)
                found = (text[:at], text[at + len(_CONTENT_MARK):])
                for content in self._PROBE_CONTENTS[1:]:
                    if self.render_delta([{"role": role, "content": content}]) != found[0] + content + found[1]:
                        found = None
                        break
        except TemplateError:
            raise
        except Exception as e:  # a template that rejects the role: render (and fail) per message
            logger.debug("chat template: no verbatim delta for role %r: %r", role, e)
            found = None
        self._role_affixes[role] = found  # idempotent: a race computes the same value twice
        return found

    def delta_text(self, messages: list[dict]) -> str:
        """The template's text from just after an assistant turn's end-of-turn through the next
        generation prompt, for ``messages`` (see :meth:`delta_ids`).

        One message ``{"role", "content"}`` with a non-blank string content takes the probed
        per-role affixes (no template rendering); anything else is rendered.

        Raises:
            TemplateError: the template does not close assistant turns with its EOS text.
        """
        plain = _plain_message(messages)
        if plain is not None:
            affixes = self.verbatim_affixes(plain[0])
            if affixes is not None:
                return affixes[0] + plain[1] + affixes[1]
        return self.render_delta(messages)

    def delta_ids(self, messages: list[dict]) -> list[int]:
        """Ids to append after an assistant turn closed by its end-of-turn token.

        Args:
            messages: the non-assistant messages that follow (tool results and/or user turns).

        Returns:
            Ids of the template's text from just after the end-of-turn token through the next
            generation prompt (all of it masked 0 by the caller).

        Raises:
            TemplateError: the template does not close assistant turns with its EOS text.
        """
        return self.encode(self.delta_text(messages))

    @property
    def turn_tail(self) -> str:
        """Template text between an assistant's end-of-turn and the next message (``"\\n"`` for Qwen3)."""
        if self._turn_tail is None:
            full = self.render([_DUMMY_SYSTEM, _DUMMY_USER, {"role": "assistant", "content": _MARK}], False, tools=False)
            at = full.rfind(_MARK) + len(_MARK)
            self._turn_tail = full[at + len(self.end_of_turn) :] if full.startswith(self.end_of_turn, at) else ""
        return self._turn_tail

    def ends_turn(self, generated_ids: list[int]) -> bool:
        """Whether generated ids end with the end-of-turn token(s)."""
        n = len(self.eot_ids)
        return len(generated_ids) >= n and generated_ids[-n:] == self.eot_ids

    # -- parsing -------------------------------------------------------------------------------
    def parse_turn(self, text: str, tool_names: Iterable[str] | None = None, ids: list[int] | None = None) -> ParsedTurn:
        """One assistant turn's decoded text (end-of-turn tokens removed), read by :attr:`parser`.

        Args:
            text: the turn's text, special tokens kept.
            tool_names: the tools the environment offers; a call to another is a ParseError.
                ``None`` skips that check.
            ids: unused (the parser reads text).

        Raises:
            ParseError: the text is not a valid reply or tool call (and nothing else).
        """
        return self.parser(text, tool_names)

    # -- the start-up probe ---------------------------------------------------------------------
    def probe(self) -> TemplateReport:
        """Check that exact delta tokenization works with this template; report prefix stability
        (:func:`rollout.core.formats.probe.probe_template`).

        Returns:
            A :class:`TemplateReport`; ``report.ok`` is False when the delta construction is unsound.
        """
        return probe_template(self)


def _plain_message(messages: list[dict]) -> tuple[str, str] | None:
    """``(role, content)`` when ``messages`` is one message with only ``role`` and ``content``
    and a non-blank string content (its delta can come from the probed affixes), else None."""
    if len(messages) != 1:
        return None
    msg = messages[0]
    content = msg.get("content")
    if isinstance(content, str) and content.strip() and msg.keys() <= {"role", "content"}:
        return str(msg.get("role")), content
    return None


def _cut_tokens(tokenizer: Any) -> tuple[str, ...]:
    """Special added tokens a prompt may be cut right before (:meth:`ChatTemplate.prompt_ids`):
    matched on the raw text (not normalized) and not stripping whitespace on their left."""
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    out = []
    for tok in added.values():
        content = getattr(tok, "content", None)
        if (isinstance(content, str) and content and getattr(tok, "special", False)
                and not getattr(tok, "lstrip", True) and not getattr(tok, "normalized", True)):
            out.append(content)
    return tuple(out)
