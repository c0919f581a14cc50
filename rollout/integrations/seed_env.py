"""The seed's environment objects on our benchmarks: :func:`make_env` (our ``get_env(...,
task_index=...)``) makes a :class:`TaskEnv`, one episode's environment bound to one task, through the
benchmark's own ``new_episode`` (:class:`rollout.core.environment.Benchmark`), with the seed's
``wiki`` / ``tools_info`` / ``task_index`` attributes; :func:`resolve_task_id` reads the seed's
``task_index``.
"""

from __future__ import annotations

import logging
from typing import Any

from rollout.core.config import EnvConfig
from rollout.core.environment import Action, Benchmark, Environment, StepResult

logger = logging.getLogger(__name__)


def resolve_task_id(domain: Any, split: str, task: int | str) -> str:
    """A task id from the seed's ``task_index``.

    Args:
        domain: the loaded benchmark (:class:`rollout.core.environment.Benchmark`: ``name``,
            ``tasks`` (id -> task) and ``task_ids(split)``), e.g. a
            :class:`~rollout.benchmarks.tau2.domain.Tau2Domain`.
        split: the split an integer indexes (``env.task_split``: ``train`` | ``test`` | ``base``).
        task: a task id (str, as in tau2's ``tasks.json``) or an index into ``split`` (int, in
            the benchmark's order, as the seed's ``task_index`` indexes its split).

    Raises:
        KeyError: unknown task id or split.
        IndexError: the index is outside the split.
        TypeError: ``task`` is neither an int nor a str.
    """
    if isinstance(task, bool) or not isinstance(task, (int, str)):
        raise TypeError(f"task_index must be a tau2 task id (str) or an index into the split (int), got {task!r}")
    if isinstance(task, int):
        ids = domain.task_ids(split)
        if not 0 <= task < len(ids):
            raise IndexError(f"task_index {task} is outside split {split!r} of {domain.name} ({len(ids)} tasks)")
        return ids[task]
    if task not in domain.tasks:
        raise KeyError(f"{task!r} is not a task of tau2 domain {domain.name}")
    return task


class TaskEnv:
    """One episode's environment bound to one task: the seed's environment object shape.

    The seed's tau-bench environment is built for one task and carries ``wiki``, ``tools_info`` and
    ``task_index``; so does this one. ``reset`` and ``step`` are the seed's, made async
    (:class:`rollout.core.environment.Environment`: ``reset`` returns ``(observation, info)``,
    ``step`` a :class:`~rollout.core.environment.StepResult` whose ``observation``, ``reward`` and
    ``done`` are read as the seed reads tau-bench's ``EnvResponse``), delegated to the wrapped environment
    (the benchmark's ``new_episode``: for tau2 a
    :class:`~rollout.benchmarks.tau2.episode.Tau2Environment` whose user simulator is built for the task).

    Args:
        env: the episode's environment, made for ``task_id``.
        task_id: the task id.
        benchmark: the loaded benchmark it came from (``None``: ``env.domain``, as our adapters'
            environments carry it).
        task_split: the split an integer ``task_index`` indexes (``None``: ``env.cfg.task_split``).

    Attributes:
        wiki: the agent's system prompt (tau2's agent instruction and the domain policy).
        tools_info: OpenAI-style tool schemas of the agent's tools.
        task_index: the task id (a str: tau2's ids are strings).
    """

    def __init__(self, env: Environment, task_id: str, *, benchmark: Benchmark | None = None, task_split: str | None = None):
        self.env = env
        self.task_id = str(task_id)
        self._benchmark = benchmark
        self._task_split = task_split

    @property
    def task_index(self) -> str:
        return self.task_id

    @property
    def domain(self) -> Any:
        """The loaded benchmark (its ``name``, ``tasks``, ``task_ids``, prompt and tools)."""
        return self._benchmark if self._benchmark is not None else self.env.domain

    @property
    def task_split(self) -> str:
        return self._task_split if self._task_split is not None else self.env.cfg.task_split

    @property
    def wiki(self) -> str:
        return self.domain.system_prompt

    @property
    def tools_info(self) -> list[dict]:
        return self.domain.tool_schemas

    @property
    def timings(self) -> dict[str, float]:
        """Seconds spent building the environment, in tools, in the user simulator, in the reward."""
        return self.env.timings

    async def reset(self, task_id: str | None = None) -> tuple[str, dict[str, Any]]:
        """Start the episode on the bound task.

        Returns:
            ``(observation, info)``: the user's opening message, ``{"task_id", "domain", ...}``.

        Raises:
            ValueError: ``task_id`` names another task (the user simulator is the bound task's).
            EnvironmentStepError, UserSimulatorError: as the wrapped environment's ``reset``.
        """
        if task_id is not None and str(task_id) != self.task_id:
            raise ValueError(f"this environment is bound to task {self.task_id!r}, not {task_id!r}")
        return await self.env.reset(self.task_id)

    async def step(self, action: Action) -> StepResult:
        """Apply one agent action: the wrapped environment's :class:`~rollout.core.environment.StepResult`."""
        return await self.env.step(action)


def make_env(domain: Benchmark, task: int | str, *, env_cfg: EnvConfig | None = None, seed: int = 0,
             executor=None, sandbox=None) -> TaskEnv:
    """Our ``get_env(..., task_index=...)``: a fresh environment for one episode of one task.

    Args:
        domain: the loaded benchmark, once per process (:class:`rollout.core.environment.Benchmark`:
            :func:`rollout.core.environment.load_benchmark`, or e.g. a
            :class:`~rollout.benchmarks.tau2.domain.Tau2Domain`); the episode's environment is its
            ``new_episode`` (tau2: a ``Tau2Environment`` with a user simulator made for the task;
            tau-bench: an environment that makes its own user at ``reset``).
        task: a task id (str) or an index into ``env_cfg.task_split`` (int); see :func:`resolve_task_id`.
        env_cfg: the ``env`` section (user simulator, timeouts, evaluator, split); default: ours.
        seed: the user simulator's seed.
        executor: thread pool for the environment's blocking calls (``None``: the event loop's default one).
        sandbox: the process's sandbox (``domain.new_actor_sandbox(env_cfg)``; for tau2 a
            :class:`~rollout.benchmarks.tau2.sandbox.ToolSandbox` for database-free tools);
            ``None``: they run in a thread without a hard bound; fine for tests and trusted models,
            not for training, see :mod:`rollout.benchmarks.tau2.environment`.

    Raises:
        KeyError, IndexError, TypeError: ``task`` does not name a task (see :func:`resolve_task_id`).
        UserSimulatorError: the user simulator cannot be set up (e.g. its API key is missing).
    """
    env_cfg = env_cfg or EnvConfig(domain=domain.name)
    task_id = resolve_task_id(domain, env_cfg.task_split, task)
    env = domain.new_episode(env_cfg, task_id, seed=seed, executor=executor, sandbox=sandbox)
    return TaskEnv(env, task_id, benchmark=domain, task_split=env_cfg.task_split)
