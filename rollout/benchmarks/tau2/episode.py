"""One episode's tau2 environment (:class:`Tau2Environment`), with the seed's shape made async:
``reset(task_id) -> (observation, info)`` and ``step(action) -> StepResult``
(:class:`rollout.core.environment.StepResult`).

* A tool action runs the tool in tau2's environment and returns the tool's output.
* A respond action (plain text) goes to the user simulator and returns the user's reply.
* Dual control (tau2 telecom: the user has tools of its own, acting on the user's phone): at
  ``reset`` the user simulator gets the user's tool schemas and a runner
  (:class:`~rollout.benchmarks.tau2.user.UserTools`); each user tool call runs in the user's side of the
  episode's environment (tau2's ``get_response`` with ``requestor="user"``), off the event loop
  and bounded like agent tools, and is recorded for tau2's evaluator. The agent sees only the
  user's text, as in tau2's orchestrator (a user's tool call and result go to the user alone).
* The episode ends when the user stops (``###STOP###``) or is transferred, when the agent calls
  ``transfer_to_human_agents`` or says ``###STOP###``; the caller enforces max steps.
* At the end the reward is tau2's ``evaluate_simulation`` reward, computed by ``env.evaluator``
  (``fast``: from the episode's copy-on-write database, :mod:`rollout.benchmarks.tau2.fast`;
  ``tau2``: tau2's own evaluator in the sandbox, :mod:`rollout.benchmarks.tau2.sandbox`).

Nothing blocks the event loop: tool calls and rewards run in threads or in the sandbox process,
each with a timeout that counts from when it starts running (database tools have their own
threads, so they never queue behind seconds-long work; one that cannot start is an
``env_error``, not the policy's ``tool_timeout``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from concurrent.futures import Executor
from dataclasses import replace
from typing import Any

from rollout.benchmarks.tau2.sandbox import TERMINATIONS, ToolSandbox, evaluate_run
from rollout.benchmarks.user_api import STOP, UserSimulator, UserTools
from rollout.core.config import EnvConfig
from rollout.core.environment import Action, EnvironmentStepError, RewardError, StepResult, ToolTimeoutError, UserSimulatorError

logger = logging.getLogger(__name__)

TRANSFER_TOOL = "transfer_to_human_agents"


class _QueuedTooLong(Exception):
    """A call waited too long for a thread without starting (args: seconds waited)."""


class Tau2Environment:
    """One episode's tau2 environment (async, seed-shaped).

    Args:
        domain: the actor's :class:`~rollout.benchmarks.tau2.domain.Tau2Domain` (typed ``Any``: that
            module builds this class's instances, so this one does not import it).
        user: the episode's user simulator.
        cfg: the ``env`` section.
        executor: thread pool for tau2 calls (``None``: the loop's default executor).
        sandbox: the actor's :class:`ToolSandbox` for database-free tools and for tau2's evaluator
            (``None``: run both in a thread of this process, without a hard bound; tests only).

    ``step`` raises :class:`ToolTimeoutError` (policy-caused), :class:`EnvironmentStepError`,
    :class:`UserSimulatorError` or :class:`RewardError` (infrastructure); a tool that raises
    inside tau2 is not an error here: tau2 turns it into an error observation for the agent.
    """

    def __init__(self, domain: Any, user: UserSimulator, cfg: EnvConfig, executor: Executor | None = None, sandbox: ToolSandbox | None = None):
        self.domain = domain
        self.user = user
        self.cfg = cfg
        self.executor = executor
        self.sandbox = sandbox
        self.task = None
        self._env = None
        self.fast = False  # this episode takes the fast path (set by reset)
        self.messages: list[Any] = []  # tau2 messages, for tau2's evaluator
        self.termination: str | None = None
        self._start = 0.0
        # user_s includes user_tool_s: the user's own tool calls (dual control) run inside its turn
        self.timings = {"env_s": 0.0, "tool_s": 0.0, "user_s": 0.0, "user_tool_s": 0.0, "reward_s": 0.0}
        self.user_tool_calls = 0
        self._call_ids = 0  # tool calls of this episode so far, the agent's and the user's

    @contextlib.contextmanager
    def _timed(self, key: str):
        """Add the wall seconds of the ``with`` body to ``self.timings[key]``, whether it returns
        or raises (a step cut at its timeout counts too)."""
        t0 = time.monotonic()
        try:
            yield
        finally:
            self.timings[key] += time.monotonic() - t0

    async def _bounded(self, executor: Executor | None, fn, *args, timeout: float, queue_timeout: float | None = None):
        """Run ``fn(*args)`` in ``executor`` and wait for it; ``timeout`` counts from when it
        starts running, not from when it was queued.

        Raises:
            asyncio.TimeoutError: it ran longer than ``timeout`` seconds (it cannot be stopped:
                the thread finishes on its own).
            _QueuedTooLong: it waited ``queue_timeout`` seconds (default ``timeout``) for a thread
                without starting (it is cancelled): a busy actor, not the call's fault.
        """
        loop = asyncio.get_running_loop()
        started: list[float] = []

        def run():
            started.append(time.monotonic())
            return fn(*args)

        fut = loop.run_in_executor(executor, run)
        queued_at = time.monotonic()
        queue_timeout = timeout if queue_timeout is None else queue_timeout
        while True:
            now = time.monotonic()
            if started:
                wait = started[0] + timeout - now
                if wait <= 0:
                    raise asyncio.TimeoutError()
            else:
                waited = now - queued_at
                if waited >= queue_timeout:
                    fut.cancel()
                    raise _QueuedTooLong(waited)
                wait = min(queue_timeout - waited, timeout)
            done, _ = await asyncio.wait({fut}, timeout=wait)
            if done:
                return fut.result()

    async def _in_thread(self, fn, *args, timeout: float):
        return await self._bounded(self.executor, fn, *args, timeout=timeout)

    async def reset(self, task_id: str) -> tuple[str, dict[str, Any]]:
        """Start the episode on ``task_id``.

        Returns:
            ``(observation, info)``: the user's opening message, and ``{"task_id", "domain"}``,
            with ``system_prompt`` when the episode's environment has a policy of the task's own
            (banking_knowledge's ``golden_retrieval``: the task's documents inlined).

        Raises:
            EnvironmentStepError, UserSimulatorError.
        """
        from tau2.data_model.message import UserMessage

        self.task = self.domain.tasks[str(task_id)]
        self._start = time.time()
        self.fast = self.cfg.evaluator == "fast" and self.domain.fast.supports(self.task)
        with self._timed("env_s"):
            try:
                if self.fast and self.domain.fast.mode == "cow":  # a view of the actor's database: microseconds, on the loop
                    self._env = self.domain.fast.new_environment(self.task)
                elif self.fast:  # the domain's constructor on a copy of the actor's database: milliseconds and up
                    self._env = await self._in_thread(self.domain.fast.new_environment, self.task, timeout=self.cfg.step_timeout_s)
                else:
                    self._env = await self._in_thread(self._build_env, timeout=self.cfg.step_timeout_s)
            except (asyncio.TimeoutError, _QueuedTooLong):
                raise EnvironmentStepError(f"building the {self.domain.name} environment took over {self.cfg.step_timeout_s}s") from None
            except Exception as e:
                raise EnvironmentStepError(f"building the environment failed: {e!r}") from e
        if self.domain.user_tool_schemas:  # dual control: the user acts on its own side (telecom's phone, banking's requests)
            bind = getattr(self.user, "bind_tools", None)
            if bind is None:
                raise UserSimulatorError(f"domain {self.domain.name} gives the user tools, but the user simulator "
                                         f"{type(self.user).__name__} cannot use them (no bind_tools)")
            # the task's own user tools (tau2 >= 1.0's Task.user_tools; possibly none)
            bind(UserTools(schemas=self.domain.user_tool_schemas_for(self.task), call=self._user_tool))
        with self._timed("user_s"):
            opening = await self.user.start()
        self.messages.append(UserMessage(role="user", content=opening))
        info: dict[str, Any] = {"task_id": self.task.id, "domain": self.domain.name}
        policy = self._env.get_policy()
        if policy != self.domain.policy:  # a prompt of the task's own (banking's golden_retrieval inlines its documents)
            info["system_prompt"] = self.domain.system_prompt_for(policy)
        return opening, info

    def _build_env(self):
        """tau2's path: a fresh environment with its own database, in the task's initial state."""
        env = self.domain.new_environment(self.task)
        st = self.task.initial_state
        if st is not None and (st.initialization_data or st.initialization_actions or st.message_history):
            env.set_state(
                initialization_data=st.initialization_data,
                initialization_actions=st.initialization_actions,
                message_history=st.message_history or [],
            )
        return env

    async def step(self, action: Action) -> StepResult:
        """Apply one agent action.

        Returns:
            The :class:`StepResult`: the tool output (``role == "tool"``, with ``tool_error``) or
            the user's reply (``"user"``); when ``done``, tau2's reward, the ``termination``
            (``user_stop`` | ``transfer`` | ``agent_stop``) and the ``reward_info``.
        """
        from tau2.data_model.message import AssistantMessage, ToolCall, ToolMessage, UserMessage

        if self._env is None:
            raise EnvironmentStepError("step() before reset()")
        if action.is_respond:
            self.messages.append(AssistantMessage(role="assistant", content=action.content))
            if STOP in action.content:
                return await self._finish("agent_stop", StepResult("", role="user"))
            with self._timed("user_s"):
                reply = await self.user.respond(action.content)
            self.messages.append(UserMessage(role="user", content=reply.text))
            answer = StepResult(reply.text, role="user")
            if reply.stop:
                return await self._finish("transfer" if reply.transfer else "user_stop", answer)
            return answer

        # ids need only be unique within the episode (tau2 pairs a call with its answer by id);
        # a counter, not uuid4, whose os.urandom is a system call on the event loop per step
        self._call_ids += 1
        call = ToolCall(id=f"call_{self._call_ids}", name=action.name, arguments=action.arguments)
        self.messages.append(AssistantMessage(role="assistant", content=action.content or None, tool_calls=[call]))
        with self._timed("tool_s"):
            content, error = await self._run_tool(call)
        self.messages.append(ToolMessage(id=call.id, role="tool", content=content, requestor="assistant", error=error))
        answer = StepResult(content, role="tool", tool_error=bool(error))
        if action.name == TRANSFER_TOOL:
            return await self._finish("transfer", answer)
        return answer

    async def _run_tool(self, call) -> tuple[str, bool]:
        """Run one tool call: database-free tools in the sandbox, database tools in the domain's
        own tool threads. Only time spent running counts against ``env.step_timeout_s``: a call
        that cannot even start (a busy actor) is an :class:`EnvironmentStepError`, never a
        ``tool_timeout`` (which is trained as the policy's failure)."""
        timeout = self.cfg.step_timeout_s
        pure = call.name in self.domain.pure_tools
        try:
            if pure and self.sandbox is not None:
                # The thread returns by itself once the sandbox answers or is killed.
                budget = timeout + self.sandbox.startup_timeout_s + 5.0
                return await self._in_thread(self.sandbox.call, call.name, call.arguments, timeout, timeout=budget)
            msg = await self._bounded(self.domain.tool_executor, self._env.get_response, call, timeout=timeout)
            return msg.content, bool(msg.error)
        except asyncio.TimeoutError:
            raise ToolTimeoutError(f"tool {call.name!r} ran longer than {timeout}s") from None
        except _QueuedTooLong as e:
            raise EnvironmentStepError(f"tool {call.name!r} waited {e.args[0]:.1f}s for a thread without starting (actor overloaded)") from None
        except (ToolTimeoutError, EnvironmentStepError):
            raise
        except Exception as e:
            raise EnvironmentStepError(f"tool {call.name!r} failed outside tau2's error handling: {e!r}") from e

    async def _user_tool(self, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        """Run one of the user's own tool calls (dual control) in the user's side of the
        episode's environment: tau2's ``Environment.get_response`` on a ``ToolCall`` with
        ``requestor="user"``, which calls ``use_user_tool`` and then ``sync_tools``, exactly as
        tau2's orchestrator routes a user tool call (``tau2/orchestrator/orchestrator.py``) and
        as tau2's evaluator replays it (``Environment.set_state``). It runs in the domain's tool
        threads, off the event loop, bounded by ``env.step_timeout_s`` from when it starts.

        The call and its result are recorded in :attr:`messages` (a ``UserMessage`` with the
        tool call, then a ``ToolMessage`` with ``requestor="user"``) for tau2's evaluator; the
        agent never sees them, only the user's next text (as in tau2, where they go to the user).

        Args:
            name: a user tool (a tool the user's toolkit lacks is tau2's error message, not a raise).
            arguments: its arguments (JSON object).

        Returns:
            ``(content, error)``: tau2's tool message content and whether it is an error.

        Raises:
            EnvironmentStepError: the call ran past ``env.step_timeout_s`` (environment code, not
                the policy's fault), could not start, or failed outside tau2's error handling.
        """
        from tau2.data_model.message import ToolCall, ToolMessage, UserMessage

        if self._env is None:
            raise EnvironmentStepError("a user tool call before reset()")
        timeout = self.cfg.step_timeout_s
        self._call_ids += 1
        call = ToolCall(id=f"user_call_{self._call_ids}", name=name, arguments=dict(arguments), requestor="user")
        with self._timed("user_tool_s"):
            try:
                msg = await self._bounded(self.domain.tool_executor, self._env.get_response, call, timeout=timeout)
            except asyncio.TimeoutError:
                raise EnvironmentStepError(f"user tool {name!r} ran longer than {timeout}s") from None
            except _QueuedTooLong as e:
                raise EnvironmentStepError(f"user tool {name!r} waited {e.args[0]:.1f}s for a thread without starting (actor overloaded)") from None
            except Exception as e:
                raise EnvironmentStepError(f"user tool {name!r} failed outside tau2's error handling: {e!r}") from e
        self.user_tool_calls += 1
        self.messages.append(UserMessage(role="user", content=None, tool_calls=[call]))
        self.messages.append(ToolMessage(id=call.id, role="tool", content=msg.content, requestor="user", error=msg.error))
        return msg.content, bool(msg.error)

    async def _finish(self, termination: str, answer: StepResult) -> StepResult:
        """``answer`` as the episode's last step: ended by ``termination``, with tau2's reward."""
        self.termination = termination
        with self._timed("reward_s"):
            reward, reward_info = await self.evaluate(termination)
        return replace(answer, done=True, reward=reward, termination=termination, reward_info=reward_info)

    async def evaluate(self, termination: str) -> tuple[float, dict[str, Any]]:
        """tau2's reward for the conversation so far, ending with ``termination``.

        With a sandbox the evaluation runs in the sandbox process and is killed past
        ``env.reward_timeout_s`` (its start-up and the wait for an earlier sandbox request are
        not counted); without one it runs in a thread here.

        Args:
            termination: ``user_stop`` | ``transfer`` | ``agent_stop``.

        Returns:
            ``(reward, info)``: see :func:`evaluate_run`.

        Raises:
            RewardError: the evaluator raised or ran past ``env.reward_timeout_s``.
        """
        if termination not in TERMINATIONS:
            raise RewardError(f"tau2 evaluation: unknown termination {termination!r}")
        timeout = self.cfg.reward_timeout_s
        if self.fast:
            # Nothing is replayed: no model output is evaluated here (see rollout.benchmarks.tau2.fast).
            try:
                return await self._in_thread(self.domain.fast.evaluate, self.task, self._env, list(self.messages), self.cfg.judge,
                                             timeout=timeout)
            except (asyncio.TimeoutError, _QueuedTooLong):
                raise RewardError(f"the reward took over {timeout}s") from None
            except Exception as e:
                raise RewardError(f"the reward failed: {e!r}") from e
        if self.sandbox is None:
            try:
                return await self._in_thread(self._evaluate_sync, termination, timeout=timeout)
            except (asyncio.TimeoutError, _QueuedTooLong):
                raise RewardError(f"tau2 evaluation took over {timeout}s") from None
            except Exception as e:
                raise RewardError(f"tau2 evaluation failed: {e!r}") from e
        if self.sandbox.domain != self.domain.name:
            raise RewardError(f"the sandbox serves domain {self.sandbox.domain!r}, not {self.domain.name!r}")
        # The thread returns by itself once the sandbox answers or is killed; this bound is a net.
        budget = timeout + self.sandbox.startup_timeout_s + 5.0
        args = (self.task, list(self.messages), termination, self._start, time.time(), timeout, self.cfg.judge, self.domain.env_kwargs(self.task))
        try:
            return await self._in_thread(self.sandbox.evaluate, *args, timeout=budget)
        except (asyncio.TimeoutError, _QueuedTooLong):
            raise RewardError(f"tau2 evaluation took over {budget:.0f}s (sandbox busy or not starting)") from None
        except RewardError:
            raise
        except Exception as e:
            raise RewardError(f"tau2 evaluation failed: {e!r}") from e

    def _evaluate_sync(self, termination: str) -> tuple[float, dict[str, Any]]:
        """In-process evaluation (no sandbox): :func:`evaluate_run` in the calling thread."""
        return evaluate_run(self.task, self.messages, termination, self.domain.name, self._start, time.time(),
                            judge=self.cfg.judge, env_kwargs=self.domain.env_kwargs(self.task))
