"""The user-simulator interface: stop signals, one user turn (:class:`UserReply`), the user's own
tools in a dual-control domain (:class:`UserTools`), the :class:`UserSimulator` protocol, and the
API key ``env.user`` names.

Stop signals are tau2's: ``###STOP###``, ``###TRANSFER###``, ``###OUT-OF-SCOPE###``.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Awaitable, Callable, Protocol

from rollout.core.config import UserConfig
from rollout.core.environment import UserSimulatorError

logger = logging.getLogger(__name__)

STOP, TRANSFER, OUT_OF_SCOPE = "###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###"
STOP_SIGNALS = (STOP, TRANSFER, OUT_OF_SCOPE)
# tau2's LLM agent opens every conversation with this greeting; the user simulator answers it.
AGENT_GREETING = "Hi! How can I help you today?"


@dataclass(frozen=True)
class UserReply:
    """One user turn. ``stop`` is True when the user ended the conversation (``text`` keeps the signal)."""

    text: str
    stop: bool

    @property
    def transfer(self) -> bool:
        return TRANSFER in self.text


def is_stop(text: str) -> bool:
    """Whether ``text`` holds one of the :data:`STOP_SIGNALS`."""
    return any(s in text for s in STOP_SIGNALS)


@dataclass(frozen=True)
class UserTools:
    """The user's own tools in a dual-control domain (tau2 telecom), handed to the user simulator
    by the environment (``bind_tools``) before the conversation starts.

    Attributes:
        schemas: OpenAI-style function schemas of the user's tools (tau2's
            ``Environment.get_user_tools()``).
        call: ``await call(name, arguments) -> (content, error)``: runs one tool call in the
            user's side of the episode's environment (off the event loop, bounded; see
            :meth:`rollout.benchmarks.tau2.episode.Tau2Environment._user_tool`), records it for tau2's
            evaluator and returns tau2's tool message content and whether it is an error. It
            raises ``EnvironmentStepError`` when the environment fails (the episode then ends
            ``env_error``).
    """

    schemas: tuple[dict, ...]
    call: Callable[[str, dict], Awaitable[tuple[str, bool]]]

    @property
    def names(self) -> list[str]:
        """The tool names, in schema order."""
        return [s["function"]["name"] for s in self.schemas]


class UserSimulator(Protocol):
    """One simulated user for one episode. In a dual-control domain the environment first calls
    the simulator's ``bind_tools(tools: UserTools)`` (simulators without it cannot serve such
    domains: the episode ends ``user_error``)."""

    async def start(self) -> str:
        """Return the user's opening message."""
        ...

    async def respond(self, agent_message: str) -> UserReply:
        """Answer the agent's text message."""
        ...


def user_api_key(cfg: UserConfig) -> str:
    """The API key named by ``cfg.api_key_env`` ("" when no variable is configured).

    Raises:
        UserSimulatorError: the variable is configured but unset or empty.
    """
    if not cfg.api_key_env:
        return ""
    key = os.environ.get(cfg.api_key_env, "")
    if not key.strip():
        raise UserSimulatorError(f"environment variable {cfg.api_key_env} (env.user.api_key_env) is not set or empty")
    return key
