"""The environment seam: what the episode loop needs from a benchmark's environment, and the
benchmark registry through which the worker, the wiring and the seed's agent load a benchmark.

The loop (:func:`rollout.core.episode.run_episode`) sees an :class:`Environment` with the seed's
verbs (``reset(task) -> observation, info``; ``step(action) -> StepResult``, both async), the typed
:class:`StepResult` each step answers, and the typed errors below, and nothing of any benchmark. Adapters
(:mod:`rollout.benchmarks`) implement it and raise these errors; each error maps to one episode
status (``docs/design.md``, "Statuses").

A benchmark is registered by name (:func:`register_benchmark`; ``env.benchmark`` selects it) in
:data:`BENCHMARKS`, one :class:`rollout.core.registry.Registry`, as a :class:`BenchmarkEntry`: a
loader that returns a :class:`Benchmark` (the domain's tasks, prompt and tools, an actor-wide
:class:`Sandbox` if it needs one, and a new :class:`Environment` per episode) and optional hooks.
The built-ins (``tau2``, ``tau_bench``) are registered by module path when the registry is first
read, so that importing this module imports neither. Adding a benchmark: a package under
``rollout/benchmarks/`` with its loader, and one ``register_benchmark`` call (the built-in table
below for one shipped with the package; an entry point for one shipped in a package of its own;
in the process that loads it otherwise, by path so that it reaches the Ray actors).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from rollout.core.registry import Registry, UnknownNameError, import_path

RESPOND = "respond"  # Action.name of a reply to the user (no tool call)
DEFAULT_BENCHMARK = "tau2"  # env.benchmark's default


@dataclass(frozen=True)
class Action:
    """One agent action: a tool call (``name`` = tool, ``arguments``) or a reply (``name == "respond"``).

    ``content`` is the assistant's visible text (for a tool call, any text around the call).
    """

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    content: str = ""

    @property
    def is_respond(self) -> bool:
        return self.name == RESPOND


StepRole = Literal["tool", "user"]  # who answered a step: a tool's result, or the user's turn
_STEP_ROLES = ("tool", "user")


@dataclass(frozen=True)
class StepResult:
    """What one :meth:`Environment.step` answers (the seed's ``EnvResponse``: ``observation``,
    ``reward``, ``done``, with the loop's keys of its ``info`` as typed fields).

    Attributes:
        observation: the tool's output (``role == "tool"``) or the user's reply (``"user"``; empty
            when the agent ended the conversation).
        role: ``"tool"`` for a tool's result, ``"user"`` for the user's turn; the loop records a
            tool's result as an OpenAI ``tool`` message and anything else as the user's turn.
        done: the episode ended with this step.
        reward: the benchmark's reward when ``done`` (0.0 before; tau2's and tau-bench's are in [0, 1]).
        tool_error: the tool failed: ``observation`` is its error message (an observation the agent
            sees and answers, not an error; counted in ``metadata.tool_errors``, and its message
            gets ``"error": true``, as tau2's ``ToolMessage.error``).
        termination: why the episode ended when ``done`` (tau2: ``user_stop`` | ``transfer`` |
            ``agent_stop``; tau-bench also ``done``); the episode's ``termination_reason``
            (``"done"`` when None). None before.
        reward_info: the reward's breakdown when ``done`` (JSON-serialisable; written as
            ``metadata.reward_info``), else None.

    Raises:
        ValueError: ``role`` is not ``"tool"`` or ``"user"``.
    """

    observation: str
    role: StepRole
    done: bool = False
    reward: float = 0.0
    tool_error: bool = False
    termination: str | None = None
    reward_info: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.role not in _STEP_ROLES:
            raise ValueError(f"StepResult.role must be 'tool' or 'user', got {self.role!r}")


class EnvironmentStepError(RuntimeError):
    """Environment code failed (not the policy's fault): an infrastructure failure (``env_error``)."""


class ToolTimeoutError(RuntimeError):
    """A tool call the model wrote ran past ``env.step_timeout_s`` and was stopped (``tool_timeout``)."""


class RewardError(RuntimeError):
    """The reward could not be computed (the evaluator failed or timed out): ``eval_error``."""


class RegradeError(RuntimeError):
    """A journaled episode cannot be re-graded (:meth:`Benchmark.regrade`): its conversation
    cannot be rebuilt, its task is gone, or the evaluator failed. One line; ``python -m rollout
    regrade`` records it for that episode and goes on."""


class UserSimulatorError(RuntimeError):
    """The user simulator failed (endpoint down, timeout, malformed answer, missing or rejected
    API key): an infrastructure failure (``user_error``). The message is one line and never holds
    the API key."""


class Environment(Protocol):
    """One episode's environment (a new one per episode), async.

    Attributes:
        timings: seconds spent so far per part (e.g. ``env_s``, ``tool_s``, ``user_s``,
            ``reward_s``), copied into the episode's metadata when it ends.
    """

    timings: dict[str, float]

    async def reset(self, task_id: str) -> tuple[str, dict[str, Any]]:
        """Start the task: ``(the user's opening message, info)``. ``info["system_prompt"]``, when
        present, is this episode's system prompt in place of the benchmark's (a policy of the
        task's own: tau2 banking_knowledge's ``golden_retrieval`` inlines the task's documents).

        Raises:
            UserSimulatorError: the user simulator failed to open.
            EnvironmentStepError: (or any exception) the environment could not be built.
        """
        ...

    async def step(self, action: Action) -> StepResult:
        """Run ``action``: who answered and what (:class:`StepResult`), with the reward, the
        termination and the reward's breakdown when the episode ends with it.

        Raises:
            ToolTimeoutError, UserSimulatorError, RewardError, EnvironmentStepError.
        """
        ...


# -- benchmarks: what the worker, the wiring and preflight need from a loaded benchmark ------------
class Sandbox(Protocol):
    """An actor's process-wide sandbox for model-controlled code (e.g. a killable child process
    that runs a calculator tool), shared by the actor's episodes and closed by the actor.

    Attributes:
        kills: times a request outlived its bound and the sandbox was killed (reported by the worker).
    """

    kills: int

    def close(self) -> None:
        """Stop the sandbox (idempotent)."""
        ...


class Benchmark(Protocol):
    """One benchmark's domain, loaded once per actor by its registered loader (:func:`load_benchmark`).

    Attributes:
        name: the loaded domain (``env.domain``), recorded in each episode's spec and metadata.
        system_prompt: the agent's system prompt.
        tool_schemas: OpenAI-style function schemas of the agent's tools (rendered by the chat template).
        tool_names: the tools' names (what the turn parser accepts), in schema order.
        tasks: task id -> the benchmark's own task object, every task of the domain.

    Optional parts, each a Protocol of its own: :class:`TaskIssueSource` (``task_issues``: the
    issues recorded against a task) and :class:`Regradable` (``regrade``: grade a journaled
    episode again).

    Optional attributes (read with ``getattr``; a benchmark without them works as before):
        graded_by: a :class:`rollout.core.records.GradedBy`, what grades this domain's episodes
            (the installed package and the task set); the worker and the trainers' task runner
            write it into every episode's ``metadata["graded_by"]``.
    """

    name: str
    tool_schemas: list[dict]
    tool_names: list[str]
    tasks: Mapping[str, Any]

    @property
    def system_prompt(self) -> str: ...

    def task_ids(self, split: str, ids: list[str] | None = None) -> list[str]:
        """Task ids of ``split`` in the benchmark's order, or ``ids`` checked against the domain.

        Raises:
            rollout.core.config.TaskSelectionError: no such split, or an id names no task (a ``KeyError``).
        """
        ...

    def new_actor_sandbox(self, env_cfg: Any, log_level: str = "ERROR") -> Sandbox | None:
        """The actor's :class:`Sandbox` for ``env_cfg`` (the ``env`` section), or None when the
        benchmark runs no model-controlled code out of process. ``log_level``: the benchmark
        library's log level (``logging.tau2_level``)."""
        ...

    def new_episode(self, env_cfg: Any, task_id: str, *, seed: int = 0, executor: Executor | None = None,
                    sandbox: Sandbox | None = None) -> Environment:
        """A fresh :class:`Environment` for one episode of ``task_id`` (its ``reset`` gets the same id).

        Args:
            env_cfg: the ``env`` section (``rollout.core.config.EnvConfig``).
            task_id: a task of :attr:`tasks`.
            seed: the episode's seed (e.g. the user simulator's).
            executor: threads for blocking calls (None: the event loop's default executor).
            sandbox: what :meth:`new_actor_sandbox` gave (None: no sandbox; tests only).

        Raises:
            KeyError: ``task_id`` is not a task of the domain.
            UserSimulatorError: the episode's user simulator cannot be set up (its status is
                ``user_error``, termination reason ``user_setup``).
        """
        ...

    def close(self) -> None:
        """Release what the domain holds (threads); the sandbox is closed by its owner."""
        ...


class TaskIssueSource(Protocol):
    """Optional part of a :class:`Benchmark`: the issues it records against its tasks (tau2-bench
    >= 1.0's ``Task.issues``). A benchmark without it has none
    (:func:`rollout.core.tasks.open_task_issues` reads it with ``getattr``)."""

    def task_issues(self, task_id: str) -> list[Any]:
        """The issues of ``task_id`` (:class:`rollout.core.records.TaskIssue`, or their JSON
        objects), any status; ``[]`` for none. Read for ``env.open_issues`` and the samples'
        ``task_issues`` (open ones only).

        Raises:
            KeyError: ``task_id`` is not a task of the domain.
        """
        ...


class Regradable(Protocol):
    """Optional part of a :class:`Benchmark`: grading a journaled episode again with the tasks and
    evaluator installed now (``python -m rollout regrade``; :mod:`rollout.app.regrade`). A
    benchmark without it cannot re-grade runs."""

    def regrade(self, task_id: str, messages: list[dict[str, Any]], termination: str, *, sandbox: Sandbox | None,
                timeout_s: float, judge: Any = None) -> tuple[float, dict[str, Any] | None]:
        """The reward and its breakdown (as :class:`StepResult`'s ``reward`` / ``reward_info``) of
        one episode (blocking; model-controlled code runs in ``sandbox``).

        Args:
            task_id: the episode's task.
            messages: its conversation as the journal keeps it (OpenAI chat messages,
                :attr:`rollout.core.records.TrainingSample.messages`).
            termination: how it ended (its ``termination_reason``).
            sandbox: what :meth:`Benchmark.new_actor_sandbox` gave.
            timeout_s: bound on the grading (``env.reward_timeout_s``).
            judge: the run's ``env.judge`` (tau2 >= 1.0: what grades NL assertions).

        Raises:
            RegradeError: it cannot be re-graded (one line).
        """
        ...


UnknownBenchmarkError = UnknownNameError  # ``env.benchmark`` names no benchmark (one line listing the registered ones)


@dataclass(frozen=True)
class BenchmarkEntry:
    """What a benchmark's name is registered to: its loader and its optional hooks, each a callable
    or the ``"package.module:attribute"`` path of one, imported on first use.

    Attributes:
        loader: ``loader(env_cfg, log_level=...) -> Benchmark``: loads the domain ``env_cfg.domain``
            (blocking; once per actor).
        gold_index: ``gold_index(domain) -> (tasks, {tool name: is_write})``: what the local
            stack's gold-replay policy indexes (tasks in tau2's shape: ``id``,
            ``user_scenario.instructions``, ``evaluation_criteria.actions`` / ``communicate_info``);
            ``None``: the gold replay cannot serve it.
        check: ``check()`` raises ``ImportError`` with one line when what the benchmark needs is not
            installed; preflight runs it before anything starts. ``None``: nothing to check.
        check_config: ``check_config(env_cfg)``: the ``env`` values only this machine can check
            (tau2: ``env.domain`` against tau2's registry), milliseconds, raising
            ``rollout.core.config.ConfigError`` (one line naming the key); the preflight runs it
            first, before anything starts. ``None``: nothing to check.
        check_user: ``check_user(user_cfg)``, sync or async: the user simulator ``env.user``
            configures can work (its endpoint answers and takes the key), raising with one line;
            the preflight runs it once the endpoints are up. ``None``: nothing to check.
        check_env: ``check_env(env_cfg)``, sync or async: what else the ``env`` section names can
            work once the endpoints are resolved (tau2: the NL-assertion judge, when a selected
            task needs one), raising with one line; the preflight runs it after ``check_user``.
            ``None``: nothing to check.
        graded_by: ``graded_by(env_cfg) -> GradedBy``: what grades ``env_cfg.domain`` in this
            process (the installed package, its version, the task set's digest:
            :class:`rollout.core.records.GradedBy`), cheap after its first call. The pool compares
            the driver's with every actor's before any episode runs
            (:mod:`rollout.core.pool.fingerprint`). ``None``: only the benchmark's name is compared.

    A new optional hook is one more field with a ``None`` default, read with :func:`benchmark_hook`.
    """

    loader: Callable[..., Benchmark] | str
    gold_index: Callable[[str], tuple[list[Any], dict[str, bool]]] | str | None = None
    check: Callable[[], None] | str | None = None
    check_config: Callable[[Any], None] | str | None = None
    check_user: Callable[[Any], Any] | str | None = None
    check_env: Callable[[Any], Any] | str | None = None
    graded_by: Callable[[Any], Any] | str | None = None


_HOOKS = tuple(f.name for f in dataclasses.fields(BenchmarkEntry))


def _registered_builtins(reg: Registry) -> None:
    """The built-in benchmarks, by module path: registering imports neither tau2 nor tau-bench."""
    reg.register("tau2", BenchmarkEntry("rollout.benchmarks.tau2.environment:load_benchmark",
                                        gold_index="rollout.benchmarks.tau2.environment:gold_index",
                                        check_config="rollout.benchmarks.tau2.retrieval:check_env_config",
                                        check_user="rollout.benchmarks.user_api:check_user_simulator",
                                        check_env="rollout.benchmarks.tau2.judge:check_judge",
                                        graded_by="rollout.benchmarks.tau2.version:graded_by"))
    reg.register("tau_bench", BenchmarkEntry("rollout.benchmarks.tau_bench.environment:load_benchmark",
                                             gold_index="rollout.benchmarks.tau_bench.environment:gold_index",
                                             check="rollout.benchmarks.tau_bench.environment:require_tau_bench",
                                             check_user="rollout.benchmarks.user_api:check_user_simulator"))


# name -> a BenchmarkEntry, a loader, or the "module:attribute" path of either
BENCHMARKS: Registry[BenchmarkEntry | Callable[..., Benchmark]] = Registry(
    "benchmark", "env.benchmark", name_ok=str.isidentifier, name_rule="an identifier (tau2, tau_bench)", loaded=_registered_builtins)
# Benchmarks shipped in other packages: an installed distribution that declares, in its
# pyproject.toml, ``[project.entry-points."tau_rollout.benchmarks"] NAME = "pkg.module:loader"``
# (a loader or a BenchmarkEntry) is found by name in every process that looks it up (the driver,
# each Ray actor, the local stack), with nothing to register by hand.
ENTRY_POINT_GROUP = BENCHMARKS.entry_point_group  # "tau_rollout.benchmarks"


def register_benchmark(name: str, loader: BenchmarkEntry | Callable[..., Benchmark] | str, *,
                       gold_index: Callable[[str], tuple[list[Any], dict[str, bool]]] | str | None = None,
                       check: Callable[[], None] | str | None = None, check_config: Callable[[Any], None] | str | None = None,
                       check_user: Callable[[Any], Any] | str | None = None, check_env: Callable[[Any], Any] | str | None = None,
                       graded_by: Callable[[Any], Any] | str | None = None, replace: bool = False) -> None:
    """Register a benchmark under ``name`` (what ``env.benchmark`` selects).

    Args:
        name: the benchmark's name (an identifier: ``tau2``, ``tau_bench``).
        loader: a :class:`BenchmarkEntry`; or ``loader(env_cfg, log_level=...) -> Benchmark``,
            which loads the domain ``env_cfg.domain`` (blocking; once per actor); or the
            ``"module:attribute"`` path of either, imported at the first :func:`load_benchmark`
            (so that registering imports nothing). A path given alone is a path entry: it reaches
            the Ray actors (:func:`rollout.core.registry.registered_paths`).
        gold_index, check, check_config, check_user, check_env, graded_by: the optional hooks of :class:`BenchmarkEntry`
            (callables or paths).
        replace: swap a registered name on purpose.

    Raises:
        ValueError: ``name`` is not an identifier, or is registered already (see
            :func:`unregister_benchmark`), or hooks are given beside a :class:`BenchmarkEntry`.
    """
    hooks = {"gold_index": gold_index, "check": check, "check_config": check_config, "check_user": check_user, "check_env": check_env,
             "graded_by": graded_by}
    given = {k: v for k, v in hooks.items() if v is not None}
    if isinstance(loader, BenchmarkEntry) and given:
        raise ValueError(f"benchmark {name!r}: give the hooks in the BenchmarkEntry, not beside it")
    BENCHMARKS.register(name, BenchmarkEntry(loader, **given) if given else loader, replace=replace)


def unregister_benchmark(name: str) -> None:
    """Remove ``name`` from the registry (a test's toy benchmark, a plugin replaced).

    Raises:
        UnknownBenchmarkError: ``name`` is not registered.
    """
    BENCHMARKS.unregister(name)


def benchmarks() -> list[str]:
    """The registered benchmarks' names (and those installed packages declare), sorted (nothing is imported)."""
    return sorted(BENCHMARKS.names())


def get_benchmark(name: str) -> BenchmarkEntry:
    """The :class:`BenchmarkEntry` registered as ``name`` (a path is imported; a bare loader is
    given an entry without hooks).

    Raises:
        UnknownBenchmarkError: no such benchmark is registered (one line listing the registered ones).
        ImportError, AttributeError: its registered path cannot be imported.
    """
    item = BENCHMARKS.get(name)
    return item if isinstance(item, BenchmarkEntry) else BenchmarkEntry(loader=item)


def benchmark_hook(name: str, hook: str) -> Callable[..., Any] | None:
    """Benchmark ``name``'s hook ``hook`` (a field of :class:`BenchmarkEntry`: ``"loader"``,
    ``"gold_index"``, ``"check"``, ``"check_config"``, ``"check_user"``, ``"check_env"``, ``"graded_by"``), imported when given as
    a path; ``None`` when it has none. The app reaches what is specific to a benchmark only
    through these.

    Raises:
        UnknownBenchmarkError: no such benchmark is registered.
        ValueError: ``hook`` is not a field of :class:`BenchmarkEntry`.
        ImportError: the hook's path cannot be imported.
    """
    if hook not in _HOOKS:
        raise ValueError(f"no benchmark hook {hook!r} ({', '.join(_HOOKS)})")
    target = getattr(get_benchmark(name), hook)
    return import_path(target) if isinstance(target, str) else target


def load_benchmark(env_cfg: Any, log_level: str = "ERROR") -> Benchmark:
    """Load the benchmark ``env_cfg.benchmark`` selects, for the domain ``env_cfg.domain``
    (blocking: it reads the domain's data; call it once per actor).

    Args:
        env_cfg: the ``env`` section (``rollout.core.config.EnvConfig``).
        log_level: the benchmark library's log level (``logging.tau2_level``).

    Raises:
        UnknownBenchmarkError: no such benchmark is registered (one line listing the registered ones).
        whatever the loader raises (e.g. tau-bench missing: an ``ImportError`` with the install command;
        an unknown domain: a ``KeyError`` naming ``env.domain``).
    """
    return benchmark_hook(getattr(env_cfg, "benchmark", DEFAULT_BENCHMARK), "loader")(env_cfg, log_level=log_level)


def require_benchmark(name: str) -> None:
    """Run the registered benchmark's ``check`` (what it needs is installed); nothing when it has none.

    Raises:
        UnknownBenchmarkError: no such benchmark is registered.
        ImportError: what the check raises (one line saying how to install what is missing).
    """
    check = benchmark_hook(name, "check")
    if check is not None:
        check()


def benchmark_gold_index(name: str, domain: str) -> tuple[list[Any], dict[str, bool]]:
    """The registered benchmark's gold index of ``domain`` (see :class:`BenchmarkEntry`), for
    the local stack's gold-replay policy.

    Raises:
        UnknownBenchmarkError: no such benchmark is registered.
        LookupError: the benchmark registered no gold index.
        whatever the gold index raises (an unknown domain: a ``KeyError``).
    """
    gold = benchmark_hook(name, "gold_index")
    if gold is None:
        raise LookupError(f"benchmark {name!r} has no gold index: the local stack's gold replay cannot serve it")
    return gold(domain)


def domain_key(benchmark: str, domain: str) -> str:
    """One string for a benchmark's domain (the local stack's ``--domain``): the domain alone for
    :data:`DEFAULT_BENCHMARK` (``retail``), else ``"<benchmark>:<domain>"`` (``tau_bench:retail``)."""
    return domain if benchmark == DEFAULT_BENCHMARK else f"{benchmark}:{domain}"


def parse_domain_key(key: str) -> tuple[str, str]:
    """``(benchmark, domain)`` of a :func:`domain_key` string."""
    benchmark, sep, domain = key.partition(":")
    return (benchmark, domain) if sep else (DEFAULT_BENCHMARK, key)
