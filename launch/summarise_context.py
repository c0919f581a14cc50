"""A context strategy of one's own: the policy summarises the oldest turns (an extension example).

    python -m rollout run --config configs/local.yaml policy.max_context_tokens=8000 \\
        policy.context_strategy=summarise_context:SummariseOldTurns   # with launch/ on PYTHONPATH

``policy.context_strategy`` takes a registered name (``none``, ``drop_tool_results``,
``drop_oldest_turns``) or an import path ``module:factory``, which every rollout actor imports
(so the module must be importable there: an installed package, or a Ray ``runtime_env``
``working_dir`` / ``py_modules``). The factory is called once per actor with no argument and
gives an object with ``name`` and ``async compact(request)`` (:class:`rollout.core.context.ContextStrategy`).

This one keeps the system message, the user's opening and the latest turn, and replaces the turns
in between with one user message holding a summary the policy writes itself: it renders a
summarisation prompt with the episode's own chat format and calls the same ``/generate`` endpoint
(``request.policy``). The summary's tokens are not trained on: only the episode's turns are in its
samples, and the compacted conversation starts a new sample (docs/design.md "History and context").
If the result still does not fit ``request.budget_tokens`` it answers ``None`` and the episode
goes on as with ``none``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any

from rollout.core.context import CompactionRequest

SUMMARY_PROMPT = ("Summarise the conversation below between a customer-service agent and a customer for the agent: "
                  "who the customer is, what they asked for, what the agent looked up and changed, and what is still "
                  "open. Be brief and keep every id, name and number.")
MAX_SUMMARY_TOKENS = 512


def _transcript(messages: list[dict[str, Any]]) -> str:
    """The turns as plain text (tool calls as JSON), for the summarisation prompt."""
    lines = []
    for m in messages:
        calls = [c["function"] for c in m.get("tool_calls") or []]
        text = (m.get("content") or "") + "".join(f"\n[call {c['name']} {c['arguments']}]" for c in calls)
        lines.append(f"{m['role']}: {text.strip()}")
    return "\n".join(lines)


class SummariseOldTurns:
    """Replaces every turn but the latest with a summary the policy writes."""

    name = "summarise_old_turns"

    def __init__(self) -> None:
        self._calls = itertools.count()

    async def compact(self, request: CompactionRequest) -> list[dict[str, Any]] | None:
        msgs = request.messages
        starts = [i for i, m in enumerate(msgs) if m.get("role") == "assistant"]
        if len(starts) < 2:
            return None
        head, old, latest = msgs[: starts[0]], msgs[starts[0] : starts[-1]], msgs[starts[-1]:]
        prompt = [{"role": "system", "content": SUMMARY_PROMPT}, {"role": "user", "content": _transcript(old)}]
        # rendering and decoding off the actor's event loop (the transcript may be thousands of tokens)
        ids = await asyncio.to_thread(request.chat.prompt_ids, prompt)
        gen = await request.policy.generate(ids, max_new_tokens=MAX_SUMMARY_TOKENS,
                                            rid=f"{request.episode_id}/summary-{next(self._calls)}", routing_key=request.episode_id)
        eot = set(request.chat.eot_ids)
        summary = (await asyncio.to_thread(request.chat.decode, [t for t in gen.ids if t not in eot])).strip()
        note = {"role": "user", "content": "[Summary of the earlier conversation] " + json.dumps(summary, ensure_ascii=False)[1:-1]}
        compacted = head + [note] + latest
        return compacted if await request.count_tokens(compacted) <= request.budget_tokens else None
