"""The guarded episode runner: :func:`rollout.core.episode.run_episode` with the guards every caller
needs around it, written once.

The worker (:meth:`rollout.core.worker.RolloutWorker.run`), the trainer integrations
(:func:`rollout.integrations.episodes.run_task`: verl, AReaL) and the seed's agent
(:meth:`rollout.integrations.seed.TrainableAgent.asolve`, slime's ``generate``) all run an episode
through :func:`run_guarded_episode`. What it guards, each as one typed failure
(:meth:`~rollout.core.records.InteractionResult.failed`; docs/design.md invariant 4, "Statuses"):

==========================================  ================  ====================
what happened                               status            termination reason
==========================================  ================  ====================
the user simulator cannot be set up         ``user_error``    ``user_setup``
the whole episode ran past ``timeout_s``    ``timeout``       ``episode_timeout``
a tokenizer call of ``prepare`` ran too     ``policy_error``  ``tokenize_timeout``
long (the loop maps its own the same way)
anything else raised (a bug): logged        ``env_error``     ``crash``
==========================================  ================  ====================

Everything the episode itself does (the policy server, tools, the user simulator's turns, the
reward) is already a status from :func:`~rollout.core.episode.run_episode`.

On every result it returns, the runner also records the task's open issues
(``InteractionResult.task_issues``, given by the caller from its benchmark:
:func:`rollout.core.tasks.open_task_issues`) and applies ``rollout.reward_shaping``
(``settings.reward_shaping``, :mod:`rollout.core.shaping`): ``raw_reward`` keeps the benchmark's
reward, ``reward`` becomes the shaped one. A shaper that fails makes the episode ``eval_error``
(the reward could not be computed), never a crash.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Awaitable, Callable

from rollout.core.environment import Environment, UserSimulatorError
from rollout.core.episode import run_episode
from rollout.core.formats import ChatFormat
from rollout.core.policy import PolicyClient
from rollout.core.prompts import TokenizeTimeout
from rollout.core.records import EpisodeSpec, EpisodeStatus, InteractionResult, TaskIssue
from rollout.core.settings import EpisodeSettings
from rollout.core.shaping import RewardShaping

__all__ = ["EPISODE_TIMEOUT_KEY", "Prepare", "finalize_result", "run_guarded_episode"]

logger = logging.getLogger(__name__)

EPISODE_TIMEOUT_KEY = "pool.episode_timeout_s"  # the key that bounds a whole episode, named in the timeout's error

Prepare = Callable[[Environment, EpisodeSettings], Awaitable[tuple[Environment, EpisodeSettings]]]
"""``prepare(env, settings) -> (env, settings)``: what a caller does to the episode's environment
and settings before the loop starts (wrap the environment, e.g. in a
:class:`~rollout.core.telemetry.probes.MeteredEnvironment`; run its reset ahead and bound the
context by the first prompt, as the trainer integrations do). Runs inside the episode's bound."""


async def run_guarded_episode(spec: EpisodeSpec, open_env: Callable[[], Environment], policy: PolicyClient, chat: ChatFormat,
                              settings: EpisodeSettings, *, timeout_s: float | None, timeout_key: str | None = EPISODE_TIMEOUT_KEY,
                              prepare: Prepare | None = None,
                              on_user_error: Callable[[UserSimulatorError], None] | None = None,
                              task_issues: Sequence[TaskIssue] = ()) -> InteractionResult:
    """Run one episode; never raises for what an episode does (every failure is a typed status,
    the module docstring's table).

    Args:
        spec: the episode.
        open_env: makes the episode's fresh environment (blocking, called once on the loop: a
            benchmark's ``new_episode``, or ``lambda: env`` for one made already). An unknown task
            id raises ``KeyError`` there: ``env_error`` / ``crash``.
        policy: the policy client (:class:`~rollout.core.policy.PolicyClient`).
        chat: the probed chat format.
        settings: the episode loop's settings.
        timeout_s: bound on the whole episode in seconds (``prepare`` and the loop), ``None`` or 0:
            no bound beyond the per-step ones.
        timeout_key: the config key ``timeout_s`` came from, named in the timeout's error text
            (``None``: a bound given by the caller, named by nothing).
        prepare: see :data:`Prepare`; ``None``: the environment and settings as they are.
        on_user_error: called with the user simulator's set-up error before the ``user_error``
            result is returned (the worker counts it).
        task_issues: the task's open issues (:func:`rollout.core.tasks.open_task_issues`),
            recorded on the result.

    Returns:
        The episode's :class:`~rollout.core.records.InteractionResult`, its task's issues
        recorded and its reward shaped (``settings.reward_shaping``).

    Raises:
        asyncio.CancelledError: the caller cancelled the episode (never swallowed).
    """
    result = await _guarded(spec, open_env, policy, chat, settings, timeout_s, timeout_key, prepare, on_user_error)
    return finalize_result(result, settings.reward_shaping, task_issues)


def finalize_result(result: InteractionResult, shaping: RewardShaping, task_issues: Sequence[TaskIssue] = ()) -> InteractionResult:
    """Record the task's open issues on ``result`` and shape its reward (``raw_reward`` keeps the
    benchmark's: :meth:`rollout.core.shaping.RewardShaping.apply`), in place; returns it. A shaper
    that raises makes the episode ``eval_error`` (reward 0.0, the error in ``metadata``), never a crash."""
    result.task_issues = list(task_issues)
    try:
        return shaping.apply(result)
    except Exception as e:  # a shaper's bug (a registered one): the reward could not be computed
        logger.warning("episode %s: reward shaping failed: %r", result.spec.episode_id, e)
        result.status, result.reward = EpisodeStatus.EVAL_ERROR, 0.0
        result.metadata["error"] = f"reward shaping failed: {e!r}"
        return result


async def _guarded(spec: EpisodeSpec, open_env: Callable[[], Environment], policy: PolicyClient, chat: ChatFormat,
                   settings: EpisodeSettings, timeout_s: float | None, timeout_key: str | None, prepare: Prepare | None,
                   on_user_error: Callable[[UserSimulatorError], None] | None) -> InteractionResult:
    """:func:`run_guarded_episode`'s guards (the module docstring's table)."""
    try:
        try:
            env = open_env()
        except UserSimulatorError as e:  # set-up failure (e.g. its API key is missing)
            if on_user_error is not None:
                on_user_error(e)
            return InteractionResult.failed(spec, EpisodeStatus.USER_ERROR, "user_setup", str(e))
        coro = _prepared_run(spec, env, policy, chat, settings, prepare)
        return await (asyncio.wait_for(coro, timeout_s) if timeout_s else coro)
    except TokenizeTimeout as e:  # a tokenizer call of prepare (the loop maps its own the same way)
        return InteractionResult.failed(spec, EpisodeStatus.POLICY_ERROR, "tokenize_timeout", str(e))
    except asyncio.TimeoutError:
        named = f" ({timeout_key})" if timeout_key else ""
        return InteractionResult.failed(spec, EpisodeStatus.TIMEOUT, "episode_timeout", f"episode ran over {timeout_s}s{named}")
    except Exception as e:  # anything else is a bug, but must not take the actor (or the trainer's worker) down
        logger.exception("episode %s crashed", spec.episode_id)
        return InteractionResult.failed(spec, EpisodeStatus.ENV_ERROR, "crash", repr(e))


async def _prepared_run(spec: EpisodeSpec, env: Environment, policy: PolicyClient, chat: ChatFormat, settings: EpisodeSettings,
                        prepare: Prepare | None) -> InteractionResult:
    if prepare is not None:
        env, settings = await prepare(env, settings)
    return await run_episode(spec, env, policy, chat, settings)
