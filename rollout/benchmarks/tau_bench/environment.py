"""The original tau-bench (sierra-research/tau-bench) behind the interface our episodes use.

``env.benchmark: tau_bench`` runs tau-bench's own environments instead of tau2's. tau-bench is on
no package registry: it is installed from its repository (``pip install
git+https://github.com/sierra-research/tau-bench``), never a dependency of this project, and none
of its code or data is copied here. Without it, :func:`make_domain` (the worker's start) and
:func:`rollout.app.preflight.check_benchmark` fail with one line saying how to install it.

What is used from tau-bench (its repository's files):

* ``tau_bench/envs/__init__.py``: ``get_env(env_name, user_strategy, user_model, task_split,
  user_provider=None, task_index=None) -> Env`` (``task_index`` only in newer versions).
* ``tau_bench/envs/base.py``: ``Env`` with ``reset(task_index) -> EnvResetResponse(observation,
  info)``, ``step(Action) -> EnvResponse(observation, reward, done, info)``, ``tools_map`` (tool
  name -> ``Tool`` class, run as ``invoke(data=env.data, **kwargs)``; an exception a tool raises
  becomes the observation ``"Error: ..."``), ``tools_info`` (OpenAI function schemas), ``wiki``
  (the domain policy), ``rules``, ``tasks``, ``terminate_tools`` (``transfer_to_human_agents``),
  ``user`` (the user simulator), ``actions`` and ``calculate_reward() -> RewardResult``: the
  database hash after the episode against the hash after replaying the task's gold actions, and
  each of the task's ``outputs`` said (lower case, commas removed) in some ``respond`` action.
  ``step`` computes the reward itself when the episode is done: the user's reply holds
  ``###STOP###``, or a terminate tool was called.
* ``tau_bench/types.py``: ``Action(name, kwargs)``, ``RESPOND_ACTION_NAME == "respond"`` (kwargs
  ``{"content": text}``), ``Task(user_id, actions, instruction, outputs)``, ``RewardResult(reward,
  info, actions)`` with ``RewardActionInfo(r_actions, gt_data_hash)`` or
  ``RewardOutputInfo(r_outputs, outputs)``, ``EnvInfo(task, source, user_cost, reward_info)``.
* ``tau_bench/envs/user.py``: ``load_user(user_strategy, model, provider)``; the user simulator's
  interface ``reset(instruction) -> str``, ``step(content) -> str``, ``get_total_cost() -> float``.
  Its LLM users call ``litellm.completion(model=..., custom_llm_provider=..., messages=...)``
  synchronously, with no endpoint argument (so the endpoint is set through litellm's environment
  variables, see :class:`TauBenchEnvironment`), and the constructor already makes one call.

How it maps onto our episodes (``rollout.core.episode.run_episode``, unchanged: it keeps
token-in/token-out; this module only provides the environment):

* Tasks: ids are ``"{split}-{index}"`` (``test-0``, ``train-12``; tau-bench's ``task_index``
  within the split ``get_env`` was built for); the splits are the ones the domain's environment
  accepts among ``test``, ``train``, ``dev`` (retail has all three, airline only ``test``), and
  ``base`` is all of them. With a concrete ``env.task_split``, ``env.task_ids`` may also be bare
  indices. The agent's system prompt is the domain's ``wiki`` (as tau-bench's tool-calling agent
  and the seed use it) and its tools are ``tools_info``.
* One tau-bench ``Env`` per episode (``get_env`` loads the domain's data; ``reset`` loads it
  again). Its user simulator is chosen by ``env.user.kind``: ``scripted`` is
  :class:`ScriptedTauBenchUser` (deterministic, no LLM; the local stack's gold replay needs it);
  ``llm`` is tau-bench's own ``llm`` user strategy through litellm, against ``env.user.base_url``
  / ``env.user.model``. ``env.evaluator`` does not apply: the reward is always tau-bench's own.
* tau-bench is synchronous: every ``reset`` / ``step`` runs in a thread of the actor's executor,
  never on the event loop. Each phase of a call has its own bound, counted from when it starts
  (the waiting coroutine watches the phase the thread is in): building the environment and
  tau-bench's own code ``env.step_timeout_s`` (past it: ``env_error``), a tool call
  ``env.step_timeout_s`` (``tool_timeout``), a user-simulator turn ``env.user.timeout_s``
  (``user_error``), the reward ``env.reward_timeout_s`` (``eval_error``). A call that cannot get
  a thread within ``env.step_timeout_s`` is ``env_error``.
* Errors: a tool that raises is an observation (tau-bench's ``"Error: ..."``, ``tool_error`` in
  the info), never an error; a failure of the user simulator is :class:`UserSimulatorError`
  (``user_error``), of the reward :class:`RewardError` (``eval_error``), of anything else in
  tau-bench's code, an unknown task id included, :class:`EnvironmentStepError` (``env_error``).
  Failures inside tau-bench's ``step`` are told apart by wrapping the env's user, tools and
  ``calculate_reward`` (tau-bench turns every ``Exception`` a tool raises into an observation, so
  the wrappers signal with a ``BaseException`` that its ``except Exception`` lets through).
* Hard bounds: a thread cannot be stopped. ``calculate`` evaluates model text with Python's
  ``eval`` (``9**9**9**9`` passes its character filter and would hold the interpreter for ever),
  so the tools in :data:`SANDBOXED_TOOLS` run in a child process (:class:`TauBenchToolSandbox`)
  that is killed past ``env.step_timeout_s``. Other tools, the user simulator and the reward run
  in threads: past their bound the episode ends with the status above, but the thread finishes
  on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.util
import inspect
import json
import logging
import os
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

from rollout.benchmarks.tau2.environment import KillableChild, _SandboxTimeout
from rollout.benchmarks.tau2.user import STOP, user_api_key
from rollout.benchmarks.tau_bench.child import child_main
from rollout.core.config import EnvConfig, TaskSelectionError
from rollout.core.environment import Action, EnvironmentStepError, RewardError, ToolTimeoutError, UserSimulatorError

logger = logging.getLogger(__name__)

BENCHMARK = "tau_bench"
INSTALL_COMMAND = "pip install git+https://github.com/sierra-research/tau-bench"
SPLITS = ("test", "train", "dev")  # the task splits tau-bench's environments know (retail: all; airline: test)
BASE_SPLIT = "base"  # every task of every split
STACK_PREFIX = "tau_bench:"  # the local stack's --domain for tau-bench's domains (rollout.devtools.local.gold)
SANDBOXED_TOOLS = frozenset({"calculate"})  # tools that evaluate model text with eval: run in a killable process
USER_STRATEGY = "llm"  # tau-bench's user strategy for env.user.kind=llm
USER_PROVIDER = "openai"  # litellm provider of an OpenAI-compatible endpoint (env.user.base_url)
_READ_TOOL_PREFIXES = ("get_", "find_", "list_", "search_", "calculate", "think", "transfer_")


class TauBenchNotInstalled(ImportError):
    """``env.benchmark: tau_bench`` but the ``tau_bench`` package cannot be found; the message is one
    line with the install command."""


class UnknownTauBenchDomain(KeyError):
    """tau-bench has no environment of that name (``get_env``: ``Unknown environment``); a
    ``KeyError`` (the CLI prints it as one config line) whose message names ``env.domain``."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def tau_bench_available() -> bool:
    """Whether ``tau_bench`` can be imported (looked up with ``importlib.util.find_spec``, not imported)."""
    try:
        return importlib.util.find_spec("tau_bench") is not None
    except (ImportError, ValueError):
        return False


def require_tau_bench() -> None:
    """Raise unless ``tau_bench`` can be imported.

    Raises:
        TauBenchNotInstalled: one line saying how to install it.
    """
    if not tau_bench_available():
        raise TauBenchNotInstalled(
            f"env.benchmark=tau_bench needs the tau_bench package (the original tau-bench), which is not installed: {INSTALL_COMMAND}")


def _import_tau_bench() -> tuple[Any, Any]:
    """``(tau_bench.envs, tau_bench.types)``, imported with litellm kept offline (tau-bench imports
    litellm, which otherwise fetches its model cost map from the network).

    Raises:
        TauBenchNotInstalled: the package is missing.
        ImportError: it is there but does not import (one line).
    """
    require_tau_bench()
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    try:
        envs = importlib.import_module("tau_bench.envs")
        types = importlib.import_module("tau_bench.types")
    except ImportError as e:
        raise ImportError(f"the tau_bench package is installed but does not import ({type(e).__name__}: {e}); reinstall it: {INSTALL_COMMAND}") from None
    return envs, types


def task_id(split: str, index: int) -> str:
    """Our id of tau-bench's task ``index`` of ``split``: ``"{split}-{index}"``."""
    return f"{split}-{int(index)}"


def parse_task_id(tid: str) -> tuple[str, int]:
    """``(split, index)`` of an id made by :func:`task_id`.

    Raises:
        ValueError: ``tid`` is not of that form.
    """
    split, sep, index = str(tid).rpartition("-")
    if not sep or not split or not index.isdigit():
        raise ValueError(f"not a tau-bench task id (expected '<split>-<index>', e.g. 'test-0'): {tid!r}")
    return split, int(index)


def guess_tool_type(name: str) -> str:
    """``"read"`` or ``"write"`` for a tau-bench tool name, guessed from the name (tau-bench does not
    type its tools): ``get_`` / ``find_`` / ``list_`` / ``search_`` / ``calculate`` / ``think`` /
    ``transfer_`` are read tools, anything else writes. Used only by the local stack's
    ``gold_replay_skip_write`` backend."""
    return "read" if name.startswith(_READ_TOOL_PREFIXES) else "write"


def _supports_task_index(get_env) -> bool:
    try:
        return "task_index" in inspect.signature(get_env).parameters
    except (TypeError, ValueError):
        return False


def build_env(domain: str, split: str, index: int, user_model: str = "human") -> Any:
    """A tau-bench ``Env`` of ``domain`` for ``split``, positioned on task ``index``, with tau-bench's
    ``human`` user strategy (whose constructor calls no model; callers install their own user).
    Blocking (loads the domain's data): call it in a thread.

    ``get_env`` versions without ``task_index`` draw ``randint(0, len(tasks))`` (both ends
    included), which is one past the end once in ``len + 1`` times: the build is then retried.

    Raises:
        ValueError: tau-bench's ``Unknown environment`` / ``Unknown task split``.
        IndexError: ``index`` is out of range for the split (or the split is empty).
    """
    envs, _ = _import_tau_bench()
    kwargs = dict(env_name=domain, user_strategy="human", user_model=user_model, task_split=split, user_provider=None)
    if _supports_task_index(envs.get_env):
        return envs.get_env(**kwargs, task_index=index)
    for attempt in range(8):
        try:
            return envs.get_env(**kwargs)
        except IndexError:
            if attempt == 7:
                raise
    raise AssertionError("unreachable")


# -- the user simulators ---------------------------------------------------------------------------
class ScriptedTauBenchUser:
    """Deterministic user with tau-bench's user-simulator interface (``tau_bench/envs/user.py``:
    ``reset(instruction) -> str``, ``step(content) -> str``, ``get_total_cost() -> float``); no LLM.

    It opens with ``"Hi! " + instruction`` (the task's instruction, which the local stack's gold
    replay recognises), answers an agent message that holds a question mark with the instruction
    and ``"Yes, please go ahead."``, and ends the conversation (``###STOP###``, tau-bench's stop
    signal) at the first message without one, or after ``max_answers`` answers. The same rules as
    :class:`rollout.benchmarks.tau2.user.ScriptedUser` for tau2.
    """

    def __init__(self, max_answers: int = 8):
        self.max_answers = max_answers
        self.instruction = ""
        self.answers = 0

    def reset(self, instruction: str | None = None) -> str:
        self.instruction = " ".join((instruction or "").split())
        self.answers = 0
        return f"Hi! {self.instruction}"

    def step(self, content: str) -> str:
        if "?" not in (content or "") or self.answers >= self.max_answers:
            return STOP
        self.answers += 1
        return f"{self.instruction}\nYes, please go ahead."

    def get_total_cost(self) -> float:
        return 0.0


_ENDPOINT_LOCK = threading.Lock()
_ENDPOINT: tuple[str | None, str] | None = None


def point_litellm_at(base_url: str | None, api_key: str) -> None:
    """Point litellm's ``openai`` provider at ``base_url`` for this process: tau-bench's users call
    ``litellm.completion`` without an endpoint argument, so it comes from the environment
    variables litellm reads (``OPENAI_BASE_URL``, ``OPENAI_API_BASE``; ``USER_MODEL_API_BASE`` for
    forks of tau-bench that read it) and the key from ``OPENAI_API_KEY`` (``"EMPTY"`` when no key
    is configured and none is set). Process-wide: one endpoint per actor; a second, different one
    is refused.

    Raises:
        UserSimulatorError: this process already points at another endpoint.
    """
    global _ENDPOINT
    with _ENDPOINT_LOCK:
        if _ENDPOINT is not None:
            if _ENDPOINT != (base_url, api_key):
                raise UserSimulatorError(f"tau-bench's user simulator already points at {_ENDPOINT[0]} in this process, not {base_url}")
            return
        if base_url:
            for var in ("OPENAI_BASE_URL", "OPENAI_API_BASE", "USER_MODEL_API_BASE"):
                os.environ[var] = base_url
        if api_key:
            os.environ["OPENAI_API_KEY"] = api_key
        else:
            os.environ.setdefault("OPENAI_API_KEY", "EMPTY")
        _ENDPOINT = (base_url, api_key)


# -- phases of one call, and their bounds ------------------------------------------------------------
class _Escape(BaseException):
    """Carries one of our errors out of tau-bench's ``step``, whose ``except Exception`` around tool
    calls would turn it into an observation."""

    def __init__(self, error: Exception):
        super().__init__(str(error))
        self.error = error


@dataclass
class _Phase:
    kind: str  # env | tool | user | reward
    detail: str
    limit: float  # seconds
    start: float  # time.monotonic()
    nested: float = 0.0  # seconds spent in phases inside this one


class _PhaseClock:
    """Which phase the thread running tau-bench is in, since when, and for how long it may last.

    Phases nest (a user turn inside ``env.step``); the innermost one is timed. Nothing nests in
    a ``reward`` phase: tau-bench's reward replays the gold actions through ``step``, and those
    tool calls belong to the reward (bounded by its limit, their failures are the reward's).
    ``spent`` has the seconds spent in each kind of phase, nested phases not counted twice.
    """

    def __init__(self) -> None:
        self._stack: list[_Phase] = []
        self._lock = threading.Lock()
        self.spent: dict[str, float] = defaultdict(float)

    def sealed(self) -> bool:
        """Whether the thread is inside the reward (where phases do not nest)."""
        with self._lock:
            return bool(self._stack) and self._stack[-1].kind == "reward"

    @contextlib.contextmanager
    def phase(self, kind: str, limit: float, detail: str = "") -> Iterator[None]:
        with self._lock:
            sealed = bool(self._stack) and self._stack[-1].kind == "reward"
            if not sealed:
                ph = _Phase(kind, detail, limit, time.monotonic())
                self._stack.append(ph)
        if sealed:
            yield
            return
        try:
            yield
        finally:
            with self._lock:
                self._stack.remove(ph)
                took = time.monotonic() - ph.start
                self.spent[kind] += took - ph.nested
                if self._stack:
                    self._stack[-1].nested += took

    def top(self) -> tuple[_Phase, float] | None:
        """The innermost phase and the seconds since it started, or None outside any."""
        with self._lock:
            if not self._stack:
                return None
            ph = self._stack[-1]
            return ph, time.monotonic() - ph.start


_POLL_S = 0.25  # the waiting coroutine re-reads the phase at least this often (a nested phase may have a shorter bound)


# -- the sandbox for tools that evaluate model text (its child: rollout.benchmarks.tau_bench.child) -------------
class TauBenchToolSandbox(KillableChild):
    """A child process that runs tau-bench's :data:`SANDBOXED_TOOLS` (``calculate``, which
    evaluates its argument with ``eval``) and is killed when a call outlives its timeout, so a
    runaway expression cannot hold the actor. One per actor; calls are serialised; started with
    the ``spawn`` method on first use (its start-up, a tau-bench import, is not counted against
    any call) and restarted after a kill. The child dies with the actor (``rollout.core.fate``).

    Args:
        tool_classes: ``"module:QualName"`` of each tool class to load at start-up.
        startup_timeout_s: bound on the start-up, seconds.
    """

    label = "tau-bench tool sandbox"

    def __init__(self, tool_classes: list[str], startup_timeout_s: float = 120.0):
        super().__init__(startup_timeout_s)
        self.tool_classes = list(tool_classes)

    def _child(self) -> tuple[Any, tuple, str]:
        return child_main, (os.getpid(), self.tool_classes), "tau-bench-tool-sandbox"

    def start(self) -> None:
        """Start the child unless it runs (blocking, at most ``startup_timeout_s``).

        Raises:
            EnvironmentStepError: it did not start in time, or died starting.
        """
        with self._lock:
            self._ensure()

    def call(self, tool_class: str, kwargs: dict[str, Any], timeout_s: float, name: str = "") -> str:
        """Run ``tool_class.invoke(data={}, **kwargs)`` in the child; blocking (call it from a thread).
        ``name`` is the tool's name, for messages.

        Returns:
            The tool's output.

        Raises:
            ToolTimeoutError: no answer within ``timeout_s`` seconds (the child is killed).
            RuntimeError: the tool raised (its message; tau-bench's ``step`` turns it into
                ``"Error: <message>"``, as when the tool runs in-process).
            EnvironmentStepError: the child did not start or died.
        """
        t0 = time.monotonic()
        try:
            return self._request((tool_class, kwargs), timeout_s)
        except _SandboxTimeout:
            name = name or tool_class.rpartition(":")[2]
            raise ToolTimeoutError(f"tool {name} ran longer than {timeout_s:g}s ({time.monotonic() - t0:.1f}s) and was killed") from None

    def close(self) -> None:
        """Stop the child (not counted in ``kills``)."""
        with self._lock:
            self._stop()


# -- the domain ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _GoldAction:
    name: str
    arguments: dict
    requestor: str = "assistant"


@dataclass(frozen=True)
class _GoldCriteria:
    actions: tuple
    communicate_info: tuple


@dataclass(frozen=True)
class _GoldScenario:
    instructions: str


@dataclass(frozen=True)
class GoldTask:
    """A tau-bench task in the shape the local stack's gold replay reads from tau2's tasks
    (``rollout.devtools.local.gold``): ``id``, ``user_scenario.instructions`` (the instruction, which
    :class:`ScriptedTauBenchUser` opens with), ``evaluation_criteria.actions`` (the gold tool calls,
    ``name`` / ``arguments`` / ``requestor``) and ``evaluation_criteria.communicate_info`` (the
    task's ``outputs``, which tau-bench's reward looks for in the agent's replies)."""

    id: str
    user_scenario: _GoldScenario
    evaluation_criteria: _GoldCriteria


class TauBenchDomain:
    """One tau-bench domain's static data, loaded once per actor (the counterpart of
    :class:`rollout.benchmarks.tau2.environment.Tau2Domain`).

    Args:
        name: tau-bench environment name (``retail``, ``airline``; ``get_env``'s ``env_name``).

    Attributes:
        name: the domain.
        benchmark: ``"tau_bench"``.
        tasks: task id (``"{split}-{index}"``) -> tau-bench ``Task``, every task of every split.
        splits: split name -> task ids: the splits the environment accepts among ``test`` /
            ``train`` / ``dev``, and ``base`` (all of them, in that order).
        policy: the domain's ``wiki`` (the agent's system prompt).
        rules: the domain's ``rules`` (tau-bench gives them to some of its agents; not prompted).
        tool_schemas: the environment's ``tools_info`` (OpenAI function schemas).
        tool_names: the tools' names, in ``tools_info`` order.
        tool_types: empty: tau-bench does not type its tools (see :func:`guess_tool_type`).
        terminate_tools: tools that end the episode (``transfer_to_human_agents``).
        tool_classes: tool name -> ``"module:QualName"`` of its class.

    Raises:
        TauBenchNotInstalled: the package is missing (one line with the install command).
        UnknownTauBenchDomain: tau-bench has no environment ``name`` (a ``KeyError``; one line
            naming ``env.domain``).

    Loading builds one environment per split (each loads the domain's data once).
    """

    benchmark = BENCHMARK

    def __init__(self, name: str):
        _import_tau_bench()
        self.name = name
        self.tasks: dict[str, Any] = {}
        self.splits: dict[str, list[str]] = {}
        env = None
        errors: list[str] = []
        for split in SPLITS:
            try:
                built = build_env(name, split, 0)
            except ValueError as e:  # "Unknown environment" / "Unknown task split"
                errors.append(f"{split}: {e}")
                continue
            except IndexError:  # a split without tasks
                continue
            ids = [task_id(split, i) for i in range(len(built.tasks))]
            self.splits[split] = ids
            self.tasks.update(zip(ids, built.tasks))
            env = env or built
        if env is None:
            raise UnknownTauBenchDomain(f"env.domain: tau-bench has no environment {name!r} ({'; '.join(errors) or 'no tasks'})")
        self.splits[BASE_SPLIT] = [t for s in SPLITS for t in self.splits.get(s, [])]
        self.policy: str = env.wiki
        self.rules: list[str] = list(getattr(env, "rules", []) or [])
        self.tool_schemas: list[dict] = json.loads(json.dumps(env.tools_info))
        self.tool_names: list[str] = [s["function"]["name"] for s in self.tool_schemas]
        self.tool_types: dict[str, str] = {}
        self.terminate_tools: list[str] = list(env.terminate_tools)
        self.tool_classes: dict[str, str] = {n: f"{cls.__module__}:{cls.__qualname__}" for n, cls in env.tools_map.items()}
        logger.info("tau-bench %s: %s tasks (%s), %d tools", name, len(self.tasks),
                    ", ".join(f"{s} {len(v)}" for s, v in self.splits.items() if s != BASE_SPLIT), len(self.tool_names))

    @property
    def system_prompt(self) -> str:
        """The agent's system prompt: the domain's ``wiki``, as tau-bench's tool-calling agent uses it."""
        return self.policy

    def task_ids(self, split: str, ids: list[str] | None = None) -> list[str]:
        """Task ids of ``split`` (tau-bench order), or ``ids`` checked against the domain; with a
        concrete split a bare index ``"5"`` stands for ``"{split}-5"``.

        Raises:
            rollout.core.config.TaskSelectionError: the split does not exist, or an id is not a task of the domain (a KeyError).
        """
        if split not in self.splits:
            raise TaskSelectionError(f"env.task_split: tau-bench {self.name} has no split {split!r} (has {sorted(self.splits)})")
        if ids is None:
            return list(self.splits[split])
        out: list[str] = []
        missing: list[str] = []
        for i in ids:
            tid = str(i)
            if tid not in self.tasks and split != BASE_SPLIT and tid.isdigit():
                tid = task_id(split, int(tid))
            if tid in self.tasks:
                out.append(tid)
            else:
                missing.append(str(i))
        if missing:
            raise TaskSelectionError(f"env.task_ids: not tasks of tau-bench {self.name}: {missing[:10]} (ids are '<split>-<index>', e.g. 'test-0')")
        return out

    def new_sandbox(self, evaluator: bool = False, log_level: str = "ERROR", startup_timeout_s: float = 120.0) -> TauBenchToolSandbox:
        """The actor's :class:`TauBenchToolSandbox` for the domain's :data:`SANDBOXED_TOOLS`
        (``evaluator`` and ``log_level`` are tau2's and do not apply)."""
        return TauBenchToolSandbox([c for n, c in self.tool_classes.items() if n in SANDBOXED_TOOLS], startup_timeout_s=startup_timeout_s)

    def new_episode(self, cfg: EnvConfig, executor: Executor | None = None, sandbox: TauBenchToolSandbox | None = None) -> TauBenchEnvironment:
        """A fresh :class:`TauBenchEnvironment` for one episode."""
        return TauBenchEnvironment(self, cfg, executor=executor, sandbox=sandbox)

    def gold_tasks(self) -> list[GoldTask]:
        """Every task as a :class:`GoldTask` (gold tool calls without ``respond`` actions; outputs
        as ``communicate_info``), for the local stack's gold replay."""
        out = []
        for tid, task in self.tasks.items():
            actions = tuple(_GoldAction(a.name, dict(a.kwargs)) for a in task.actions if a.name != "respond")
            out.append(GoldTask(tid, _GoldScenario(task.instruction), _GoldCriteria(actions, tuple(task.outputs))))
        return out

    def close(self) -> None:
        """Nothing to release (the sandbox is closed by its owner)."""


def make_domain(env_cfg: EnvConfig, tau2_log_level: str = "ERROR"):
    """The domain of ``env.benchmark``: a :class:`TauBenchDomain` for ``tau_bench``, else tau2's
    :class:`~rollout.benchmarks.tau2.environment.Tau2Domain` (as before). The worker's one entry point.

    Raises:
        TauBenchNotInstalled: ``tau_bench`` without the package (one line with the install command).
        UnknownTauBenchDomain: tau-bench has no such environment.
        ValueError: unknown benchmark.
        whatever ``Tau2Domain`` raises for tau2.
    """
    benchmark = getattr(env_cfg, "benchmark", "tau2")
    if benchmark == BENCHMARK:
        return TauBenchDomain(env_cfg.domain)
    if benchmark != "tau2":
        raise ValueError(f"env.benchmark: unknown benchmark {benchmark!r} (tau2 | tau_bench)")
    from rollout.benchmarks.tau2.environment import Tau2Domain

    return Tau2Domain(env_cfg.domain, tau2_log_level=tau2_log_level)


def gold_index(domain: str) -> tuple[list[GoldTask], dict[str, bool]]:
    """What the local stack's gold replay indexes for tau-bench's ``domain``: ``(tasks, {tool name:
    is_write})``, the shape of ``rollout.devtools.local.gold._load_domain`` (every task of every split, as
    :class:`GoldTask`; writes guessed by :func:`guess_tool_type`). Tasks are matched by their
    instruction, which :class:`ScriptedTauBenchUser` opens with; the gold replay's own rules
    decide tasks that share one.

    Raises:
        TauBenchNotInstalled, UnknownTauBenchDomain: as :class:`TauBenchDomain`.
    """
    dom = TauBenchDomain(domain)
    return dom.gold_tasks(), {n: guess_tool_type(n) == "write" for n in dom.tool_names}


def stack_domain(env_cfg: EnvConfig) -> str:
    """The ``--domain`` the local stack's servers get: ``env.domain`` for tau2, ``"tau_bench:<domain>"``
    for tau-bench (``rollout.devtools.local.gold`` then indexes tau-bench's tasks through :func:`gold_index`)."""
    if getattr(env_cfg, "benchmark", "tau2") == BENCHMARK:
        return f"{STACK_PREFIX}{env_cfg.domain}"
    return env_cfg.domain


# -- one episode -----------------------------------------------------------------------------------------
class _GuardedUser:
    """tau-bench's user-simulator interface around the episode's user: each call is a ``user``
    phase, and what it raises leaves tau-bench's ``step`` as :class:`UserSimulatorError`."""

    def __init__(self, inner: Any, clock: _PhaseClock, limit: float):
        self.inner = inner
        self.clock = clock
        self.limit = limit

    def _run(self, what: str, fn, *args, **kwargs):
        with self.clock.phase("user", self.limit, "tau-bench's user simulator"):
            try:
                return fn(*args, **kwargs)
            except _Escape:
                raise
            except Exception as e:
                raise _Escape(UserSimulatorError(f"tau-bench's user simulator failed ({what}): {type(e).__name__}: {' '.join(str(e).split())[:300]}")) from None

    def reset(self, instruction: str | None = None) -> str:
        return self._run("reset", self.inner.reset, instruction=instruction)

    def step(self, content: str) -> str:
        return self._run("step", self.inner.step, content)

    def get_total_cost(self) -> float:
        return self._run("get_total_cost", self.inner.get_total_cost)


class _GuardedTool:
    """A tau-bench tool class's ``invoke`` / ``get_info``, timed as a ``tool`` phase; the
    :data:`SANDBOXED_TOOLS` run in the sandbox. Inside the reward (gold replay: trusted
    arguments) tools run as they are."""

    def __init__(self, name: str, cls: Any, path: str, clock: _PhaseClock, limit: float, sandbox: TauBenchToolSandbox | None):
        self.name = name
        self.cls = cls
        self.path = path
        self.clock = clock
        self.limit = limit
        self.sandbox = sandbox if name in SANDBOXED_TOOLS else None

    def get_info(self) -> dict[str, Any]:
        return self.cls.get_info()

    def invoke(self, data: Any, **kwargs: Any) -> Any:
        if self.clock.sealed():
            return self.cls.invoke(data=data, **kwargs)
        if self.sandbox is None:
            with self.clock.phase("tool", self.limit, f"tool {self.name}"):
                return self.cls.invoke(data=data, **kwargs)
        # start-up (a spawn and an import) is not the call's time: bounded by the sandbox's own limit
        with self.clock.phase("env", self.sandbox.startup_timeout_s + 5.0, "tau-bench tool sandbox start-up"):
            try:
                self.sandbox.start()
            except EnvironmentStepError as e:
                raise _Escape(e) from None
        # the sandbox kills the call ``limit`` seconds after it gets the child (a call of another
        # episode may hold it): the watcher's bound is only a net behind that
        with self.clock.phase("tool", self.limit + self.sandbox.startup_timeout_s + 5.0, f"tool {self.name} (sandboxed)"):
            try:
                return self.sandbox.call(self.path, kwargs, self.limit, name=self.name)
            except (ToolTimeoutError, EnvironmentStepError) as e:
                raise _Escape(e) from None


class TauBenchEnvironment:
    """One episode's tau-bench environment, with the async interface of
    :class:`rollout.benchmarks.tau2.environment.Tau2Environment` (``rollout.core.episode.Environment``).

    Args:
        domain: the actor's :class:`TauBenchDomain`.
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
    ``env.user.base_url`` (:func:`point_litellm_at`), since tau-bench's users pass no endpoint.

    Attributes:
        timings: seconds spent, per kind: ``env_s`` (tau-bench's own code, building included),
            ``tool_s``, ``user_s``, ``reward_s``.
        termination: ``user_stop`` | ``transfer`` | ``done`` (another terminate tool) once done.
    """

    def __init__(self, domain: TauBenchDomain, cfg: EnvConfig, executor: Executor | None = None, sandbox: TauBenchToolSandbox | None = None):
        self.domain = domain
        self.cfg = cfg
        self.executor = executor
        self.sandbox = sandbox
        self.task_id: str | None = None
        self.termination: str | None = None
        self._env: Any = None
        self._types: Any = None
        self._clock = _PhaseClock()
        self._stuck: str | None = None  # why calls are refused (a thread ran past its bound)
        self.timings = {"env_s": 0.0, "tool_s": 0.0, "user_s": 0.0, "reward_s": 0.0}

    # -- running tau-bench in a thread -------------------------------------------------------------
    def _overdue(self, ph: _Phase) -> Exception:
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
            (:class:`_Escape`); :class:`EnvironmentStepError` for anything else ``fn`` raised, or
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
                    wait = min(_POLL_S, ph.limit - elapsed)
                elif not started.is_set():
                    waited = time.monotonic() - queued
                    if waited >= env_limit:
                        fut.cancel()
                        raise EnvironmentStepError(f"tau-bench {what} waited {waited:.1f}s for a thread without starting (actor overloaded)")
                    wait = min(_POLL_S, env_limit - waited)
                else:
                    wait = 0.01  # returning
                await asyncio.wait({fut}, timeout=wait)
        finally:
            for kind in ("env", "tool", "user", "reward"):
                self.timings[f"{kind}_s"] = round(clock.spent.get(kind, 0.0), 6)
        try:
            return fut.result()
        except _Escape as e:
            raise e.error from None
        except Exception as e:
            raise EnvironmentStepError(f"tau-bench {what} failed: {type(e).__name__}: {' '.join(str(e).split())[:300]}") from e

    # -- reset / step ------------------------------------------------------------------------------------
    def _make_user(self) -> Any:
        """The episode's user simulator (see the module docstring); blocking (the llm user's
        constructor calls the model)."""
        ucfg = self.cfg.user
        if ucfg.kind == "scripted":
            return ScriptedTauBenchUser()
        if ucfg.kind != "llm":
            raise UserSimulatorError(f"env.user.kind: unknown user simulator {ucfg.kind!r}")
        if not ucfg.base_url or not ucfg.model:
            raise UserSimulatorError("env.user.base_url and env.user.model are required for tau-bench's llm user simulator")
        point_litellm_at(ucfg.base_url, user_api_key(ucfg))
        user_mod = importlib.import_module("tau_bench.envs.user")
        return user_mod.load_user(USER_STRATEGY, model=ucfg.model, provider=USER_PROVIDER)

    def _reset_sync(self, split: str, index: int) -> tuple[Any, str]:
        env = build_env(self.domain.name, split, index)
        clock, timeout = self._clock, self.cfg.step_timeout_s
        with clock.phase("user", self.cfg.user.timeout_s, "tau-bench's user simulator"):
            try:
                user = self._make_user()
            except UserSimulatorError as e:
                raise _Escape(e) from None
            except Exception as e:
                raise _Escape(UserSimulatorError(f"tau-bench's user simulator could not be set up: {type(e).__name__}: {e}")) from None
        env.user = _GuardedUser(user, clock, self.cfg.user.timeout_s)
        env.tools_map = {name: _GuardedTool(name, cls, self.domain.tool_classes.get(name, ""), clock, timeout, self.sandbox)
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
                except _Escape:
                    raise
                except Exception as e:
                    raise _Escape(RewardError(f"tau-bench's reward failed: {type(e).__name__}: {' '.join(str(e).split())[:300]}")) from None

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
        _, self._types = _import_tau_bench()
        self._env, observation = await self._call("reset", self._reset_sync, split, index)
        self.task_id = tid
        return observation, {"task_id": tid, "domain": self.domain.name, "benchmark": BENCHMARK, "split": split, "task_index": index}

    async def step(self, action: Action) -> tuple[str, float, bool, dict[str, Any]]:
        """Apply one agent action through tau-bench's ``Env.step``.

        Args:
            action: a tool call (``name``, ``arguments``) or a reply (``name == "respond"``,
                ``content``), which tau-bench gets as ``Action(name, kwargs)`` (a reply's kwargs
                ``{"content": content}``; a tool call's surrounding text is not passed on).

        Returns:
            ``(observation, reward, done, info)``: the tool's output (``info["role"] == "tool"``)
            or the user's reply (``"user"``); tau-bench's reward when ``done`` (0.0 before);
            ``info`` has ``role``, ``termination`` (``user_stop`` | ``transfer`` | ``done`` | None),
            ``tool_error`` (the observation is tau-bench's ``"Error: ..."`` or ``"Unknown
            action ..."``), ``source`` and, when done, ``reward_info`` (:func:`reward_info`).

        Raises:
            ToolTimeoutError, EnvironmentStepError, UserSimulatorError, RewardError: see the class.
        """
        if self._env is None:
            raise EnvironmentStepError("step() before reset()")
        respond = action.is_respond
        kwargs = {"content": action.content} if respond else dict(action.arguments)
        resp = await self._call(f"step ({action.name})", self._env.step, self._types.Action(name=action.name, kwargs=kwargs))
        observation = resp.observation if isinstance(resp.observation, str) else str(resp.observation)
        info: dict[str, Any] = {
            "role": "user" if respond else "tool",
            "termination": None,
            "tool_error": (not respond) and observation.startswith(("Error", "Unknown action")),
            "source": resp.info.source,
        }
        if not resp.done:
            return observation, 0.0, False, info
        if respond:
            self.termination = "user_stop"
        else:
            self.termination = "transfer" if action.name.startswith("transfer_") else "done"
        info["termination"] = self.termination
        info["reward_info"] = reward_info(resp.info)
        return observation, float(resp.reward), True, info


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
