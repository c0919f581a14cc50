"""One benchmark episode for a trainer's own loop (verl's agent loop, AReaL's workflow): everything
but the framework. Importing this module imports no framework.

A trainer integration is an adapter over :class:`TaskRunner`: it builds one (our config, the
refusal of several samples per episode when the trainer takes one output per episode), hands
:meth:`TaskRunner.run` the dataset row and its policy-client adapter (a factory of a
:class:`~rollout.core.policy.PolicyClient` over the trainer's engine), and converts the
:class:`TaskEpisode` it gets back into the trainer's output (docs/design.md, "A trainer
integration").

* :class:`TaskRunner` / :class:`TaskEpisode`: a row's task -> env config, domain state, the probed
  chat format (:func:`rollout.core.formats.build_chat_format`), stop ids, the client,
  ``EpisodeSpec``, the guarded run, whether it may be trained, its samples in
  ``rollout.sample_mode``.
* :func:`load_tau_config`: our YAML (a path, else ``$TAU_ROLLOUT_CONFIG``, else the defaults), once
  per process; ``policy.router_url`` is a placeholder, since the trainer's engine serves the policy.
* :func:`several_samples_reason`: whether the config can give several samples per episode.
* :func:`domain_state`: the benchmark domain's data, tool sandbox, threads and episode settings,
  loaded once per process through the benchmark registry.
* :func:`run_task_episode`: :func:`rollout.core.runner.run_guarded_episode` on the domain and, when
  the trainer bounds the prompt and the response separately (verl pads each to a fixed length),
  the first prompt rendered ahead and the context bound to ``first prompt + response limit``.
* :func:`episode_metrics`: seconds spent generating, in tools and the user simulator, and in the reward.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from rollout.core.choices import History, SampleMode
from rollout.core.config import Config, EnvConfig, OpenIssues, load_config
from rollout.core.environment import Benchmark, Environment, load_benchmark
from rollout.core.export import get_exporter
from rollout.core.formats import ChatFormat, build_chat_format
from rollout.core.policy import PolicyClient
from rollout.core.prompts import off_loop
from rollout.core.records import EpisodeSpec, InteractionResult, TrainingSample
from rollout.core.runner import run_guarded_episode
from rollout.core.settings import EpisodeSettings
from rollout.core.tasks import open_task_issues

logger = logging.getLogger(__name__)

__all__ = ["CONFIG_ENV", "UNUSED_ROUTER", "ClientFactory", "DomainState", "TaskEpisode", "TaskRunner", "domain_state", "env_config_for",
           "episode_metrics", "load_tau_config", "run_task_episode", "several_samples_reason", "single_token_stop_ids", "warn_unmatched_stops"]

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
    if cfg.rollout.sample_mode == SampleMode.PER_TURN:
        return "rollout.sample_mode=per_turn gives one sample per assistant turn"
    if cfg.rollout.sample_mode not in SampleMode.values():  # a registered mode of one's own: any number
        return f"rollout.sample_mode={cfg.rollout.sample_mode} (a registered mode) may give several samples per episode"
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
                                                   tool_names=bench.tool_names, partial_rollout=cfg.rollout.partial_rollout,
                                                   reward_shaping=cfg.rollout.reward_shaping)
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
    """Run ``spec``'s episode (:func:`rollout.core.runner.run_guarded_episode`); never raises for
    what an episode does (every failure is a status).

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
    def open_env() -> Environment:
        return st.benchmark.new_episode(env_cfg, spec.task_id, seed=spec.seed, executor=st.executor, sandbox=st.sandbox)

    async def bound_by_first_prompt(env: Environment, settings: EpisodeSettings) -> tuple[Environment, EpisodeSettings]:
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
        return env, settings

    bounded = prompt_limit is not None and response_limit is not None
    result = await run_guarded_episode(spec, open_env, policy, chat, st.settings, timeout_s=timeout_s,
                                       prepare=bound_by_first_prompt if bounded else None,
                                       task_issues=open_task_issues(st.benchmark, spec.task_id))
    result.add_graded_by(getattr(st.benchmark, "graded_by", None))  # the benchmark's optional GradedBy, as the worker adds it
    return result


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


ClientFactory = Callable[[ChatFormat, list[int]], PolicyClient]
"""An integration's policy-client adapter: ``client_for(chat, stop_ids) -> PolicyClient``, one
client per episode over the trainer's engine, given the episode's probed chat format (its
``eot_ids``) and the one-token stop strings as ids (:func:`single_token_stop_ids`)."""


@dataclass
class TaskEpisode:
    """One row's episode, as :meth:`TaskRunner.run` hands it to the integration's output conversion.

    Attributes:
        result: the episode's record (status, reward, trajectory, metadata, conversation).
        trainable: whether its status is in ``rollout.train_statuses`` (infrastructure failures
            are not, by default: docs/design.md invariant 4), and, with ``env.open_issues=skip``,
            its task has no open issue (a row naming such a task runs, untrained).
        samples: its samples in ``rollout.sample_mode`` (the exporter's ``split`` of the episode
            sample; one for ``trajectory``), each with the episode's reward and status.
        client: the policy client the episode ran on (what the adapter recorded: versions, ...).
    """

    result: InteractionResult
    trainable: bool
    samples: list[TrainingSample]
    client: PolicyClient


class TaskRunner:
    """The episodes of one trainer integration: a dataset row's task on our episode loop, with the
    trainer's engine as the policy. An integration builds one and calls :meth:`run` per row; what
    it supplies is its policy-client adapter (:data:`ClientFactory`) and the conversion of the
    :class:`TaskEpisode` into its own output.

    Args:
        who: the integration's name in messages (e.g. ``tau2_agent``, ``Tau2Workflow``).
        id_prefix: the first part of every episode id (``verl`` -> ``verl/<domain>/<task>/<hex>``).
        tau_rollout_config: our YAML; ``None``: ``$TAU_ROLLOUT_CONFIG`` or the defaults
            (:func:`load_tau_config`).
        tau_rollout_overrides: ``key=value`` overrides of our config.
        multiple_outputs: whether the trainer takes several samples per episode.
        one_output_hint: the end of the refusal when it does not and the config may give several
            (what to change, in the trainer's terms).

    Attributes:
        cfg: our config (:class:`~rollout.core.config.Config`).

    Raises:
        ValueError: the config may give several samples per episode (:func:`several_samples_reason`)
            and ``multiple_outputs`` is off: ``"<who>: <why>, <one_output_hint>"``.
        rollout.core.config.ConfigError: a bad value in our YAML.
    """

    def __init__(self, who: str, id_prefix: str, tau_rollout_config: str | None = None, tau_rollout_overrides: Iterable[str] | None = None,
                 *, multiple_outputs: bool = False, one_output_hint: str = "use rollout.sample_mode=trajectory"):
        self.who = who
        self.id_prefix = id_prefix
        self.cfg = load_tau_config(tau_rollout_config, tuple(tau_rollout_overrides or ()))
        self.multiple_outputs = bool(multiple_outputs)
        why = several_samples_reason(self.cfg)
        if why and not self.multiple_outputs:
            raise ValueError(f"{who}: {why}, {one_output_hint}")

    def template_kwargs(self, given: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The chat-template arguments: ``given`` (the trainer's), with our ``policy.enable_thinking`` where it is unset."""
        kw = dict(given or {})
        if self.cfg.policy.enable_thinking is not None:
            kw.setdefault("enable_thinking", self.cfg.policy.enable_thinking)
        return kw

    async def run(self, row: Mapping[str, Any], tokenizer: Any, client_for: ClientFactory, *, template_kwargs: Mapping[str, Any] | None = None,
                  group_id: str | None = None, prompt_limit: int | None = None, response_limit: int | None = None,
                  keep_messages: bool | None = None) -> TaskEpisode:
        """Run one row's episode.

        Args:
            row: the task: ``task_id`` (required), ``domain`` (overrides ``env.domain``), ``seed``
                (the episode's seed; default a random one), as :mod:`rollout.integrations.verl_data`
                writes ``extra_info``.
            tokenizer: the policy's tokenizer (the trainer's).
            client_for: the integration's policy-client adapter (:data:`ClientFactory`).
            template_kwargs: the trainer's chat-template arguments (see :meth:`template_kwargs`).
            group_id: the episode's group (default ``<domain>/<task>``).
            prompt_limit, response_limit: the trainer's separate bounds (:func:`run_task_episode`).
            keep_messages: keep the conversation in the samples (default ``rollout.keep_messages``).

        Returns:
            The :class:`TaskEpisode`; a failed episode is a status in it, never an exception.

        Raises:
            ValueError: the row names no task.
            KeyError: the task is not in the domain.
            TemplateError: the chat format cannot be used with the tokenizer.
        """
        cfg = self.cfg
        if row.get("task_id") is None:
            raise ValueError(f"{self.who}: the row names no task: it needs a task_id (extra_info.task_id as "
                             "rollout.integrations.verl_data writes it)")
        task_id = str(row["task_id"])
        env_cfg = env_config_for(cfg, row.get("domain"))
        st = await asyncio.to_thread(domain_state, cfg, env_cfg)
        if task_id not in st.benchmark.tasks:
            raise KeyError(f"{self.who}: task {task_id!r} is not a task of {env_cfg.benchmark} {env_cfg.domain}")
        probed = await asyncio.to_thread(build_chat_format, tokenizer, st.benchmark.tool_schemas, self.template_kwargs(template_kwargs),
                                         cfg.policy.chat_format)
        stop_ids, unmatched = single_token_stop_ids(tokenizer, cfg.policy.sampling.stop)
        warn_unmatched_stops(unmatched)
        client = client_for(probed.chat, stop_ids)
        seed = int(row["seed"]) if row.get("seed") is not None else secrets.randbelow(2**31 - 1)
        spec = EpisodeSpec(episode_id=f"{self.id_prefix}/{env_cfg.domain}/{task_id}/{uuid.uuid4().hex[:12]}", domain=env_cfg.domain,
                           task_id=task_id, group_id=group_id or f"{env_cfg.domain}/{task_id}", sample_index=0, seed=seed)
        res = await run_task_episode(spec, st, env_cfg, client, probed.chat, timeout_s=cfg.pool.episode_timeout_s, prompt_limit=prompt_limit,
                                     response_limit=response_limit, who=self.who)
        keep = cfg.rollout.keep_messages if keep_messages is None else bool(keep_messages)
        samples = get_exporter(cfg.rollout.sample_mode, keep_messages=keep).split(res.to_sample(messages=keep))
        trainable = res.status.value in set(cfg.rollout.train_statuses)
        if res.task_issues and cfg.env.open_issues == OpenIssues.SKIP:  # a dataset made before the issue, or by hand
            trainable = False
            logger.warning("%s: task %s has an open issue (%s) and env.open_issues=skip: its episode %s is not trained "
                           "(rollout.integrations.verl_data leaves such tasks out of the dataset)", self.who, task_id,
                           res.task_issues[0].title, spec.episode_id)
        return TaskEpisode(res, trainable, samples, client)
