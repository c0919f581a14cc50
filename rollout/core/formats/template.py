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
configured tokenizer, that this construction is sound and reports which renderings are prefix-stable.

Per turn, the delta of one message is not rendered again: the template's text around a message's
content is probed once per role (rendering the delta of marker contents) and the delta is then
``prefix + content + suffix``, which is exactly what the template renders as long as it copies the
content verbatim. The probe checks that with several contents (surrounding whitespace, markup,
JSON, a stop signal); a role whose check fails, a message with keys other than ``role`` and
``content``, a non-string or blank content, and several messages at once are rendered with the
template as before. Each turn's tokenizer work is then the encoding of the new text alone.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

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


class TemplateError(RuntimeError):
    """The chat template cannot be used for exact delta tokenization; the message says why."""


@dataclass
class TemplateReport:
    """What :meth:`ChatTemplate.probe` found.

    Attributes:
        end_of_turn: the text that closes an assistant turn (e.g. ``<|im_end|>``).
        turn_tail: template text after the end-of-turn that the server never generates
            (``"\\n"`` for Qwen3); it opens every delta.
        prefix_stable: per case, whether rendering the history alone is a prefix of rendering it
            with the next message (``False`` is expected for Qwen3 after a thinking turn: that is
            why history is never re-rendered).
        delta_independent: per case, whether the delta of a message is the same whatever the
            previous assistant turn contained (required: False is fatal).
        canonical_boundary: per case, whether tokenizing the delta on its own gives the same ids as
            tokenizing the whole rendered text (False is not fatal: the trajectory is still what
            the policy saw, but not the canonical tokenization).
        verbatim_roles: per role (``user``, ``tool``), whether a one-message delta is taken from
            the probed affixes around its content (True) or rendered every time (False; slower,
            equally exact).
        problems: fatal findings; empty when the template is usable.
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
        return not self.problems

    def summary(self) -> str:
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


class ChatTemplate:
    """Renders prompts and message deltas to token ids with one tokenizer's chat template.

    Args:
        tokenizer: a ``transformers`` tokenizer with a chat template.
        tools: OpenAI-style tool schemas given to the template (rendered into the system turn).
        template_kwargs: extra keyword arguments for ``apply_chat_template`` (e.g.
            ``{"enable_thinking": False}`` for Qwen3).

    Raises:
        TemplateError: the tokenizer has no EOS token to close assistant turns with.
    """

    def __init__(self, tokenizer, tools: list[dict] | None = None, template_kwargs: dict[str, Any] | None = None):
        self.tokenizer = tokenizer
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
        # The Rust backend's batch calls, which release the GIL (see _gil_free_codec), or None.
        self._codec = _gil_free_codec(tokenizer)
        # prompt_ids: ids of shared prompt prefixes (system prompt + tools), and prefixes whose
        # halves did not tokenize apart; the special tokens a prompt may be cut before.
        self._prefix_ids: dict[str, list[int]] = {}
        self._prefix_refused: set[str] = set()
        self._cut_tokens: tuple[str, ...] = _cut_tokens(tokenizer)
        # role -> (prefix, suffix) of a one-message delta, or None where the template does not
        # copy the content verbatim (probed once per role, see _affixes).
        self._role_affixes: dict[str, tuple[str, str] | None] = {}

    # -- rendering ---------------------------------------------------------------------------
    def render(self, messages: list[dict], add_generation_prompt: bool, tools: bool = True) -> str:
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
        (see :func:`_gil_free_codec`); False means the ``transformers`` calls, which hold it."""
        return self._codec is not None

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        """Ids of the first prompt: ``messages`` (system and first user turn) + generation prompt.

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
        token that does not strip on its left) in the 256 characters before the last message's
        content; 0 when there is none."""
        content = messages[-1].get("content") if messages else None
        if not isinstance(content, str) or not content or not self._cut_tokens:
            return 0
        pos = text.rfind(content)
        if pos <= 0:
            return 0
        lo = max(0, pos - 256)
        return max((text.rfind(tok, lo, pos) for tok in self._cut_tokens), default=-1)

    def _delta_text(self, messages: list[dict], previous_assistant: dict | None = None) -> str:
        prev = previous_assistant or {"role": "assistant", "content": _MARK}
        base = [_DUMMY_SYSTEM, _DUMMY_USER, prev]
        full = self.render(base + list(messages), add_generation_prompt=True, tools=False)
        at = full.find(_MARK)  # the first: a message after it may hold the marker text too
        if at < 0:
            raise TemplateError("the chat template dropped the previous assistant turn's content")
        end = at + len(_MARK)
        if previous_assistant is None:
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

    # Contents the per-role probe renders: the template must copy each one verbatim.
    _PROBE_CONTENTS = (
        _CONTENT_MARK,
        f"  {_CONTENT_MARK} \n\n",
        f"\n<tool_response>\n{_CONTENT_MARK}\n</tool_response>",
        f'{{"order_id": "#W1", "items": [{{"price": 1.5}}]}} {_CONTENT_MARK} ok?',
        f"###STOP### {_CONTENT_MARK}",
    )

    def _affixes(self, role: str) -> tuple[str, str] | None:
        """``(prefix, suffix)`` such that the delta of ``{"role": role, "content": c}`` is
        ``prefix + c + suffix`` for every probed content, or None (probed once per role)."""
        if role in self._role_affixes:
            return self._role_affixes[role]
        found: tuple[str, str] | None = None
        try:
            text = self._delta_text([{"role": role, "content": _CONTENT_MARK}])
            if text.count(_CONTENT_MARK) == 1:
                at = text.index(_CONTENT_MARK)
                found = (text[:at], text[at + len(_CONTENT_MARK):])
                for content in self._PROBE_CONTENTS[1:]:
                    if self._delta_text([{"role": role, "content": content}]) != found[0] + content + found[1]:
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
            affixes = self._affixes(plain[0])
            if affixes is not None:
                return affixes[0] + plain[1] + affixes[1]
        return self._delta_text(messages)

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

    # -- probe ---------------------------------------------------------------------------------
    def probe(self) -> TemplateReport:
        """Check that exact delta tokenization works with this template; report prefix stability.

        Cases cover the roles in use: a user turn and a tool result after an assistant turn with
        and without ``<think>`` reasoning and with a tool call.

        Returns:
            A :class:`TemplateReport`; ``report.ok`` is False when the delta construction is unsound.
        """
        rep = TemplateReport(end_of_turn=self.end_of_turn, turn_tail="")
        try:
            rep.turn_tail = self.turn_tail
            self._delta_text([{"role": "user", "content": "x"}])
        except TemplateError as e:
            rep.problems.append(str(e))
            return rep
        call = {"type": "function", "function": {"name": "lookup", "arguments": {"id": "1"}}}
        assistants = {
            "plain": {"role": "assistant", "content": "Sure."},
            "thinking": {"role": "assistant", "content": "<think>\nreasoning\n</think>\n\nSure."},
            "tool_call": {"role": "assistant", "content": "", "tool_calls": [call]},
        }
        nexts = {
            "user": [{"role": "user", "content": "Next question?"}],
            "tool": [{"role": "tool", "content": '{"ok": true}'}],
        }
        for nk, new in nexts.items():
            ref = self._delta_text(new)
            for ak, asst in assistants.items():
                case = f"{nk}_after_{ak}"
                hist = [_DUMMY_SYSTEM, _DUMMY_USER, asst]
                rep.prefix_stable[case] = self.render(hist + new, True, tools=False).startswith(self.render(hist, False, tools=False))
                # Delta of `new` when the previous assistant turn had this shape (marker inside).
                marked = dict(asst)
                marked["content"] = (asst["content"] or "") + _MARK
                try:
                    same = self._delta_text(new, previous_assistant=marked) == ref
                except TemplateError:
                    same = False
                rep.delta_independent[case] = same
                if not same:
                    rep.problems.append(
                        f"the template renders a {nk} message differently after an assistant turn of kind "
                        f"'{ak}': appending deltas cannot reproduce it exactly"
                    )
            # Canonical tokenization: ids(prefix) + ids(delta) == ids(prefix + delta)?
            prefix = self.render([_DUMMY_SYSTEM, _DUMMY_USER], True, tools=False) + "Sure." + self.end_of_turn
            rep.canonical_boundary[nk] = self.encode(prefix) + self.encode(ref) == self.encode(prefix + ref)
            rep.verbatim_roles[nk] = self._affixes(nk) is not None
        return rep


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


# --------------------------------------------------------------------------- GIL-free tokenizer calls
class _RustCodec:
    """Encode and decode through a fast tokenizer's Rust backend (a ``tokenizers.Tokenizer``):
    its *batch* calls, which release the GIL while they run (for worker threads), and its plain
    calls, which hold it (for the event loop's short texts).

    Why: the episode loop tokenizes in worker threads so that the event loop stays free, but a
    thread only leaves the loop free if it lets go of the GIL. ``transformers``' ``encode`` builds
    a ``BatchEncoding`` (offsets included) under the GIL and ``Tokenizer.decode`` holds it
    throughout, while ``encode_batch_fast`` / ``decode_batch`` release it for the Rust work, and
    ``encode_batch_fast`` skips the offsets. ``python -m rollout.bench turns`` measures both ways
    side by side (the main thread's lag while a thread tokenizes). The ids and text are the same
    as ``transformers``' (checked by :func:`_gil_free_codec` before use).
    """

    def __init__(self, backend: Any) -> None:
        self._backend = backend
        self._encode_batch = getattr(backend, "encode_batch_fast", None) or backend.encode_batch

    def encode(self, text: str) -> list[int]:
        """Ids of ``text``, the GIL released meanwhile (for worker threads)."""
        return self._encode_batch([text], add_special_tokens=False)[0].ids

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids``, the GIL released meanwhile (for worker threads)."""
        return self._backend.decode_batch([list(ids)], skip_special_tokens=False)[0]

    def encode_holding_gil(self, text: str) -> list[int]:
        """Ids of ``text`` without releasing the GIL: for the event loop's short texts. A thread
        that lets the GIL go must take it back, which, while other threads run Python, waits up
        to the interpreter's switch interval (5 ms): far more than encoding a short text costs.
        (Measured with ``py-spy``: the loop spent 40% of its busy time in those waits when its
        short texts went through the releasing calls.)"""
        return self._backend.encode(text, add_special_tokens=False).ids

    def decode_holding_gil(self, ids: list[int]) -> str:
        """Text of ``ids`` without releasing the GIL (see :meth:`encode_holding_gil`)."""
        return self._backend.decode(list(ids), skip_special_tokens=False)


def _codec_check_texts(tokenizer: Any) -> list[str]:
    """Texts on which the Rust calls must give ``transformers``' ids and text: special tokens in
    running text, JSON, whitespace runs, non-ASCII, and (where the tokenizer has one) a rendered
    chat with a tool schema."""
    specials = [t for t in (getattr(tokenizer, "all_special_tokens", None) or []) if isinstance(t, str)][:8]
    texts = [
        "",
        "Hello, world.  Two  spaces\n\n\tand a tab.",
        '{"order_id": "#W2378156", "items": [{"price": 54.04, "options": {"color": "blue"}}]}',
        "Straße, naïve café, 東京, emoji \U0001F600\U0001F469\u200d\U0001F4BB, \u00a0nbsp",
        "<tool_call>\n{\"name\": \"get_user_details\", \"arguments\": {\"user_id\": \"mia_li_3668\"}}\n</tool_call>",
        " ".join(f"x{t}y {t}\n{t}" for t in specials),
    ]
    if getattr(tokenizer, "chat_template", None):
        try:
            tool = {"type": "function", "function": {"name": "lookup", "description": "Look up an order.",
                                                     "parameters": {"type": "object", "properties": {"id": {"type": "string"}}}}}
            texts.append(tokenizer.apply_chat_template(
                [{"role": "system", "content": "You are a helpful agent."}, {"role": "user", "content": "Where is #W1?"}],
                tools=[tool], tokenize=False, add_generation_prompt=True))
        except Exception as e:  # a template that needs other messages: the plain texts suffice
            logger.debug("chat template: no rendered text for the codec check: %r", e)
    return texts


def _gil_free_codec(tokenizer: Any) -> _RustCodec | None:
    """A :class:`_RustCodec` over ``tokenizer``'s Rust backend when it gives exactly the ids and
    text of ``tokenizer.encode(text, add_special_tokens=False)`` and ``tokenizer.decode(ids,
    skip_special_tokens=False)``; None otherwise (a slow tokenizer, one that cleans up spaces or
    splits special tokens, or a check that fails), and the ``transformers`` calls are used.

    The check encodes and decodes :func:`_codec_check_texts` both ways, plus ids that cut a
    multi-byte character in half. Never raises.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None) or getattr(tokenizer, "_tokenizer", None)
    if backend is None or not type(backend).__module__.startswith("tokenizers"):
        return None
    if not all(hasattr(backend, a) for a in ("encode_batch", "decode_batch")):
        return None
    if getattr(tokenizer, "clean_up_tokenization_spaces", False) or getattr(tokenizer, "split_special_tokens", False):
        return None
    if getattr(backend, "encode_special_tokens", False):
        return None
    codec = _RustCodec(backend)
    try:
        for text in _codec_check_texts(tokenizer):
            ids = list(tokenizer.encode(text, add_special_tokens=False))
            if codec.encode(text) != ids or codec.encode_holding_gil(text) != ids:
                logger.info("chat template: the Rust tokenizer's ids differ from transformers' on %r; not used", text[:60])
                return None
            for probe in (ids, ids[: max(1, len(ids) // 2)], ids[1:]):
                want = tokenizer.decode(probe, skip_special_tokens=False)
                if codec.decode(probe) != want or codec.decode_holding_gil(probe) != want:
                    logger.info("chat template: the Rust tokenizer's text differs from transformers'; not used")
                    return None
    except Exception as e:  # any surprise: keep the transformers calls
        logger.info("chat template: the Rust tokenizer's batch calls are not usable (%r)", e)
        return None
    return codec
