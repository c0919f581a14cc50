"""The environment seam: what the episode loop needs from a benchmark's environment, and the
benchmark registry through which the worker, the wiring and the seed's agent load a benchmark.

The loop (:func:`rollout.core.episode.run_episode`) sees an :class:`Environment` with the seed's
shape (``reset(task) -> observation, info``; ``step(action) -> observation, reward, done, info``,
both async) and the typed errors below, and nothing of any benchmark. Adapters
(:mod:`rollout.benchmarks`) implement it and raise these errors; each error maps to one episode
status (``docs/design.md``, "Statuses").

A benchmark is registered by name (:func:`register_benchmark`; ``env.benchmark`` selects it) with a
loader that returns a :class:`Benchmark`: the domain's tasks, prompt and tools, an actor-wide
:class:`Sandbox` if it needs one, and a new :class:`Environment` per episode. The built-ins
(``tau2``, ``tau_bench``) are registered at the bottom of this module by module path, so that
importing it imports neither. Adding a benchmark: a package under ``rollout/benchmarks/`` with its
loader, and one ``register_benchmark`` call (the built-in table below for one shipped with the
package; in the process that loads it otherwise, e.g. a test's toy benchmark).
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Protocol

RESPOND = "respond"  # Action.name of a reply to the user (no tool call)
DEFAULT_BENCHMARK = "tau2"  # env.benchmark's default
# Benchmarks shipped in other packages: an installed distribution that declares, in its
# pyproject.toml, ``[project.entry-points."tau_rollout.benchmarks"] NAME = "pkg.module:loader"``
# is found by name in every process that looks it up (the driver, each Ray actor, the local stack),
# with nothing to register by hand (the standard plugin mechanism of Python packaging).
ENTRY_POINT_GROUP = "tau_rollout.benchmarks"


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


class EnvironmentStepError(RuntimeError):
    """Environment code failed (not the policy's fault): an infrastructure failure (``env_error``)."""


class ToolTimeoutError(RuntimeError):
    """A tool call the model wrote ran past ``env.step_timeout_s`` and was stopped (``tool_timeout``)."""


class RewardError(RuntimeError):
    """The reward could not be computed (the evaluator failed or timed out): ``eval_error``."""


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
        """Start the task: ``(the user's opening message, info)``.

        Raises:
            UserSimulatorError: the user simulator failed to open.
            EnvironmentStepError: (or any exception) the environment could not be built.
        """
        ...

    async def step(self, action: Action) -> tuple[str, float, bool, dict[str, Any]]:
        """Run ``action``: ``(observation, reward, done, info)``; ``info["role"]`` is ``"tool"``
        for a tool's result, else ``"user"``; ``info["tool_error"]`` when the tool failed (an
        observation, not an error); ``info["termination"]`` and ``info["reward_info"]`` when done.

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


class UnknownBenchmarkError(KeyError, ValueError):
    """``env.benchmark`` names no registered benchmark; the message is one line listing the registered ones."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class _Entry:
    """A registered benchmark: callables, or ``"module:attribute"`` paths imported on first use."""

    loader: Callable[..., Benchmark] | str
    gold_index: Callable[[str], tuple[list[Any], dict[str, bool]]] | str | None = None
    check: Callable[[], None] | str | None = None


_REGISTRY: dict[str, _Entry] = {}
_REGISTRY_LOCK = threading.Lock()


def register_benchmark(name: str, loader: Callable[..., Benchmark] | str, *,
                       gold_index: Callable[[str], tuple[list[Any], dict[str, bool]]] | str | None = None,
                       check: Callable[[], None] | str | None = None) -> None:
    """Register a benchmark under ``name`` (what ``env.benchmark`` selects).

    Args:
        name: the benchmark's name (an identifier: ``tau2``, ``tau_bench``).
        loader: ``loader(env_cfg, log_level=...) -> Benchmark``: loads the domain ``env_cfg.domain``
            (blocking; once per actor), or its ``"module:attribute"`` path, imported at the first
            :func:`load_benchmark` (so that registering imports nothing).
        gold_index: optional ``gold_index(domain) -> (tasks, {tool name: is_write})`` (or its
            path): what the local stack's gold-replay policy indexes (tasks in tau2's shape: ``id``,
            ``user_scenario.instructions``, ``evaluation_criteria.actions`` / ``communicate_info``).
        check: optional ``check()`` (or its path) that raises ``ImportError`` with one line when
            what the benchmark needs is not installed; preflight runs it before anything starts.

    Raises:
        ValueError: ``name`` is not an identifier, or is registered already (see
            :func:`unregister_benchmark`).
    """
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"a benchmark's name must be an identifier, got {name!r}")
    with _REGISTRY_LOCK:
        if name in _REGISTRY:
            raise ValueError(f"benchmark {name!r} is already registered (unregister_benchmark({name!r}) first)")
        _REGISTRY[name] = _Entry(loader, gold_index, check)


def unregister_benchmark(name: str) -> None:
    """Remove ``name`` from the registry (a test's toy benchmark, a plugin replaced).

    Raises:
        UnknownBenchmarkError: ``name`` is not registered.
    """
    with _REGISTRY_LOCK:
        if _REGISTRY.pop(name, None) is None:
            raise _unknown(name)


def benchmarks() -> list[str]:
    """The registered benchmarks' names, sorted (nothing is imported)."""
    with _REGISTRY_LOCK:
        return sorted(_REGISTRY)


def _unknown(name: str) -> UnknownBenchmarkError:
    return UnknownBenchmarkError(f"env.benchmark: no benchmark {name!r} is registered (registered: {', '.join(sorted(_REGISTRY))})")


def _entry(name: str) -> _Entry:
    with _REGISTRY_LOCK:
        entry = _REGISTRY.get(name)
    if entry is None and find_plugin(name):
        with _REGISTRY_LOCK:
            entry = _REGISTRY.get(name)
    if entry is None:
        raise _unknown(name)
    return entry


def find_plugin(name: str) -> bool:
    """Register benchmark ``name`` from an installed package's entry point (group
    :data:`ENTRY_POINT_GROUP`; its value is the loader's ``"module:attribute"`` path, imported on
    first use) when the registry does not hold it; True when ``name`` is registered afterwards.
    Reads the installed packages' metadata (not their code), once per name not registered.
    """
    if name in benchmarks():
        return True
    from importlib.metadata import entry_points

    found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
    if not found:
        return False
    with _REGISTRY_LOCK:
        _REGISTRY.setdefault(name, _Entry(found[0].value))
    return True


def _resolve(target: Callable | str) -> Callable:
    """``target`` itself, or the attribute a ``"module:attribute"`` path names (imported now)."""
    if not isinstance(target, str):
        return target
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


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
    return _resolve(_entry(getattr(env_cfg, "benchmark", DEFAULT_BENCHMARK)).loader)(env_cfg, log_level=log_level)


def require_benchmark(name: str) -> None:
    """Run the registered benchmark's ``check`` (what it needs is installed); nothing when it has none.

    Raises:
        UnknownBenchmarkError: no such benchmark is registered.
        ImportError: what the check raises (one line saying how to install what is missing).
    """
    check = _entry(name).check
    if check is not None:
        _resolve(check)()


def benchmark_gold_index(name: str, domain: str) -> tuple[list[Any], dict[str, bool]]:
    """The registered benchmark's gold index of ``domain`` (see :func:`register_benchmark`), for
    the local stack's gold-replay policy.

    Raises:
        UnknownBenchmarkError: no such benchmark is registered.
        LookupError: the benchmark registered no gold index.
        whatever the gold index raises (an unknown domain: a ``KeyError``).
    """
    gold = _entry(name).gold_index
    if gold is None:
        raise LookupError(f"benchmark {name!r} has no gold index: the local stack's gold replay cannot serve it")
    return _resolve(gold)(domain)


def domain_key(benchmark: str, domain: str) -> str:
    """One string for a benchmark's domain (the local stack's ``--domain``): the domain alone for
    :data:`DEFAULT_BENCHMARK` (``retail``), else ``"<benchmark>:<domain>"`` (``tau_bench:retail``)."""
    return domain if benchmark == DEFAULT_BENCHMARK else f"{benchmark}:{domain}"


def parse_domain_key(key: str) -> tuple[str, str]:
    """``(benchmark, domain)`` of a :func:`domain_key` string."""
    benchmark, sep, domain = key.partition(":")
    return (benchmark, domain) if sep else (DEFAULT_BENCHMARK, key)


# The built-in benchmarks, by module path: registering imports neither tau2 nor tau-bench.
register_benchmark("tau2", "rollout.benchmarks.tau2.environment:load_benchmark",
                   gold_index="rollout.benchmarks.tau2.environment:gold_index")
register_benchmark("tau_bench", "rollout.benchmarks.tau_bench.environment:load_benchmark",
                   gold_index="rollout.benchmarks.tau_bench.environment:gold_index",
                   check="rollout.benchmarks.tau_bench.environment:require_tau_bench")
