"""The ``mistral`` chat format, rendered by ``mistral-common`` (optional: imported lazily).

Every prompt and delta is mistral-common's own encoding of OpenAI-style messages
(``ChatCompletionRequest.from_openai`` -> ``MistralTokenizer.encode_chat_completion``: its
validator, normalizer and versioned instruct tokenizer), token by token; no template is written
here. What that encoding is (mistral-common 1.13, ``tokens/tokenizers/instruct.py``):

* a turn is ``<s>[INST]user[/INST]assistant</s>``; an assistant turn ends with ``</s>`` (the
  EOS, which the server samples; nothing follows it before the next message);
* tool calls (v3, v7): ``[TOOL_CALLS][{"name": ..., "arguments": {...}, "id": ...}, ...]`` (one
  JSON list; ``"id"`` only where the call has one); v11: ``[TOOL_CALLS]name[CALL_ID]id[ARGS]{...}``
  per call; v13+: ``[TOOL_CALLS]name[ARGS]{...}`` (no id). Several calls per turn in every version;
* a tool result: v3 ``[TOOL_RESULTS]{"content": ..., "call_id": id}[/TOOL_RESULTS]``; v7 and v11
  ``[TOOL_RESULTS]id[TOOL_CONTENT]content[/TOOL_RESULTS]``; v13+ ``[TOOL_RESULTS]content[/TOOL_RESULTS]``;
  the model then answers directly (no ``[INST]``);
* call ids (v3-v11): the model writes one with each call (v3/v7 ``"id"``, v11 ``[CALL_ID]``), 9
  letters or digits, and the result of that call echoes it. The parser keeps it
  (:attr:`~rollout.core.formats.protocol.ToolCall.id`), the loop gives it to the call in
  ``messages`` and to its tool result, so deltas and re-encodings carry the id the model wrote.
  Where the model wrote none (v13+, or a v3-v11 call without one) the loop's ids (``call_3``,
  ``call_3-1``) are mapped by :func:`mistral_call_id`;
* the system prompt: v3 prepends it to the **last** user message (``system\\n\\nuser``); v7+ writes
  ``[SYSTEM_PROMPT]...[/SYSTEM_PROMPT]`` where it stands;
* the tools: ``[AVAILABLE_TOOLS][...][/AVAILABLE_TOOLS]`` right before the **last** ``[INST]`` up to
  v11, before the first from v13 on; reasoning ``[THINK]...[/THINK]`` from v13 (where the file has them).

Append-only (docs/design.md invariant 1): the prompt is the encoding of ``[system, user]`` with the
tools; a delta is what mistral-common encodes for the new messages after a fixed one-turn
conversation without tools or system prompt, cut right after that turn's ``</s>`` (checked to be
a prefix every time). So the trajectory is the encoding of the conversation with the tools and
the v3 system prompt left where the first prompt put them: up to v11 a full re-encoding moves them
to the last ``[INST]`` (not prefix-stable; the probe reports it), and it writes ids into
earlier calls that the model sampled without one (a call sampled with its id re-encodes as
sampled). The policy saw exactly the append-only ids.
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any, Iterable

from rollout.core.formats.mistral_vocab import (
    _CALL_ID_RE,
    VOCABULARY_FILES,
    MistralVocabulary,
    is_mistral_tokenizer,
    load_vocabulary,
    lock_for,
    mistral_tokenizer_of,
    parse_turn_ids,
    vocabulary_files,
)
from rollout.core.formats.protocol import MissingPackageError, ParsedTurn, ParseError, TemplateError, TemplateReport
from rollout.core.formats.registry import FormatInfo
from rollout.core.formats.template import INLINE_MAX_CHARS, INLINE_MAX_IDS

logger = logging.getLogger(__name__)

__all__ = ["FORMATS", "VOCABULARY_FILES", "MistralFormat", "detect", "load_vocabulary", "mistral_call_id", "mistral_format", "vocabulary_files"]

_BASE_USER, _BASE_REPLY, _BASE_TOOL = "Hello.", "Sure.", "rollout_probe"  # the fixed turn deltas follow
_PROBE_CALL_ID = "pR0b3ca11"  # an id as a v3-v11 model writes one (9 letters or digits)
_PROBE_TOOL = {"type": "function", "function": {"name": "lookup", "description": "Look up a record.",
                                                "parameters": {"type": "object", "properties": {"id": {"type": "string"}}}}}
_MC_ERRORS: tuple[type[BaseException], ...] = (ValueError, TypeError, KeyError, AssertionError, NotImplementedError)


def mistral_call_id(call_id: str | None, index: int = 0) -> str:
    """The 9-character alphanumeric id Mistral v3+ needs for tool call ``call_id``: itself when it
    already is one (an id the model wrote), else the first 9 hex digits of its SHA-256
    (deterministic; the loop's ``call_3``). ``None``: the ``index``-th call's default id
    (``ParsedTurn.call_ids()``: ``call_0``, ``call_0-1``, ...)."""
    cid = call_id if call_id else ("call_0" if index == 0 else f"call_0-{index}")
    return cid if _CALL_ID_RE.fullmatch(cid) else hashlib.sha256(cid.encode()).hexdigest()[:9]


def detect(tokenizer: Any) -> bool:
    """``policy.chat_format=auto``: a Mistral tokenizer (see :func:`~rollout.core.formats.mistral_vocab.is_mistral_tokenizer`)."""
    return is_mistral_tokenizer(tokenizer)


class MistralFormat:
    """The ``mistral`` :class:`~rollout.core.formats.protocol.ChatFormat` over mistral-common
    (module docstring). Thread-safe: mistral-common is called under one lock per tokenizer
    (:func:`~rollout.core.formats.mistral_vocab.lock_for`); :meth:`parse_turn`, which runs on the
    event loop, decodes without it (tiktoken's and SentencePiece's decoders are read-only).

    Args:
        tokenizer: the policy tokenizer (:class:`MistralVocabulary`, ``MistralCommonBackend``, a
            ``MistralTokenizer``, or a ``transformers`` tokenizer whose folder holds ``tekken.json``).
        tools: OpenAI-style tool schemas (``[AVAILABLE_TOOLS]`` of the first prompt).
        template_kwargs: unused (``enable_thinking`` and others are logged and ignored: a Mistral
            model decides itself whether to write ``[THINK]``).

    Raises:
        TemplateError: mistral-common is missing, no mistral-common tokenizer can be had for
            ``tokenizer``, or its version is below v3 (no tool-call ids; v2 drops earlier results).
    """

    end_of_turn = "</s>"
    turn_tail = ""

    def __init__(self, tokenizer: Any, tools: list[dict] | None = None, template_kwargs: dict[str, Any] | None = None) -> None:
        try:
            self._mt = mistral_tokenizer_of(tokenizer)
        except ImportError:
            raise MissingPackageError("mistral-common") from None
        except ValueError as e:
            raise TemplateError(str(e)) from None
        from mistral_common.tokens.tokenizers.base import TokenizerVersion

        raw = self._raw = self._mt.instruct_tokenizer.tokenizer
        self.version = raw.version
        if self.version < TokenizerVersion.v3:
            raise TemplateError(f"chat format mistral needs a tokenizer of version v3 or later, not {self.version.value}")
        own = isinstance(tokenizer, MistralVocabulary) and tokenizer.mistral is self._mt
        self.vocab = tokenizer if own else MistralVocabulary(self._mt, name_or_path=str(getattr(tokenizer, "name_or_path", "") or ""))
        self.tokenizer = tokenizer if hasattr(tokenizer, "eos_token") else self.vocab  # the loop reads eos_token / pad_token
        self.tools = [dict(t) for t in tools] if tools else None
        self.eot_ids: list[int] = [raw.eos_id]
        self._lock = lock_for(raw)
        self.thinks: tuple[int, int] | None = None
        if self.version >= TokenizerVersion.v13 and raw.is_special("[THINK]") and raw.is_special("[/THINK]"):
            self.thinks = (raw.get_special_token("[THINK]"), raw.get_special_token("[/THINK]"))
        self._v7, self._v13 = self.version >= TokenizerVersion.v7, self.version >= TokenizerVersion.v13
        # v3-v11 models write an id with each call, and the call's result echoes it (module docstring)
        self.writes_call_ids = not self._v13
        self._shape = "[TOOL_CALLS]name[ARGS]{...} per call" if self.version >= TokenizerVersion.v11 else '[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]'
        self.call_hint = f"Reply to the user in plain text, or call tools as {self._shape}."
        self._heads: dict[tuple[str, ...], list[int]] = {}
        unused = sorted(template_kwargs or {})
        if unused:
            logger.info("chat format mistral ignores template_kwargs %s (mistral-common takes none)", unused)

    # -- rendering with mistral-common -------------------------------------------------------------
    def _openai(self, messages: list[dict]) -> list[dict]:
        """``messages`` as the OpenAI dicts ``ChatCompletionRequest.from_openai`` reads: only the keys
        it encodes, call ids mapped by :func:`mistral_call_id` (a tool message without one answers
        the call of its position after the last assistant turn); reasoning kept where [THINK] exists."""
        out, nth = [], 0
        for m in messages:
            role = m.get("role")
            if role == "assistant":
                nth = 0
                d: dict[str, Any] = {"role": role, "content": m.get("content") or None}
                if m.get("tool_calls"):
                    d["tool_calls"] = [{"id": mistral_call_id(c.get("id"), i), "type": "function",
                                        "function": {"name": c["function"]["name"], "arguments": c["function"].get("arguments") or "{}"}}
                                       for i, c in enumerate(m["tool_calls"])]
                if self.thinks and m.get("reasoning_content"):
                    d["reasoning_content"] = m["reasoning_content"]
            elif role == "tool":
                d = {"role": role, "content": m.get("content") or "", "tool_call_id": mistral_call_id(m.get("tool_call_id"), nth)}
                nth += 1
            elif role in ("user", "system"):
                d = {"role": role, "content": m.get("content") or ""}
            else:
                raise TemplateError(f"chat format mistral: cannot render a message of role {role!r}")
            out.append(d)
        return out

    def _encode(self, messages: list[dict], tools: bool, continue_final: bool = False) -> list[int]:
        """mistral-common's ids of ``messages`` (caller holds the lock). ``continue_final``: the last
        (assistant) message is left open (no ``</s>``), as ``continue_final_message``."""
        from mistral_common.exceptions import MistralCommonException
        from mistral_common.protocol.instruct.request import ChatCompletionRequest

        try:
            req = ChatCompletionRequest.from_openai(self._openai(messages), tools=self.tools if tools else None,
                                                    continue_final_message=continue_final)
            return list(self._mt.encode_chat_completion(req).tokens)
        except (MistralCommonException, *_MC_ERRORS) as e:
            raise TemplateError(f"mistral-common cannot encode these messages ({type(e).__name__}: {str(e)[:200]})") from None

    def encode_conversation(self, messages: list[dict], tools: bool = True, continue_final: bool = False) -> list[int]:
        """What mistral-common encodes for a whole conversation (OpenAI-style messages, the loop's
        ``messages`` included): the reference the probe and the tests compare with. Blocking.

        Raises:
            TemplateError: mistral-common rejects the conversation (the message has its reason).
        """
        with self._lock:
            return self._encode(messages, tools, continue_final)

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        """Ids of the first prompt (``<s>``, the tools, ``messages``; the model answers next). Blocking."""
        return self.encode_conversation(messages)

    def _delta(self, messages: list[dict]) -> list[int]:
        msgs = [dict(m) for m in messages]
        if not msgs or any(m.get("role") not in ("user", "tool") for m in msgs):
            raise TemplateError("chat format mistral renders deltas of user and tool messages only")
        lead = next((i for i, m in enumerate(msgs) if m["role"] != "tool"), len(msgs))
        ids = tuple(mistral_call_id(m.get("tool_call_id"), i) for i, m in enumerate(msgs[:lead]))
        for m, cid in zip(msgs, ids):
            m["tool_call_id"] = cid
        calls = [{"id": cid, "type": "function", "function": {"name": _BASE_TOOL, "arguments": "{}"}} for cid in ids]
        base = [{"role": "user", "content": _BASE_USER}, {"role": "assistant", "content": None if ids else _BASE_REPLY, "tool_calls": calls}]
        head = self._heads.get(ids)
        if head is None:
            head = self._encode(base, tools=False, continue_final=True) + self.eot_ids
            if len(self._heads) >= 256:
                self._heads.clear()
            self._heads[ids] = head
        full = self._encode(base + msgs, tools=False)
        if full[:len(head)] != head:
            raise TemplateError("mistral-common encodes the turn before these messages differently once they follow it: no delta")
        return full[len(head):]

    def delta_ids(self, messages: list[dict]) -> list[int]:
        """Ids to append after an assistant turn closed by ``</s>``: mistral-common's encoding of
        ``messages`` (user turns as ``[INST]...[/INST]``, tool results as ``[TOOL_RESULTS]...``; several
        results of one turn in order) after a fixed turn, without the real history. A tool
        message's ``tool_call_id`` is the id its call was written with (kept as it is) or is
        mapped by :func:`mistral_call_id`; without one it answers the call of its position.
        Blocking.

        Raises:
            TemplateError: a role other than user or tool, or mistral-common rejects the messages.
        """
        with self._lock:
            return self._delta(messages)

    def try_delta_ids_now(self, messages: list[dict]) -> list[int] | None:
        """:meth:`delta_ids` on the calling thread for at most :data:`INLINE_MAX_CHARS` characters
        of content when the lock is free (measured here: 0.14 ms for a user turn, 0.16-0.27 ms for a
        tool result; one answering an id not seen before costs 1.6-1.8 times one of a known id, side
        by side, as the fixed turn before it is encoded once per id set; all of it mistral-common's
        validation and encoding); else None."""
        if sum(len(str(m.get("content") or "")) for m in messages) > INLINE_MAX_CHARS or not self._lock.acquire(blocking=False):
            return None
        try:
            return self._delta(messages)
        finally:
            self._lock.release()

    def generated_ids(self, content: str, calls: list[tuple[str, dict]], call_ids: list[str] | None = None) -> list[int]:
        """The ids a model of this version writes for an assistant turn (without ``</s>``):
        mistral-common's encoding of the assistant message. Where the version cannot hold text
        and calls in one message (v3) they are encoded one after the other.

        Args:
            content: the visible text ("" for none).
            calls: ``(name, arguments)`` per call, in order.
            call_ids: the id written with each call (9 letters or digits; v3/v7 ``"id"``, v11
                ``[CALL_ID]``), as a v3-v11 model writes them (:attr:`writes_call_ids`); ``None``:
                calls without ids. Ignored from v13 on, which has the model write none.

        Raises:
            ValueError: ``call_ids`` does not give one id per call.
        """
        from mistral_common.protocol.instruct.messages import AssistantMessage
        from mistral_common.protocol.instruct.tool_calls import FunctionCall
        from mistral_common.protocol.instruct.tool_calls import ToolCall as MistralCall

        if call_ids is not None and len(call_ids) != len(calls):
            raise ValueError(f"{len(call_ids)} call ids for {len(calls)} calls")
        ids = ["aaaaaaaaa"] * len(calls) if self._v13 else (list(call_ids) if call_ids is not None else ["null"] * len(calls))
        tcs = [MistralCall(id=cid, function=FunctionCall(name=n, arguments=json.dumps(a, ensure_ascii=False)))
               for cid, (n, a) in zip(ids, calls)]
        if content and tcs and self._v7:
            parts = [AssistantMessage(content=content, tool_calls=tcs, prefix=True)]
        else:
            parts = [AssistantMessage(content=content, prefix=True)] * bool(content) + [AssistantMessage(tool_calls=tcs, prefix=True)] * bool(tcs)
        with self._lock:
            return [t for p in parts for t in self._mt.instruct_tokenizer.encode_assistant_message(p, False)]

    # -- turns ---------------------------------------------------------------------------------------
    def ends_turn(self, generated_ids: list[int]) -> bool:
        """Whether generated ids end with ``</s>``."""
        return bool(generated_ids) and generated_ids[-1] == self.eot_ids[0]

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids``, special tokens as their texts (``[TOOL_CALLS]``). Blocking."""
        return self.vocab.decode(ids)

    def try_decode_now(self, ids: list[int]) -> str | None:
        """:meth:`decode` for at most :data:`INLINE_MAX_IDS` ids when the lock is free, else None."""
        return self.vocab.try_decode(ids) if len(ids) <= INLINE_MAX_IDS else None

    def parse_turn(self, text: str, tool_names: Iterable[str] | None = None, ids: list[int] | None = None) -> ParsedTurn:
        """Read one assistant turn with mistral-common's own splitting and decoding of tool calls
        (``mistral_common.experimental.tools``: one JSON list per ``[TOOL_CALLS]`` up to v7, then
        ``name[CALL_ID]id[ARGS]{...}`` / ``name[ARGS]{...}``), and ``[THINK]`` blocks where the version has them.

        Args:
            text: the decoded turn (read only when ``ids`` is None: it is then encoded, its
                special-token texts becoming their ids).
            tool_names: the tools offered; a call to another is a ParseError. None: any name.
            ids: the turn's sampled ids (``</s>`` removed); preferred over ``text``.

        Raises:
            ParseError: empty output, control tokens out of place, a malformed ``[TOOL_CALLS]`` (not a
                JSON list of ``{"name", "arguments"}``; a missing ``[ARGS]``), arguments that are not
                a JSON object, an unknown tool, a call over ``MAX_CALL_CHARS``; nothing else.
        """
        try:
            if ids is None:
                if not isinstance(text, str):
                    raise ParseError("output is not text")
                ids = self.vocab.encode_unlocked(text)
            return parse_turn_ids(self.vocab, [int(i) for i in ids], None if tool_names is None else set(tool_names), self.thinks, self._shape)
        except ParseError:
            raise
        except (*_MC_ERRORS, IndexError, RecursionError) as e:
            raise ParseError(f"malformed output ({type(e).__name__}: {str(e)[:80]})") from None

    # -- the start-up probe ----------------------------------------------------------------------------
    def probe(self) -> TemplateReport:
        """Check exact deltas against mistral-common's encoding of whole conversations. Blocking.

        Cases: a user message after a plain / tool-call / two-call (/ thinking, v13 with [THINK]
        / text-and-call, v7+) assistant turn, and one or two tool results after a turn with as
        many calls. ``delta_independent``: :meth:`delta_ids` equals what mistral-common encodes for
        the message after that real turn (conversation without tools and system prompt, whose
        placement moves); a failure is fatal. ``prefix_stable``: with the tools and a system prompt,
        the encoding of the history alone is a prefix of the encoding with the message (False up
        to v11 for user messages: the tools, and in v3 the system prompt, move to the last
        [INST]). ``prefix_stable["call_ids_as_sampled"]``: a call turn as the model writes it
        (v3-v11 with its id), read by :meth:`parse_turn` and kept as the loop keeps it
        (``ParsedTurn.to_message``), is what a re-encoding writes (required: False is fatal, the
        re-encoded call and its result would carry another id). ``prefix_stable
        ["call_without_id_as_sampled"]`` (v3-v11): the same for a call written without an id
        (False: the re-encoding inserts one).
        """
        rep = TemplateReport(end_of_turn=self.end_of_turn, turn_tail=self.turn_tail)
        name = ((self.tools or [_PROBE_TOOL])[0].get("function") or {}).get("name", "lookup")
        system, user = {"role": "system", "content": "You are a helpful agent."}, {"role": "user", "content": "Hello."}

        def turn(content: str | None, n_calls: int = 0, reasoning: str | None = None) -> dict:
            calls = [{"id": f"call_1-{i}" if i else "call_1", "type": "function", "function": {"name": name, "arguments": f'{{"id": "{i}"}}'}}
                     for i in range(n_calls)]
            return {"role": "assistant", "content": content, "tool_calls": calls, **({"reasoning_content": reasoning} if reasoning else {})}

        shapes = {"plain": turn("Sure."), "tool_call": turn(None, 1), "tool_calls_2": turn(None, 2)}
        if self._v7:
            shapes["text_and_call"] = turn("Let me look.", 1)
        if self.thinks:
            shapes["thinking"] = turn("Sure.", 0, "reasoning")
        result = {"role": "tool", "content": '{"ok": true}'}
        nexts = {"user": [{"role": "user", "content": "Next question?"}], "tool": [{**result, "tool_call_id": "call_1"}],
                 "tools_2": [{**result, "tool_call_id": "call_1"}, {"role": "tool", "content": "done", "tool_call_id": "call_1-1"}]}
        try:
            with self._lock:
                for nk, new in nexts.items():
                    mine = self._delta(new)
                    for ak, asst in shapes.items():
                        if nk != "user" and len(asst["tool_calls"]) != len(new):
                            continue
                        case = f"{nk}_after_{ak}"
                        head = self._encode([system, user, asst], True, True) + self.eot_ids
                        rep.prefix_stable[case] = self._encode([system, user, asst, *new], True)[:len(head)] == head
                        head = self._encode([user, asst], False, True) + self.eot_ids
                        full = self._encode([user, asst, *new], False)
                        rep.delta_independent[case] = full[:len(head)] == head and full[len(head):] == mine
                        if not rep.delta_independent[case]:
                            rep.problems.append(f"mistral-common encodes a {nk} message differently after an assistant turn of kind "
                                                f"'{ak}': appending deltas cannot reproduce it exactly")
                    rep.canonical_boundary[nk] = all(v for k, v in rep.delta_independent.items() if k.startswith(f"{nk}_after_"))
                    rep.verbatim_roles[nk] = False  # every delta is encoded by mistral-common
            # a call as the model writes it (v3-v11: with its id), read and kept as the loop keeps it
            sampled = self.generated_ids("", [(name, {"id": "0"})], [_PROBE_CALL_ID] if self.writes_call_ids else None)
            kept = self.parse_turn("", None, sampled).to_message("call_1")
            bare = self.generated_ids("", [(name, {"id": "0"})])
            with self._lock:
                history = self._encode([user, kept], False, True)
                rep.prefix_stable["call_ids_as_sampled"] = history[-len(sampled):] == sampled
                if self.writes_call_ids:
                    history = self._encode([user, turn(None, 1)], False, True)
                    rep.prefix_stable["call_without_id_as_sampled"] = history[-len(bare):] == bare
            if not rep.prefix_stable["call_ids_as_sampled"]:
                rep.problems.append("a call re-encodes with another id than the one the model wrote with it")
        except (TemplateError, ParseError) as e:
            rep.problems.append(str(e))
        return rep


def mistral_format(tokenizer: Any, tools: list[dict] | None = None, template_kwargs: dict[str, Any] | None = None) -> MistralFormat:
    """The ``mistral`` format's factory (:class:`MistralFormat`).

    Raises:
        TemplateError: see :class:`MistralFormat`.
    """
    return MistralFormat(tokenizer, tools=tools, template_kwargs=template_kwargs)


FORMATS = (
    FormatInfo(
        name="mistral", factory=mistral_format, detect=detect,
        detection="a mistral-common tokenizer (MistralTokenizer, MistralCommonBackend) or special tokens [INST] and [TOOL_CALLS]",
        vocabulary="mistral", renderer="mistral-common (ChatCompletionRequest.from_openai + MistralTokenizer.encode_chat_completion)",
        tested=True,
        note=("builtin:mistral is tekken_240911.json (tokenizer v3); v7, v11, v13+ from a model's own tekken.json; "
              "several calls per turn; needs the extra 'families' (mistral-common)"),
        requires=(("mistral_common", "mistral-common"),), extra="families",
    ),
)
