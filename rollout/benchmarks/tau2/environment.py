"""tau2-bench environments behind the seed's interface.

``Tau2Domain`` loads one domain's tasks, policy, tool schemas and database once per actor.
``Tau2Environment`` is one episode's environment, with the seed's shape made async:
``reset(task_id) -> (observation, info)`` and ``step(action) -> (observation, reward, done, info)``.

* A tool action runs the tool in tau2's environment and returns the tool's output.
* A respond action (plain text) goes to the user simulator and returns the user's reply.
* Dual control (tau2 telecom: the user has tools of its own, acting on the user's phone): at
  ``reset`` the user simulator gets the user's tool schemas and a runner
  (:class:`~rollout.benchmarks.tau2.user.UserTools`); each user tool call runs in the user's side of the
  episode's environment (tau2's ``get_response`` with ``requestor="user"``), off the event loop
  and bounded like agent tools, and is recorded for tau2's evaluator. The agent sees only the
  user's text, as in tau2's orchestrator (a user's tool call and result go to the user alone).
* Domains are those tau2's registry registers (:mod:`rollout.benchmarks.tau2.registry`).
* The episode ends when the user stops (``###STOP###``) or is transferred, when the agent calls
  ``transfer_to_human_agents`` or says ``###STOP###``; the caller enforces max steps.
* At the end the reward is tau2's ``evaluate_simulation`` (``EvaluationType.ALL``) reward,
  computed by ``env.evaluator``:

  - ``fast`` (default, :mod:`rollout.benchmarks.tau2.fast`): the episode's environment is a copy-on-write
    view of the actor's database (microseconds to build, kilobytes per episode) and the reward is
    computed from it and a per-task gold state, with nothing rebuilt or replayed (about 1.5 ms);
    equal to tau2's reward and breakdown on every task of airline and retail
    (``tests/component/test_fast_reward.py``, ``python -m rollout.bench env``). Domains whose environment
    it does not serve (telecom: a custom ``Environment`` subclass with user tools) take tau2's
    path below.
  - ``tau2`` (the reference): a fresh tau2 environment per episode (50-250 ms), and tau2's own
    evaluator, which rebuilds two environments and replays the trajectory (0.3-0.7 s).

Nothing blocks the event loop: tool calls and rewards run in threads or in the sandbox process,
each with a timeout that counts from when it starts running (database tools have their own
threads, so they never queue behind seconds-long work; one that cannot start is an
``env_error``, not the policy's ``tool_timeout``). No model output is evaluated in the actor's
own process, at step time or at reward time:

* Tools that touch no database (tau2's ``GENERIC`` and ``THINK`` tools, e.g. ``calculate``, which
  evaluates its argument with Python's ``eval``) run in a separate sandbox process that is killed
  when a call outlives ``env.step_timeout_s``: a pathological expression such as ``9**9**9**9``
  cannot hang the actor. Read and write tools are dictionary look-ups and updates on the
  episode's own database.
* The fast reward replays nothing. tau2's evaluator (``env.evaluator: tau2``) replays the whole
  trajectory, ``calculate`` calls included: it runs in the sandbox process, bounded by
  ``env.reward_timeout_s`` (past it the process is killed and the episode ends as
  ``eval_error``). Without a sandbox (``sandbox=None``, tests and tools only) it runs in a thread
  of the caller's process, without a hard bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.machinery
import logging
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
import uuid
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any

from rollout.benchmarks.tau2.fast import PURE_TOOL_TYPES, FastPath
from rollout.benchmarks.tau2.registry import DomainLoaders, load_domain
from rollout.benchmarks.tau2.user import STOP, UserSimulator, UserTools
from rollout.core.config import EnvConfig, TaskSelectionError
from rollout.core.environment import Action, EnvironmentStepError, RewardError, ToolTimeoutError, UserSimulatorError
from rollout.core.fate import start_from_lasting_thread

logger = logging.getLogger(__name__)

TRANSFER_TOOL = "transfer_to_human_agents"


def _import_tau2(log_level: str | None = None) -> None:
    """Import tau2 with litellm kept offline; with ``log_level``, set loguru's level (tau2 logs
    every tool response at DEBUG). About 1-2 s the first time."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    if log_level is not None:
        # loguru's default handler reads this when loguru is first imported (tau2 logs at import)
        os.environ.setdefault("LOGURU_LEVEL", log_level.upper())
    import tau2  # noqa: F401
    from loguru import logger as loguru_logger

    if log_level is not None and getattr(_import_tau2, "_level", None) != log_level:
        loguru_logger.remove()
        loguru_logger.add(sys.stderr, level=log_level.upper())
        _import_tau2._level = log_level  # type: ignore[attr-defined]


_CONSTANTS: dict[tuple[str, str], str] = {}


def _literal_constants(module: str, names: tuple[str, ...]) -> dict[str, str]:
    """Module-level string constants of ``module`` (string literals, optionally ``.strip()``-ed), read from its source without
    importing it: importing ``tau2.agent.llm_agent`` for its prompt constants would pull in
    litellm (about 145 MB resident per actor). Falls back to importing the module when a
    constant is not a plain literal. Cached per process.

    Raises:
        ImportError: the module cannot be found.
    """
    if all((module, n) in _CONSTANTS for n in names):
        return {n: _CONSTANTS[(module, n)] for n in names}
    import ast

    # The file from the top package's folder: find_spec would import the parent packages, and
    # tau2.agent's __init__ imports the module itself.
    parts = module.split(".")
    top = importlib.import_module(parts[0])
    path = os.path.join(os.path.dirname(top.__file__), *parts[1:]) + ".py"
    found: dict[str, str] = {}
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), filename=path)
    except OSError:
        tree = ast.Module(body=[], type_ignores=[])
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) and node.targets[0].id in names:
            expr, strip = node.value, None
            if (isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr in ("strip", "lstrip", "rstrip")
                    and not expr.args and not expr.keywords):  # """...""".strip()
                expr, strip = expr.func.value, expr.func.attr
            try:
                value = ast.literal_eval(expr)
            except ValueError:
                continue
            if isinstance(value, str) and strip is not None:
                value = getattr(value, strip)()
            if isinstance(value, str):
                found[node.targets[0].id] = value  # the last assignment wins, as on import
    if set(found) != set(names):
        mod = importlib.import_module(module)
        found = {n: getattr(mod, n) for n in names}
    for n, v in found.items():
        _CONSTANTS[(module, n)] = v
    return found


def _domain_module(domain: str) -> DomainLoaders:
    """The functions tau2's registry registers for ``domain`` (``get_environment``, ``get_tasks``,
    ``get_tasks_split``), see :func:`rollout.benchmarks.tau2.registry.load_domain`.

    Raises:
        UnknownDomainError: tau2 has no such domain (one line naming ``env.domain``).
    """
    _import_tau2()
    return load_domain(domain)


class Tau2Domain:
    """One tau2 domain's static data, loaded once per actor.

    The domain is any that tau2's registry registers (``tau2/registry.py``: airline, retail,
    telecom, ...; :mod:`rollout.benchmarks.tau2.registry`), loaded through the functions registered for it.

    Args:
        name: the domain's registry name (``env.domain``).
        tau2_log_level: loguru level for tau2's logs.

    Raises:
        UnknownDomainError: tau2 registers no domain ``name`` (a ``KeyError``; one line naming
            ``env.domain`` and listing tau2's domains).

    Attributes:
        name: the registry name (``airline`` | ``retail`` | ``telecom`` | ...).
        tasks: task id -> ``tau2`` Task, every task of the domain (telecom: 2285, its ``full`` split).
        splits: split name (``train`` / ``test`` / ``base``, telecom also ``small`` / ``full``) ->
            task ids, from tau2's split_tasks.json; a domain without splits has only ``base`` (all tasks).
        policy: the domain policy (the agent's system prompt).
        tool_schemas: OpenAI-style function schemas of the agent's tools.
        tool_types: tool name -> tau2 ToolType value (``read`` / ``write`` / ``think`` / ``generic``).
        user_tool_schemas: OpenAI-style function schemas of the user's own tools (dual control,
            tau2's ``Environment.get_user_tools()``: telecom's phone); empty when the user has none.
    """

    def __init__(self, name: str, tau2_log_level: str = "ERROR"):
        _import_tau2(tau2_log_level)
        loaders = _domain_module(name)
        from tau2.environment.toolkit import get_tool_types

        self.name = name
        self._loaders = loaders
        self.tasks = {t.id: t for t in loaders.get_tasks(None)}
        splits = loaders.get_tasks_split() if loaders.get_tasks_split is not None else None
        self.splits: dict[str, list[str]] = dict(splits) if splits else {"base": list(self.tasks)}
        env = loaders.get_environment()
        self.policy: str = env.get_policy()
        self.tool_schemas: list[dict] = [t.openai_schema for t in env.get_tools()]
        self.tool_names: list[str] = [s["function"]["name"] for s in self.tool_schemas]
        self.tool_types: dict[str, str] = {k: v.value for k, v in get_tool_types(env.tools).items()}
        self.user_tool_schemas: list[dict] = [t.openai_schema for t in env.get_user_tools()] if env.user_tools is not None else []
        # The fast path's shared database is this environment's (parsed once per actor).
        self.fast = FastPath(name, env, self.tool_types)
        self._tool_executor: ThreadPoolExecutor | None = None

    @property
    def tool_executor(self) -> ThreadPoolExecutor:
        """Threads for database tool calls only (microseconds to milliseconds each), so that they
        never queue behind environment builds, rewards or tokenization in the actor's main pool."""
        if self._tool_executor is None:
            self._tool_executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix=f"{self.name}-db-tools")
        return self._tool_executor

    def close(self) -> None:
        """Stop the database tool threads (idempotent)."""
        if self._tool_executor is not None:
            self._tool_executor.shutdown(wait=False, cancel_futures=True)
            self._tool_executor = None

    @property
    def system_prompt(self) -> str:
        """The agent's system prompt: tau2's own agent instruction and the domain policy."""
        consts = _literal_constants("tau2.agent.llm_agent", ("AGENT_INSTRUCTION", "SYSTEM_PROMPT"))
        return consts["SYSTEM_PROMPT"].format(agent_instruction=consts["AGENT_INSTRUCTION"], domain_policy=self.policy)

    def new_sandbox(self, evaluator: bool, log_level: str = "ERROR", startup_timeout_s: float = 120.0) -> ToolSandbox:
        """The actor's :class:`ToolSandbox` for this domain: on the fast path it runs
        database-free tools on the toolkit alone (no database in the child), and loads tau2's
        evaluator only when ``evaluator`` (``env.evaluator: tau2``) or when first needed."""
        tools = self.fast.tools_class if self.fast.enabled else None
        return ToolSandbox(self.name, startup_timeout_s=startup_timeout_s, log_level=log_level,
                           tools_class=f"{tools.__module__}:{tools.__qualname__}" if tools is not None else None, evaluator=evaluator)

    def task_ids(self, split: str, ids: list[str] | None = None) -> list[str]:
        """Task ids of ``split`` (tau2 order), or ``ids`` checked against the domain.

        Raises:
            rollout.core.config.TaskSelectionError: an id is not a task of the domain, or the split does not exist (a KeyError).
        """
        if split not in self.splits:
            raise TaskSelectionError(f"env.task_split: domain {self.name} has no split {split!r} (has {sorted(self.splits)})")
        if ids is None:
            return list(self.splits[split])
        missing = [i for i in ids if str(i) not in self.tasks]
        if missing:
            raise TaskSelectionError(f"env.task_ids: not tasks of domain {self.name}: {missing[:10]}")
        return [str(i) for i in ids]

    def new_environment(self):
        """A fresh tau2 ``Environment`` with its own database(s) (30-280 ms, 7-27 MB), from the
        constructor tau2's registry registers for the domain (telecom: a ``TelecomEnvironment``
        with the user's phone as its user-side database)."""
        return self._loaders.get_environment()


# -- evaluation (tau2's own evaluator) -----------------------------------------------------------
_TERMINATIONS = ("user_stop", "transfer", "agent_stop")


def evaluate_run(task: Any, messages: list[Any], termination: str, domain: str, start_time: float, end_time: float) -> tuple[float, dict[str, Any]]:
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

    Returns:
        ``(reward, info)``; ``info`` has ``reward_breakdown`` (reward type -> float), ``db_match``,
        ``communicate_met`` and ``action_match`` (lists of bools, or None).

    Raises:
        KeyError: unknown ``termination``; anything tau2's evaluator raises.
    """
    from tau2.data_model.simulation import SimulationRun, TerminationReason
    from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation

    reason = {
        "user_stop": TerminationReason.USER_STOP,
        "transfer": TerminationReason.USER_STOP,  # tau2's user says ###TRANSFER### and stops
        "agent_stop": TerminationReason.AGENT_STOP,
    }[termination]
    sim = SimulationRun(
        id=uuid.uuid4().hex,
        task_id=task.id,
        start_time=str(start_time),
        end_time=str(end_time),
        duration=end_time - start_time,
        termination_reason=reason,
        messages=messages,
    )
    ri = evaluate_simulation(sim, task, EvaluationType.ALL, solo_mode=False, domain=domain)
    breakdown = {getattr(k, "value", str(k)): float(v) for k, v in (ri.reward_breakdown or {}).items()}
    info = {
        "reward_breakdown": breakdown,
        "db_match": ri.db_check.db_match if ri.db_check is not None else None,
        "communicate_met": [c.met for c in ri.communicate_checks] if ri.communicate_checks else None,
        "action_match": [c.action_match for c in ri.action_checks] if ri.action_checks else None,
    }
    return float(ri.reward), info


# -- sandbox for tools that touch no database, and for evaluation ----------------------------------
def _sandbox_main(conn, domain: str, log_level: str, parent_pid: int | None = None, tools_class: str | None = None,
                  with_evaluator: bool = True) -> None:  # runs in the child process
    from rollout.core.fate import set_parent_death_signal, share_fate

    # Die with the actor, even when it is SIGKILLed and even in the middle of a runaway eval that
    # holds the GIL (PDEATHSIG needs no Python thread; it follows the parent thread that started
    # this process, which KillableChild makes one that lives as long as the parent: see
    # rollout.core.fate.start_from_lasting_thread); the parent watch covers platforms without it.
    set_parent_death_signal(signal.SIGKILL)
    share_fate(parent_pid, on_parent_death=lambda: os._exit(1))
    _import_tau2(log_level)
    if tools_class is None:
        env = load_domain(domain).get_environment()
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


class _QueuedTooLong(Exception):
    """A call waited too long for a thread without starting (args: seconds waited)."""


class _SandboxTimeout(Exception):
    """The sandbox did not answer in time and was killed."""


_SPAWN_LOCK = threading.Lock()


@contextlib.contextmanager
def _spawn_without_main_script():
    """While a ``spawn`` child is started: keep it from re-running the parent's ``__main__`` script.

    ``multiprocessing``'s ``spawn`` makes the child import the parent's main module again (as
    ``__mp_main__``) when that module is a script file, so that functions defined there can be
    unpickled. In a Ray actor the script is Ray's ``default_worker.py``, which imports Ray: each
    sandbox child then held Ray's libraries, 55 MiB of its 131 MiB resident (measured here with
    ``/proc/PID/maps`` and ``python -m rollout.bench memory``). Our children's entry points live
    in importable modules, so the script is not needed: for the start only, the main module gets
    the spec name ``__main__``, for which the child's preparation imports nothing (CPython's
    ``multiprocessing.spawn._fixup_main_from_name`` returns at once for that name, as it does for
    a ``python -m pkg`` main). A main module run with ``-m`` (a spec already) or without a file is
    left as it is. Starts are serialised by a lock, so concurrent
    starts from several threads restore the main module correctly.
    """
    main = sys.modules.get("__main__")
    if main is None or getattr(main, "__spec__", None) is not None or not getattr(main, "__file__", None):
        yield
        return
    with _SPAWN_LOCK:
        main.__spec__ = importlib.machinery.ModuleSpec("__main__", None)
        try:
            yield
        finally:
            main.__spec__ = None


class KillableChild:
    """A ``spawn``-ed child process that serves requests over a pipe, one at a time, and is
    killed when a request outlives its timeout (restarted on the next request). Shared by
    :class:`ToolSandbox` and the tau-bench adapter's sandbox.

    Protocol: the child sends ``"ready"`` once started, then answers each request with
    ``("ok", result)`` or ``("exc", message)``. Subclasses give the child's entry point
    (:meth:`_child`) and a ``label`` for messages. The start-up is bounded by
    ``startup_timeout_s`` and not counted against any request.

    Args:
        startup_timeout_s: bound on the child's start-up, seconds.
    """

    label = "child process"

    def __init__(self, startup_timeout_s: float = 120.0):
        self.startup_timeout_s = startup_timeout_s
        self._ctx = mp.get_context("spawn")
        self._proc = None
        self._conn = None
        self._lock = threading.Lock()
        self.kills = 0

    def _child(self) -> tuple[Any, tuple, str]:
        """``(target, args after the pipe end, process name)`` of the child to start."""
        raise NotImplementedError

    @property
    def pid(self) -> int | None:
        """The child's process id (None before the first start and after a kill)."""
        return self._proc.pid if self._proc is not None else None

    def _ensure(self) -> None:
        """Start the child if needed and wait until it is ready (call it holding ``_lock``).

        Raises:
            EnvironmentStepError: the child did not start within ``startup_timeout_s`` or died
                starting (its exit code then in the message).
        """
        if self._proc is not None and self._proc.is_alive():
            return
        target, args, name = self._child()
        parent, child = self._ctx.Pipe()
        self._proc = self._ctx.Process(target=target, args=(child, *args), daemon=True, name=name)
        proc = self._proc

        def start() -> None:
            with _spawn_without_main_script():
                proc.start()

        # the child sets PR_SET_PDEATHSIG, which follows the thread that starts it: not this
        # (possibly short-lived executor) thread, but one that lives as long as the process
        start_from_lasting_thread(start)
        child.close()
        self._conn = parent
        try:
            ready = parent.poll(self.startup_timeout_s) and parent.recv() == "ready"
        except (EOFError, OSError):
            ready = False
        if not ready:
            self._proc.join(timeout=0.2)  # a child that died: its exit code
            code = self._proc.exitcode
            self.kill()
            if code is not None:
                raise EnvironmentStepError(f"{self.label} exited during its start-up (exit code {code})")
            raise EnvironmentStepError(f"{self.label} did not start within {self.startup_timeout_s:g}s")

    def _stop(self) -> bool:
        proc, self._proc = self._proc, None
        if proc is None or not proc.is_alive():
            return False
        proc.kill()
        proc.join(timeout=5)
        return True

    def kill(self) -> None:
        """Kill the child (a request ran too long or the pipe broke); counted in ``kills``."""
        self.kills += int(self._stop())

    def _request(self, request: Any, timeout_s: float) -> Any:
        """Send one request and wait up to ``timeout_s`` for its result (blocking).

        Raises:
            _SandboxTimeout: no answer within ``timeout_s`` (the process is killed).
            EnvironmentStepError: the child did not start, or died.
            RuntimeError: the request raised in the child (the message says what).
        """
        with self._lock:
            self._ensure()
            try:
                self._conn.send(request)
                if self._conn.poll(timeout_s):
                    status, result = self._conn.recv()
                else:
                    self.kill()
                    raise _SandboxTimeout()
            except (EOFError, OSError) as e:  # BrokenPipeError is an OSError
                self.kill()
                raise EnvironmentStepError(f"{self.label} died: {e!r}") from None
        if status != "ok":
            raise RuntimeError(result)
        return result


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
    """

    def __init__(self, domain: str, startup_timeout_s: float = 120.0, log_level: str = "ERROR", tools_class: str | None = None,
                 evaluator: bool = True):
        super().__init__(startup_timeout_s)
        self.domain = domain
        self.log_level = log_level
        self.tools_class = tools_class
        self.with_evaluator = evaluator
        self._evaluator_loaded = False

    label = "tool sandbox"

    def _child(self) -> tuple[Any, tuple, str]:
        self._evaluator_loaded = self.with_evaluator  # a new child: loaded at start, or not
        return (_sandbox_main, (self.domain, self.log_level, os.getpid(), self.tools_class, self.with_evaluator),
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
        except _SandboxTimeout:
            raise ToolTimeoutError(f"tool {name!r} ran longer than {timeout_s:.1f}s ({time.monotonic() - t0:.1f}s) and was killed") from None
        except RuntimeError as e:
            if isinstance(e, EnvironmentStepError):
                raise
            raise EnvironmentStepError(f"tool {name!r} failed in the sandbox: {e}") from None

    def evaluate(self, task: Any, messages: list[Any], termination: str, start_time: float, end_time: float, timeout_s: float) -> tuple[float, dict[str, Any]]:
        """tau2's reward for one conversation, computed in the child (:func:`evaluate_run` there);
        blocking (call it from a thread).

        Args:
            task, messages, termination, start_time, end_time: as for :func:`evaluate_run`.
            timeout_s: bound on the evaluation in seconds; past it the child is killed.

        Returns:
            ``(reward, info)`` as :func:`evaluate_run` gives them.

        Raises:
            RewardError: the evaluation ran past ``timeout_s`` (the child was killed), raised in
                the child, or the child did not start or died.
        """
        payload = {"task": task, "messages": list(messages), "termination": termination, "start_time": start_time, "end_time": end_time}
        if not self._evaluator_loaded:
            try:
                self._request(("load_evaluator",), self.startup_timeout_s)
            except _SandboxTimeout:
                raise RewardError(f"loading tau2's evaluator in the sandbox took over {self.startup_timeout_s:.0f}s") from None
            except RuntimeError as e:
                raise RewardError(f"loading tau2's evaluator in the sandbox failed: {e}") from None
            self._evaluator_loaded = True
        t0 = time.monotonic()
        try:
            reward, info = self._request(("evaluate", payload), timeout_s)
        except _SandboxTimeout:
            raise RewardError(f"tau2 evaluation ran longer than {timeout_s:.1f}s ({time.monotonic() - t0:.1f}s) and was killed") from None
        except EnvironmentStepError as e:
            raise RewardError(f"tau2 evaluation failed: {e}") from None
        except RuntimeError as e:
            raise RewardError(f"tau2 evaluation failed: {e}") from None
        return reward, info

    def close(self) -> None:
        """Stop the child (not counted in ``kills``)."""
        self._stop()


class Tau2Environment:
    """One episode's tau2 environment (async, seed-shaped).

    Args:
        domain: the actor's :class:`Tau2Domain`.
        user: the episode's user simulator.
        cfg: the ``env`` section.
        executor: thread pool for tau2 calls (``None``: the loop's default executor).
        sandbox: the actor's :class:`ToolSandbox` for database-free tools and for tau2's evaluator
            (``None``: run both in a thread of this process, without a hard bound; tests only).

    ``step`` raises :class:`ToolTimeoutError` (policy-caused), :class:`EnvironmentStepError`,
    :class:`UserSimulatorError` or :class:`RewardError` (infrastructure); a tool that raises
    inside tau2 is not an error here: tau2 turns it into an error observation for the agent.
    """

    def __init__(self, domain: Tau2Domain, user: UserSimulator, cfg: EnvConfig, executor: Executor | None = None, sandbox: ToolSandbox | None = None):
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
            ``(observation, info)``: the user's opening message, and ``{"task_id", "domain"}``.

        Raises:
            EnvironmentStepError, UserSimulatorError.
        """
        from tau2.data_model.message import UserMessage

        self.task = self.domain.tasks[str(task_id)]
        self._start = time.time()
        self.fast = self.cfg.evaluator == "fast" and self.domain.fast.supports(self.task)
        with self._timed("env_s"):
            try:
                if self.fast:  # a view of the actor's database: microseconds, on the loop
                    self._env = self.domain.fast.new_environment(self.task)
                else:
                    self._env = await self._in_thread(self._build_env, timeout=self.cfg.step_timeout_s)
            except (asyncio.TimeoutError, _QueuedTooLong):
                raise EnvironmentStepError(f"building the {self.domain.name} environment took over {self.cfg.step_timeout_s}s") from None
            except Exception as e:
                raise EnvironmentStepError(f"building the environment failed: {e!r}") from e
        if self.domain.user_tool_schemas:  # dual control: the user acts on its own side (telecom's phone)
            bind = getattr(self.user, "bind_tools", None)
            if bind is None:
                raise UserSimulatorError(f"domain {self.domain.name} gives the user tools, but the user simulator "
                                         f"{type(self.user).__name__} cannot use them (no bind_tools)")
            bind(UserTools(schemas=tuple(self.domain.user_tool_schemas), call=self._user_tool))
        with self._timed("user_s"):
            opening = await self.user.start()
        self.messages.append(UserMessage(role="user", content=opening))
        return opening, {"task_id": self.task.id, "domain": self.domain.name}

    def _build_env(self):
        """tau2's path: a fresh environment with its own database, in the task's initial state."""
        env = self.domain.new_environment()
        st = self.task.initial_state
        if st is not None and (st.initialization_data or st.initialization_actions or st.message_history):
            env.set_state(
                initialization_data=st.initialization_data,
                initialization_actions=st.initialization_actions,
                message_history=st.message_history or [],
            )
        return env

    async def step(self, action: Action) -> tuple[str, float, bool, dict[str, Any]]:
        """Apply one agent action.

        Returns:
            ``(observation, reward, done, info)``. ``observation`` is the tool output (``info["role"]
            == "tool"``) or the user's reply (``"user"``). ``reward`` is tau2's reward when ``done``
            (0.0 before). ``info`` has ``role``, ``termination`` (``user_stop`` | ``transfer`` |
            ``agent_stop`` | None), ``tool_error`` and, when done, ``reward_info``.
        """
        from tau2.data_model.message import AssistantMessage, ToolCall, ToolMessage, UserMessage

        if self._env is None:
            raise EnvironmentStepError("step() before reset()")
        info: dict[str, Any] = {"termination": None, "tool_error": False}
        if action.is_respond:
            self.messages.append(AssistantMessage(role="assistant", content=action.content))
            if STOP in action.content:
                info["role"] = "user"
                return await self._finish("agent_stop", "", info)
            with self._timed("user_s"):
                reply = await self.user.respond(action.content)
            self.messages.append(UserMessage(role="user", content=reply.text))
            info["role"] = "user"
            if reply.stop:
                return await self._finish("transfer" if reply.transfer else "user_stop", reply.text, info)
            return reply.text, 0.0, False, info

        # ids need only be unique within the episode (tau2 pairs a call with its answer by id);
        # a counter, not uuid4, whose os.urandom is a system call on the event loop per step
        self._call_ids += 1
        call = ToolCall(id=f"call_{self._call_ids}", name=action.name, arguments=action.arguments)
        self.messages.append(AssistantMessage(role="assistant", content=action.content or None, tool_calls=[call]))
        with self._timed("tool_s"):
            content, error = await self._run_tool(call)
        self.messages.append(ToolMessage(id=call.id, role="tool", content=content, requestor="assistant", error=error))
        info.update(role="tool", tool_error=error)
        if action.name == TRANSFER_TOOL:
            return await self._finish("transfer", content, info)
        return content, 0.0, False, info

    async def _run_tool(self, call) -> tuple[str, bool]:
        """Run one tool call: database-free tools in the sandbox, database tools in the domain's
        own tool threads. Only time spent running counts against ``env.step_timeout_s``: a call
        that cannot even start (a busy actor) is an :class:`EnvironmentStepError`, never a
        ``tool_timeout`` (which is trained as the policy's failure)."""
        timeout = self.cfg.step_timeout_s
        pure = self.domain.tool_types.get(call.name) in PURE_TOOL_TYPES
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

    async def _finish(self, termination: str, observation: str, info: dict[str, Any]):
        self.termination = termination
        info["termination"] = termination
        with self._timed("reward_s"):
            reward, reward_info = await self.evaluate(termination)
        info["reward_info"] = reward_info
        return observation, reward, True, info

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
        if termination not in _TERMINATIONS:
            raise RewardError(f"tau2 evaluation: unknown termination {termination!r}")
        timeout = self.cfg.reward_timeout_s
        if self.fast:
            # Nothing is replayed: no model output is evaluated here (see rollout.benchmarks.tau2.fast).
            try:
                return await self._in_thread(self.domain.fast.evaluate, self.task, self._env, list(self.messages), timeout=timeout)
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
        args = (self.task, list(self.messages), termination, self._start, time.time(), timeout)
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
        return evaluate_run(self.task, self.messages, termination, self.domain.name, self._start, time.time())
