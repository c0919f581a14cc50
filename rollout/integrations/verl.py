"""verl's agent loop for tau2 (and tau-bench): one episode on our episode loop per verl sample.

Importing this module imports verl (``verl.experimental.agent_loop``) and registers
:class:`Tau2AgentLoop` in verl's agent-loop registry as ``tau2_agent`` (:data:`AGENT_NAME`).
Nothing else in ``rollout`` imports it. Facts from verl 0.9.1's source
(``verl/experimental/agent_loop/agent_loop.py``): an agent loop subclasses ``AgentLoopBase``,
is registered by name (``@register(name)`` or an entry of the YAML that
``actor_rollout_ref.rollout.agent.agent_loop_config_path`` names, ``{name, _target_, ...}``), is
built per sample by ``hydra.utils.instantiate`` with the entry's other keys as keyword arguments,
and its ``async run(sampling_params, **row)`` returns an ``AgentLoopOutput`` for the row of the
dataset whose ``agent_name`` names it. ``AgentLoopWorker`` hands it the server manager
(``self.server_manager``), the model's tokenizer and the trainer's config.

What a run does:

1. Our config (domain, user simulator, ``env.max_steps``, chat format, stop strings, per-turn
   ``max_new_tokens``, ``on_parse_error``, ``rollout.train_statuses``, ``rollout.sample_mode``,
   timeouts) is the YAML named by the agent-loop entry's ``tau_rollout_config`` key, else the
   environment variable ``TAU_ROLLOUT_CONFIG``, else our defaults, with the entry's
   ``tau_rollout_overrides`` (``key=value`` strings) on top; loaded once per process, with the
   domain's data and tool sandbox. verl's sampling parameters (``temperature``, ``top_p``,
   ``top_k``; greedy in validation) and tokenizer are used, not ours; ``policy.router_url`` and
   ``pool.*`` (but ``pool.episode_timeout_s``) are not read.
2. The task is the row's ``extra_info["task_id"]`` (``extra_info["domain"]`` overrides
   ``env.domain``, ``extra_info["seed"]`` fixes the episode's seed):
   :mod:`rollout.integrations.verl_data` writes such a dataset.
3. :func:`rollout.core.episode.run_episode` runs it with our environment, user simulator and chat
   format, and verl's server manager as the policy client
   (:class:`~rollout.integrations.verl_client.VerlPolicyClient`). The episode's context is bounded
   by verl's: the first prompt P must fit ``rollout.prompt_length`` and the rest
   ``rollout.response_length`` (the loop's ``max_context_tokens`` becomes
   ``min(policy.max_context_tokens, P + response_length)``), so verl's padding never cuts a token.
   A first prompt longer than ``prompt_length`` ends the episode ``truncated`` (termination
   ``context``) before any call, with its prompt cut on the left as verl cuts its own, and a
   warning naming the key.
4. The result becomes ``AgentLoopOutput`` (:func:`rollout.integrations.verl_output.output_fields`):
   our tokens, loss mask (``response_mask``), rollout log-probs, the tau2 reward as
   ``reward_score`` (verl's reward loop is then skipped for the sample), our status and weight
   versions in ``extra_fields``. An episode whose status is not in ``rollout.train_statuses``
   gets a zero ``response_mask`` and ``extra_fields["tau2_trainable"] = False``.

Sample modes: verl's ``AgentLoopWorker`` takes ONE ``AgentLoopOutput`` per run. ``trajectory``
(default) gives one; ``merge_prefix`` with ``policy.history=append`` and no context strategy gives
the same one. ``per_turn``, ``policy.history=rerender`` and a ``policy.context_strategy`` give
several samples per episode: the loop refuses them when it is built, in one line, unless the
agent-loop entry sets ``multiple_outputs: true``; ``run`` then returns a list (one output per
sample, each with the episode's reward), the shape verl's TransferQueue worker
(``verl/trainer/ppo/v1/agent_loop_tq.py``: ``AgentLoopWorkerTQ._agent_loop_postprocess``) takes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, register

from rollout.core.choices import History, SampleMode
from rollout.core.config import Config, EnvConfig, load_config
from rollout.core.environment import Benchmark, Environment, UserSimulatorError, load_benchmark
from rollout.core.episode import run_episode
from rollout.core.export import get_exporter
from rollout.core.formats import ChatFormat
from rollout.core.prompts import TokenizeTimeout, off_loop
from rollout.core.records import EpisodeSpec, EpisodeStatus, InteractionResult
from rollout.core.settings import EpisodeSettings
from rollout.integrations.seed import _chat_for
from rollout.integrations.verl_client import VerlPolicyClient, single_token_stop_ids, warn_unmatched_stops
from rollout.integrations.verl_data import AGENT_NAME
from rollout.integrations.verl_output import num_turns, output_fields

logger = logging.getLogger(__name__)

__all__ = ["AGENT_NAME", "CONFIG_ENV", "Tau2AgentLoop", "load_tau_config", "several_samples_reason"]

CONFIG_ENV = "TAU_ROLLOUT_CONFIG"
# The loop sends every call through verl's server manager and never reads policy.router_url; our
# config requires one when local.enabled=false, so the loop's config gets this placeholder.
UNUSED_ROUTER = "http://verl-server-manager.invalid"

_LOCK = threading.Lock()
_CONFIGS: dict[tuple[str | None, tuple[str, ...]], Config] = {}
_DOMAINS: dict[tuple, _Domain] = {}


@dataclass
class _Domain:
    """What one process keeps per benchmark domain: its data, tool sandbox, threads and settings."""

    benchmark: Benchmark
    sandbox: Any
    executor: ThreadPoolExecutor
    settings: EpisodeSettings


def load_tau_config(path: str | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Our config for the loop: the YAML ``path``, else ``$TAU_ROLLOUT_CONFIG``, else the defaults,
    with ``overrides`` (``key=value``) on top; loaded once per process per (path, overrides).
    ``policy.router_url`` is set to :data:`UNUSED_ROUTER` (verl's server manager serves the policy).

    Raises:
        rollout.core.config.ConfigError: a bad YAML value (one line naming the key).
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
    mode = SampleMode(cfg.rollout.sample_mode)
    if mode == SampleMode.PER_TURN:
        return "rollout.sample_mode=per_turn gives one sample per assistant turn"
    if History(cfg.policy.history) == History.RERENDER:
        return "policy.history=rerender starts a new sample wherever a rendering does not extend the last"
    if str(cfg.policy.context_strategy) != "none":
        return f"policy.context_strategy={cfg.policy.context_strategy} starts a new sample at each compaction"
    return None


def _domain(cfg: Config, env_cfg: EnvConfig) -> _Domain:
    """The domain's state, loaded once per process (blocking: seconds the first time)."""
    key = (id(cfg), env_cfg.benchmark, env_cfg.domain)
    with _LOCK:
        st = _DOMAINS.get(key)
        if st is None:
            bench = load_benchmark(env_cfg, log_level=cfg.logging.tau2_level)
            sandbox = bench.new_actor_sandbox(env_cfg, log_level=cfg.logging.tau2_level)
            settings = EpisodeSettings.from_policy(cfg.policy, max_steps=env_cfg.max_steps, system_prompt=bench.system_prompt,
                                                   tool_names=bench.tool_names, partial_rollout=cfg.rollout.partial_rollout)
            executor = ThreadPoolExecutor(max_workers=max(8, cfg.pool.max_concurrent_episodes), thread_name_prefix=f"tau2-verl-{env_cfg.domain}")
            st = _DOMAINS[key] = _Domain(bench, sandbox, executor, settings)
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
        if self._error is not None:
            raise self._error
        return self._result

    async def step(self, action):
        return await self.env.step(action)

    @property
    def timings(self) -> dict:
        return getattr(self.env, "timings", {})


@register(AGENT_NAME)
class Tau2AgentLoop(AgentLoopBase):
    """verl's agent loop for one tau2 episode (see the module docstring).

    Args:
        *args, **kwargs: verl's (``AgentLoopBase``: trainer config, server manager, tokenizer, ...).
        tau_rollout_config: our YAML (the agent-loop entry's key); ``None``: ``$TAU_ROLLOUT_CONFIG``
            or the defaults.
        tau_rollout_overrides: ``key=value`` overrides of our config.
        multiple_outputs: allow several samples per episode (``run`` returns a list), for verl's
            TransferQueue worker.

    Raises:
        ValueError: the config may give several samples per episode and ``multiple_outputs`` is
            off (one line naming the key).
        rollout.core.config.ConfigError: a bad value in our YAML.
    """

    def __init__(self, *args: Any, tau_rollout_config: str | None = None, tau_rollout_overrides: Any = None,
                 multiple_outputs: bool = False, **kwargs: Any):
        kwargs.pop("name", None)  # the entry's own name, passed along by hydra
        super().__init__(*args, **kwargs)
        self.tau_cfg = load_tau_config(tau_rollout_config, tuple(tau_rollout_overrides or ()))
        self.multiple_outputs = bool(multiple_outputs)
        why = several_samples_reason(self.tau_cfg)
        if why and not self.multiple_outputs:
            raise ValueError(f"{AGENT_NAME}: {why}, but verl's AgentLoopWorker takes one AgentLoopOutput per run: use "
                             "rollout.sample_mode=trajectory, or set multiple_outputs: true in the agent-loop entry for verl's "
                             "TransferQueue worker, which takes a list")
        self.prompt_length = int(self.rollout_config.prompt_length)
        self.response_length = int(self.rollout_config.response_length)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput | list[AgentLoopOutput]:
        """Run the row's tau2 episode (see the module docstring).

        Args:
            sampling_params: verl's (``temperature``, ``top_p``, ``top_k``, ``logprobs``, ...).
            **kwargs: the dataset row: ``extra_info`` (``task_id``; ``domain``, ``seed``), ``uid``.

        Returns:
            One ``AgentLoopOutput``, or (``multiple_outputs``) a list of them, one per sample.

        Raises:
            ValueError: the row names no task (``extra_info["task_id"]``).
            KeyError: the task is not in the domain.
        """
        cfg = self.tau_cfg
        extra = dict(kwargs.get("extra_info") or {})
        if extra.get("task_id") is None:
            raise ValueError(f"{AGENT_NAME}: the dataset row has no extra_info.task_id (rollout.integrations.verl_data writes one)")
        task_id = str(extra["task_id"])
        env_cfg = cfg.env if not extra.get("domain") or extra["domain"] == cfg.env.domain else replace(cfg.env, domain=str(extra["domain"]))
        st = await asyncio.to_thread(_domain, cfg, env_cfg)
        if task_id not in st.benchmark.tasks:
            raise KeyError(f"{AGENT_NAME}: task {task_id!r} is not a task of {env_cfg.benchmark} {env_cfg.domain}")
        chat = await asyncio.to_thread(_chat_for, self.tokenizer, st.benchmark.tool_schemas, self._template_kwargs(), cfg.policy.chat_format)
        stop_ids, unmatched = single_token_stop_ids(self.tokenizer, cfg.policy.sampling.stop)
        warn_unmatched_stops(unmatched)
        eos = getattr(self.tokenizer, "eos_token_id", None)
        client = VerlPolicyClient(self.server_manager, sampling_params, stop_token_ids=stop_ids,
                                  end_ids=list(chat.eot_ids) + ([eos] if eos is not None else []), backend=str(self.rollout_config.name))
        seed = int(extra["seed"]) if extra.get("seed") is not None else secrets.randbelow(2**31 - 1)
        spec = EpisodeSpec(episode_id=f"verl/{env_cfg.domain}/{task_id}/{uuid.uuid4().hex[:12]}", domain=env_cfg.domain, task_id=task_id,
                           group_id=str(kwargs.get("uid") or f"{env_cfg.domain}/{task_id}"), sample_index=0, seed=seed)
        t0 = time.monotonic()
        res = await self._episode(spec, st, env_cfg, client, chat)
        trainable = res.status.value in set(cfg.rollout.train_statuses)
        samples = get_exporter(cfg.rollout.sample_mode, keep_messages=cfg.rollout.keep_messages).split(
            res.to_sample(messages=cfg.rollout.keep_messages))
        timings = res.metadata.get("timings") or {}
        metrics = {"generate_sequences": float(timings.get("generate_s", 0.0)),
                   "tool_calls": float(timings.get("tool_s", 0.0)) + float(timings.get("user_s", 0.0)),
                   "compute_score": float(timings.get("reward_s", 0.0)), "num_preempted": client.preempted}
        fallback = [int(eos if eos is not None else 0)]
        outputs = [AgentLoopOutput(**self._fit(output_fields(s, trainable=trainable, turns=num_turns(res.messages), metrics=metrics,
                                                             versions=client.versions, fallback_prompt=fallback)))
                   for s in samples]
        logger.debug("episode %s: %s, reward %.3f, %d sample(s), %.2fs", spec.episode_id, res.status.value, res.reward, len(outputs),
                     time.monotonic() - t0)
        if self.multiple_outputs:
            return outputs
        if len(outputs) != 1:  # several_samples_reason refused every config that can do this
            raise RuntimeError(f"{AGENT_NAME}: episode {spec.episode_id} gave {len(outputs)} samples in one-output mode")
        return outputs[0]

    def _template_kwargs(self) -> dict[str, Any]:
        kw = dict(self.apply_chat_template_kwargs or {})
        if self.tau_cfg.policy.enable_thinking is not None:
            kw.setdefault("enable_thinking", self.tau_cfg.policy.enable_thinking)
        return kw

    def _fit(self, fields: dict[str, Any]) -> dict[str, Any]:
        """In one-output mode, a prompt longer than verl's ``prompt_length`` (the episode ended
        before its first call) is cut on the left, as verl cuts its own; nothing of it is trained."""
        cut = len(fields["prompt_ids"]) - self.prompt_length
        if not self.multiple_outputs and cut > 0:
            fields["prompt_ids"] = fields["prompt_ids"][cut:]
            fields["extra_fields"]["tau2_prompt_cut"] = cut
        return fields

    async def _episode(self, spec: EpisodeSpec, st: _Domain, env_cfg: EnvConfig, client: VerlPolicyClient,
                       chat: ChatFormat) -> InteractionResult:
        """``run_episode`` with the worker's outer guards (the whole-episode bound, a crash net)
        and, in one-output mode, verl's context bound (the module docstring, point 3)."""
        timeout_s = self.tau_cfg.pool.episode_timeout_s
        try:
            try:
                env: Environment = st.benchmark.new_episode(env_cfg, spec.task_id, seed=spec.seed, executor=st.executor, sandbox=st.sandbox)
            except UserSimulatorError as e:
                return InteractionResult(spec, EpisodeStatus.USER_ERROR, 0.0, None, metadata={"termination_reason": "user_setup", "error": str(e)})
            settings = st.settings
            if not self.multiple_outputs:
                env = _PreReset(env)
                opening = await env.prefetch(spec.task_id)
                if opening is not None:
                    first = [{"role": "system", "content": settings.system_prompt}, {"role": "user", "content": opening}]
                    p = len(await off_loop(settings, chat.prompt_ids, first))
                    if p > self.prompt_length:
                        logger.warning("%s: task %s's first prompt has %d tokens, more than actor_rollout_ref.rollout.prompt_length=%d "
                                       "(data.max_prompt_length): the episode ends truncated before its first turn", AGENT_NAME,
                                       spec.task_id, p, self.prompt_length)
                    bound = p if p > self.prompt_length else p + self.response_length
                    settings = replace(settings, max_context_tokens=min(settings.max_context_tokens, bound))
            coro = run_episode(spec, env, client, chat, settings)
            return await (asyncio.wait_for(coro, timeout_s) if timeout_s else coro)
        except TokenizeTimeout as e:  # measuring the first prompt (the loop maps its own the same way)
            return InteractionResult(spec, EpisodeStatus.POLICY_ERROR, 0.0, None, metadata={"termination_reason": "tokenize_timeout", "error": str(e)})
        except asyncio.TimeoutError:
            return InteractionResult(spec, EpisodeStatus.TIMEOUT, 0.0, None,
                                     metadata={"termination_reason": "episode_timeout", "error": f"episode ran over {timeout_s}s (pool.episode_timeout_s)"})
        except Exception as e:  # a bug must not take verl's worker down; it is a typed failure
            logger.exception("episode %s crashed", spec.episode_id)
            return InteractionResult(spec, EpisodeStatus.ENV_ERROR, 0.0, None, metadata={"termination_reason": "crash", "error": repr(e)})
