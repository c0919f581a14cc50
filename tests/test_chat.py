"""Delta tokenization against the real Qwen3 chat template."""

import pytest

from rollout.chat import ChatTemplate, TemplateError
from rollout.records import Trajectory

TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Look up an order.",
          "parameters": {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}}}]


def _run(chat, turns):
    """Simulate an episode: turns = [(assistant_text_as_generated, next_message or None)]."""
    msgs = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Where is my order?"}]
    traj = Trajectory(prompt_ids=chat.prompt_ids(msgs))
    requests = []
    for text, nxt in turns:
        gen = chat.encode(text)
        requests.append((list(traj.tokens), gen))
        traj.append_generated(gen, [-0.5] * len(gen))
        if not chat.ends_turn(gen):
            traj.append_context(chat.eot_ids)
        if nxt is not None:
            traj.append_context(chat.delta_ids([nxt]))
    return traj, requests


def test_probe_accepts_qwen3_and_reports_thinking_instability(tokenizer):
    rep = ChatTemplate(tokenizer, TOOLS).probe()
    assert rep.ok, rep.summary()
    assert rep.end_of_turn == "<|im_end|>" and rep.turn_tail == "\n"
    # Qwen3 drops <think> of earlier turns once a user turn follows: re-rendering is not stable.
    assert rep.prefix_stable["user_after_thinking"] is False
    assert all(rep.delta_independent.values())


def test_deltas_reproduce_the_canonical_rendering_without_thinking(tokenizer):
    chat = ChatTemplate(tokenizer, TOOLS)
    call = '<tool_call>\n{"name": "lookup", "arguments": {"id": "7"}}\n</tool_call><|im_end|>'
    traj, _ = _run(chat, [(call, {"role": "tool", "content": '{"status": "shipped"}'}),
                          ("It has shipped. Anything else?<|im_end|>", {"role": "user", "content": "No, thanks."})])
    full = [
        {"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Where is my order?"},
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "lookup", "arguments": {"id": "7"}}}]},
        {"role": "tool", "content": '{"status": "shipped"}'},
        {"role": "assistant", "content": "It has shipped. Anything else?"},
        {"role": "user", "content": "No, thanks."},
    ]
    canonical = chat.encode(tokenizer.apply_chat_template(full, tools=TOOLS, tokenize=False, add_generation_prompt=True))
    assert traj.tokens == canonical


def test_thinking_turns_stay_append_only(tokenizer):
    chat = ChatTemplate(tokenizer, TOOLS)
    think = "<think>\nThe user wants order 7.\n</think>\n\n"
    traj, requests = _run(chat, [
        (think + '<tool_call>\n{"name": "lookup", "arguments": {"id": "7"}}\n</tool_call>', {"role": "tool", "content": "shipped"}),
        (think + "It has shipped.<|im_end|>", {"role": "user", "content": "Thanks!"}),
        (think + "You're welcome.<|im_end|>", None),
    ])
    for inp, gen in requests:  # each request's input + output is a prefix of the final tokens
        assert traj.tokens[: len(inp) + len(gen)] == inp + gen
    text = chat.decode(traj.tokens)
    assert text.count("The user wants order 7.") == 3  # never dropped from history
    # The template itself would have dropped the earlier think blocks on re-rendering:
    rendered = tokenizer.apply_chat_template(
        [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Where is my order?"},
         {"role": "assistant", "content": think + "It has shipped."}, {"role": "user", "content": "Thanks!"}],
        tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert "The user wants order 7." not in rendered
    # Mask is 1 exactly on generated ids: the first stop-string turn got a masked <|im_end|>.
    n_gen = sum(len(g) for _, g in requests)
    assert sum(traj.loss_mask) == n_gen
    assert "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>" in text


def test_delta_starts_with_the_lost_newline(tokenizer):
    chat = ChatTemplate(tokenizer)
    text = chat.decode(chat.delta_ids([{"role": "user", "content": "hi"}]))
    assert text == "\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    off = ChatTemplate(tokenizer, template_kwargs={"enable_thinking": False})
    assert off.decode(off.delta_ids([{"role": "user", "content": "hi"}])).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


class _NoEOSTemplateTokenizer:
    """A tokenizer whose template never closes assistant turns with its EOS text."""

    eos_token = "</s>"

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]

    def apply_chat_template(self, messages, tools=None, tokenize=False, add_generation_prompt=False, **kw):
        out = "".join(f"[{m['role']}] {m['content']}\n" for m in messages)
        return out + ("[assistant] " if add_generation_prompt else "")


def test_probe_rejects_a_template_without_end_of_turn():
    chat = ChatTemplate(_NoEOSTemplateTokenizer())
    rep = chat.probe()
    assert not rep.ok and "EOS" in rep.problems[0]
    with pytest.raises(TemplateError):
        chat.delta_ids([{"role": "user", "content": "x"}])


def test_delta_from_probed_affixes_equals_the_rendered_delta(tokenizer, retail, airline):
    """Per turn, a one-message delta is prefix + content + suffix (no template rendering); it must
    be exactly what the template renders, for every kind of content an episode appends."""
    from rollout import bench_turns

    chat = ChatTemplate(tokenizer, retail.tool_schemas)
    rep = chat.probe()
    assert rep.verbatim_roles == {"user": True, "tool": True}, rep.summary()
    contents = ["hi", "  padded \n\n", "\n", "<tool_response>\nx\n</tool_response>", "###STOP###", "Ünïcödé 中文 🎉",
                "<|im_end|> inside", "{\"a\": [1, 2]}", "line\r\nbreaks\ttabs", "ROLLOUT-DELTA-MARK-5c1e"]
    for domain in (retail, airline):
        _, steps = bench_turns.build_conversation(domain, 30)
        contents += [s.follow["content"] for s in steps]
    for role in ("user", "tool"):
        for c in contents:
            msg = [{"role": role, "content": c}]
            assert chat.delta_text(msg) == chat._delta_text(msg), (role, c[:40])
    # What the affixes do not cover is rendered: several messages, blank content, extra keys.
    two = [{"role": "tool", "content": "a"}, {"role": "user", "content": "b"}]
    assert chat.delta_text(two) == chat._delta_text(two)
    assert chat.delta_text([{"role": "user", "content": "   "}]) == chat._delta_text([{"role": "user", "content": "   "}])
    named = [{"role": "tool", "name": "lookup", "content": "x"}]
    assert chat.delta_text(named) == chat._delta_text(named)
    assert chat.decode(chat.delta_ids([{"role": "tool", "content": "ok"}])) == (
        "\n<|im_start|>user\n<tool_response>\nok\n</tool_response><|im_end|>\n<|im_start|>assistant\n")


class _StrippingTemplateTokenizer(_NoEOSTemplateTokenizer):
    """A template that strips user contents and closes turns with its EOS text."""

    eos_token = "</s>"

    def apply_chat_template(self, messages, tools=None, tokenize=False, add_generation_prompt=False, **kw):
        out = "".join(f"[{m['role']}] {m['content'].strip() if m['role'] == 'user' else m['content']}</s>\n" for m in messages)
        return out + ("[assistant] " if add_generation_prompt else "")


def test_a_template_that_does_not_copy_contents_verbatim_is_rendered_every_turn():
    chat = ChatTemplate(_StrippingTemplateTokenizer())
    rep = chat.probe()
    assert rep.ok and rep.verbatim_roles == {"user": False, "tool": True}
    msg = [{"role": "user", "content": "  padded  "}]
    assert chat.delta_text(msg) == "\n[user] padded</s>\n[assistant] "
