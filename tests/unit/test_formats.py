"""The chat-format seam: the registry of formats and its first member, ``hermes`` (the tokenizer's
own chat template, exact delta tokenization, with the Qwen3 / Hermes ``<tool_call>`` parser)."""

from __future__ import annotations

import pytest

from rollout.core.formats import (
    DEFAULT_CHAT_FORMAT,
    ChatFormat,
    ChatTemplate,
    ParsedTurn,
    ParseError,
    ToolCall,
    chat_formats,
    get_chat_format,
    parse_turn,
    register_chat_format,
)
from rollout.core.formats import registry as registry_module

TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Look up an order.",
          "parameters": {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}}}]
OPENING = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Where is my order #W1?"}]
FOLLOWS = [  # what answers an assistant turn in an episode: tool results and user turns
    {"role": "tool", "content": '{"status": "shipped", "items": [{"price": 54.04}]}'},
    {"role": "user", "content": "Thanks! Can you also check #W2?"},
    {"role": "tool", "content": "  padded \n\n"},
    {"role": "user", "content": "Ünïcödé 中文 " + "word " * 200},
]
TURNS = [
    '<tool_call>\n{"name": "lookup", "arguments": {"id": "W1"}}\n</tool_call>',
    "<think>\nThe order shipped.\n</think>\n\nIt has shipped. Anything else?<|im_end|>",
    "<tool_call>\n{\"name\": \"lookup\", \"arguments\": \"not json\"}\n</tool_call>",  # a parse error
    "",  # empty: a parse error
]


@pytest.fixture
def registry(monkeypatch):
    """The registry, restored after the test (registrations made in it do not leak)."""
    monkeypatch.setattr(registry_module, "_FORMATS", dict(registry_module._FORMATS))
    return registry_module


def test_hermes_is_registered_and_the_default():
    assert DEFAULT_CHAT_FORMAT == "hermes" and "hermes" in chat_formats()
    assert chat_formats() == tuple(sorted(chat_formats()))


def test_an_unknown_format_names_the_registered_ones(registry):
    register_chat_format("toy", lambda tokenizer, tools=None, template_kwargs=None: ChatTemplate(tokenizer, tools, template_kwargs))
    with pytest.raises(KeyError, match=r"unknown chat format 'qwen9'; registered: \['hermes', 'toy'\]"):
        get_chat_format("qwen9")


def test_registration_is_refused_twice_and_for_bad_names(registry):
    def factory(tokenizer, tools=None, template_kwargs=None):
        return ChatTemplate(tokenizer, tools, template_kwargs)

    with pytest.raises(ValueError, match="'hermes' is already registered"):
        register_chat_format("hermes", factory)
    register_chat_format("toy", factory)
    assert get_chat_format("toy") is factory and "toy" in chat_formats()
    with pytest.raises(ValueError, match="'toy' is already registered"):
        register_chat_format("toy", factory)
    assert get_chat_format("toy") is factory  # the first registration stands
    with pytest.raises(ValueError, match="non-empty name"):
        register_chat_format("", factory)
    with pytest.raises(ValueError, match="must be callable"):
        register_chat_format("broken", "not a factory")
    assert "broken" not in chat_formats()


@pytest.mark.parametrize("template_kwargs", [{}, {"enable_thinking": False}])
def test_hermes_gives_exactly_what_todays_chat_template_gives(tokenizer, template_kwargs):
    fmt = get_chat_format("hermes")(tokenizer, tools=TOOLS, template_kwargs=template_kwargs)
    today = ChatTemplate(tokenizer, TOOLS, template_kwargs)
    assert isinstance(fmt, ChatFormat)
    assert fmt.probe().summary() == today.probe().summary() and fmt.probe().ok
    assert fmt.tokenizer is tokenizer and fmt.eot_ids == today.eot_ids
    assert fmt.prompt_ids(OPENING) == today.prompt_ids(OPENING)
    for msg in FOLLOWS:
        assert fmt.delta_ids([msg]) == today.delta_ids([msg]), msg
        assert fmt.try_delta_ids_now([msg]) == today.try_delta_ids_now([msg]), msg
    assert fmt.delta_ids(FOLLOWS[:2]) == today.delta_ids(FOLLOWS[:2])
    for text in TURNS:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert fmt.ends_turn(ids) == today.ends_turn(ids)
        assert fmt.decode(ids) == today.decode(ids) == fmt.try_decode_now(ids)
        try:
            want: ParsedTurn | str = parse_turn(text, ["lookup"])
        except ParseError as e:
            want = f"ParseError: {e}"
        try:
            got: ParsedTurn | str = fmt.parse_turn(text, ["lookup"])
        except ParseError as e:
            got = f"ParseError: {e}"
        assert got == want, text
    assert fmt.parse_turn(TURNS[0], ["lookup"]).tool_call == ToolCall("lookup", {"id": "W1"})
    with pytest.raises(ParseError, match="unknown tool"):
        fmt.parse_turn(TURNS[0], ["other"])


def test_a_family_on_the_tokenizers_template_needs_only_its_parser(tokenizer, registry):
    """A format whose tokenizer's chat template gives exact deltas is a ChatTemplate with its own
    parser: registered by name, built by the same call the worker makes."""
    def bracket_calls(text, tool_names=None):  # a toy syntax: [call name]
        if text.startswith("[call ") and text.endswith("]"):
            return ParsedTurn(content="", tool_call=ToolCall(text[6:-1]))
        raise ParseError("not a [call ...]")

    register_chat_format("bracket", lambda tokenizer, tools=None, template_kwargs=None:
                         ChatTemplate(tokenizer, tools, template_kwargs, parser=bracket_calls))
    fmt = get_chat_format("bracket")(tokenizer, tools=TOOLS, template_kwargs={})
    assert fmt.parse_turn("[call lookup]").tool_call == ToolCall("lookup")
    with pytest.raises(ParseError):
        fmt.parse_turn(TURNS[0])
    assert fmt.prompt_ids(OPENING) == get_chat_format("hermes")(tokenizer, tools=TOOLS).prompt_ids(OPENING)
