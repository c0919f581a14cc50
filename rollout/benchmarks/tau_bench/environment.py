"""The original tau-bench (sierra-research/tau-bench) behind the interface our episodes use.

``env.benchmark: tau_bench`` runs tau-bench's own environments instead of tau2's. tau-bench is
installed from its repository (:data:`INSTALL_COMMAND`), never a dependency of this project
(:mod:`rollout.benchmarks.tau_bench.package` lists what is used of it). Without it, the
benchmark's load (the worker's start) and :func:`rollout.app.preflight.check_benchmark` fail with
one line saying how to install it.

This module is the adapter's entry: the benchmark registry loads it through
:func:`load_benchmark` (and checks the package with :func:`require_tau_bench`); it holds
:class:`TauBenchDomain` (tasks, prompt, tools, users, the gold view for the local stack) and keeps
the names the adapter always offered here. One episode is
:class:`~rollout.benchmarks.tau_bench.episode.TauBenchEnvironment`; the bounds on tau-bench's code
and the tool sandbox are in :mod:`rollout.benchmarks.tau_bench.guards`.

How it maps onto our episodes (``rollout.core.episode.run_episode``, unchanged: it keeps
token-in/token-out; the adapter only provides the environment):

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
  (the waiting coroutine watches the phase the thread is in,
  :mod:`rollout.benchmarks.tau_bench.guards`): building the environment and
  tau-bench's own code ``env.step_timeout_s`` (past it: ``env_error``), a tool call
  ``env.step_timeout_s`` (``tool_timeout``), a user-simulator turn ``env.user.timeout_s``
  (``user_error``), the reward ``env.reward_timeout_s`` (``eval_error``). A call that cannot get
  a thread within ``env.step_timeout_s`` is ``env_error``.
* Errors: a tool that raises is an observation (tau-bench's ``"Error: ..."``, ``StepResult.tool_error``),
  never an error; a failure of the user simulator is :class:`UserSimulatorError`
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

import importlib
import json
import logging
import os
import threading
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

from rollout.benchmarks.tau_bench.episode import TauBenchEnvironment, reward_info
from rollout.benchmarks.tau_bench.guards import SANDBOXED_TOOLS, TauBenchToolSandbox
from rollout.benchmarks.tau_bench.package import (
    BASE_SPLIT,
    BENCHMARK,
    INSTALL_COMMAND,
    SPLITS,
    TauBenchNotInstalled,
    UnknownTauBenchDomain,
    build_env,
    guess_tool_type,
    import_tau_bench,
    parse_task_id,
    require_tau_bench,
    task_id,
    tau_bench_available,
)
from rollout.benchmarks.user_api import STOP, scripted_answer, user_api_key
from rollout.core.config import EnvConfig, TaskSelectionError, UserConfig
from rollout.core.environment import DEFAULT_BENCHMARK, Benchmark, UserSimulatorError, domain_key
from rollout.core.environment import load_benchmark as load_registered_benchmark
from rollout.core.tasks import unknown_task_ids

logger = logging.getLogger(__name__)

__all__ = ["BASE_SPLIT", "BENCHMARK", "INSTALL_COMMAND", "SANDBOXED_TOOLS", "SPLITS", "STACK_PREFIX", "GoldTask", "ScriptedTauBenchUser",
           "TauBenchDomain", "TauBenchEnvironment", "TauBenchNotInstalled", "TauBenchToolSandbox", "UnknownTauBenchDomain", "build_env",
           "gold_index", "guess_tool_type", "load_benchmark", "make_domain", "parse_task_id", "point_litellm_at", "require_tau_bench",
           "reward_info", "stack_domain", "tau_bench_available", "task_id"]

STACK_PREFIX = f"{BENCHMARK}:"  # the local stack's --domain for tau-bench's domains (rollout.core.environment.domain_key)
USER_STRATEGY = "llm"  # tau-bench's user strategy for env.user.kind=llm
USER_PROVIDER = "openai"  # litellm provider of an OpenAI-compatible endpoint (env.user.base_url)


# -- the user simulators ---------------------------------------------------------------------------
class ScriptedTauBenchUser:
    """Deterministic user with tau-bench's user-simulator interface (``tau_bench/envs/user.py``:
    ``reset(instruction) -> str``, ``step(content) -> str``, ``get_total_cost() -> float``); no LLM.

    It opens with ``"Hi! " + instruction`` (the task's instruction, which the local stack's gold
    replay recognises), answers an agent message that holds a question mark with the instruction
    and ``"Yes, please go ahead."``, and ends the conversation (``###STOP###``, tau-bench's stop
    signal) at the first message without one, or after ``max_answers`` answers. The same rules as
    :class:`rollout.benchmarks.tau2.scripted_user.ScriptedUser` for tau2.
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
        answer = scripted_answer(content, self.answers, self.max_answers, self.instruction)
        if answer is None:
            return STOP
        self.answers += 1
        return answer

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
    """One tau-bench domain's static data, loaded once per actor: the tau-bench benchmark
    (:class:`rollout.core.environment.Benchmark`; the counterpart of
    :class:`rollout.benchmarks.tau2.domain.Tau2Domain`).

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
        import_tau_bench()
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
            raise unknown_task_ids(missing, list(self.tasks), f"tau-bench {self.name}", hint="ids are '<split>-<index>', e.g. 'test-0'")
        return out

    def new_sandbox(self, evaluator: bool = False, log_level: str = "ERROR", startup_timeout_s: float = 120.0) -> TauBenchToolSandbox:
        """The actor's :class:`TauBenchToolSandbox` for the domain's :data:`SANDBOXED_TOOLS`
        (``evaluator`` and ``log_level`` are tau2's and do not apply)."""
        return TauBenchToolSandbox([c for n, c in self.tool_classes.items() if n in SANDBOXED_TOOLS], startup_timeout_s=startup_timeout_s)

    def new_actor_sandbox(self, env_cfg: EnvConfig, log_level: str = "ERROR") -> TauBenchToolSandbox:
        """The actor's sandbox (:meth:`new_sandbox`; :class:`rollout.core.environment.Benchmark`)."""
        return self.new_sandbox()

    def new_episode(self, cfg: EnvConfig, task_id: str | None = None, *, seed: int = 0, executor: Executor | None = None,
                    sandbox: TauBenchToolSandbox | None = None) -> TauBenchEnvironment:
        """A fresh :class:`~rollout.benchmarks.tau_bench.episode.TauBenchEnvironment` for one
        episode; its user simulator is made at ``reset`` (:meth:`new_user`).

        Args:
            cfg: the ``env`` section.
            task_id: the episode's task (``None``: any, named at ``reset``); checked here.
            seed: unused (tau-bench's users take no seed).
            executor: threads for tau-bench's calls (None: the loop's default executor).
            sandbox: the actor's :class:`TauBenchToolSandbox` (None: :data:`SANDBOXED_TOOLS` run
                in a thread, without a hard bound; tests only).

        Raises:
            KeyError: ``task_id`` is not a task of the domain.
        """
        if task_id is not None and str(task_id) not in self.tasks:
            raise KeyError(task_id)
        return TauBenchEnvironment(self, cfg, executor=executor, sandbox=sandbox)

    def new_user(self, cfg: UserConfig) -> Any:
        """The episode's user simulator, with tau-bench's user-simulator interface, as ``env.user``
        configures it (see the module docstring); blocking (the llm user's constructor calls the
        model): :class:`~rollout.benchmarks.tau_bench.episode.TauBenchEnvironment` calls it in a thread.

        Raises:
            UserSimulatorError: unknown ``env.user.kind``, ``base_url`` / ``model`` missing for the
                llm user, its API key variable unset, or the process's litellm pointed elsewhere.
        """
        if cfg.kind == "scripted":
            return ScriptedTauBenchUser()
        if cfg.kind != "llm":
            raise UserSimulatorError(f"env.user.kind: unknown user simulator {cfg.kind!r}")
        if not cfg.base_url or not cfg.model:
            raise UserSimulatorError("env.user.base_url and env.user.model are required for tau-bench's llm user simulator")
        point_litellm_at(cfg.base_url, user_api_key(cfg))
        user_mod = importlib.import_module("tau_bench.envs.user")
        return user_mod.load_user(USER_STRATEGY, model=cfg.model, provider=USER_PROVIDER)

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


def load_benchmark(env_cfg: EnvConfig, log_level: str = "ERROR") -> TauBenchDomain:
    """The benchmark registry's loader for ``env.benchmark: tau_bench``: the :class:`TauBenchDomain`
    of ``env.domain`` (``log_level`` is tau2's and does not apply).

    Raises:
        TauBenchNotInstalled: the package is missing (one line with the install command).
        UnknownTauBenchDomain: tau-bench has no such environment.
    """
    return TauBenchDomain(env_cfg.domain)


def make_domain(env_cfg: EnvConfig, tau2_log_level: str = "ERROR") -> Benchmark:
    """The domain of ``env.benchmark``, through the benchmark registry
    (:func:`rollout.core.environment.load_benchmark`): a :class:`TauBenchDomain` for ``tau_bench``,
    tau2's :class:`~rollout.benchmarks.tau2.domain.Tau2Domain` for ``tau2``.

    Raises:
        TauBenchNotInstalled: ``tau_bench`` without the package (one line with the install command).
        UnknownTauBenchDomain: tau-bench has no such environment.
        rollout.core.environment.UnknownBenchmarkError: no such benchmark is registered (a ``ValueError``).
        whatever ``Tau2Domain`` raises for tau2.
    """
    return load_registered_benchmark(env_cfg, log_level=tau2_log_level)


def gold_index(domain: str) -> tuple[list[GoldTask], dict[str, bool]]:
    """What the local stack's gold replay indexes for tau-bench's ``domain``: ``(tasks, {tool name:
    is_write})`` (every task of every split, as :class:`GoldTask`; writes guessed by
    :func:`guess_tool_type`). Tasks are matched by their instruction, which
    :class:`ScriptedTauBenchUser` opens with; the gold replay's own rules decide tasks that share one.

    Raises:
        TauBenchNotInstalled, UnknownTauBenchDomain: as :class:`TauBenchDomain`.
    """
    dom = TauBenchDomain(domain)
    return dom.gold_tasks(), {n: guess_tool_type(n) == "write" for n in dom.tool_names}


def stack_domain(env_cfg: EnvConfig) -> str:
    """The ``--domain`` the local stack's servers get: ``env.domain`` for tau2, ``"tau_bench:<domain>"``
    for tau-bench (:func:`rollout.core.environment.domain_key`; the gold replay then indexes the
    domain through the registry's gold index, :func:`gold_index` for tau-bench)."""
    return domain_key(getattr(env_cfg, "benchmark", DEFAULT_BENCHMARK), env_cfg.domain)
