"""A :class:`~rollout.core.formats.protocol.ChatFormat` over a Renderer of the PyPI package ``renderers``.

``renderers`` (Prime Intellect; ``renderers/base.py``) renders a model family's conversation to
token ids in Python, parses completion ids back (``parse_response``) and extends a rollout without
re-rendering sampled tokens (``bridge_to_next_turn``). :class:`RenderersFormat` adapts one Renderer
to the episode loop (docs/design.md, invariant 1):

* :meth:`~RenderersFormat.prompt_ids`: the renderer's ids of ``[system, user]``, the tools and the
  generation prompt.
* :meth:`~RenderersFormat.delta_ids`: the ids after an assistant turn closed by ``eot_ids``,
  through the next generation prompt, computed WITHOUT the real history: the renderer's bridge
  from a fixed dummy conversation (system, user, one assistant turn as the renderer renders it;
  with a tool schema, as an episode has), keeping the ids after that dummy prior. Where the
  renderer refuses a bridge (DeepSeek V4 refuses several tool results at once: its full render
  sorts them by call id), the dummy conversation is rendered whole with the messages, and the ids
  after the dummy turn are kept if the dummy turn is an unchanged prefix there.
* :meth:`~RenderersFormat.parse_turn`: ``parse_response`` on the turn's ids, mapped to
  :class:`ParsedTurn`; anything wrong is a :class:`ParseError`, never another exception.
* :meth:`~RenderersFormat.probe`: the deltas do not depend on the turn they follow; ``prompt +
  generated + eot + delta`` is the renderer's full render where it declares itself prefix-stable;
  the renderer's own rendering of calls parses back to them.

The family modules (:mod:`~rollout.core.formats.qwen35`, :mod:`~rollout.core.formats.deepseek_v4`)
configure their renderer with :func:`renderer_config`, so that bridges are allowed across user
turns (renderers' ``thinking_retention="all"``), and import ``renderers`` in their factories: this
module imports without it.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from rollout.core.formats.codec import gil_free_codec
from rollout.core.formats.hermes import MAX_CALL_CHARS
from rollout.core.formats.protocol import MissingPackageError, ParsedTurn, ParseError, TemplateError, TemplateReport, ToolCall
from rollout.core.formats.registry import ChatFormatFactory, FormatInfo
from rollout.core.formats.template import INLINE_MAX_IDS

__all__ = ["PROBE_TOOLS", "FamilySyntax", "RenderersFormat", "import_renderers", "make_renderer", "renderer_config", "renderers_format_info"]

logger = logging.getLogger(__name__)

_SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
_USER = {"role": "user", "content": "Hello."}
_REASONING = "The user greets me."
_CALLS = [{"id": "call_a", "type": "function", "function": {"name": "lookup", "arguments": {"order_id": "#W1", "count": 2}}},
          {"id": "call_b", "type": "function", "function": {"name": "lookup", "arguments": {"order_id": "#W2", "count": 1}}}]
# The shapes of the assistant turn a delta may follow (the fixed prior is the first of the first
# two whose rendering extends the generation prompt token for token), and the messages that follow.
_ASSISTANTS: dict[str, dict[str, Any]] = {
    "plain": {"role": "assistant", "content": "Sure."},
    "thinking": {"role": "assistant", "content": "Sure.", "reasoning_content": _REASONING},
    "tool_calls": {"role": "assistant", "content": "", "tool_calls": _CALLS},
    "thinking_tool_calls": {"role": "assistant", "content": "Let me look.", "reasoning_content": _REASONING, "tool_calls": _CALLS},
}
_NEXTS: dict[str, list[dict[str, Any]]] = {
    "user": [{"role": "user", "content": "Next question?"}],
    "tool": [{"role": "tool", "content": '{"ok": true}'}],
    "tools": [{"role": "tool", "content": '{"order": "#W1"}'}, {"role": "tool", "content": '{"order": "#W2"}'}],
}  # and the tool schema the dummy conversations carry (the probe's calls are read with it):
PROBE_TOOLS = [{"type": "function", "function": {
    "name": "lookup", "description": "Look up an order.",
    "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}, "count": {"type": "integer"}}, "required": ["order_id"]}}}]


@dataclass(frozen=True)
class FamilySyntax:
    """What the adapter needs to know about a family beyond its renderer.

    Attributes:
        name: the chat format's name (e.g. ``"qwen3.6"``), for messages.
        call_hint: one sentence: how to reply or call a tool (:attr:`ChatFormat.call_hint`).
        stray_markers: texts that must not be left in a reply's visible content once the parser has
            taken out reasoning and calls (a call tag outside a call); each is a :class:`ParseError`.
        untyped_values_are_text: whether a value that is not JSON is text when the tool declares no
            schema (Qwen3.5's XML calls write strings unquoted, so renderers' ``invalid_json`` then
            means a string; DeepSeek V4 marks strings with ``string="true"``: always an error).
    """

    name: str
    call_hint: str
    stray_markers: tuple[str, ...] = ()
    untyped_values_are_text: bool = False


def import_renderers() -> Any:
    """The ``renderers`` module. Raises :class:`~rollout.core.formats.protocol.MissingPackageError`
    (a :class:`TemplateError`, with the pip line) when it is not installed."""
    try:
        import renderers
    except ImportError:  # the optional extra
        raise MissingPackageError("renderers") from None
    return renderers


def renderer_config(chat_format: str, config_class: str, template_kwargs: dict[str, Any] | None, flag: str, flag_default: bool,
                    defaults: dict[str, Any] | None = None) -> Any:
    """The typed renderer config ``renderers.<config_class>``: the format's ``defaults`` with
    ``template_kwargs`` (the template's kwargs, e.g. ``enable_thinking``) over them, and bridges
    allowed across user turns (``thinking_retention="all"``, which changes no full render).
    ``flag``, the config's flag for earlier reasoning (``preserve_thinking``, ``drop_thinking``),
    is dropped when it holds its default ``flag_default``: set explicitly it would imply
    ``thinking_retention="tool_cycle"``, and renderers refuses the two together
    (``configs._reject_thinking_retention_conflict``).

    Raises:
        TemplateError: ``renderers`` is missing, or the config refuses a kwarg (the message names
            ``chat_format``, the config and the kwargs given).
    """
    kwargs = {**(defaults or {}), **(template_kwargs or {})}
    if flag in kwargs and kwargs[flag] is flag_default:
        kwargs.pop(flag)
    try:
        return getattr(import_renderers(), config_class)(**kwargs, thinking_retention="all")
    except ValueError as e:
        raise TemplateError(f"chat format {chat_format} ({config_class}): template kwargs {sorted(template_kwargs or {})} "
                            f"refused: {e}") from None


def make_renderer(tokenizer: Any, config: Any) -> Any:
    """``renderers.create_renderer(tokenizer, config)``. Raises :class:`TemplateError` when the
    renderer refuses the tokenizer (a special token of the family missing) or the config."""
    try:
        return import_renderers().create_renderer(tokenizer, config)
    except TemplateError:
        raise
    except Exception as e:  # an assertion on a missing special token, a config the renderer refuses
        raise TemplateError(f"renderers cannot render {getattr(config, 'name', config)!r} with tokenizer "
                            f"{getattr(tokenizer, 'name_or_path', '')!r}: {e!r}") from None


def _declares(tools: list[dict] | None, name: str) -> bool:
    """Whether ``tools`` declares parameters for the tool ``name``."""
    for tool in tools or ():
        spec = tool.get("function", tool) if isinstance(tool, dict) else None
        if isinstance(spec, dict) and spec.get("name") == name:
            params = spec.get("parameters")
            return isinstance(params, dict) and isinstance(params.get("properties"), dict)
    return False


class RenderersFormat:
    """A :class:`~rollout.core.formats.protocol.ChatFormat` over a ``renderers`` Renderer (see the module docstring).

    Args: ``renderer`` (one that allows bridges across user turns), the ``tokenizer`` it encodes
    with, the family's :class:`FamilySyntax`, and ``tools`` (OpenAI-style schemas, rendered into
    the prompt and read for argument types).

    Raises:
        TemplateError: no rendering of a one-turn conversation extends the generation prompt and
            ends with a stop token.
    """

    def __init__(self, renderer: Any, tokenizer: Any, syntax: FamilySyntax, tools: list[dict] | None = None):
        self.renderer = renderer
        self.tokenizer = tokenizer
        self.syntax = syntax
        self.call_hint = syntax.call_hint
        self.tools = list(tools) if tools else None
        # every call into the renderer or the tokenizer holds this lock: a Rust tokenizer shared by
        # threads fails with "Already borrowed" when calls overlap (as in ChatTemplate)
        self._lock = threading.RLock()
        self._codec = gil_free_codec(tokenizer)
        try:
            with self._lock:
                self._stops = {int(i) for i in renderer.get_stop_token_ids()}
            # the fixed prior: the first of these turns whose rendering extends the prompt token for token
            turns = [(k, self._turn_ids(_ASSISTANTS[k], PROBE_TOOLS)) for k in ("plain", "thinking")]
        except TemplateError:
            raise
        except Exception as e:
            raise TemplateError(f"chat format {syntax.name}: the renderer cannot render a one-turn conversation: {e!r}") from None
        kind, turn = next(((k, t) for k, t in turns if t is not None and t[2]), (None, None))
        if turn is None:
            raise TemplateError(f"chat format {syntax.name}: the renderer's rendering of an assistant turn does not extend "
                                "its generation prompt and close with a stop token; its deltas cannot be exact")
        self.eot_ids: list[int] = [turn[1][-1]]
        self._tail_ids: list[int] = turn[3]
        self._prior = ([_SYSTEM, _USER, _ASSISTANTS[kind]], turn[0], turn[1])

    def _render(self, messages: list[dict], add_generation_prompt: bool, tools: list[dict] | None) -> list[int]:
        with self._lock:
            return list(self.renderer.render_ids(list(messages), tools=tools, add_generation_prompt=add_generation_prompt))

    def encode(self, text: str) -> list[int]:
        """Ids of ``text`` (special tokens in it become their ids; no BOS). Blocking."""
        with self._lock:
            if self._codec is not None:
                return self._codec.encode(text)
            return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids``, special tokens kept. Blocking."""
        with self._lock:
            if self._codec is not None:
                return self._codec.decode(list(ids))
            return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def try_decode_now(self, ids: list[int]) -> str | None:
        """:meth:`decode` at once with the Rust codec for at most ``INLINE_MAX_IDS`` ids when the lock is free; else None."""
        if self._codec is None or len(ids) > INLINE_MAX_IDS or not self._lock.acquire(blocking=False):
            return None
        try:
            return self._codec.decode_holding_gil(list(ids))
        finally:
            self._lock.release()

    def try_delta_ids_now(self, messages: list[dict]) -> list[int] | None:
        """Always None: a delta is the renderer's bridge, which the loop runs in a thread."""
        return None

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        """The renderer's ids of ``messages`` (system, first user turn), the tools and the generation
        prompt. Blocking. Raises :class:`TemplateError` when the renderer cannot render them."""
        try:
            return self._render(messages, True, self.tools)
        except Exception as e:
            raise TemplateError(f"chat format {self.syntax.name}: cannot render the prompt: {e!r}") from None

    def delta_ids(self, messages: list[dict]) -> list[int]:
        """Ids after an assistant turn closed by :attr:`eot_ids`, through the next generation
        prompt, for ``messages`` (tool results and/or user turns; several tool results are one
        delta), from the fixed dummy prior (module docstring). Blocking. Raises
        :class:`TemplateError` for no messages, an assistant one, or ones the renderer cannot append."""
        if not messages or any(m.get("role") == "assistant" for m in messages):
            raise TemplateError("a delta needs non-assistant messages (tool results, user turns)")
        return self._delta_after(self._prior, messages, PROBE_TOOLS)

    def _delta_after(self, prior: tuple[list[dict], list[int], list[int]], messages: list[dict], tools: list[dict] | None) -> list[int]:
        """The ids ``messages`` add after ``prior`` = ``(its messages, prompt ids, sampled ids through
        the end-of-turn)``: the renderer's bridge, or where it refuses one, its full render of
        ``prior`` + ``messages`` when that keeps the prior's ids as they are."""
        msgs, prompt, completion = prior
        base = prompt + completion
        try:
            with self._lock:
                bridged = self.renderer.bridge_to_next_turn(list(prompt), list(completion), list(messages), tools=tools)
            if bridged is not None:
                ids = list(bridged.token_ids)
                if ids[:len(base)] != base:
                    raise TemplateError(f"chat format {self.syntax.name}: the renderer's bridge rewrote the turn it extends")
                return ids[len(base):]
            full = self._render(msgs + list(messages), True, tools)
        except TemplateError:
            raise
        except Exception as e:
            raise TemplateError(f"chat format {self.syntax.name}: cannot render {[m.get('role') for m in messages]}: {e!r}") from None
        if full[:len(base)] != base:
            raise TemplateError(f"chat format {self.syntax.name}: the renderer neither bridges {[m.get('role') for m in messages]} "
                                "nor renders them after an assistant turn without changing it")
        return full[len(base):]

    def ends_turn(self, generated_ids: list[int]) -> bool:
        """Whether generated ids end with :attr:`eot_ids`."""
        n = len(self.eot_ids)
        return len(generated_ids) >= n and list(generated_ids[-n:]) == self.eot_ids

    def parse_turn(self, text: str, tool_names: Iterable[str] | None = None, ids: list[int] | None = None) -> ParsedTurn:
        """Read one assistant turn with the renderer's ``parse_response`` on ``ids`` (the generated
        ids, end-of-turn removed; ``text`` is encoded only when they are None). ``tool_names``: the
        tools on offer (None: no check).

        Raises:
            ParseError (and nothing else): no content and no call, unclosed reasoning, an unclosed or
                malformed call, a value invalid for its type, arguments not an object, an unknown
                tool, a call marker outside a call.
        """
        try:
            if ids is None:
                if not isinstance(text, str):
                    raise ParseError("output is not text")
                ids = self.encode(text)
            return self._parse(list(ids), self.tools, tool_names)
        except ParseError:
            raise
        except Exception as e:  # the parser met something it did not expect: the model's doing
            logger.debug("chat format %s: parse_response failed: %r", self.syntax.name, e)
            raise ParseError(f"unreadable output ({type(e).__name__})") from None

    def _parse(self, ids: list[int], tools: list[dict] | None, tool_names: Iterable[str] | None) -> ParsedTurn:
        with self._lock:
            parsed = self.renderer.parse_response(ids, tools=tools, prompt_ids=list(self._prior[1]))
        if parsed.reasoning_complete is False:
            raise ParseError("unclosed reasoning block: close it before replying or calling a tool")
        content = (parsed.content or "").strip()
        for marker in self.syntax.stray_markers:
            if marker in content:
                raise ParseError(f"{marker!r} outside a well-formed tool call or reasoning block")
        names = None if tool_names is None else set(tool_names)
        calls = tuple(self._call(tc, tools, names) for tc in parsed.tool_calls)
        if not content and not calls:
            raise ParseError("empty response: reply to the user or call a tool")
        return ParsedTurn(content=content, tool_calls=calls, reasoning=parsed.reasoning_content)

    def _call(self, tc: Any, tools: list[dict] | None, names: set[str] | None) -> ToolCall:
        """One renderers ``ParsedToolCall`` as a :class:`ToolCall`, or a ParseError."""
        status = str(getattr(tc.status, "value", tc.status))
        name = tc.name
        if len(tc.raw or "") > MAX_CALL_CHARS:
            raise ParseError(f"tool call longer than {MAX_CALL_CHARS} characters")
        if status == "unclosed_block":
            raise ParseError("unclosed tool call")
        if status == "missing_name" or not isinstance(name, str) or not name:
            raise ParseError("tool call without a tool name")
        if status == "malformed_structure":
            raise ParseError(f"malformed tool call to {name!r}")
        if status == "unknown_tool" or (names is not None and name not in names):
            raise ParseError(f"unknown tool {name!r}")
        args = tc.arguments
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except (ValueError, RecursionError):
                raise ParseError(f"arguments of {name!r} are not a JSON object") from None
        args = {} if args is None else args
        if not isinstance(args, dict):
            raise ParseError(f"arguments of {name!r} must be a JSON object")
        if status == "invalid_json" and not (self.syntax.untyped_values_are_text and not _declares(tools, name)):
            raise ParseError(f"tool call to {name!r}: an argument value is not valid JSON for its declared type, "
                             "or the parameter is not declared")
        if status not in ("ok", "invalid_json"):
            raise ParseError(f"unreadable tool call to {name!r} ({status})")
        return ToolCall(name=name, arguments=args)

    def assistant_text(self, content: str, calls: list[tuple[str, dict]], reasoning: str | None = None) -> str:
        """The text a model of the family generates after the generation prompt for a turn with
        ``content``, ``calls`` ((name, arguments), in order) and ``reasoning``, end-of-turn left
        out: the renderer's text of the turn minus its prompt's. Blocking.

        Raises:
            TemplateError: the rendered turn does not extend the prompt's text.
        """
        asst: dict[str, Any] = {"role": "assistant", "content": content}
        if reasoning is not None:
            asst["reasoning_content"] = reasoning
        if calls:
            asst["tool_calls"] = [{"id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": a}}
                                  for i, (n, a) in enumerate(calls)]
        head = self.decode(self._render([_SYSTEM, _USER], True, self.tools))
        text = self.decode(self._render([_SYSTEM, _USER, asst], False, self.tools))
        eot = self.decode(self.eot_ids)
        end = text.rfind(eot)
        if not text.startswith(head) or end < len(head):
            raise TemplateError(f"chat format {self.syntax.name}: the rendered assistant turn does not extend its prompt")
        return text[len(head):end]

    def _turn_ids(self, asst: dict, tools: list[dict] | None) -> tuple[list[int], list[int], bool, list[int]] | None:
        """``(prompt, generated ids through the last stop token, exact, ids after it)`` of ``asst``
        after a one-user prompt: cut from the full render (exact) or the ids of the text it adds
        there; None when it cannot follow the prompt (reasoning after a closed one) or never stops."""
        prompt = self._render([_SYSTEM, _USER], True, tools)
        full = self._render([_SYSTEM, _USER, asst], False, tools)
        exact = full[:len(prompt)] == prompt
        if exact:
            gen = full[len(prompt):]
        else:
            head, text = self.decode(prompt), self.decode(full)
            if not text.startswith(head):
                return None
            gen = self.encode(text[len(head):])
        ends = [i for i, t in enumerate(gen) if t in self._stops]
        return (prompt, gen[:ends[-1] + 1], exact, gen[ends[-1] + 1:]) if ends else None

    def probe(self) -> TemplateReport:
        """A :class:`TemplateReport` (``ok`` False when the format cannot be kept exact). Blocking.

        Per case (a user turn, one or two tool results, after a plain, a reasoning, a tool-calls and
        a reasoning + tool-calls turn): the delta after that turn equals :meth:`delta_ids` (fatal
        if not); where the turn's ids are the renderer's own, ``prompt + turn + delta`` equals its
        full render (``prefix_stable``; fatal where the renderer declares ``is_prefix_stable``).
        The renderer's own turns with reasoning and calls must parse back to them (fatal)."""
        rep = TemplateReport(end_of_turn=self.decode(self.eot_ids), turn_tail=self.decode(self._tail_ids))
        try:
            self._probe(rep)
        except (TemplateError, ParseError) as e:
            rep.problems.append(str(e))
        except Exception as e:  # the renderer failed on the probe's own conversation
            rep.problems.append(f"chat format {self.syntax.name}: the renderer failed while probing: {e!r}")
        return rep

    def _probe(self, rep: TemplateReport) -> None:
        declared_stable = bool(getattr(self.renderer, "is_prefix_stable", False))
        turns = {k: self._turn_ids(a, PROBE_TOOLS) for k, a in _ASSISTANTS.items()}
        own = {k: self._turn_ids(a, self.tools) for k, a in _ASSISTANTS.items()}  # with the format's own tools
        for nk, new in _NEXTS.items():
            ref = self.delta_ids(new)
            for ak, asst in _ASSISTANTS.items():
                if turns[ak] is None or turns[ak][1][-len(self.eot_ids):] != self.eot_ids:
                    continue
                prompt, gen = turns[ak][:2]
                case = f"{nk}_after_{ak}"
                try:
                    same = self._delta_after(([_SYSTEM, _USER, asst], prompt, gen), new, PROBE_TOOLS) == ref
                except TemplateError:
                    same = False
                rep.delta_independent[case] = same
                if not same:
                    rep.problems.append(f"chat format {self.syntax.name}: the delta of {nk} after an assistant turn of kind "
                                        f"'{ak}' differs from the fixed one: appending deltas cannot be exact")
                if own[ak] is not None and own[ak][2]:
                    prompt, gen = own[ak][:2]
                    stable = self._render([_SYSTEM, _USER, asst] + new, True, self.tools) == prompt + gen + ref
                    rep.prefix_stable[case] = stable
                    if declared_stable and not stable:
                        rep.problems.append(f"chat format {self.syntax.name}: the renderer declares itself prefix-stable, but "
                                            f"prompt + turn + delta differs from its full render ({case})")
            head, tail = self.decode(self._prior[2]), self.decode(ref)
            rep.canonical_boundary[nk] = self.encode(head) + self.encode(tail) == self.encode(head + tail)
        for ak in ("thinking", "tool_calls", "thinking_tool_calls"):
            if turns[ak] is None:
                continue
            gen = turns[ak][1][:-len(self.eot_ids)]
            want = _ASSISTANTS[ak]
            want_calls = [(c["function"]["name"], c["function"]["arguments"]) for c in want.get("tool_calls", [])]
            for how, got in (("ids", self._parse(gen, PROBE_TOOLS, None)),
                             ("text", self._parse(self.encode(self.decode(gen)), PROBE_TOOLS, None))):
                calls = [(c.name, c.arguments) for c in got.tool_calls]
                reasoning_ok = got.reasoning is None or _REASONING not in self.decode(gen) or got.reasoning.strip() == _REASONING
                if calls != want_calls or got.content != want["content"] or not reasoning_ok:
                    rep.problems.append(f"chat format {self.syntax.name}: the renderer's own '{ak}' turn parses back (from {how}) "
                                        f"as {got!r}, not as it was rendered")


def renderers_format_info(name: str, factory: ChatFormatFactory, detect: Callable[[Any], bool], *, detection: str, vocabulary: str,
                          renderer: str, note: str, vocabulary_package: tuple[str, str] | None = None) -> FormatInfo:
    """The registry entry of a family rendered by ``renderers`` (:class:`RenderersFormat`): its
    :class:`~rollout.core.formats.registry.FormatInfo` with ``renderer`` shown as
    ``renderers.<renderer>`` (the class, then how it renders), ``tested`` (the suite runs it
    against its ``builtin:<vocabulary>``, shipped on PyPI), ``note`` followed by
    ``; needs the extra 'families' (renderers)``, and ``requires`` renderers and
    ``vocabulary_package`` (``(import name, PyPI name)`` of the package shipping the vocabulary,
    where one does), both installed by the ``families`` extra."""
    return FormatInfo(name=name, factory=factory, detect=detect, detection=detection, vocabulary=vocabulary,
                      renderer=f"renderers.{renderer}", tested=True, note=f"{note}; needs the extra 'families' (renderers)",
                      requires=(("renderers", "renderers"),) + ((vocabulary_package,) if vocabulary_package else ()), extra="families")
