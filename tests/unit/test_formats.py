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
def registry():
    """The registry, restored after the test (registrations made in it do not leak)."""
    before = set(chat_formats())
    yield registry_module
    for name in set(chat_formats()) - before:
        registry_module.unregister_chat_format(name)


def test_hermes_is_registered_and_the_default():
    assert DEFAULT_CHAT_FORMAT == "hermes" and "hermes" in chat_formats()
    assert chat_formats() == tuple(sorted(chat_formats()))


def test_an_unknown_format_names_the_registered_ones(registry):
    register_chat_format("toy", lambda tokenizer, tools=None, template_kwargs=None: ChatTemplate(tokenizer, tools, template_kwargs))
    with pytest.raises(KeyError, match=r"^policy.chat_format: no chat format 'qwen9' is registered \(registered: hermes, .*toy; or auto"):
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
            return ParsedTurn(content="", tool_calls=(ToolCall(text[6:-1]),))
        raise ParseError("not a [call ...]")

    register_chat_format("bracket", lambda tokenizer, tools=None, template_kwargs=None:
                         ChatTemplate(tokenizer, tools, template_kwargs, parser=bracket_calls))
    fmt = get_chat_format("bracket")(tokenizer, tools=TOOLS, template_kwargs={})
    assert fmt.parse_turn("[call lookup]").tool_call == ToolCall("lookup")
    with pytest.raises(ParseError):
        fmt.parse_turn(TURNS[0])
    assert fmt.prompt_ids(OPENING) == get_chat_format("hermes")(tokenizer, tools=TOOLS).prompt_ids(OPENING)


# -- choosing a family: policy.chat_format, auto detection, python -m rollout formats ------------------


def test_auto_picks_hermes_for_qwen3_and_says_so(tokenizer, caplog):
    """``policy.chat_format=auto`` detects Qwen3's tokenizer (ChatML + <tool_call> template) as
    hermes, and the worker's resolution logs what it picked."""
    import logging

    from rollout.core.config import PolicyConfig
    from rollout.core.formats import detect_chat_format, resolve_chat_format
    from rollout.core.worker import chat_format_for

    assert detect_chat_format(tokenizer) == "hermes"
    assert resolve_chat_format("auto", tokenizer) == "hermes" and resolve_chat_format("hermes", tokenizer) == "hermes"
    with caplog.at_level(logging.INFO, logger="rollout.core.formats.registry"):
        assert chat_format_for(PolicyConfig(), tokenizer) == "hermes"
    assert "policy.chat_format=auto: chat format hermes" in caplog.text


def test_auto_refuses_a_tokenizer_no_family_recognises(registry):
    """A tokenizer no detector accepts is a TemplateError naming policy.chat_format, not a guess."""
    from rollout.core.config import PolicyConfig
    from rollout.core.formats import TemplateError, detect_chat_format
    from rollout.core.worker import chat_format_for

    class Bare:
        name_or_path = "some/unknown-model"
        chat_template = "{{ messages }}"
        all_special_tokens: list = []

    assert detect_chat_format(Bare()) is None
    with pytest.raises(TemplateError, match=r"policy.chat_format=auto: no registered chat format recognises .*set policy.chat_format"):
        chat_format_for(PolicyConfig(), Bare())


def test_a_detector_that_raises_does_not_stop_detection(registry, tokenizer):
    from rollout.core.formats import FormatInfo, detect_chat_format

    def boom(tok):
        raise RuntimeError("broken detector")

    register_chat_format(FormatInfo(name="broken", factory=lambda tokenizer, tools=None, template_kwargs=None: None, detect=boom))
    assert detect_chat_format(tokenizer) == "hermes"


def test_the_config_names_policy_chat_format_for_an_unknown_family():
    from rollout.core.config import ConfigError, load_config

    assert load_config(None, ["local.enabled=true"]).policy.chat_format == "auto"
    assert load_config(None, ["local.enabled=true", "policy.chat_format=hermes"]).policy.chat_format == "hermes"
    with pytest.raises(ConfigError, match=r"^policy.chat_format: no chat format 'qwen9' is registered \(registered: hermes, .*; or auto"):
        load_config(None, ["local.enabled=true", "policy.chat_format=qwen9"])
    with pytest.raises(ValueError, match="'auto' is policy.chat_format's detection"):
        register_chat_format("auto", lambda tokenizer, tools=None, template_kwargs=None: None)


def test_hermes_refuses_a_tokenizer_without_a_chat_template(tokenizer):
    from rollout.core.formats import TemplateError

    class NoTemplate:
        name_or_path = "bare"
        chat_template = None
        eos_token = tokenizer.eos_token

    with pytest.raises(TemplateError, match="has none; set policy.chat_format"):
        get_chat_format("hermes")(NoTemplate())


def test_python_m_rollout_formats_lists_every_family_as_json_and_as_a_table():
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True")
    out = subprocess.run([sys.executable, "-m", "rollout", "formats", "--json"], capture_output=True, text=True, env=env, timeout=120, check=True)
    rows = json.loads(out.stdout)
    by_name = {r["name"]: r for r in rows}
    assert set(by_name) == set(chat_formats())
    assert by_name["hermes"]["tokenizer"] == "builtin:qwen3" and by_name["hermes"]["tested"] is True
    for r in rows:
        assert {"name", "tokenizer", "tested", "renderer", "detection", "installed"} <= set(r)
        assert r["tokenizer"] is None or r["tokenizer"].startswith("builtin:")
    table = subprocess.run([sys.executable, "-m", "rollout", "formats"], capture_output=True, text=True, env=env, timeout=120, check=True).stdout
    assert table.splitlines()[0].split() [:2] == ["format", "tokenizer"]
    for name in chat_formats():
        assert any(line.startswith(name + " ") for line in table.splitlines())
