"""tau-bench's environment base class, re-created for tests (``tau_bench/envs/base.py``).

Behaviour kept from tau-bench (the adapter depends on it):

* ``reset(task_index)`` reloads the data, clears ``actions`` and returns the user's first message
  (``EnvResetResponse``).
* ``step(Action)`` appends the action to ``actions``; ``respond`` goes to the user and is done when
  the user's reply holds ``###STOP###``; a tool runs as ``tools_map[name].invoke(data=self.data,
  **kwargs)`` and an exception it raises becomes the observation ``"Error: <exception>"``; a tool
  in ``terminate_tools`` ends the episode; an unknown name is the observation ``"Unknown action
  <name>"``. When done, ``calculate_reward()`` runs and ``info.user_cost`` is the user's cost.
* ``calculate_reward`` hashes the data, reloads it, replays the task's gold actions through
  ``self.step`` (terminate tools excepted) and compares the hashes; when the task has outputs,
  each must occur (lower case) in some ``respond`` content (lower case, commas removed), and the
  info is then the outputs' (``RewardOutputInfo``).
"""

import random
from hashlib import sha256
from typing import Any, Callable, Dict, List, Optional, Type, Union

from tau_bench.envs.tool import Tool
from tau_bench.envs.user import UserStrategy, load_user
from tau_bench.types import (
    RESPOND_ACTION_NAME,
    Action,
    EnvInfo,
    EnvResetResponse,
    EnvResponse,
    RewardActionInfo,
    RewardOutputInfo,
    RewardResult,
    Task,
)


def to_hashable(item: Any) -> Any:
    """Nested dicts / lists / sets as nested tuples (dict items sorted by key)."""
    if isinstance(item, dict):
        return tuple((k, to_hashable(v)) for k, v in sorted(item.items()))
    if isinstance(item, list):
        return tuple(to_hashable(v) for v in item)
    if isinstance(item, set):
        return tuple(sorted(to_hashable(v) for v in item))
    return item


def consistent_hash(value: Any) -> str:
    """sha256 hex digest of ``str(value)``."""
    return sha256(str(value).encode("utf-8")).hexdigest()


class Env(object):
    """A tau-bench environment: data, tools, tasks, policy (``wiki``) and a user simulator (see the module docstring)."""

    def __init__(
        self,
        data_load_func: Callable[[], Dict[str, Any]],
        tools: List[Type[Tool]],
        tasks: List[Task],
        wiki: str,
        rules: List[str],
        user_strategy: Union[str, UserStrategy],
        user_model: str,
        user_provider: Optional[str] = None,
        task_index: Optional[int] = None,
    ) -> None:
        super().__init__()
        self.data_load_func = data_load_func
        self.data = data_load_func()
        self.tools_map: Dict[str, Type[Tool]] = {t.get_info()["function"]["name"]: t for t in tools}
        self.tools_info = [t.get_info() for t in tools]
        self.terminate_tools: List[str] = []
        self.tasks = tasks
        # tau-bench draws randint(0, len(tasks)) here (both ends included) when no index is given
        self.task_index = task_index if task_index is not None else random.randint(0, len(tasks))
        self.task = tasks[self.task_index]
        self.wiki = wiki
        self.rules = rules
        self.user = load_user(user_strategy=user_strategy, model=user_model, provider=user_provider)
        self.actions: List[Action] = []

    def reset(self, task_index: Optional[int] = None) -> EnvResetResponse:
        if task_index is None:
            task_index = random.randint(0, len(self.tasks))
        self.task_index = task_index
        self.data = self.data_load_func()
        self.task = self.tasks[task_index]
        self.actions = []
        first = self.user.reset(instruction=self.task.instruction)
        return EnvResetResponse(observation=first, info=EnvInfo(task=self.task, source="user"))

    def step(self, action: Action) -> EnvResponse:
        self.actions.append(action)
        info = EnvInfo(task=self.task)
        reward = 0
        done = False
        if action.name == RESPOND_ACTION_NAME:
            observation = self.user.step(action.kwargs["content"])
            info.source = "user"
            done = "###STOP###" in observation
        elif action.name in self.tools_map:
            try:
                observation = self.tools_map[action.name].invoke(data=self.data, **action.kwargs)
            except Exception as e:
                observation = f"Error: {e}"
            info.source = action.name
            done = action.name in self.terminate_tools
        else:
            observation = f"Unknown action {action.name}"
            info.source = action.name
        if done:
            result = self.calculate_reward()
            reward = result.reward
            info.reward_info = result
            info.user_cost = self.user.get_total_cost()
        return EnvResponse(observation=observation, reward=reward, done=done, info=info)

    def get_data_hash(self) -> str:
        return consistent_hash(to_hashable(self.data))

    def calculate_reward(self) -> RewardResult:
        episode_hash = self.get_data_hash()
        reward = 1.0
        gold = [a for a in self.task.actions if a.name != RESPOND_ACTION_NAME]
        self.data = self.data_load_func()
        for action in self.task.actions:
            if action.name not in self.terminate_tools:
                self.step(action)
        gold_hash = self.get_data_hash()
        info: Union[RewardActionInfo, RewardOutputInfo] = RewardActionInfo(
            r_actions=episode_hash == gold_hash, gt_data_hash=gold_hash
        )
        if not info.r_actions:
            reward = 0.0
        if self.task.outputs:
            said = [a.kwargs["content"].lower().replace(",", "") for a in self.actions if a.name == RESPOND_ACTION_NAME]
            found = {out: any(out.lower() in text for text in said) for out in self.task.outputs}
            if not all(found.values()):
                reward = 0.0
            info = RewardOutputInfo(r_outputs=1.0 if all(found.values()) else 0.0, outputs=found)
        return RewardResult(reward=reward, info=info, actions=gold)
