"""The tau2-bench adapter: tau2's domains behind the environment seam (:mod:`rollout.core.environment`).

This module is the adapter's entry: the benchmark registry loads ``env.benchmark: tau2`` through
:func:`load_benchmark` and the local stack's gold replay indexes a domain through
:func:`gold_index`; it also keeps the names the adapter always offered here. The work is done by:

* :mod:`rollout.benchmarks.tau2.domain`: :class:`Tau2Domain`, one domain's tasks, splits, policy
  and tools, loaded once per actor (any domain tau2's registry registers,
  :mod:`rollout.benchmarks.tau2.registry`); it makes the actor's sandbox and each episode's
  environment with its user simulator (:mod:`rollout.benchmarks.tau2.user`).
* :mod:`rollout.benchmarks.tau2.episode`: :class:`Tau2Environment`, one episode, the seed's shape
  made async: ``reset(task_id) -> (observation, info)``, ``step(action) -> (observation, reward,
  done, info)``; a tool action runs the tool, a respond action goes to the user simulator.
* :mod:`rollout.benchmarks.tau2.sandbox`: :class:`ToolSandbox` and :func:`evaluate_run`.

The reward at the end is tau2's ``evaluate_simulation`` (``EvaluationType.ALL``) reward, computed
by ``env.evaluator``:

- ``fast`` (default, :mod:`rollout.benchmarks.tau2.fast`): the episode's environment is a copy-on-write
  view of the actor's database (microseconds to build, kilobytes per episode) and the reward is
  computed from it and a per-task gold state, with nothing rebuilt or replayed (milliseconds: docs/performance.md);
  equal to tau2's reward and breakdown on every task of airline and retail
  (``tests/component/test_fast_reward.py``, ``python -m rollout.bench env``). Domains whose environment
  it does not serve (telecom: a custom ``Environment`` subclass with user tools) take tau2's
  path below.
- ``tau2`` (the reference): a fresh tau2 environment per episode (docs/design.md, "tau2-bench"), and tau2's own
  evaluator, which rebuilds two environments and replays the trajectory (docs/performance.md).

No model output is evaluated in the actor's own process, at step time or at reward time:

* Tools that touch no database (tau2's ``GENERIC`` and ``THINK`` tools, e.g. ``calculate``, which
  evaluates its argument with Python's ``eval``) run in a separate sandbox process that is killed
  when a call outlives ``env.step_timeout_s``: a pathological expression such as ``9**9**9**9``
  cannot hang the actor. Read and write tools are dictionary look-ups and updates on the
  episode's own database.
* The fast reward replays nothing. tau2's evaluator (``env.evaluator: tau2``) replays the whole
  trajectory, ``calculate`` calls included: it runs in the sandbox process, bounded by
  ``env.reward_timeout_s`` (past it the process is killed and the episode ends as
  ``eval_error``). Without a sandbox (``sandbox=None``, tests and tools only) it runs in a thread
  of the caller's process, without a hard bound.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from rollout.benchmarks.process import KillableChild
from rollout.benchmarks.tau2.domain import Tau2Domain
from rollout.benchmarks.tau2.episode import TRANSFER_TOOL, Tau2Environment
from rollout.benchmarks.tau2.fast import mutates_state
from rollout.benchmarks.tau2.imports import domain_loaders
from rollout.benchmarks.tau2.registry import load_domain
from rollout.benchmarks.tau2.retrieval import constructor_params, offline_retrieval_configs
from rollout.benchmarks.tau2.sandbox import ToolSandbox, evaluate_run
from rollout.core.config import EnvConfig

logger = logging.getLogger(__name__)

_domain_module = domain_loaders  # the name tests and tools have used

__all__ = ["KillableChild", "TRANSFER_TOOL", "Tau2Domain", "Tau2Environment", "ToolSandbox", "evaluate_run", "gold_index", "load_benchmark"]


def load_benchmark(env_cfg: EnvConfig, log_level: str = "ERROR") -> Tau2Domain:
    """The benchmark registry's loader for ``env.benchmark: tau2``: the :class:`Tau2Domain` of
    ``env.domain`` (blocking: 1-5 s; once per actor).

    Args:
        env_cfg: the ``env`` section.
        log_level: loguru level for tau2's logs (``logging.tau2_level``).

    Raises:
        rollout.benchmarks.tau2.registry.UnknownDomainError: tau2 registers no such domain (a ``KeyError``).
    """
    return Tau2Domain(env_cfg.domain, tau2_log_level=log_level, retrieval_config=getattr(env_cfg, "retrieval_config", None))


def gold_index(domain: str) -> tuple[list[Any], dict[str, bool]]:
    """What the local stack's gold replay indexes for ``domain``: ``(tasks, {tool name: is_write})``,
    every task of the domain (``get_tasks(None)``: airline's and retail's are their ``base``
    split, telecom's its 2285 ``full`` tasks, banking_knowledge's 97) and whether each tool, the
    agent's or the user's, changes the environment (tau2's ``ToolType.WRITE``, or a tool that says
    it mutates state: :func:`rollout.benchmarks.tau2.fast.mutates_state`).

    Raises:
        rollout.benchmarks.tau2.registry.UnknownDomainError: tau2 registers no such domain (a ``KeyError``).
    """
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    loaders = load_domain(domain)
    tasks = loaders.get_tasks(None)
    kw = {}
    if "retrieval_variant" in constructor_params(loaders.get_environment):
        # a knowledge domain (banking_knowledge): its tools' types do not depend on the retrieval
        # config (which adds read-only search tools), and tau2's default one needs an API key
        kw["retrieval_variant"] = offline_retrieval_configs(domain)[0]
    env = loaders.get_environment(**kw)
    is_write = {name: mutates_state(tk, name) for tk in (env.tools, env.user_tools) if tk is not None for name in tk.tools}
    del env
    return tasks, is_write
