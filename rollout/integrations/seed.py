"""The seed's agent interface, on our episode loop.

Users who come from the seed (slime's tau-bench example agent, docs/design.md "Who uses it") call ``await agent.asolve(env, rollout_args, sampling_params, task_index, max_num_steps)``
and read the seed's ``InteractionResult`` (here :class:`SeedResult`) with ``prompt``, ``reward``,
``messages``, ``info``, ``response``, ``loss_mask``, ``tokens``, ``response_length`` and ``status``. This module keeps that
entry point and those fields, and runs the episode with :func:`rollout.core.episode.run_episode` (the
one loop of this project: token in / token out, log-probs from the server, nothing re-tokenized,
the environment off the event loop, every ending typed). The result adds ``rollout_log_probs``,
``weight_versions`` and ``generation_spans``, and keeps our exact status in ``episode_status``.

The arguments, mapped onto ours:

* ``env``: the seed passes a tau-bench environment built for one task (``get_env(...,
  task_index=i)``, with ``wiki`` and ``tools_info``). Ours is :class:`TaskEnv` (made by
  :func:`make_env` from a loaded benchmark, :class:`rollout.core.environment.Benchmark`): the
  benchmark's own environment for one episode (``new_episode``; for tau2 a
  :class:`~rollout.benchmarks.tau2.episode.Tau2Environment`) bound to one task, with the same
  ``wiki`` / ``tools_info`` / ``task_index`` attributes and the seed's ``reset`` / ``step`` made
  async. Any environment with :class:`rollout.core.environment.Environment`'s shape works too when
  ``task_index`` is given (e.g. a bare ``Tau2Environment``).
* ``rollout_args``: an ``argparse.Namespace`` (slime's ``args``) or a mapping. Read: the router
  (``router_url``, or slime's ``sglang_router_ip`` + ``sglang_router_port``), the tokenizer
  (``tokenizer``: a loaded tokenizer or a name; else slime's ``hf_checkpoint``), the context bound
  (slime's ``rollout_max_context_len``), chat-template arguments (slime's
  ``apply_chat_template_kwargs``) and the chat format (``chat_format``; default the agent's
  ``policy.chat_format``, ``auto``: detected from the tokenizer).
* ``sampling_params``: SGLang's ``sampling_params`` dict, as the seed sends it with every
  ``/generate`` call; ``max_new_tokens`` is per assistant turn (as in the seed, which sends the
  same dict for every turn). See :func:`policy_config` for what is read, forced and passed through.
* ``task_index``: a tau2 task id (str), or an index (int) into the environment's task split
  (``env.task_split``), as the seed's index into its split; ``None``: the task ``env`` is bound to.
* ``max_num_steps``: agent turns (our ``env.max_steps``).

The statuses, ours -> the seed's three (:class:`Status`), are in :mod:`rollout.integrations.seed_result`
(``episode_status`` and ``info["status"]`` keep ours); the environment
objects in :mod:`rollout.integrations.seed_env`; reading ``rollout_args`` and ``sampling_params``
in :mod:`rollout.integrations.seed_args`. This module keeps every name it always offered.

:class:`SeedResult` was this module's ``InteractionResult`` (the seed's name): renamed so that
:class:`rollout.core.records.InteractionResult`, the episode loop's record, is the only class of
that name.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
import uuid
from collections.abc import Mapping
from typing import Any

import aiohttp

from rollout.core import records
from rollout.core.config import PolicyConfig, RewardShapingConfig
from rollout.core.environment import Environment
from rollout.core.formats import ChatFormat, build_chat_format
from rollout.core.records import EpisodeSpec
from rollout.core.runner import run_guarded_episode
from rollout.core.settings import EpisodeSettings
from rollout.core.tasks import open_task_issues
from rollout.core.tokenizer import load_tokenizer
from rollout.integrations.seed_args import PassthroughClient, policy_config, rollout_arg, router_url
from rollout.integrations.seed_env import TaskEnv, make_env, resolve_task_id
from rollout.integrations.seed_result import SEED_STATUS, SeedResult, Status, seed_status

logger = logging.getLogger(__name__)

_PassthroughClient = PassthroughClient  # the name tests have used

__all__ = ["SEED_STATUS", "SeedResult", "Status", "TaskEnv", "TrainableAgent", "make_env", "policy_config", "resolve_task_id", "router_url",
           "seed_status"]


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
        reward_shaping: our ``rollout.reward_shaping`` section (:mod:`rollout.core.shaping`);
            ``None``: no shaping. The result's ``reward`` is then the shaped one and
            ``info["raw_reward"]`` the benchmark's.

    Loading the tokenizer and probing its chat template happen once per process, in a thread.
    """

    def __init__(self, tools_info: list[dict] | None = None, wiki: str | None = None, *, rollout_args: Any = None,
                 sampling_params: dict[str, Any] | None = None, policy: PolicyConfig | None = None, tokenizer: Any = None,
                 session: aiohttp.ClientSession | None = None, reward_shaping: RewardShapingConfig | None = None):
        self.tools_info = tools_info
        self.reward_shaping = reward_shaping
        self.wiki = wiki
        self.rollout_args = rollout_args
        self.sampling_params = sampling_params
        self._policy_given = policy is not None
        self.policy = policy or PolicyConfig()
        self.tokenizer = tokenizer
        self.session = session

    def _tokenizer_source(self, rollout_args: Any) -> Any:
        for src in (self.tokenizer, rollout_arg(rollout_args, "tokenizer"), rollout_arg(rollout_args, "hf_checkpoint")):
            if src is not None:
                return src
        if self._policy_given:
            return self.policy.tokenizer
        raise ValueError("no tokenizer: pass tokenizer= to the agent, or set rollout_args.tokenizer or rollout_args.hf_checkpoint")

    def _template_kwargs(self, rollout_args: Any) -> dict[str, Any]:
        kwargs = dict(rollout_arg(rollout_args, "apply_chat_template_kwargs", {}) or {})
        if self.policy.enable_thinking is not None:
            kwargs.setdefault("enable_thinking", self.policy.enable_thinking)
        return kwargs

    @staticmethod
    def _prepare(source: Any, tools: list[dict], template_kwargs: dict[str, Any], chat_format: str = "auto") -> ChatFormat:
        """Blocking: load the tokenizer (cached by name) and the probed chat format (cached)."""
        tok = load_tokenizer(str(source)) if isinstance(source, str) else source
        return build_chat_format(tok, tools, template_kwargs, chat_format).chat

    async def asolve(self, env: Environment, rollout_args: Any, sampling_params: dict[str, Any] | None,
                     task_index: int | str | None = None, max_num_steps: int = 30, *, episode_id: str | None = None,
                     group_id: str | None = None, sample_index: int = 0, timeout_s: float | None = None) -> SeedResult:
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
            A :class:`SeedResult` (module docstring): ``tokens`` = prompt ids + response
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
        chat_format = str(rollout_arg(rollout_args, "chat_format", None) or self.policy.chat_format)
        chat = await asyncio.to_thread(self._prepare, self._tokenizer_source(rollout_args), tools, self._template_kwargs(rollout_args), chat_format)
        settings = EpisodeSettings.from_policy(policy, max_steps=max_num_steps, system_prompt=wiki, tool_names=_tool_names(tools),
                                               reward_shaping=self.reward_shaping)
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
    async def _run(spec: EpisodeSpec, env: Environment, policy: PolicyConfig, passthrough: dict[str, Any], chat: ChatFormat,
                   settings: EpisodeSettings, session: aiohttp.ClientSession, timeout_s: float | None) -> records.InteractionResult:
        """The episode on ``env`` with the worker's guards (:func:`rollout.core.runner.run_guarded_episode`:
        the whole-episode bound ``timeout_s``, an asolve argument, and a crash net)."""
        client = PassthroughClient(policy, session, passthrough=passthrough)
        result = await run_guarded_episode(spec, lambda: env, client, chat, settings, timeout_s=timeout_s, timeout_key=None,
                                           task_issues=open_task_issues(getattr(env, "domain", None), spec.task_id))
        # what graded it, when the environment's domain says (a tau2 environment's Tau2Domain does)
        result.add_graded_by(getattr(getattr(env, "domain", None), "graded_by", None))
        return result

    @staticmethod
    async def _seed_result(res: records.InteractionResult, chat: ChatFormat, tokenize_timeout_s: float) -> SeedResult:
        traj = res.trajectory or records.Trajectory(prompt_ids=[])
        traj.check()
        t0 = time.monotonic()
        prompt = await asyncio.wait_for(asyncio.to_thread(chat.decode, traj.prompt_ids), tokenize_timeout_s) if traj.prompt_ids else ""
        logger.debug("episode %s: %s, reward %.3f, %d response tokens (prompt decoded in %.3fs)", res.spec.episode_id,
                     res.status.value, res.reward, traj.response_length, time.monotonic() - t0)
        info = {**res.metadata, "episode_id": res.spec.episode_id, "task_id": res.spec.task_id, "domain": res.spec.domain,
                "status": res.status.value, "raw_reward": float(res.raw_reward if res.raw_reward is not None else res.reward),
                "task_issues": [i.to_dict() for i in res.task_issues or []]}
        return SeedResult(
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
