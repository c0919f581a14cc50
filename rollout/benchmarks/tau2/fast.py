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

The fast path serves a task when its domain's environment is a plain tau2 ``Environment``
without user tools, and the task has no ``initialization_data`` or ``message_history`` (these
rebuild the database outside the tools); otherwise the episode takes tau2's path. Every task of
airline and retail qualifies. ``tests/component/test_fast_reward.py`` checks reward and breakdown against
``evaluate_simulation`` for every task of both domains, on gold, perturbed and failing
trajectories. ``env.evaluator: tau2`` selects tau2's path for every episode (the reference).
"""

from __future__ import annotations

import copy
import logging
import threading
from typing import Any

from rollout.benchmarks.tau2.cow import DatabaseState, SharedDatabase

logger = logging.getLogger(__name__)

PURE_TOOL_TYPES = ("generic", "think")  # tau2 tool types that touch no database


class FastPath:
    """Per-actor state of the fast path for one domain: the shared database, the domain's
    toolkit class and policy, and the gold database state per task.

    Args:
        domain_name: tau2 domain name.
        env: a fresh tau2 ``Environment`` of the domain; its database becomes the shared one
            (nothing may write it afterwards).
        tool_types: tool name -> tau2 tool type value (``read`` | ``write`` | ``think`` | ``generic``).
    """

    def __init__(self, domain_name: str, env: Any, tool_types: dict[str, str]) -> None:
        from tau2.environment.environment import Environment

        self.domain_name = domain_name
        self.policy = env.get_policy()
        self.tools_class = type(env.tools)
        self.tool_types = tool_types
        # Only a plain Environment without user tools: its set_state / sync_tools are tau2's base ones.
        self.enabled = type(env) is Environment and env.user_tools is None and env.tools is not None and env.tools.db is not None
        self.shared = SharedDatabase(env.tools.db) if self.enabled else None
        self._gold: dict[str, DatabaseState] = {}
        self._gold_lock = threading.Lock()

    def supports(self, task: Any) -> bool:
        """Whether ``task`` can take the fast path (see the module docstring)."""
        if not self.enabled:
            return False
        st = task.initial_state
        return st is None or (st.initialization_data is None and not st.message_history)

    def new_environment(self, task: Any) -> Any:
        """A tau2 ``Environment`` over a new view of the shared database, in the task's initial
        state (its ``initialization_actions`` applied, as tau2's ``set_state`` applies them);
        about 20 us without initialization actions.

        Raises:
            ValueError: the task cannot take the fast path.
        """
        from tau2.environment.environment import Environment

        if not self.supports(task):
            raise ValueError(f"task {task.id} cannot take the fast path")
        env = Environment(domain_name=self.domain_name, policy=self.policy, tools=self.tools_class(self.shared.view()))
        st = task.initial_state
        if st is not None and st.initialization_actions:
            for action in st.initialization_actions:
                env.run_env_function_call(action)
            env.sync_tools()
        return env

    def gold_state(self, task: Any) -> DatabaseState:
        """The database state after the task's gold actions (computed once per task; a gold
        action that fails is skipped, as tau2's evaluator skips it with a warning).

        Database-free tools (``generic`` / ``think``, e.g. ``calculate``) are not run: they cannot
        change the database.
        """
        state = self._gold.get(task.id)
        if state is not None:
            return state
        with self._gold_lock:
            state = self._gold.get(task.id)
            if state is None:
                env = self.new_environment(task)
                for action in task.evaluation_criteria.actions or []:
                    if action.requestor == "assistant" and self.tool_types.get(action.name) in PURE_TOOL_TYPES:
                        continue
                    try:
                        env.make_tool_call(tool_name=action.name, requestor=action.requestor, **copy.deepcopy(action.arguments))
                    except Exception as e:  # noqa: BLE001  (tau2's evaluator skips it the same way)
                        logger.debug("task %s: gold action %s failed: %s", task.id, action.name, e)
                state = self._gold[task.id] = self.shared.state(env.tools.db)
        return state

    def evaluate(self, task: Any, env: Any, messages: list[Any]) -> tuple[float, dict[str, Any]]:
        """tau2's reward (``evaluate_simulation``, ``EvaluationType.ALL``, not solo) for an episode
        that ended by a user or agent stop, from its own environment ``env``; blocking (ms).

        Args:
            task: the tau2 Task.
            env: the episode's environment (from :meth:`new_environment`), after its tool calls.
            messages: the conversation as tau2 messages, as for tau2's evaluator.

        Returns:
            ``(reward, info)`` as :func:`rollout.benchmarks.tau2.sandbox.evaluate_run` gives them.

        Raises:
            ValueError: the task's reward basis holds NL assertions (as tau2 raises for ``ALL``).
        """
        from tau2.data_model.tasks import RewardType
        from tau2.evaluator.evaluator_action import ActionEvaluator
        from tau2.evaluator.evaluator_communicate import CommunicateEvaluator

        criteria = task.evaluation_criteria
        if criteria is None:
            return 1.0, {"reward_breakdown": {}, "db_match": None, "communicate_met": None, "action_match": None}
        basis = set(criteria.reward_basis)

        # The environment part (tau2's EnvironmentEvaluator), without rebuilding or replaying.
        if criteria.actions is None and criteria.env_assertions is None:
            env_reward, db_match, env_breakdown = 1.0, True, None
        else:
            db_match = self.shared.matches(env.tools.db, self.gold_state(task))
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
        reward, breakdown = 1.0, {}
        if basis & {RewardType.DB, RewardType.ENV_ASSERTION}:
            breakdown.update(env_breakdown or {})
            reward *= env_reward
        if RewardType.ACTION in basis:
            breakdown.update(action.reward_breakdown or {})
            reward *= action.reward
        if RewardType.NL_ASSERTION in basis:
            raise ValueError("NL assertions are part of the reward basis, but they are not being evaluated.")
        if RewardType.COMMUNICATE in basis:
            breakdown.update(communicate.reward_breakdown or {})
            reward *= communicate.reward
        info = {
            "reward_breakdown": {getattr(k, "value", str(k)): float(v) for k, v in breakdown.items()},
            "db_match": db_match,
            "communicate_met": [c.met for c in communicate.communicate_checks] if communicate.communicate_checks else None,
            "action_match": [c.action_match for c in action.action_checks] if action.action_checks else None,
        }
        return float(reward), info
