"""Delta tokenization against the real Qwen3 chat template."""

import pytest

from rollout.core.formats import ChatTemplate, TemplateError
from rollout.core.trajectory import Trajectory

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
    from rollout.devtools.bench import turns as bench_turns

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


# -- the Rust codec (GIL-free batch calls) and the calls the event loop makes itself ------------
_TEXTS = [
    "",
    "plain words",
    '{"user_id": "mia_li_3668", "orders": ["#W2378156", "#W4073673"], "total": 1043.71}',
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
    "<tool_call>\n{\"name\": \"x\"}\n</tool_call><|im_end|><|endoftext|>",
    "多语言 Straße 😀 \t\n  \n\n trailing   ",
]


def test_rust_codec_gives_transformers_ids_and_text(tokenizer, retail):
    chat = ChatTemplate(tokenizer, retail.tool_schemas)
    assert chat.releases_gil  # Qwen3's fast tokenizer passes the codec check
    rendered = chat.render([{"role": "system", "content": retail.system_prompt},
                            {"role": "user", "content": "I want to return #W2378156."}], add_generation_prompt=True)
    for text in _TEXTS + [rendered]:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert chat.encode(text) == ids == chat._codec.encode_holding_gil(text)
        for cut in (ids, ids[: len(ids) // 2], ids[1:], ids[:1]):
            want = tokenizer.decode(cut, skip_special_tokens=False)
            assert chat.decode(cut) == want == chat._codec.decode_holding_gil(cut)
    # ids that split a multi-byte character decode as transformers decodes them (replacement chars)
    rare = tokenizer.encode("🦜🧬", add_special_tokens=False)  # byte-level pieces of 4-byte characters
    assert len(rare) > 2 and chat.decode(rare[:1]) == tokenizer.decode(rare[:1], skip_special_tokens=False)
    assert "\ufffd" in chat.decode(rare[:1])


def test_codec_falls_back_to_transformers_where_it_would_differ(tokenizer):
    class CleaningUp:  # a tokenizer that cleans up spaces on decode: the Rust call would not
        def __init__(self, inner):
            self._inner = inner
            self.eos_token = inner.eos_token
            self.clean_up_tokenization_spaces = True
            self.backend_tokenizer = inner.backend_tokenizer

        def __getattr__(self, name):
            return getattr(self._inner, name)

    chat = ChatTemplate(CleaningUp(tokenizer))
    assert not chat.releases_gil
    assert chat.encode("a , b") == tokenizer.encode("a , b", add_special_tokens=False)
    assert chat.try_decode_now([1, 2]) is None and chat.try_delta_ids_now([{"role": "user", "content": "hi"}]) is None

    class Lying(CleaningUp):  # a backend whose ids differ from the tokenizer's: the check catches it
        def __init__(self, inner):
            super().__init__(inner)
            self.clean_up_tokenization_spaces = False

        def encode(self, text, add_special_tokens=True):
            return self._inner.encode(text + " ", add_special_tokens=add_special_tokens)

    assert not ChatTemplate(Lying(tokenizer)).releases_gil


def test_inline_calls_equal_the_threaded_ones_and_never_wait(tokenizer):
    chat = ChatTemplate(tokenizer, TOOLS)
    for role in ("user", "tool"):
        msg = {"role": role, "content": '{"status": "shipped", "items": 3}'}
        assert chat.try_delta_ids_now([msg]) is None  # the role is not probed yet: rendering is a thread's job
        want = chat.delta_ids([msg])  # probes the role
        assert chat.try_delta_ids_now([msg]) == want
    gen = chat.encode('<tool_call>\n{"name": "lookup", "arguments": {"id": "7"}}\n</tool_call>')
    assert chat.try_decode_now(gen) == chat.decode(gen)
    # too long for the loop: left to a thread
    long_msg = {"role": "user", "content": "word " * 1000}
    assert chat.try_delta_ids_now([long_msg]) is None and chat.delta_ids([long_msg])
    assert chat.try_decode_now(list(range(1000, 1000 + 600))) is None
    # not one plain message: rendered, so left to a thread
    assert chat.try_delta_ids_now([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]) is None
    assert chat.try_delta_ids_now([{"role": "tool", "content": "x", "name": "lookup"}]) is None
    # the lock is held (a thread encoding a large prompt): the loop does not wait, it hands off
    with chat._lock:
        assert chat.try_decode_now(gen) is None
        assert chat.try_delta_ids_now([{"role": "user", "content": "ok"}]) is None


def test_prompt_ids_reuse_the_shared_prefix_and_equal_a_whole_tokenization(tokenizer, retail):
    chat = ChatTemplate(tokenizer, retail.tool_schemas)
    system = {"role": "system", "content": retail.system_prompt}
    def check(text):
        msgs = [system, {"role": "user", "content": text}]
        want = tokenizer.encode(chat.render(msgs, add_generation_prompt=True), add_special_tokens=False)
        assert chat.prompt_ids(msgs) == want, text

    for text in ["Hi! I want to exchange the keyboard in order #W2378156.", "  leading and trailing spaces \n\n",
                 "x", "東京 😀", "hi"]:
        check(text)
    assert len(chat._prefix_ids) == 1  # one system prompt + tools: one shared prefix, tokenized once
    (prefix,) = chat._prefix_ids
    assert prefix.startswith("<|im_start|>system\n") and prefix.endswith("<|im_end|>\n")
    # contents that also occur in the template's own text are cut elsewhere: still exact
    for text in ["<|im_start|>user\nspecial tokens inside<|im_end|>", "\n", "assistant", "<|im_end|>"]:
        check(text)
    # a second system prompt gets its own prefix; both keep giving whole-text ids
    other = [{"role": "system", "content": "Another policy."}, {"role": "user", "content": "hello"}]
    n = len(chat._prefix_ids)
    assert chat.prompt_ids(other) == tokenizer.encode(chat.render(other, add_generation_prompt=True), add_special_tokens=False)
    assert len(chat._prefix_ids) == n + 1
