"""rollout.core.formats.build_chat_format: the probed chat format for a tokenizer, built once per
process (what the worker, the seed's agent and the trainer integrations use)."""

from __future__ import annotations

import pytest

from rollout.core.formats import ChatTemplate, ProbedChatFormat, TemplateError, build_chat_format
from rollout.core.formats import build as build_module
from rollout.core.formats.protocol import TemplateReport

TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Look up.", "parameters": {"type": "object", "properties": {}}}}]


def test_auto_resolves_probes_and_caches_per_tokenizer_tools_and_arguments(tokenizer):
    a = build_chat_format(tokenizer, TOOLS, {}, "auto")
    assert isinstance(a, ProbedChatFormat) and a.name == "hermes" and isinstance(a.chat, ChatTemplate) and a.report.ok
    assert build_chat_format(tokenizer, TOOLS, {}, "hermes") is a  # auto and its family are one format
    b = build_chat_format(tokenizer, TOOLS, {"enable_thinking": False}, "hermes")
    assert b is not a and b.chat.prompt_ids([{"role": "user", "content": "hi"}]) != a.chat.prompt_ids([{"role": "user", "content": "hi"}])
    assert build_chat_format(tokenizer, None, {}, "hermes") is not a  # other tools: another system prompt


def test_a_format_that_fails_its_probe_is_refused_naming_the_tokenizer_and_never_cached(tokenizer, monkeypatch):
    built = []

    class Unfit(ChatTemplate):
        def probe(self) -> TemplateReport:
            built.append(self)
            return TemplateReport(end_of_turn="<|im_end|>", turn_tail="\n", problems=["deltas depend on the history"])

    # hermes' factory, as the registry would answer it, replaced by one whose probe fails
    monkeypatch.setattr(build_module, "get_chat_format", lambda name: lambda tokenizer, tools=None, template_kwargs=None: Unfit(
        tokenizer, tools, template_kwargs))
    for _ in range(2):
        with pytest.raises(TemplateError, match=r"tokenizer 'my/tokenizer': exact delta tokenization is impossible with chat format "
                                                r"hermes:\n(.|\n)*deltas depend on the history"):
            build_chat_format(tokenizer, TOOLS, {"unfit": True}, "hermes", source="my/tokenizer")
    assert len(built) == 2  # probed again: a failure is not cached


def test_an_unknown_family_names_the_registered_ones(tokenizer):
    with pytest.raises(TemplateError, match=r"policy.chat_format: no chat format 'qwen9' is registered \(registered: hermes, .*mistral"):
        build_chat_format(tokenizer, TOOLS, {}, "qwen9")
