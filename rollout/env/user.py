"""User simulators: the other side of a tau-bench conversation.

Two implementations behind the :class:`UserSimulator` protocol, one instance per episode:

* :class:`ScriptedUser` — deterministic and LLM-free, built from the task's user scenario: it
  opens with the reason for the call and the known info, answers the agent's questions from that
  info, and stops once the agent says something that is not a question. Runs and tests need no
  API key with it.
* :class:`LLMUser` — any OpenAI-compatible chat endpoint through ``litellm.acompletion`` (async:
  it never blocks the event loop), prompted with tau2's own user-simulator guidelines and the
  task's scenario, as tau2's ``UserSimulator`` does.

Stop signals are tau2's: ``###STOP###``, ``###TRANSFER###``, ``###OUT-OF-SCOPE###``.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass
from typing import Any, Protocol

from rollout.config import UserConfig

logger = logging.getLogger(__name__)

STOP, TRANSFER, OUT_OF_SCOPE = "###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###"
STOP_SIGNALS = (STOP, TRANSFER, OUT_OF_SCOPE)
# tau2's LLM agent opens every conversation with this greeting; the user simulator answers it.
AGENT_GREETING = "Hi! How can I help you today?"


class UserSimulatorError(RuntimeError):
    """The user simulator failed (endpoint down, timeout, malformed answer): an infrastructure failure."""


@dataclass(frozen=True)
class UserReply:
    """One user turn. ``stop`` is True when the user ended the conversation (``text`` keeps the signal)."""

    text: str
    stop: bool

    @property
    def transfer(self) -> bool:
        return TRANSFER in self.text


def is_stop(text: str) -> bool:
    return any(s in text for s in STOP_SIGNALS)


class UserSimulator(Protocol):
    """One simulated user for one episode."""

    async def start(self) -> str:
        """Return the user's opening message."""
        ...

    async def respond(self, agent_message: str) -> UserReply:
        """Answer the agent's text message."""
        ...


def _instruction_fields(task: Any) -> tuple[str, str]:
    """(reason_for_call, known_info) of a tau2 task; plain-string instructions give (text, "")."""
    ins = task.user_scenario.instructions
    if isinstance(ins, str):
        return ins.strip(), ""
    return (ins.reason_for_call or "").strip(), (ins.known_info or "").strip()


class ScriptedUser:
    """Deterministic user built from a tau2 task's scenario (no LLM).

    Args:
        task: a ``tau2.data_model.tasks.Task``.
        max_answers: answers given before the user stops regardless (bounds a looping agent).
    """

    def __init__(self, task: Any, max_answers: int = 8):
        self.reason, self.known = _instruction_fields(task)
        self.max_answers = max_answers
        self.answers = 0

    async def start(self) -> str:
        return f"Hi! {self.reason}" + (f"\n{self.known}" if self.known else "")

    async def respond(self, agent_message: str) -> UserReply:
        if "?" not in agent_message or self.answers >= self.max_answers:
            return UserReply(STOP, stop=True)
        self.answers += 1
        info = self.known or self.reason
        return UserReply(f"{info}\nYes, please go ahead.", stop=False)


class LLMUser:
    """User simulated by an LLM behind an OpenAI-compatible endpoint.

    Args:
        task: a ``tau2.data_model.tasks.Task`` (its scenario is the simulator's instructions).
        cfg: the ``env.user`` section (``base_url`` must already be resolved).
        seed: passed to the endpoint as ``seed``.

    Raises (from ``start`` / ``respond``):
        UserSimulatorError: the call failed, timed out or returned no text.
    """

    def __init__(self, task: Any, cfg: UserConfig, seed: int = 0):
        if not cfg.base_url or not cfg.model:
            raise UserSimulatorError("env.user.base_url and env.user.model are required for the llm user simulator")
        from tau2.user.user_simulator import SYSTEM_PROMPT, get_global_user_sim_guidelines

        self.cfg = cfg
        self.seed = seed
        self.api_key = os.environ.get(cfg.api_key_env, "") if cfg.api_key_env else ""
        if cfg.api_key_env and not self.api_key:
            raise UserSimulatorError(f"environment variable {cfg.api_key_env} (env.user.api_key_env) is not set")
        system = SYSTEM_PROMPT.format(
            global_user_sim_guidelines=get_global_user_sim_guidelines(use_tools=False),
            instructions=str(task.user_scenario),
        )
        # Roles are flipped: the simulator is the "assistant", the agent speaks as "user".
        self.history: list[dict[str, str]] = [{"role": "system", "content": system}]

    async def _complete(self, agent_text: str) -> str:
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        import litellm

        self.history.append({"role": "user", "content": agent_text})
        try:
            resp = await asyncio.wait_for(
                litellm.acompletion(
                    model=f"openai/{self.cfg.model}",
                    api_base=self.cfg.base_url,
                    api_key=self.api_key or "EMPTY",
                    messages=self.history,
                    temperature=self.cfg.temperature,
                    max_tokens=self.cfg.max_tokens,
                    seed=self.seed,
                    num_retries=0,
                ),
                timeout=self.cfg.timeout_s,
            )
            text = resp.choices[0].message.content
        except asyncio.TimeoutError:
            raise UserSimulatorError(f"user simulator timed out after {self.cfg.timeout_s}s") from None
        except Exception as e:  # litellm raises many types; all are infrastructure failures here
            raise UserSimulatorError(f"user simulator call failed: {e.__class__.__name__}: {str(e)[:300]}") from None
        if not isinstance(text, str) or not text.strip():
            raise UserSimulatorError("user simulator returned no text")
        self.history.append({"role": "assistant", "content": text})
        return text.strip()

    async def start(self) -> str:
        return await self._complete(AGENT_GREETING)

    async def respond(self, agent_message: str) -> UserReply:
        text = await self._complete(agent_message)
        return UserReply(text, stop=is_stop(text))


def make_user(task: Any, cfg: UserConfig, seed: int) -> UserSimulator:
    """Build the configured user simulator for one episode."""
    if cfg.kind == "scripted":
        return ScriptedUser(task)
    if cfg.kind == "llm":
        return LLMUser(task, cfg, seed=seed)
    raise ValueError(f"env.user.kind: unknown user simulator {cfg.kind!r}")
