"""The ``mistral`` dialect (:mod:`rollout.core.formats.mistral`): prompts as mistral-common encodes
them, ``<s>[SYSTEM_PROMPT]...[/SYSTEM_PROMPT][AVAILABLE_TOOLS]...[/AVAILABLE_TOOLS][INST]user[/INST]
assistant</s>[TOOL_RESULTS]...[/TOOL_RESULTS]...``, and assistant turns as a Mistral model writes them.

Reading works for every tokenizer version (v3 results ``{"content": ..., "call_id": ...}``, v7/v11
``id[TOOL_CONTENT]content``, v13+ the content alone). In v3 the system prompt has no block of its
own: it opens the user turn it is encoded in (``system\\n\\nuser``), which is then read as one user
message. Writing takes mistral-common's encoding of the assistant message in the version of the
built-in vocabulary (``builtin:mistral``, v3: ``[TOOL_CALLS][{"name": ..., "arguments": {...},
"id": "..."}]``), with an id per call as a v3 model writes one (9 letters or digits; derived from
the turn and the call's place, so a replay is deterministic), so that
:meth:`MistralFormat.parse_turn <rollout.core.formats.mistral.MistralFormat.parse_turn>` reads back
the same content, calls and ids, and the results that follow must echo those ids.
"""

from __future__ import annotations

import hashlib
import json
import re
import string

from rollout.devtools.local.dialects import Message
from rollout.devtools.local.dialects.builtin import builtin_format

__all__ = ["DIALECTS", "MistralDialect", "call_ids"]

_MARKS = ("<s>", "</s>", "[INST]", "[/INST]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
          "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]")
_SPLIT_RE = re.compile("(" + "|".join(re.escape(m) for m in _MARKS) + ")")
# block opener -> (its closer, the role of the message it holds; None: not a message)
_BLOCKS = {"[INST]": ("[/INST]", "user"), "[TOOL_RESULTS]": ("[/TOOL_RESULTS]", "tool"),
           "[SYSTEM_PROMPT]": ("[/SYSTEM_PROMPT]", "system"), "[AVAILABLE_TOOLS]": ("[/AVAILABLE_TOOLS]", None)}


def _tool_content(body: str) -> str:
    """A tool result's content: after ``[TOOL_CONTENT]`` (v7, v11), the ``content`` of v3's JSON
    object, else the body itself (v13+)."""
    if "[TOOL_CONTENT]" in body:
        return body.split("[TOOL_CONTENT]", 1)[1]
    try:
        obj = json.loads(body)
    except ValueError:
        return body
    if isinstance(obj, dict) and "call_id" in obj and "content" in obj:
        return obj["content"] if isinstance(obj["content"], str) else json.dumps(obj["content"], ensure_ascii=False)
    return body


def _count_calls(text: str) -> int:
    """Calls in an assistant turn: one per ``[TOOL_CALLS]`` (v11+), or the length of the JSON list
    that follows it (v3, v7)."""
    n = 0
    for part in text.split("[TOOL_CALLS]")[1:]:
        try:
            found = json.loads(part)
        except ValueError:
            found = None
        n += len(found) if isinstance(found, list) and found else 1
    return n


class MistralDialect:
    """Reads and writes the Mistral chat format (see the module docstring).

    ``split_token`` is ``[INST]``: every user turn starts with it and no message spans it, so the
    oracle may read a prompt piece by piece (a piece may hold several messages)."""

    split_token = "[INST]"

    def messages(self, text: str) -> list[Message]:
        """System, user, tool and assistant messages in order (``[AVAILABLE_TOOLS]`` skipped). An
        assistant turn is the text after ``[/INST]`` or ``[/TOOL_RESULTS]`` up to ``</s>`` (closed) or
        the next block (not closed); the empty open turn of a generation prompt is left out."""
        out: list[Message] = []
        parts = [p for p in _SPLIT_RE.split(text) if p]
        i, answer = 0, False  # answer: the text that follows is the assistant's
        while i < len(parts):
            part = parts[i]
            if part in _BLOCKS:
                closer, role = _BLOCKS[part]
                body, closed, i = "", False, i + 1
                while i < len(parts) and parts[i] != closer and parts[i] not in _BLOCKS:
                    body, i = body + parts[i], i + 1
                if i < len(parts) and parts[i] == closer:
                    closed, i = True, i + 1
                if role is not None:
                    out.append(Message(role, _tool_content(body) if role == "tool" else body, closed))
                answer = closed and role in ("user", "tool")
                continue
            if part in ("<s>", "</s>") or part in _MARKS:
                answer, i = False, i + 1
                continue
            if answer:  # an assistant turn: up to </s> (closed) or the next block
                closed = i + 1 < len(parts) and parts[i + 1] == "</s>"
                out.append(Message("assistant", part, closed, _count_calls(part)))
                i += 2 if closed else 1
                answer = False
                continue
            i += 1  # stray text outside any message
        return out

    def assistant_text(self, content: str, calls: list[tuple[str, dict]], turn_key: int = 0) -> str:
        """What a Mistral model writes for the turn before ``</s>``: mistral-common's encoding of the
        assistant message with ``content`` and ``calls``, each call with the id
        :func:`call_ids` gives it (v3-v11 models write one), decoded with its special tokens."""
        fmt = builtin_format("mistral")  # the built-in vocabulary, loaded on the first written turn
        ids = call_ids(turn_key, len(calls)) if fmt.writes_call_ids else None
        return fmt.decode(fmt.generated_ids(content, list(calls), ids))


_ID_CHARS = string.ascii_letters + string.digits


def call_ids(turn_key: int, n: int) -> list[str]:
    """``n`` call ids as a Mistral v3-v11 model writes them: 9 letters or digits (what
    mistral-common accepts), here the SHA-256 of ``turn_key`` and the call's place mapped onto
    those 62 characters: deterministic, and different between calls and between turns."""
    return ["".join(_ID_CHARS[b % len(_ID_CHARS)] for b in hashlib.sha256(f"{turn_key}/{i}".encode()).digest()[:9]) for i in range(n)]


DIALECTS = {"mistral": MistralDialect()}
