"""The ``hermes`` dialect (Qwen2.5 / Qwen3): ChatML turns ``<|im_start|>role\\n...<|im_end|>``, tool
results as ``<tool_response>`` blocks inside a user turn, calls as ``<tool_call>`` JSON blocks."""

from __future__ import annotations

import json
import re

from rollout.core.formats.hermes import CALL_CLOSE, CALL_OPEN
from rollout.devtools.local.dialects import Message

__all__ = ["DIALECTS", "HermesDialect"]

TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE = "<tool_response>", "</tool_response>"
# One chat message: role, content, and whether it was closed by <|im_end|> (the last, open
# assistant turn of a generation prompt is not).
_MESSAGE_RE = re.compile(r"<\|im_start\|>([^\n]*)\n(.*?)(<\|im_end\|>|(?=<\|im_start\|>)|\Z)", re.DOTALL)
_RESPONSE_RE = re.compile(re.escape(TOOL_RESPONSE_OPEN) + r"\n?(.*?)\n?" + re.escape(TOOL_RESPONSE_CLOSE), re.DOTALL)


class HermesDialect:
    """Reads and writes the Qwen3 / Hermes chat format (see the module docstring)."""

    split_token = "<|im_start|>"

    def messages(self, text: str) -> list[Message]:
        """ChatML messages; a user turn of ``<tool_response>`` blocks is one tool message per block."""
        out: list[Message] = []
        for m in _MESSAGE_RE.finditer(text):
            role, content, closed = m.group(1).strip(), m.group(2), bool(m.group(3))
            if role == "user" and TOOL_RESPONSE_OPEN in content:
                out += [Message("tool", r.group(1), closed) for r in _RESPONSE_RE.finditer(content)]
            elif role == "assistant":
                out.append(Message(role, content, closed, content.count(CALL_OPEN)))
            else:
                out.append(Message(role, content, closed))
        return out

    def assistant_text(self, content: str, calls: list[tuple[str, dict]], turn_key: int = 0) -> str:
        """``content``, then one ``<tool_call>\\n{"name", "arguments"}\\n</tool_call>`` block per call."""
        blocks = [CALL_OPEN + "\n" + json.dumps({"name": n, "arguments": a}, ensure_ascii=False) + "\n" + CALL_CLOSE for n, a in calls]
        return "\n".join([content] * bool(content) + blocks)


DIALECTS = {"hermes": HermesDialect()}
