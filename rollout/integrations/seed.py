"""The seed's agent interface, on our episode loop.

Users who come from the seed (``shared/seed/trainable_agents.py.txt``, the tau-bench example of
slime) call ``await agent.asolve(env, rollout_args, sampling_params, task_index, max_num_steps)``
and read an ``InteractionResult`` with ``prompt``, ``reward``, ``messages``, ``info``,
``response``, ``loss_mask``, ``tokens``, ``response_length`` and ``status``. This module keeps that
entry point and those fields, and runs the episode with :func:`rollout.core.episode.run_episode` (the
one loop of this project: token in / token out, log-probs from the server, nothing re-tokenized,
the environment off the event loop, every ending typed). The result adds ``rollout_log_probs``,
``weight_versions`` and ``generation_spans``, and keeps our exact status in ``episode_status``.

The arguments, mapped onto ours:

* ``env``: the seed passes a tau-bench environment built for one task (``get_env(...,
  task_index=i)``, with ``wiki`` and ``tools_info``). Ours is :class:`TaskEnv` (made by
  :func:`make_env`): a :class:`~rollout.benchmarks.tau2.environment.Tau2Environment` bound to one tau2 task, with
  the same ``wiki`` / ``tools_info`` / ``task_index`` attributes and the seed's ``reset`` / ``step``
  made async. :func:`make_env` also wraps a domain that makes its own environments
  (``new_episode``: the original tau-bench's adapter, :mod:`rollout.benchmarks.tau_bench.environment`). Any
  environment with :class:`rollout.core.episode.Environment`'s shape works too when ``task_index`` is
  given (e.g. a bare ``Tau2Environment``).
* ``rollout_args``: an ``argparse.Namespace`` (slime's ``args``) or a mapping. Read: the router
  (``router_url``, or slime's ``sglang_router_ip`` + ``sglang_router_port``), the tokenizer
  (``tokenizer``: a loaded tokenizer or a name; else slime's ``hf_checkpoint``), the context bound
  (slime's ``rollout_max_context_len``) and chat-template arguments (slime's
  ``apply_chat_template_kwargs``).
* ``sampling_params``: SGLang's ``sampling_params`` dict, as the seed sends it with every
  ``/generate`` call; ``max_new_tokens`` is per assistant turn (as in the seed, which sends the
  same dict for every turn). See :func:`policy_config` for what is read, forced and passed through.
* ``task_index``: a tau2 task id (str), or an index (int) into the environment's task split
  (``env.task_split``), as the seed's index into its split; ``None``: the task ``env`` is bound to.
* ``max_num_steps``: agent turns (our ``env.max_steps``).

Status, ours (:class:`~rollout.core.records.EpisodeStatus`) -> the seed's :class:`Status` (which has
three values; ``episode_status`` and ``info["status"]`` keep ours):

==================================================================  ==========  =========================================
ours                                                                seed        why
==================================================================  ==========  =========================================
``completed``                                                       completed   the conversation ended (user, agent, transfer)
``max_steps``                                                       truncated   the seed's loop ran out of steps: ``TRUNCATED``
``truncated``                                                       truncated   the context window is full
``parse_error``                                                     aborted     the seed aborts on an unparseable turn
``tool_timeout``                                                    aborted     the seed aborts when ``env.step`` raises
``aborted``                                                         aborted     the server answered ``finish_reason`` abort
``timeout``, ``policy_error``, ``env_error``, ``user_error``,       aborted     infrastructure failures (the seed aborts on
``eval_error``, ``actor_lost``, ``cancelled``                                   a failed ``env.step``; it had no other name)
==================================================================  ==========  =========================================

``aborted`` in the seed's sense mixes policy failures with infrastructure failures: decide what to
train from ``episode_status`` (or :meth:`InteractionResult.to_sample` and
:mod:`rollout.integrations.slime`, which follow ``rollout.train_statuses``), never from ``status`` alone.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

import aiohttp

from rollout.benchmarks.tau2.environment import Tau2Domain, Tau2Environment
from rollout.benchmarks.tau2.user import make_user
from rollout.core import records
from rollout.core.config import EnvConfig, PolicyConfig, SamplingConfig
from rollout.core.environment import Action
from rollout.core.episode import Environment, EpisodeSettings, run_episode
from rollout.core.formats import ChatTemplate, TemplateError
from rollout.core.policy import SGLangClient
from rollout.core.records import EpisodeSpec, EpisodeStatus, TrainingSample
from rollout.core.tokenizer import load_tokenizer

logger = logging.getLogger(__name__)


class Status(Enum):
    """The seed's episode status (``trainable_agents.py``'s ``Status``): three values."""

    COMPLETED = "completed"
    TRUNCATED = "truncated"
    ABORTED = "aborted"


SEED_STATUS: dict[EpisodeStatus, Status] = {
    EpisodeStatus.COMPLETED: Status.COMPLETED,
    EpisodeStatus.MAX_STEPS: Status.TRUNCATED,
    EpisodeStatus.TRUNCATED: Status.TRUNCATED,
    EpisodeStatus.PARSE_ERROR: Status.ABORTED,
    EpisodeStatus.TOOL_TIMEOUT: Status.ABORTED,
    EpisodeStatus.ABORTED: Status.ABORTED,
    EpisodeStatus.TIMEOUT: Status.ABORTED,
    EpisodeStatus.POLICY_ERROR: Status.ABORTED,
    EpisodeStatus.ENV_ERROR: Status.ABORTED,
    EpisodeStatus.USER_ERROR: Status.ABORTED,
    EpisodeStatus.EVAL_ERROR: Status.ABORTED,
    EpisodeStatus.ACTOR_LOST: Status.ABORTED,
    EpisodeStatus.CANCELLED: Status.ABORTED,
}


def seed_status(status: EpisodeStatus | str) -> Status:
    """The seed's :class:`Status` for one of our statuses (the table in the module docstring).

    Args:
        status: an :class:`~rollout.core.records.EpisodeStatus` or its value (``"max_steps"``).

    Raises:
        ValueError: ``status`` is not one of ours.
    """
    return SEED_STATUS[EpisodeStatus(status)]


@dataclass
class InteractionResult:
    """What :meth:`TrainableAgent.asolve` returns: the seed's fields, then ours.

    The seed's (``trainable_agents.py``'s ``InteractionResult``):
        prompt: the first prompt's text (the system turn with the tools, the user's opening and the
            generation prompt), decoded from the ids that were sent.
        reward: tau2's reward in [0, 1]; 0.0 when none was computed (see ``episode_status``).
        messages: the OpenAI-style conversation (system, user, assistant, tool).
        info: our episode metadata (turns, termination reason, timings in seconds, token counts,
            reward breakdown, error text) plus ``episode_id``, ``task_id``, ``domain`` and
            ``status`` (ours).
        response: the assistant messages' contents joined (the seed's definition; informational).
        loss_mask: length ``response_length``; 1 exactly on tokens the policy sampled.
        tokens: prompt + response token ids (length ``len(prompt ids) + response_length``).
        status: the seed's :class:`Status` (see the module docstring's table).
        response_length: number of response tokens (``tokens[-response_length:]``; the seed set
            it on the result after building it).

    Ours:
        rollout_log_probs: length ``response_length``; the server's log-prob (natural log) of each
            sampled token, 0.0 where the mask is 0.
        weight_versions: one entry per ``/generate`` call, in order: the server's
            ``meta_info["weight_version"]`` (``None`` where it sent none).
        generation_spans: ``(start, end)`` response indices each call sampled (aligned with
            ``weight_versions``; they cover exactly the mask-1 tokens).
        episode_status: our exact :class:`~rollout.core.records.EpisodeStatus`.
        episode: the loop's own :class:`rollout.core.records.InteractionResult` (spec, trajectory).
    """

    prompt: str
    reward: float
    messages: list[dict[str, Any]]
    info: dict[str, Any]
    response: str = ""
    loss_mask: list[int] | None = None
    tokens: list[int] | None = None
    status: Status = Status.COMPLETED
    response_length: int = 0
    rollout_log_probs: list[float] | None = None
    weight_versions: list[str | None] = field(default_factory=list)
    generation_spans: list[tuple[int, int]] = field(default_factory=list)
    episode_status: EpisodeStatus = EpisodeStatus.COMPLETED
    episode: records.InteractionResult | None = None

    @property
    def prompt_token_ids(self) -> list[int]:
        """The first prompt's ids (``tokens[:-response_length]``)."""
        toks = self.tokens or []
        return toks[: len(toks) - self.response_length]

    @property
    def response_token_ids(self) -> list[int]:
        """The response ids (``tokens[-response_length:]``), aligned with ``loss_mask``."""
        toks = self.tokens or []
        return toks[len(toks) - self.response_length :]

    def to_sample(self) -> TrainingSample:
        """Our :class:`~rollout.core.records.TrainingSample` of this episode (what ``samples.jsonl``
        holds; :func:`rollout.integrations.slime.to_slime` turns either into slime's ``Sample`` fields).

        Raises:
            ValueError: the result has no ``episode`` (it was not made by :meth:`TrainableAgent.asolve`).
        """
        if self.episode is None:
            raise ValueError("this InteractionResult carries no episode record (not made by TrainableAgent.asolve)")
        return self.episode.to_sample()


# -- environments ------------------------------------------------------------------------------
def resolve_task_id(domain: Any, split: str, task: int | str) -> str:
    """A task id from the seed's ``task_index``.

    Args:
        domain: the domain: a :class:`~rollout.benchmarks.tau2.environment.Tau2Domain`, or any domain with
            ``name``, ``tasks`` (id -> task) and ``task_ids(split)`` (e.g. the tau-bench adapter's).
        split: the split an integer indexes (``env.task_split``: ``train`` | ``test`` | ``base``).
        task: a task id (str, as in tau2's ``tasks.json``) or an index into ``split`` (int, in
            tau2's order, as the seed's ``task_index`` indexes its split).

    Raises:
        KeyError: unknown task id or split.
        IndexError: the index is outside the split.
        TypeError: ``task`` is neither an int nor a str.
    """
    if isinstance(task, bool) or not isinstance(task, (int, str)):
        raise TypeError(f"task_index must be a tau2 task id (str) or an index into the split (int), got {task!r}")
    if isinstance(task, int):
        ids = domain.task_ids(split)
        if not 0 <= task < len(ids):
            raise IndexError(f"task_index {task} is outside split {split!r} of {domain.name} ({len(ids)} tasks)")
        return ids[task]
    if task not in domain.tasks:
        raise KeyError(f"{task!r} is not a task of tau2 domain {domain.name}")
    return task


class TaskEnv:
    """One episode's environment bound to one tau2 task: the seed's environment object shape.

    The seed's tau-bench environment is built for one task and carries ``wiki``, ``tools_info`` and
    ``task_index``; so does this one. ``reset`` and ``step`` are the seed's, made async and returning
    tuples (:class:`rollout.core.episode.Environment`), delegated to the wrapped
    :class:`~rollout.benchmarks.tau2.environment.Tau2Environment`, whose user simulator is built for the task.

    Args:
        env: the episode's ``Tau2Environment`` (its user simulator made for ``task_id``), or
            another environment of ours with ``domain`` and ``cfg`` (the tau-bench adapter's).
        task_id: the task id.

    Attributes:
        wiki: the agent's system prompt (tau2's agent instruction and the domain policy).
        tools_info: OpenAI-style tool schemas of the agent's tools.
        task_index: the task id (a str: tau2's ids are strings).
    """

    def __init__(self, env: Environment, task_id: str):
        self.env = env
        self.task_id = str(task_id)

    @property
    def task_index(self) -> str:
        return self.task_id

    @property
    def domain(self) -> Any:
        return self.env.domain

    @property
    def task_split(self) -> str:
        return self.env.cfg.task_split

    @property
    def wiki(self) -> str:
        return self.env.domain.system_prompt

    @property
    def tools_info(self) -> list[dict]:
        return self.env.domain.tool_schemas

    @property
    def timings(self) -> dict[str, float]:
        """Seconds spent building the environment, in tools, in the user simulator, in the reward."""
        return self.env.timings

    async def reset(self, task_id: str | None = None) -> tuple[str, dict[str, Any]]:
        """Start the episode on the bound task.

        Returns:
            ``(observation, info)``: the user's opening message, ``{"task_id", "domain"}``.

        Raises:
            ValueError: ``task_id`` names another task (the user simulator is the bound task's).
            EnvironmentStepError, UserSimulatorError: as ``Tau2Environment.reset``.
        """
        if task_id is not None and str(task_id) != self.task_id:
            raise ValueError(f"this environment is bound to task {self.task_id!r}, not {task_id!r}")
        return await self.env.reset(self.task_id)

    async def step(self, action: Action) -> tuple[str, float, bool, dict[str, Any]]:
        """Apply one agent action: ``(observation, reward, done, info)`` (see ``Tau2Environment.step``)."""
        return await self.env.step(action)


def make_env(domain: Any, task: int | str, *, env_cfg: EnvConfig | None = None, seed: int = 0,
             executor=None, sandbox=None) -> TaskEnv:
    """Our ``get_env(..., task_index=...)``: a fresh environment for one episode of one task.

    Args:
        domain: the domain, loaded once per process: a :class:`~rollout.benchmarks.tau2.environment.Tau2Domain`
            (the episode gets a ``Tau2Environment`` and a user simulator made for the task), or a
            domain with ``new_episode(env_cfg, executor=, sandbox=)`` (the tau-bench adapter's,
            whose environment makes its own user at ``reset``).
        task: a task id (str) or an index into ``env_cfg.task_split`` (int); see :func:`resolve_task_id`.
        env_cfg: the ``env`` section (user simulator, timeouts, evaluator, split); default: ours.
        seed: the user simulator's seed.
        executor: thread pool for tau2 calls (``None``: the event loop's default one).
        sandbox: the process's :class:`~rollout.benchmarks.tau2.environment.ToolSandbox` for database-free tools
            (``None``: they run in a thread without a hard bound; fine for tests and trusted models,
            not for training, see :mod:`rollout.benchmarks.tau2.environment`).

    Raises:
        KeyError, IndexError, TypeError: ``task`` does not name a task (see :func:`resolve_task_id`).
        UserSimulatorError: the user simulator cannot be set up (e.g. its API key is missing).
    """
    env_cfg = env_cfg or EnvConfig(domain=domain.name)
    task_id = resolve_task_id(domain, env_cfg.task_split, task)
    if not isinstance(domain, Tau2Domain) and hasattr(domain, "new_episode"):
        return TaskEnv(domain.new_episode(env_cfg, executor=executor, sandbox=sandbox), task_id)
    user = make_user(domain.tasks[task_id], env_cfg.user, seed=seed)
    return TaskEnv(Tau2Environment(domain, user, env_cfg, executor=executor, sandbox=sandbox), task_id)


# -- rollout_args / sampling_params ----------------------------------------------------------------
def _arg(args: Any, name: str, default: Any = None) -> Any:
    """``args.name`` for a Namespace, ``args[name]`` for a mapping; ``default`` when absent or None."""
    if args is None:
        return default
    value = args.get(name) if isinstance(args, Mapping) else getattr(args, name, None)
    return default if value is None else value


def router_url(rollout_args: Any, default: str | None = None) -> str:
    """The router's base URL (``http://host:port``) from the seed's ``rollout_args``.

    Args:
        rollout_args: Namespace or mapping with ``router_url``, or slime's ``sglang_router_ip``
            and ``sglang_router_port`` (what the seed reads).
        default: used when ``rollout_args`` names no router.

    Raises:
        ValueError: no router is named.
    """
    url = _arg(rollout_args, "router_url")
    if url:
        return str(url).rstrip("/")
    ip, port = _arg(rollout_args, "sglang_router_ip"), _arg(rollout_args, "sglang_router_port")
    if ip is not None and port is not None:
        host = str(ip)
        return f"{host}:{port}" if "://" in host else f"http://{host}:{port}"
    if default:
        return default.rstrip("/")
    raise ValueError("rollout_args names no router: set router_url, or sglang_router_ip and sglang_router_port")


# sampling_params keys the client controls: exactness needs these values (docs/design.md invariant 1)
_FORCED_SAMPLING = {"skip_special_tokens": False, "no_stop_trim": True}
# sampling_params keys that become our SamplingConfig; the rest is sent as given
_OURS = ("temperature", "top_p", "top_k", "max_new_tokens", "stop")


def policy_config(base: PolicyConfig, rollout_args: Any, sampling_params: Mapping[str, Any] | None) -> tuple[PolicyConfig, dict[str, Any], int | None]:
    """Our ``policy`` section for one ``asolve`` call.

    Args:
        base: the defaults (the agent's ``policy``): timeouts, retries, API key variable,
            ``on_parse_error``, ``max_context_tokens``, sampling defaults.
        rollout_args: see :func:`router_url`; ``rollout_max_context_len`` (slime's) replaces
            ``max_context_tokens`` when set.
        sampling_params: SGLang's ``sampling_params``. ``temperature``, ``top_p``, ``top_k``,
            ``max_new_tokens`` (tokens per assistant turn) and ``stop`` become our
            :class:`~rollout.core.config.SamplingConfig` (missing or ``None``: ``base``'s; our default
            ``stop`` is ``["</tool_call>"]``, one tool call per turn); ``sampling_seed`` seeds the
            episode (its calls get distinct seeds derived from it; without it each episode draws
            a fresh random seed, so that a GRPO group's members differ); ``skip_special_tokens=False``
            and ``no_stop_trim=True`` are forced (token-exact trajectories need them; another value
            is logged and replaced); any other key (``stop_token_ids``, ``repetition_penalty``,
            ``min_new_tokens``, ...) is sent with every call unchanged.

    Returns:
        ``(policy, passthrough, seed)``: the section, the extra ``sampling_params`` keys, and the
        ``sampling_seed`` (``None`` when not given).

    Raises:
        ValueError: no router is named, or a sampling value has the wrong type or range.
    """
    sp = dict(sampling_params or {})
    sampling = base.sampling
    updates: dict[str, Any] = {}
    try:
        for key, cast in (("temperature", float), ("top_p", float), ("top_k", int), ("max_new_tokens", int)):
            if sp.get(key) is not None:
                updates[key] = cast(sp[key])
        if sp.get("stop") is not None:
            stop = sp["stop"]
            updates["stop"] = [stop] if isinstance(stop, str) else [str(s) for s in stop]
        seed = None if sp.get("sampling_seed") is None else int(sp["sampling_seed"]) % (2**31 - 1)
    except (TypeError, ValueError) as e:
        raise ValueError(f"sampling_params: {e}") from None
    if updates.get("max_new_tokens", sampling.max_new_tokens) < 1:
        raise ValueError(f"sampling_params: max_new_tokens must be >= 1, got {updates['max_new_tokens']}")
    sampling = SamplingConfig(**{**{k: getattr(sampling, k) for k in _OURS}, **updates})
    for key, want in _FORCED_SAMPLING.items():
        if key in sp and sp[key] is not None and sp[key] != want:
            logger.warning("sampling_params[%r]=%r replaced by %r: token-exact trajectories need it", key, sp[key], want)
    passthrough = {k: v for k, v in sp.items() if k not in _OURS and k not in _FORCED_SAMPLING and k != "sampling_seed" and v is not None}
    context = _arg(rollout_args, "rollout_max_context_len")
    policy = replace(
        base,
        router_url=router_url(rollout_args, default=base.router_url),
        sampling=sampling,
        max_context_tokens=int(context) if context else base.max_context_tokens,
    )
    return policy, passthrough, seed


class _PassthroughClient(SGLangClient):
    """:class:`~rollout.core.policy.SGLangClient` that also sends the caller's extra ``sampling_params``
    keys (ours win where both set one)."""

    def __init__(self, *args, passthrough: dict[str, Any] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.passthrough = dict(passthrough or {})

    def payload(self, input_ids: list[int], max_new_tokens: int, rid: str, seed: int | None) -> dict:
        body = super().payload(input_ids, max_new_tokens, rid, seed)
        if self.passthrough:
            body["sampling_params"] = {**self.passthrough, **body["sampling_params"]}
        return body


# -- chat templates, once per process ----------------------------------------------------------------
_CHAT_LOCK = threading.Lock()
_CHATS: dict[tuple, tuple[Any, ChatTemplate]] = {}
_MAX_CHATS = 16


def _chat_for(tokenizer: Any, tools: list[dict], template_kwargs: dict[str, Any]) -> ChatTemplate:
    """The probed :class:`~rollout.core.formats.ChatTemplate` for a tokenizer, tools and template
    arguments, built once per process (blocking: call it in a thread).

    Raises:
        TemplateError: the template cannot give exact delta tokenization.
    """
    key = (id(tokenizer), json.dumps(tools, sort_keys=True, default=str), json.dumps(template_kwargs, sort_keys=True, default=str))
    with _CHAT_LOCK:
        hit = _CHATS.get(key)
        if hit is not None and hit[0] is tokenizer:
            return hit[1]
    chat = ChatTemplate(tokenizer, tools=tools, template_kwargs=template_kwargs)
    report = chat.probe()
    if not report.ok:
        raise TemplateError("exact delta tokenization is impossible with this tokenizer's chat template:\n" + report.summary())
    with _CHAT_LOCK:
        if len(_CHATS) >= _MAX_CHATS:
            _CHATS.pop(next(iter(_CHATS)))
        _CHATS[key] = (tokenizer, chat)  # the tokenizer is kept alive, so its id stays its own
    return chat


def _tool_names(tools: list[dict]) -> tuple[str, ...]:
    names = []
    for t in tools:
        fn = t.get("function", t) if isinstance(t, Mapping) else {}
        if fn.get("name"):
            names.append(str(fn["name"]))
    return tuple(names)


# -- the agent --------------------------------------------------------------------------------------
class TrainableAgent:
    """The seed's trainable agent (``TrainableToolCallingAgent``) on our episode loop.

    Args:
        tools_info: OpenAI-style tool schemas (the seed's ``env.tools_info``); ``None``: the
            environment's at each call.
        wiki: the agent's system prompt (the seed's ``env.wiki``); ``None``: the environment's.
        rollout_args, sampling_params: kept as attributes, as the seed's agent keeps them (its
            callers pass ``agent.rollout_args, agent.sampling_params`` back to :meth:`asolve`).
        policy: our ``policy`` section, the defaults under what ``rollout_args`` and
            ``sampling_params`` set (timeouts, retries, ``api_key_env``, ``on_parse_error``,
            ``enable_thinking``, ``max_context_tokens``, the tokenizer name); default: ours.
        tokenizer: a loaded tokenizer or a tokenizer name; ``None``: ``rollout_args.tokenizer``,
            else slime's ``rollout_args.hf_checkpoint``, else ``policy.tokenizer`` when ``policy``
            was given.
        session: an aiohttp session to send ``/generate`` calls on (owned by the caller); ``None``:
            each :meth:`asolve` call opens and closes its own.

    Loading the tokenizer and probing its chat template happen once per process, in a thread.
    """

    def __init__(self, tools_info: list[dict] | None = None, wiki: str | None = None, *, rollout_args: Any = None,
                 sampling_params: dict[str, Any] | None = None, policy: PolicyConfig | None = None, tokenizer: Any = None,
                 session: aiohttp.ClientSession | None = None):
        self.tools_info = tools_info
        self.wiki = wiki
        self.rollout_args = rollout_args
        self.sampling_params = sampling_params
        self._policy_given = policy is not None
        self.policy = policy or PolicyConfig()
        self.tokenizer = tokenizer
        self.session = session

    def _tokenizer_source(self, rollout_args: Any) -> Any:
        for src in (self.tokenizer, _arg(rollout_args, "tokenizer"), _arg(rollout_args, "hf_checkpoint")):
            if src is not None:
                return src
        if self._policy_given:
            return self.policy.tokenizer
        raise ValueError("no tokenizer: pass tokenizer= to the agent, or set rollout_args.tokenizer or rollout_args.hf_checkpoint")

    def _template_kwargs(self, rollout_args: Any) -> dict[str, Any]:
        kwargs = dict(_arg(rollout_args, "apply_chat_template_kwargs", {}) or {})
        if self.policy.enable_thinking is not None:
            kwargs.setdefault("enable_thinking", self.policy.enable_thinking)
        return kwargs

    @staticmethod
    def _prepare(source: Any, tools: list[dict], template_kwargs: dict[str, Any]) -> ChatTemplate:
        """Blocking: load the tokenizer (cached by name) and the probed chat template (cached)."""
        tok = load_tokenizer(str(source)) if isinstance(source, str) else source
        return _chat_for(tok, tools, template_kwargs)

    async def asolve(self, env: Environment, rollout_args: Any, sampling_params: dict[str, Any] | None,
                     task_index: int | str | None = None, max_num_steps: int = 30, *, episode_id: str | None = None,
                     group_id: str | None = None, sample_index: int = 0, timeout_s: float | None = None) -> InteractionResult:
        """Run one episode (the seed's entry point, on :func:`rollout.core.episode.run_episode`).

        Args:
            env: a :class:`TaskEnv` (see :func:`make_env`), or any
                :class:`rollout.core.episode.Environment` with ``task_index`` given.
            rollout_args: the router, tokenizer and context bound (module docstring; Namespace or
                mapping).
            sampling_params: SGLang's ``sampling_params`` (see :func:`policy_config`).
            task_index: tau2 task id (str) or index into ``env``'s split (int); ``None``: the task
                ``env`` is bound to.
            max_num_steps: agent turns (>= 1).
            episode_id: the episode's id (its ``/generate`` calls' ``rid`` prefix and routing key);
                default: a fresh one.
            group_id, sample_index: recorded in the sample (GRPO group); default group: the task.
            timeout_s: bound on the whole episode in seconds (past it: status ``timeout``).

        Returns:
            An :class:`InteractionResult` (module docstring): ``tokens`` = prompt ids + response
            ids; ``loss_mask``, ``rollout_log_probs`` have ``response_length`` entries each.
            Everything that goes wrong in the episode (server, tools, user simulator, reward) is a
            status, not an exception.

        Raises:
            ValueError: no router or tokenizer named, no task, bad sampling values, ``max_num_steps < 1``.
            KeyError, IndexError, TypeError: ``task_index`` names no task of the domain.
            TemplateError: the tokenizer's chat template cannot give exact delta tokenization.
            OSError: the tokenizer files cannot be read.
        """
        if max_num_steps < 1:
            raise ValueError(f"max_num_steps must be >= 1, got {max_num_steps}")
        task_id = self._task_id(env, task_index)
        domain = getattr(getattr(env, "domain", None), "name", None) or "unknown"
        tools = self.tools_info or getattr(env, "tools_info", None) or getattr(getattr(env, "domain", None), "tool_schemas", None)
        wiki = self.wiki or getattr(env, "wiki", None) or getattr(getattr(env, "domain", None), "system_prompt", None)
        if not tools or not wiki:
            raise ValueError("no tools_info / wiki: pass them to the agent, or use an environment that has them (make_env)")
        policy, passthrough, seed = policy_config(self.policy, rollout_args, sampling_params)
        chat = await asyncio.to_thread(self._prepare, self._tokenizer_source(rollout_args), tools, self._template_kwargs(rollout_args))
        settings = EpisodeSettings.from_policy(policy, max_steps=max_num_steps, system_prompt=wiki, tool_names=_tool_names(tools))
        eid = episode_id or f"asolve/{domain}/{task_id}/{uuid.uuid4().hex[:12]}"
        spec = EpisodeSpec(
            episode_id=eid, domain=domain, task_id=task_id, group_id=group_id or f"{domain}/{task_id}", sample_index=int(sample_index),
            seed=secrets.randbelow(2**31 - 1) if seed is None else seed,
        )
        if self.session is not None and not self.session.closed:
            res = await self._run(spec, env, policy, passthrough, chat, settings, self.session, timeout_s)
        else:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
                res = await self._run(spec, env, policy, passthrough, chat, settings, session, timeout_s)
        return await self._seed_result(res, chat, policy.tokenize_timeout_s)

    @staticmethod
    def _task_id(env: Any, task_index: int | str | None) -> str:
        bound = getattr(env, "task_id", None)
        if task_index is None:
            if bound is None:
                raise ValueError("task_index is required: this environment is not bound to a task (use make_env)")
            return str(bound)
        domain = getattr(env, "domain", None)
        if hasattr(domain, "task_ids") and hasattr(domain, "tasks"):
            split = getattr(env, "task_split", None) or getattr(getattr(env, "cfg", None), "task_split", None) or "base"
            tid = resolve_task_id(domain, split, task_index)
        elif isinstance(task_index, str):
            tid = task_index
        else:
            raise TypeError(f"task_index {task_index!r}: an index needs an environment whose domain lists its split; pass a task id")
        if bound is not None and tid != str(bound):
            raise ValueError(f"task_index {task_index!r} is task {tid!r}, but the environment is bound to task {bound!r}")
        return tid

    @staticmethod
    async def _run(spec: EpisodeSpec, env: Environment, policy: PolicyConfig, passthrough: dict[str, Any], chat: ChatTemplate,
                   settings: EpisodeSettings, session: aiohttp.ClientSession, timeout_s: float | None) -> records.InteractionResult:
        """``run_episode`` with the worker's outer guards: the whole-episode bound and a crash net."""
        client = _PassthroughClient(policy, session, passthrough=passthrough)
        try:
            coro = run_episode(spec, env, client, chat, settings)
            return await (asyncio.wait_for(coro, timeout_s) if timeout_s else coro)
        except asyncio.TimeoutError:
            return records.InteractionResult(spec, EpisodeStatus.TIMEOUT, 0.0, None,
                                             metadata={"termination_reason": "episode_timeout", "error": f"episode ran over {timeout_s}s"})
        except Exception as e:  # a bug must not take the caller down; it is a typed failure
            logger.exception("episode %s crashed", spec.episode_id)
            return records.InteractionResult(spec, EpisodeStatus.ENV_ERROR, 0.0, None, metadata={"termination_reason": "crash", "error": repr(e)})

    @staticmethod
    async def _seed_result(res: records.InteractionResult, chat: ChatTemplate, tokenize_timeout_s: float) -> InteractionResult:
        traj = res.trajectory or records.Trajectory(prompt_ids=[])
        traj.check()
        t0 = time.monotonic()
        prompt = await asyncio.wait_for(asyncio.to_thread(chat.decode, traj.prompt_ids), tokenize_timeout_s) if traj.prompt_ids else ""
        logger.debug("episode %s: %s, reward %.3f, %d response tokens (prompt decoded in %.3fs)", res.spec.episode_id,
                     res.status.value, res.reward, traj.response_length, time.monotonic() - t0)
        info = {**res.metadata, "episode_id": res.spec.episode_id, "task_id": res.spec.task_id, "domain": res.spec.domain,
                "status": res.status.value}
        return InteractionResult(
            prompt=prompt,
            reward=float(res.reward),
            messages=list(res.messages),
            info=info,
            response="".join(m.get("content") or "" for m in res.messages if m.get("role") == "assistant"),
            loss_mask=list(traj.loss_mask),
            tokens=traj.tokens,
            status=seed_status(res.status),
            response_length=traj.response_length,
            rollout_log_probs=list(traj.rollout_log_probs),
            weight_versions=list(traj.weight_versions),
            generation_spans=list(traj.generation_spans),
            episode_status=res.status,
            episode=res,
        )
