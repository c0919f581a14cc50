"""The tau_bench package (the original tau-bench, sierra-research/tau-bench): whether it is
installed, importing it, building its environments, and our task ids for its tasks.

tau-bench is on no package registry: it is installed from its repository (:data:`INSTALL_COMMAND`),
never a dependency of this project, and none of its code or data is copied here.

What is used from tau-bench (its repository's files):

* ``tau_bench/envs/__init__.py``: ``get_env(env_name, user_strategy, user_model, task_split,
  user_provider=None, task_index=None) -> Env`` (``task_index`` only in newer versions).
* ``tau_bench/envs/base.py``: ``Env`` with ``reset(task_index) -> EnvResetResponse(observation,
  info)``, ``step(Action) -> EnvResponse(observation, reward, done, info)``, ``tools_map`` (tool
  name -> ``Tool`` class, run as ``invoke(data=env.data, **kwargs)``; an exception a tool raises
  becomes the observation ``"Error: ..."``), ``tools_info`` (OpenAI function schemas), ``wiki``
  (the domain policy), ``rules``, ``tasks``, ``terminate_tools`` (``transfer_to_human_agents``),
  ``user`` (the user simulator), ``actions`` and ``calculate_reward() -> RewardResult``: the
  database hash after the episode against the hash after replaying the task's gold actions, and
  each of the task's ``outputs`` said (lower case, commas removed) in some ``respond`` action.
  ``step`` computes the reward itself when the episode is done: the user's reply holds
  ``###STOP###``, or a terminate tool was called.
* ``tau_bench/types.py``: ``Action(name, kwargs)``, ``RESPOND_ACTION_NAME == "respond"`` (kwargs
  ``{"content": text}``), ``Task(user_id, actions, instruction, outputs)``, ``RewardResult(reward,
  info, actions)`` with ``RewardActionInfo(r_actions, gt_data_hash)`` or
  ``RewardOutputInfo(r_outputs, outputs)``, ``EnvInfo(task, source, user_cost, reward_info)``.
* ``tau_bench/envs/user.py``: ``load_user(user_strategy, model, provider)``; the user simulator's
  interface ``reset(instruction) -> str``, ``step(content) -> str``, ``get_total_cost() -> float``.
  Its LLM users call ``litellm.completion(model=..., custom_llm_provider=..., messages=...)``
  synchronously, with no endpoint argument (so the endpoint is set through litellm's environment
  variables, see :func:`rollout.benchmarks.tau_bench.environment.point_litellm_at`), and the constructor already makes one call.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import logging
import os
from typing import Any

logger = logging.getLogger(__name__)

BENCHMARK = "tau_bench"
INSTALL_COMMAND = "pip install git+https://github.com/sierra-research/tau-bench"
SPLITS = ("test", "train", "dev")  # the task splits tau-bench's environments know (retail: all; airline: test)
BASE_SPLIT = "base"  # every task of every split
_READ_TOOL_PREFIXES = ("get_", "find_", "list_", "search_", "calculate", "think", "transfer_")


class TauBenchNotInstalled(ImportError):
    """``env.benchmark: tau_bench`` but the ``tau_bench`` package cannot be found; the message is one
    line with the install command."""


class UnknownTauBenchDomain(KeyError):
    """tau-bench has no environment of that name (``get_env``: ``Unknown environment``); a
    ``KeyError`` (the CLI prints it as one config line) whose message names ``env.domain``."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def tau_bench_available() -> bool:
    """Whether ``tau_bench`` can be imported (looked up with ``importlib.util.find_spec``, not imported)."""
    try:
        return importlib.util.find_spec("tau_bench") is not None
    except (ImportError, ValueError):
        return False


def require_tau_bench() -> None:
    """Raise unless ``tau_bench`` can be imported.

    Raises:
        TauBenchNotInstalled: one line saying how to install it.
    """
    if not tau_bench_available():
        raise TauBenchNotInstalled(
            f"env.benchmark=tau_bench needs the tau_bench package (the original tau-bench), which is not installed: {INSTALL_COMMAND}")


def import_tau_bench() -> tuple[Any, Any]:
    """``(tau_bench.envs, tau_bench.types)``, imported with litellm kept offline (tau-bench imports
    litellm, which otherwise fetches its model cost map from the network).

    Raises:
        TauBenchNotInstalled: the package is missing.
        ImportError: it is there but does not import (one line).
    """
    require_tau_bench()
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    try:
        envs = importlib.import_module("tau_bench.envs")
        types = importlib.import_module("tau_bench.types")
    except ImportError as e:
        raise ImportError(f"the tau_bench package is installed but does not import ({type(e).__name__}: {e}); reinstall it: {INSTALL_COMMAND}") from None
    return envs, types


def task_id(split: str, index: int) -> str:
    """Our id of tau-bench's task ``index`` of ``split``: ``"{split}-{index}"``."""
    return f"{split}-{int(index)}"


def parse_task_id(tid: str) -> tuple[str, int]:
    """``(split, index)`` of an id made by :func:`task_id`.

    Raises:
        ValueError: ``tid`` is not of that form.
    """
    split, sep, index = str(tid).rpartition("-")
    if not sep or not split or not index.isdigit():
        raise ValueError(f"not a tau-bench task id (expected '<split>-<index>', e.g. 'test-0'): {tid!r}")
    return split, int(index)


def guess_tool_type(name: str) -> str:
    """``"read"`` or ``"write"`` for a tau-bench tool name, guessed from the name (tau-bench does not
    type its tools): ``get_`` / ``find_`` / ``list_`` / ``search_`` / ``calculate`` / ``think`` /
    ``transfer_`` are read tools, anything else writes. Used only by the local stack's
    ``gold_replay_skip_write`` backend."""
    return "read" if name.startswith(_READ_TOOL_PREFIXES) else "write"


def _supports_task_index(get_env) -> bool:
    try:
        return "task_index" in inspect.signature(get_env).parameters
    except (TypeError, ValueError):
        return False


def build_env(domain: str, split: str, index: int, user_model: str = "human") -> Any:
    """A tau-bench ``Env`` of ``domain`` for ``split``, positioned on task ``index``, with tau-bench's
    ``human`` user strategy (whose constructor calls no model; callers install their own user).
    Blocking (loads the domain's data): call it in a thread.

    ``get_env`` versions without ``task_index`` draw ``randint(0, len(tasks))`` (both ends
    included), which is one past the end once in ``len + 1`` times: the build is then retried.

    Raises:
        ValueError: tau-bench's ``Unknown environment`` / ``Unknown task split``.
        IndexError: ``index`` is out of range for the split (or the split is empty).
    """
    envs, _ = import_tau_bench()
    kwargs = dict(env_name=domain, user_strategy="human", user_model=user_model, task_split=split, user_provider=None)
    if _supports_task_index(envs.get_env):
        return envs.get_env(**kwargs, task_index=index)
    for attempt in range(8):
        try:
            return envs.get_env(**kwargs)
        except IndexError:
            if attempt == 7:
                raise
    raise AssertionError("unreachable")
