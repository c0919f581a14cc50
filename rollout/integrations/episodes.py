"""One tau2 episode for a trainer's own loop (verl's agent loop, AReaL's workflow): the parts that
do not depend on the framework. Importing this module imports no framework.

* :func:`load_tau_config`: our YAML (a path, else ``$TAU_ROLLOUT_CONFIG``, else the defaults), once
  per process; ``policy.router_url`` is a placeholder, since the trainer's engine serves the policy.
* :func:`several_samples_reason`: whether the config can give several samples per episode.
* :func:`domain_state`: the benchmark domain's data, tool sandbox, threads and episode settings,
  loaded once per process.
* :func:`run_task_episode`: ``run_episode`` with the worker's outer guards (the whole-episode
  bound, a crash net) and, when the trainer bounds the prompt and the response separately (verl
  pads each to a fixed length), the first prompt rendered ahead and the context bound to
  ``first prompt + response limit``.
* :func:`episode_metrics`: seconds spent generating, in tools and the user simulator, and in the reward.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from rollout.core.choices import History, SampleMode
from rollout.core.config import Config, EnvConfig, load_config
from rollout.core.environment import Benchmark, Environment, UserSimulatorError, load_benchmark
from rollout.core.episode import run_episode
from rollout.core.formats import ChatFormat
from rollout.core.policy import PolicyClient
from rollout.core.prompts import TokenizeTimeout, off_loop
from rollout.core.records import EpisodeSpec, EpisodeStatus, InteractionResult
from rollout.core.settings import EpisodeSettings

logger = logging.getLogger(__name__)

__all__ = ["CONFIG_ENV", "UNUSED_ROUTER", "DomainState", "domain_state", "env_config_for", "episode_metrics", "load_tau_config",
           "run_task_episode", "several_samples_reason", "single_token_stop_ids", "warn_unmatched_stops"]

CONFIG_ENV = "TAU_ROLLOUT_CONFIG"
# The trainer's engine serves every call and policy.router_url is never read; our config requires
# one when local.enabled=false, so the config gets this placeholder.
UNUSED_ROUTER = "http://trainer-inference-engine.invalid"

_LOCK = threading.Lock()
_CONFIGS: dict[tuple[str | None, tuple[str, ...]], Config] = {}
_DOMAINS: dict[tuple, DomainState] = {}
_warned_stops: set[str] = set()


@dataclass
class DomainState:
    """What one process keeps per benchmark domain.

    Attributes:
        benchmark: the domain's data (``env.benchmark``'s loader).
        sandbox: its tool sandbox (``None`` when the benchmark needs none).
        executor: threads for the environment's blocking calls.
        settings: the episode loop's settings for this domain (``policy`` and ``env`` sections).
    """

    benchmark: Benchmark
    sandbox: Any
    executor: ThreadPoolExecutor
    settings: EpisodeSettings


def load_tau_config(path: str | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Our config: the YAML ``path``, else ``$TAU_ROLLOUT_CONFIG``, else the defaults, with
    ``overrides`` (``key=value``) on top; loaded once per process per (path, overrides), so a
    changed file is read again only under another path. ``policy.router_url`` is set to
    :data:`UNUSED_ROUTER`.

    Raises:
        rollout.core.config.ConfigError: a bad YAML value (one line naming the key).
        FileNotFoundError: ``path`` does not exist.
    """
    path = str(path) if path else (os.environ.get(CONFIG_ENV) or None)
    key = (path, tuple(str(o) for o in overrides))
    with _LOCK:
        if key not in _CONFIGS:
            _CONFIGS[key] = load_config(path, [*key[1], f"policy.router_url={UNUSED_ROUTER}"])
        return _CONFIGS[key]


def several_samples_reason(cfg: Config) -> str | None:
    """Why ``cfg`` may give several samples per episode (``per_turn``, ``rerender``, a context
    strategy), or ``None`` when every episode is one sample (``trajectory``; ``merge_prefix`` with
    the append-only history and no context strategy)."""
    if SampleMode(cfg.rollout.sample_mode) == SampleMode.PER_TURN:
        return "rollout.sample_mode=per_turn gives one sample per assistant turn"
    if History(cfg.policy.history) == History.RERENDER:
        return "policy.history=rerender starts a new sample wherever a rendering does not extend the last"
    if str(cfg.policy.context_strategy) != "none":
        return f"policy.context_strategy={cfg.policy.context_strategy} starts a new sample at each compaction"
    return None


def env_config_for(cfg: Config, domain: str | None) -> EnvConfig:
    """``cfg.env``, with ``env.domain`` replaced when a dataset row names another ``domain``."""
    return cfg.env if not domain or domain == cfg.env.domain else replace(cfg.env, domain=str(domain))


def domain_state(cfg: Config, env_cfg: EnvConfig) -> DomainState:
    """The domain's :class:`DomainState`, loaded once per process (blocking: seconds the first time).

    Raises:
        whatever :func:`rollout.core.environment.load_benchmark` raises (an unknown benchmark or domain).
    """
    key = (id(cfg), env_cfg.benchmark, env_cfg.domain)
    with _LOCK:
        st = _DOMAINS.get(key)
        if st is None:
            bench = load_benchmark(env_cfg, log_level=cfg.logging.tau2_level)
            sandbox = bench.new_actor_sandbox(env_cfg, log_level=cfg.logging.tau2_level)
            settings = EpisodeSettings.from_policy(cfg.policy, max_steps=env_cfg.max_steps, system_prompt=bench.system_prompt,
                                                   tool_names=bench.tool_names, partial_rollout=cfg.rollout.partial_rollout)
            executor = ThreadPoolExecutor(max_workers=max(8, cfg.pool.max_concurrent_episodes), thread_name_prefix=f"tau2-{env_cfg.domain}")
            st = _DOMAINS[key] = DomainState(bench, sandbox, executor, settings)
        return st


class _PreReset:
    """An :class:`~rollout.core.environment.Environment` whose ``reset`` was run ahead (so the
    first prompt's length is known before the loop starts); ``reset`` answers that result, or
    raises its error, for :func:`run_episode` to map to a status as usual."""

    def __init__(self, env: Environment):
        self.env = env
        self._result: tuple[str, dict] | None = None
        self._error: BaseException | None = None

    async def prefetch(self, task_id: str) -> str | None:
        """Run the real reset; the opening message, or ``None`` when it raised."""
        try:
            self._result = await self.env.reset(task_id)
        except Exception as e:  # mapped by run_episode when it calls reset
            self._error = e
            return None
        return self._result[0]

    async def reset(self, task_id: str):
        """The prefetched answer (or error)."""
        if self._error is not None:
            raise self._error
        return self._result

    async def step(self, action):
        """The wrapped environment's step."""
        return await self.env.step(action)

    @property
    def timings(self) -> dict:
        """The wrapped environment's timings."""
        return getattr(self.env, "timings", {})


async def run_task_episode(spec: EpisodeSpec, st: DomainState, env_cfg: EnvConfig, policy: PolicyClient, chat: ChatFormat, *,
                           timeout_s: float | None, prompt_limit: int | None = None, response_limit: int | None = None,
                           who: str = "trainer") -> InteractionResult:
    """Run ``spec``'s episode; never raises for what an episode does (every failure is a status).

    Args:
        spec: the episode (task, seed, ids).
        st: the domain's state (:func:`domain_state`).
        env_cfg: the ``env`` section (the row's domain).
        policy: the trainer's engine as a :class:`~rollout.core.policy.PolicyClient`.
        chat: the probed chat format.
        timeout_s: bound on the whole episode, seconds (``pool.episode_timeout_s``; ``None``: none).
        prompt_limit, response_limit: the trainer's separate bounds on the first prompt and on the
            rest, tokens (verl's ``prompt_length`` / ``response_length``), or ``None``. With both,
            the first prompt P is rendered before the loop starts and the loop runs with
            ``max_context_tokens = min(policy.max_context_tokens, P + response_limit)``; a P over
            ``prompt_limit`` ends the episode ``truncated`` (termination ``context``) before any
            call, with a warning.
        who: the name used in that warning (e.g. ``tau2_agent``).

    Returns:
        The episode's :class:`~rollout.core.records.InteractionResult` (``user_error`` when the
        user simulator cannot be set up, ``timeout`` past ``timeout_s``, ``env_error`` with
        termination ``crash`` for a bug, ``policy_error`` when rendering the first prompt ran past
        ``policy.tokenize_timeout_s``).
    """
    try:
        try:
            env: Environment = st.benchmark.new_episode(env_cfg, spec.task_id, seed=spec.seed, executor=st.executor, sandbox=st.sandbox)
        except UserSimulatorError as e:
            return InteractionResult(spec, EpisodeStatus.USER_ERROR, 0.0, None, metadata={"termination_reason": "user_setup", "error": str(e)})
        settings = st.settings
        if prompt_limit is not None and response_limit is not None:
            env = _PreReset(env)
            opening = await env.prefetch(spec.task_id)
            if opening is not None:
                first = [{"role": "system", "content": settings.system_prompt}, {"role": "user", "content": opening}]
                p = len(await off_loop(settings, chat.prompt_ids, first))
                if p > prompt_limit:
                    logger.warning("%s: task %s's first prompt has %d tokens, more than the trainer's prompt length %d: the episode "
                                   "ends truncated before its first turn", who, spec.task_id, p, prompt_limit)
                bound = p if p > prompt_limit else p + response_limit
                settings = replace(settings, max_context_tokens=min(settings.max_context_tokens, bound))
        coro = run_episode(spec, env, policy, chat, settings)
        return await (asyncio.wait_for(coro, timeout_s) if timeout_s else coro)
    except TokenizeTimeout as e:  # rendering the first prompt (the loop maps its own the same way)
        return InteractionResult(spec, EpisodeStatus.POLICY_ERROR, 0.0, None, metadata={"termination_reason": "tokenize_timeout", "error": str(e)})
    except asyncio.TimeoutError:
        return InteractionResult(spec, EpisodeStatus.TIMEOUT, 0.0, None,
                                 metadata={"termination_reason": "episode_timeout", "error": f"episode ran over {timeout_s}s (pool.episode_timeout_s)"})
    except Exception as e:  # a bug must not take the trainer's worker down; it is a typed failure
        logger.exception("episode %s crashed", spec.episode_id)
        return InteractionResult(spec, EpisodeStatus.ENV_ERROR, 0.0, None, metadata={"termination_reason": "crash", "error": repr(e)})


def episode_metrics(result: InteractionResult) -> dict[str, float]:
    """``{"generate_s", "env_s", "reward_s"}``: seconds in ``/generate`` calls, in tools and the
    user simulator, and computing the reward (0.0 where the episode did not record them)."""
    t = result.metadata.get("timings") or {}
    return {"generate_s": float(t.get("generate_s", 0.0)), "env_s": float(t.get("tool_s", 0.0)) + float(t.get("user_s", 0.0)),
            "reward_s": float(t.get("reward_s", 0.0))}


def single_token_stop_ids(tokenizer: Any, stops: Iterable[str]) -> tuple[list[int], list[str]]:
    """``(ids, rest)``: the stop strings that are one token of ``tokenizer``'s vocabulary, as ids,
    and the others (which a server without a detokenizer cannot stop on). Trainers' engines stop on
    ids (verl's SGLang server runs with ``skip_tokenizer_init=True``), so one-token stop strings such
    as Qwen3's ``</tool_call>`` are sent as ``stop_token_ids``.

    Args:
        tokenizer: a Hugging Face tokenizer (``encode`` with ``add_special_tokens``).
        stops: stop strings (``policy.sampling.stop``).
    """
    ids: list[int] = []
    rest: list[str] = []
    for s in stops:
        enc = tokenizer.encode(s, add_special_tokens=False)
        if len(enc) == 1:
            ids.append(int(enc[0]))
        else:
            rest.append(s)
    return ids, rest


def warn_unmatched_stops(stops: Iterable[str]) -> None:
    """Log once per process each stop string that is not one token: the trainer integrations send
    stop token ids only (verl's SGLang server, run with ``skip_tokenizer_init``, cannot match
    strings), so such a string never ends a turn."""
    for s in stops:
        if s not in _warned_stops:
            _warned_stops.add(s)
            logger.warning("stop string %r is not one token of the policy's vocabulary: the trainer's engine is sent stop "
                           "token ids only; the model's end of turn ends such turns", s)
