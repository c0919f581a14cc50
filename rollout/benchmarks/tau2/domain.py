"""A tau2 domain, loaded once per actor: the tau2 benchmark behind
:class:`rollout.core.environment.Benchmark`.

:class:`Tau2Domain` holds the domain's tasks, splits, policy and tool schemas, the fast path's
shared database (:mod:`rollout.benchmarks.tau2.fast`), and makes the actor's tool sandbox
(:mod:`rollout.benchmarks.tau2.sandbox`) and each episode's environment
(:mod:`rollout.benchmarks.tau2.episode`) with its user simulator (:mod:`rollout.benchmarks.tau2.user`).
Domains are those tau2's registry registers (:mod:`rollout.benchmarks.tau2.registry`).
"""

from __future__ import annotations

import logging
from concurrent.futures import Executor, ThreadPoolExecutor

from rollout.benchmarks.tau2.episode import Tau2Environment
from rollout.benchmarks.tau2.fast import FastPath
from rollout.benchmarks.tau2.imports import domain_loaders, import_tau2, literal_constants
from rollout.benchmarks.tau2.sandbox import ToolSandbox
from rollout.benchmarks.tau2.user import make_user
from rollout.core.config import EnvConfig, TaskSelectionError

logger = logging.getLogger(__name__)


class Tau2Domain:
    """One tau2 domain's static data, loaded once per actor: the tau2 benchmark
    (:class:`rollout.core.environment.Benchmark`).

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
        import_tau2(tau2_log_level)
        loaders = domain_loaders(name)
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
        consts = literal_constants("tau2.agent.llm_agent", ("AGENT_INSTRUCTION", "SYSTEM_PROMPT"))
        return consts["SYSTEM_PROMPT"].format(agent_instruction=consts["AGENT_INSTRUCTION"], domain_policy=self.policy)

    def new_sandbox(self, evaluator: bool, log_level: str = "ERROR", startup_timeout_s: float = 120.0) -> ToolSandbox:
        """The actor's :class:`ToolSandbox` for this domain: on the fast path it runs
        database-free tools on the toolkit alone (no database in the child), and loads tau2's
        evaluator only when ``evaluator`` (``env.evaluator: tau2``) or when first needed."""
        tools = self.fast.tools_class if self.fast.enabled else None
        return ToolSandbox(self.name, startup_timeout_s=startup_timeout_s, log_level=log_level,
                           tools_class=f"{tools.__module__}:{tools.__qualname__}" if tools is not None else None, evaluator=evaluator)

    def new_actor_sandbox(self, env_cfg: EnvConfig, log_level: str = "ERROR") -> ToolSandbox:
        """The actor's sandbox for ``env_cfg``: :meth:`new_sandbox`, with tau2's evaluator loaded
        at start when ``env.evaluator: tau2`` (:class:`rollout.core.environment.Benchmark`)."""
        return self.new_sandbox(evaluator=env_cfg.evaluator == "tau2", log_level=log_level)

    def new_episode(self, env_cfg: EnvConfig, task_id: str, *, seed: int = 0, executor: Executor | None = None,
                    sandbox: ToolSandbox | None = None) -> Tau2Environment:
        """A fresh :class:`~rollout.benchmarks.tau2.episode.Tau2Environment` for one episode of
        ``task_id``, with the user simulator ``env.user`` configures, made for the task
        (:func:`rollout.benchmarks.tau2.user.make_user`).

        Args:
            env_cfg: the ``env`` section.
            task_id: a task of :attr:`tasks`.
            seed: the user simulator's seed.
            executor: thread pool for tau2 calls (``None``: the loop's default executor).
            sandbox: the actor's :class:`ToolSandbox` (``None``: database-free tools and tau2's
                evaluator run in a thread, without a hard bound; tests only).

        Raises:
            KeyError: ``task_id`` is not a task of the domain.
            UserSimulatorError: the user simulator cannot be set up (e.g. its API key is missing).
            ValueError: unknown ``env.user.kind``.
        """
        user = make_user(self.tasks[task_id], env_cfg.user, seed=seed)
        return Tau2Environment(self, user, env_cfg, executor=executor, sandbox=sandbox)

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
