"""The scripted user: deterministic and LLM-free, built from a tau2 task's user scenario.

It opens with the reason for the call and the known info, answers the agent's questions from that
info, and stops once the agent says something that is not a question; runs and tests need no API
key with it. In a dual-control domain (tau2 telecom) it replays the task's gold user actions
(:func:`gold_segments`), one block per agent message, and says its case number
(:func:`case_reference`) so that the local gold-replay policy can tell tasks with the same
opening apart.
"""

from __future__ import annotations

import copy
import hashlib
import re
from typing import Any

from rollout.benchmarks.user_api import STOP, UserReply, UserTools, scripted_answer


def case_reference(task_id: str) -> str:
    """The case number the scripted user gives in dual-control domains: ``TC-`` and the first 10
    hex digits of the sha256 of the task id. Opaque (it says nothing of the task's faults) and
    unique per task, so the local gold-replay policy can find the task of a conversation whose
    opening many tasks share (telecom's 114 base tasks have 3 distinct reasons for calling)."""
    return "TC-" + hashlib.sha256(str(task_id).encode()).hexdigest()[:10]


CASE_REFERENCE_RE = re.compile(r"case number is (TC-[0-9a-f]{10})")


def gold_segments(task: Any) -> list[tuple[str, list[tuple[str, dict]]]]:
    """A task's gold actions (``evaluation_criteria.actions``) in order, grouped into maximal runs
    by requestor: ``[("assistant" | "user", [(tool name, arguments), ...]), ...]``. The user's runs
    are what the scripted user replays, one per agent message; the local gold-replay policy hands
    over to the user before each of them. Tasks without gold actions give ``[]``.
    """
    crit = task.evaluation_criteria
    segments: list[tuple[str, list[tuple[str, dict]]]] = []
    for a in (crit.actions or []) if crit is not None else []:
        who = "user" if a.requestor == "user" else "assistant"
        if not segments or segments[-1][0] != who:
            segments.append((who, []))
        segments[-1][1].append((a.name, dict(a.arguments)))
    return segments


def _instruction_fields(task: Any) -> tuple[str, str]:
    """(reason_for_call, known_info) of a tau2 task; plain-string instructions give (text, "")."""
    ins = task.user_scenario.instructions
    if isinstance(ins, str):
        return ins.strip(), ""
    return (ins.reason_for_call or "").strip(), (ins.known_info or "").strip()


class ScriptedUser:
    """Deterministic user built from a tau2 task's scenario (no LLM).

    It opens with the reason for the call and the known info, answers the agent's questions with
    that info and stops once the agent says something that is not a question. With user tools
    (dual control, :meth:`bind_tools`) it also says its :func:`case_reference` in the opening and
    replays the task's gold user actions: each agent message is answered by the next block of
    them (:func:`gold_segments`), run through the tools, and a text that reports their results;
    once they are all done it behaves as above.

    Args:
        task: a ``tau2.data_model.tasks.Task``.
        max_answers: answers given before the user stops regardless (bounds a looping agent;
            replayed blocks are not counted, there are finitely many).
    """

    def __init__(self, task: Any, max_answers: int = 8):
        self.reason, self.known = _instruction_fields(task)
        self.task_id = str(task.id)
        self.max_answers = max_answers
        self.answers = 0
        self._blocks = [acts for who, acts in gold_segments(task) if who == "user"]
        self._tools: UserTools | None = None
        self.tool_calls = 0  # user tool calls made

    def bind_tools(self, tools: UserTools) -> None:
        """Take the user's tools (dual control); call it before :meth:`start`."""
        self._tools = tools

    async def start(self) -> str:
        text = f"Hi! {self.reason}" + (f"\n{self.known}" if self.known else "")
        if self._tools is not None:
            text += f"\nMy case number is {case_reference(self.task_id)}."
        return text

    async def respond(self, agent_message: str) -> UserReply:
        """Answer the agent (see the class).

        Raises:
            EnvironmentStepError: a replayed tool call failed in the environment (from
                :attr:`UserTools.call`).
        """
        if self._tools is not None and self._blocks:
            lines = []
            for name, args in self._blocks.pop(0):
                content, _ = await self._tools.call(name, copy.deepcopy(args))
                self.tool_calls += 1
                lines.append(f"- {name}: {content}")
            return UserReply("I did that on my side. What I got:\n" + "\n".join(lines), stop=False)
        answer = scripted_answer(agent_message, self.answers, self.max_answers, self.known or self.reason)
        if answer is None:
            return UserReply(STOP, stop=True)
        self.answers += 1
        return UserReply(answer, stop=False)
