"""User simulators with tau-bench's interface (``tau_bench/envs/user.py``).

``reset(instruction) -> str`` returns the user's first message, ``step(content) -> str`` answers the
agent, ``get_total_cost() -> float``. The LLM user calls ``litellm.completion(model=...,
custom_llm_provider=..., messages=...)`` as tau-bench's does, with the same quirk: its constructor
already calls ``reset()`` (one model call without an instruction).
"""

import abc
import enum
from typing import Any, Dict, List, Optional, Union


def completion(**kwargs):
    """``litellm.completion``, imported on first use (tau-bench imports it at module import)."""
    from litellm import completion as litellm_completion

    return litellm_completion(**kwargs)


class BaseUserSimulationEnv(abc.ABC):
    """The user simulator's interface."""

    metadata = {}

    @abc.abstractmethod
    def reset(self, instruction: Optional[str] = None) -> str:
        raise NotImplementedError

    @abc.abstractmethod
    def step(self, content: str) -> str:
        raise NotImplementedError

    @abc.abstractmethod
    def get_total_cost(self) -> float:
        raise NotImplementedError


class HumanUserSimulationEnv(BaseUserSimulationEnv):
    """A person at the terminal."""

    def reset(self, instruction: Optional[str] = None) -> str:
        return input(f"{instruction}\n")

    def step(self, content: str) -> str:
        return input(f"{content}\n")

    def get_total_cost(self) -> float:
        return 0


class LLMUserSimulationEnv(BaseUserSimulationEnv):
    """A user played by a chat model through litellm."""

    def __init__(self, model: str, provider: str) -> None:
        super().__init__()
        self.messages: List[Dict[str, Any]] = []
        self.model = model
        self.provider = provider
        self.total_cost = 0.0
        self.reset()

    def _system(self, instruction: Optional[str]) -> str:
        text = "You play a customer talking to a shop's support agent."
        if instruction is not None:
            text += f"\n\nInstruction: {instruction}\n"
        return text + "\nSay one line at a time. When your goal is met, reply '###STOP###' alone."

    def _next(self) -> str:
        res = completion(model=self.model, custom_llm_provider=self.provider, messages=self.messages)
        message = res.choices[0].message
        self.messages.append(message.model_dump())
        self.total_cost += (getattr(res, "_hidden_params", None) or {}).get("response_cost") or 0.0
        return message.content

    def reset(self, instruction: Optional[str] = None) -> str:
        self.messages = [
            {"role": "system", "content": self._system(instruction)},
            {"role": "user", "content": "Hi! How can I help you today?"},
        ]
        return self._next()

    def step(self, content: str) -> str:
        self.messages.append({"role": "user", "content": content})
        return self._next()

    def get_total_cost(self) -> float:
        return self.total_cost


class UserStrategy(enum.Enum):
    """tau-bench's user strategies (the stand-in implements human and llm)."""

    HUMAN = "human"
    LLM = "llm"
    REACT = "react"
    VERIFY = "verify"
    REFLECTION = "reflection"


def load_user(
    user_strategy: Union[str, UserStrategy],
    model: Optional[str] = "gpt-4o",
    provider: Optional[str] = None,
) -> BaseUserSimulationEnv:
    """The user simulator of ``user_strategy`` (``human`` and ``llm`` in this stand-in).

    Raises:
        ValueError: unknown strategy, or the llm strategy without a model or a provider.
    """
    if isinstance(user_strategy, str):
        user_strategy = UserStrategy(user_strategy)
    if user_strategy == UserStrategy.HUMAN:
        return HumanUserSimulationEnv()
    if user_strategy == UserStrategy.LLM:
        if model is None:
            raise ValueError("LLM user strategy requires a model")
        if provider is None:
            raise ValueError("LLM user strategy requires a model provider")
        return LLMUserSimulationEnv(model=model, provider=provider)
    raise ValueError(f"Unknown user strategy {user_strategy} (the stand-in has human and llm)")
