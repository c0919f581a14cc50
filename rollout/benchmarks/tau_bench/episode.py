"""One episode's tau-bench environment (:class:`TauBenchEnvironment`), with the async interface
of :class:`rollout.core.environment.Environment`.

tau-bench is synchronous: every ``reset`` / ``step`` runs in a thread of the actor's executor,
never on the event loop. Each phase of a call has its own bound, counted from when it starts
(:mod:`rollout.benchmarks.tau_bench.guards`): building the environment and tau-bench's own code
``env.step_timeout_s`` (past it: ``env_error``), a tool call ``env.step_timeout_s``
(``tool_timeout``), a user-simulator turn ``env.user.timeout_s`` (``user_error``), the reward
``env.reward_timeout_s`` (``eval_error``). A call that cannot get a thread within
``env.step_timeout_s`` is ``env_error``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import Executor
from typing import Any

from rollout.benchmarks.tau_bench.guards import POLL_S, Escape, GuardedTool, GuardedUser, Phase, PhaseClock, TauBenchToolSandbox
from rollout.benchmarks.tau_bench.package import BASE_SPLIT, BENCHMARK, build_env, import_tau_bench, parse_task_id
from rollout.core.config import EnvConfig
from rollout.core.environment import Action, EnvironmentStepError, RewardError, StepResult, ToolTimeoutError, UserSimulatorError

logger = logging.getLogger(__name__)


class TauBenchEnvironment:
    """One episode's tau-bench environment (:class:`rollout.core.environment.Environment`).

    Args:
        domain: the actor's :class:`~rollout.benchmarks.tau_bench.environment.TauBenchDomain`
            (typed ``Any``: that module builds this class's instances, so this one does not import
            it); its ``new_user(env.user)`` makes the episode's user simulator at ``reset``.
        cfg: the ``env`` section (``step_timeout_s``, ``reward_timeout_s``, ``user``).
        executor: threads for tau-bench's calls (None: the loop's default executor).
        sandbox: the actor's :class:`TauBenchToolSandbox` (None: :data:`SANDBOXED_TOOLS` run in a
            thread, without a hard bound; tests only).

    ``reset`` / ``step`` raise :class:`ToolTimeoutError` (the policy's), or
    :class:`EnvironmentStepError`, :class:`UserSimulatorError`, :class:`RewardError`
    (infrastructure); a tool that raises inside tau-bench is an observation, not an error. After
    a call ran past its bound its thread may still be running: the environment refuses further
    calls (``EnvironmentStepError``).

    With ``env.user.kind: llm`` the process's litellm ``openai`` provider is pointed at
    ``env.user.base_url`` (:func:`rollout.benchmarks.tau_bench.environment.point_litellm_at`),
    since tau-bench's users pass no endpoint.

    Attributes:
        timings: seconds spent, per kind: ``env_s`` (tau-bench's own code, building included),
            ``tool_s``, ``user_s``, ``reward_s``.
        termination: ``user_stop`` | ``transfer`` | ``done`` (another terminate tool) once done.
    """

    def __init__(self, domain: Any, cfg: EnvConfig, executor: Executor | None = None, sandbox: TauBenchToolSandbox | None = None):
        self.domain = domain
        self.cfg = cfg
        self.executor = executor
        self.sandbox = sandbox
        self.task_id: str | None = None
        self.termination: str | None = None
        self._env: Any = None
        self._types: Any = None
        self._clock = PhaseClock()
        self._stuck: str | None = None  # why calls are refused (a thread ran past its bound)
        self.timings = {"env_s": 0.0, "tool_s": 0.0, "user_s": 0.0, "reward_s": 0.0}

    # -- running tau-bench in a thread -------------------------------------------------------------
    def _overdue(self, ph: Phase) -> Exception:
        if ph.kind == "tool":
            if ph.detail.endswith("(sandboxed)"):
                return ToolTimeoutError(f"{ph.detail.removesuffix(' (sandboxed)')} ran longer than {ph.limit:g}s (waiting for the sandbox included) "
                                        "and the sandbox did not stop it")
            return ToolTimeoutError(f"{ph.detail} ran longer than {ph.limit:g}s (env.step_timeout_s; its thread cannot be stopped and finishes on its own)")
        if ph.kind == "user":
            return UserSimulatorError(f"tau-bench's user simulator took over {ph.limit:g}s (env.user.timeout_s)")
        if ph.kind == "reward":
            return RewardError(f"tau-bench's reward took over {ph.limit:g}s (env.reward_timeout_s)")
        return EnvironmentStepError(f"{ph.detail} took over {ph.limit:g}s (env.step_timeout_s)")

    async def _call(self, what: str, fn, *args) -> Any:
        """``fn(*args)`` in a thread, inside an ``env`` phase, watched phase by phase.

        Raises:
            the phase's error when a phase runs past its bound; the error a wrapper carried out
            (:class:`Escape`); :class:`EnvironmentStepError` for anything else ``fn`` raised, or
            when no thread started it within ``env.step_timeout_s``.
        """
        if self._stuck:
            raise EnvironmentStepError(f"tau-bench {what} refused: {self._stuck}")
        loop = asyncio.get_running_loop()
        started = threading.Event()
        clock = self._clock
        env_limit = self.cfg.step_timeout_s

        def run():
            started.set()
            with clock.phase("env", env_limit, f"tau-bench {what}"):
                return fn(*args)

        fut = loop.run_in_executor(self.executor, run)
        queued = time.monotonic()
        try:
            while not fut.done():
                top = clock.top()
                if top is not None:
                    ph, elapsed = top
                    if elapsed >= ph.limit:
                        self._stuck = f"an earlier call ran past its bound ({ph.kind}) and may still be running"
                        raise self._overdue(ph)
                    wait = min(POLL_S, ph.limit - elapsed)
                elif not started.is_set():
                    waited = time.monotonic() - queued
                    if waited >= env_limit:
                        fut.cancel()
                        raise EnvironmentStepError(f"tau-bench {what} waited {waited:.1f}s for a thread without starting (actor overloaded)")
                    wait = min(POLL_S, env_limit - waited)
                else:
                    wait = 0.01  # returning
                await asyncio.wait({fut}, timeout=wait)
        finally:
            for kind in ("env", "tool", "user", "reward"):
                self.timings[f"{kind}_s"] = round(clock.spent.get(kind, 0.0), 6)
        try:
            return fut.result()
        except Escape as e:
            raise e.error from None
        except Exception as e:
            raise EnvironmentStepError(f"tau-bench {what} failed: {type(e).__name__}: {' '.join(str(e).split())[:300]}") from e

    # -- reset / step ------------------------------------------------------------------------------------
    def _reset_sync(self, split: str, index: int) -> tuple[Any, str]:
        env = build_env(self.domain.name, split, index)
        clock, timeout = self._clock, self.cfg.step_timeout_s
        with clock.phase("user", self.cfg.user.timeout_s, "tau-bench's user simulator"):
            try:
                user = self.domain.new_user(self.cfg.user)  # blocking: tau-bench's llm user calls the model
            except UserSimulatorError as e:
                raise Escape(e) from None
            except Exception as e:
                raise Escape(UserSimulatorError(f"tau-bench's user simulator could not be set up: {type(e).__name__}: {e}")) from None
        env.user = GuardedUser(user, clock, self.cfg.user.timeout_s)
        env.tools_map = {name: GuardedTool(name, cls, self.domain.tool_classes.get(name, ""), clock, timeout, self.sandbox)
                         for name, cls in env.tools_map.items()}
        env.calculate_reward = self._guard_reward(env.calculate_reward)
        res = env.reset(task_index=index)
        return env, res.observation

    def _guard_reward(self, calculate_reward):
        clock, limit = self._clock, self.cfg.reward_timeout_s

        def guarded():
            with clock.phase("reward", limit, "tau-bench's reward"):
                try:
                    return calculate_reward()
                except Escape:
                    raise
                except Exception as e:
                    raise Escape(RewardError(f"tau-bench's reward failed: {type(e).__name__}: {' '.join(str(e).split())[:300]}")) from None

        return guarded

    async def reset(self, task_id: str) -> tuple[str, dict[str, Any]]:
        """Start the episode on ``task_id`` (``"{split}-{index}"``).

        Returns:
            ``(observation, info)``: the user's first message, and ``{"task_id", "domain",
            "benchmark", "split", "task_index"}``.

        Raises:
            EnvironmentStepError: unknown task id, or tau-bench failed or timed out building the
                environment.
            UserSimulatorError: the user simulator failed, timed out or could not be set up.
        """
        tid = str(task_id)
        if tid not in self.domain.tasks:
            raise EnvironmentStepError(f"reset: {tid!r} is not a task of tau-bench {self.domain.name} (ids are '<split>-<index>', "
                                       f"splits {sorted(s for s in self.domain.splits if s != BASE_SPLIT)})")
        split, index = parse_task_id(tid)
        _, self._types = import_tau_bench()
        self._env, observation = await self._call("reset", self._reset_sync, split, index)
        self.task_id = tid
        return observation, {"task_id": tid, "domain": self.domain.name, "benchmark": BENCHMARK, "split": split, "task_index": index}

    async def step(self, action: Action) -> StepResult:
        """Apply one agent action through tau-bench's ``Env.step``.

        Args:
            action: a tool call (``name``, ``arguments``) or a reply (``name == "respond"``,
                ``content``), which tau-bench gets as ``Action(name, kwargs)`` (a reply's kwargs
                ``{"content": content}``; a tool call's surrounding text is not passed on).

        Returns:
            The :class:`StepResult`: the tool's output (``role == "tool"``) or the user's reply
            (``"user"``); ``tool_error`` when the observation is tau-bench's ``"Error: ..."`` or
            ``"Unknown action ..."``; when ``done``, tau-bench's reward, the ``termination``
            (``user_stop`` | ``transfer`` | ``done``) and the ``reward_info`` (:func:`reward_info`).

        Raises:
            ToolTimeoutError, EnvironmentStepError, UserSimulatorError, RewardError: see the class.
        """
        if self._env is None:
            raise EnvironmentStepError("step() before reset()")
        respond = action.is_respond
        kwargs = {"content": action.content} if respond else dict(action.arguments)
        resp = await self._call(f"step ({action.name})", self._env.step, self._types.Action(name=action.name, kwargs=kwargs))
        observation = resp.observation if isinstance(resp.observation, str) else str(resp.observation)
        role = "user" if respond else "tool"
        tool_error = (not respond) and observation.startswith(("Error", "Unknown action"))
        if not resp.done:
            return StepResult(observation, role=role, tool_error=tool_error)
        if respond:
            self.termination = "user_stop"
        else:
            self.termination = "transfer" if action.name.startswith("transfer_") else "done"
        return StepResult(observation, role=role, done=True, reward=float(resp.reward), tool_error=tool_error,
                          termination=self.termination, reward_info=reward_info(resp.info))


def reward_info(env_info: Any) -> dict[str, Any]:
    """Our ``reward_info`` from tau-bench's ``EnvInfo`` of the final step (JSON-serialisable).

    Returns:
        ``{"reward_breakdown": {"r_actions" and/or "r_outputs": float}, "db_match": bool | None
        (the data hash matched the gold replay's), "outputs": {output: said} | None,
        "gold_actions": int, "user_cost": float | None}``. tau-bench reports one of the two
        checks (newer versions report the outputs' when a task has outputs, while still
        scoring the data).
    """
    rr = getattr(env_info, "reward_info", None)
    out: dict[str, Any] = {"reward_breakdown": {}, "db_match": None, "outputs": None, "gold_actions": 0,
                           "user_cost": getattr(env_info, "user_cost", None)}
    if rr is None:
        return out
    ri = rr.info
    if hasattr(ri, "r_actions"):
        out["reward_breakdown"]["r_actions"] = float(ri.r_actions)
        out["db_match"] = bool(ri.r_actions)
    if hasattr(ri, "r_outputs"):
        out["reward_breakdown"]["r_outputs"] = float(ri.r_outputs)
        out["outputs"] = {str(k): bool(v) for k, v in dict(ri.outputs).items()}
    out["gold_actions"] = len(rr.actions or [])
    return out
