"""The environment seam: what the episode loop needs from a benchmark's environment.

The loop (:func:`rollout.core.episode.run_episode`) sees an :class:`Environment` with the seed's
shape (``reset(task) -> observation, info``; ``step(action) -> observation, reward, done, info``,
both async) and the typed errors below, and nothing of any benchmark. Adapters
(:mod:`rollout.benchmarks`) implement it and raise these errors; each error maps to one episode
status (``docs/design.md``, "Statuses").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

RESPOND = "respond"  # Action.name of a reply to the user (no tool call)


@dataclass(frozen=True)
class Action:
    """One agent action: a tool call (``name`` = tool, ``arguments``) or a reply (``name == "respond"``).

    ``content`` is the assistant's visible text (for a tool call, any text around the call).
    """

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    content: str = ""

    @property
    def is_respond(self) -> bool:
        return self.name == RESPOND


class EnvironmentStepError(RuntimeError):
    """Environment code failed (not the policy's fault): an infrastructure failure (``env_error``)."""


class ToolTimeoutError(RuntimeError):
    """A tool call the model wrote ran past ``env.step_timeout_s`` and was stopped (``tool_timeout``)."""


class RewardError(RuntimeError):
    """The reward could not be computed (the evaluator failed or timed out): ``eval_error``."""


class UserSimulatorError(RuntimeError):
    """The user simulator failed (endpoint down, timeout, malformed answer, missing or rejected
    API key): an infrastructure failure (``user_error``). The message is one line and never holds
    the API key."""


class Environment(Protocol):
    """One episode's environment (a new one per episode), async.

    Attributes:
        timings: seconds spent so far per part (e.g. ``env_s``, ``tool_s``, ``user_s``,
            ``reward_s``), copied into the episode's metadata when it ends.
    """

    timings: dict[str, float]

    async def reset(self, task_id: str) -> tuple[str, dict[str, Any]]:
        """Start the task: ``(the user's opening message, info)``.

        Raises:
            UserSimulatorError: the user simulator failed to open.
            EnvironmentStepError: (or any exception) the environment could not be built.
        """
        ...

    async def step(self, action: Action) -> tuple[str, float, bool, dict[str, Any]]:
        """Run ``action``: ``(observation, reward, done, info)``; ``info["role"]`` is ``"tool"``
        for a tool's result, else ``"user"``; ``info["tool_error"]`` when the tool failed (an
        observation, not an error); ``info["termination"]`` and ``info["reward_info"]`` when done.

        Raises:
            ToolTimeoutError, UserSimulatorError, RewardError, EnvironmentStepError.
        """
        ...
