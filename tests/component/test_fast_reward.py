"""The fast environment and reward path (``env.evaluator: fast``) equals tau2's own path.

* Copy-on-write tables behave as the dicts they stand for, and views never write the shared
  database.
* On gold, perturbed (skipped write, wrong argument, extra write, write then undo) and failing
  trajectories, every tool answer and every reward with its breakdown equals tau2's
  ``evaluate_simulation`` on a fresh environment: for every task of airline and retail in the
  extended suite, for a spread of tasks in CI (the reference path costs 0.4-1 s per episode, so
  the whole matrix, about 1,200 episodes, takes 10-20 minutes on a 2-core machine; ``python -m
  rollout.devtools.bench env`` runs it too).
* Through :class:`Tau2Environment`, both evaluators give the same results.
* A runaway ``calculate`` in the trajectory is never replayed at reward time; database tools
  never queue behind other work, and one that cannot start is not a ``tool_timeout``.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from rollout.benchmarks.tau2.cow import CowTable
from rollout.benchmarks.tau2.environment import Tau2Environment
from rollout.benchmarks.tau2.user import ScriptedUser
from rollout.core.config import EnvConfig
from rollout.core.environment import RESPOND, Action, EnvironmentStepError, ToolTimeoutError
from rollout.devtools.bench.env import KINDS, compare_domain, play, trajectories


# -- copy-on-write tables ---------------------------------------------------------------------------
class Rec:
    def __init__(self, v):
        self.v = v


def test_cow_table_is_a_dict_in_order_contents_and_isolation():
    base = {"a": Rec(1), "b": Rec(2), "c": Rec(3)}
    t = CowTable(base)
    d = dict(base)  # what a private copy of the table would do, side by side
    assert list(t) == list(d) and len(t) == 3 and "b" in t and "z" not in t
    t["b"].v = 20  # a read by key copies; the change stays in the view
    assert base["b"].v == 2 and t["b"].v == 20 and t.peek("b").v == 20
    t["z"] = Rec(9)
    d["z"] = None
    del t["a"]
    del d["a"]
    t["a"] = Rec(7)  # re-added: goes to the end, as in a dict
    d["a"] = None
    assert list(t) == list(d) == ["b", "c", "z", "a"] and len(t) == 4
    assert [k for k, _ in t.items()] == list(d) and t.get("nope") is None
    assert t.pop("z").v == 9 and "z" not in t and len(t) == 3
    with pytest.raises(KeyError):
        t["z"]
    with pytest.raises(KeyError):
        del t["z"]
    assert base["a"].v == 1 and list(base) == ["a", "b", "c"]  # the shared table is untouched
    assert t.touched() == {"a", "b"}  # "z" came and went: absent, as in the shared table
    # scans read without copying: the untouched record is the shared object itself
    assert [r for k, r in t.items() if k == "c"][0] is base["c"] and t.own_records() == 2
    other = CowTable(base)  # another episode sees the shared records, not this one's changes
    assert other["b"].v == 2 and list(other) == ["a", "b", "c"]


def test_views_hash_as_tau2_and_compare_by_touched_records(retail):
    from tau2.data_model.message import ToolCall

    fast = retail.fast
    fresh = retail.new_environment()
    assert fast.shared.full_hash(fast.shared.view()) == fresh.tools.db.get_hash()
    task = retail.tasks["0"]
    env = fast.new_environment(task)
    for a in task.evaluation_criteria.actions:
        call = ToolCall(id="c", name=a.name, arguments=dict(a.arguments))
        assert env.get_response(call).content == fresh.get_response(call).content
    assert fast.shared.full_hash(env.tools.db) == fresh.tools.db.get_hash()  # tau2's own hash, rebuilt
    assert fast.shared.matches(env.tools.db, fast.gold_state(task))
    assert not fast.shared.matches(fast.shared.view(), fast.gold_state(task))


# -- rewards equal tau2's ---------------------------------------------------------------------------
def _check(result: dict) -> None:
    assert result["mismatches"] == []
    assert result["identical_rewards"] == result["identical_answers"] == result["episodes"] > 0
    assert result["shared_db_unchanged"]


# Tasks with writes and an undoable record, with calculate, and without writes, per domain.
CI_TASKS = {"retail": ["5", "16", "24"], "airline": ["0", "12"]}


@pytest.mark.parametrize("name", ["retail", "airline"])
def test_fast_rewards_equal_tau2_on_a_spread_of_tasks(name, request):
    domain = request.getfixturevalue(name)
    result = compare_domain(domain, CI_TASKS[name])
    _check(result)
    assert set(result["kinds"]) == set(KINDS) and result["episodes"] >= 12  # every kind of trajectory was played
    assert {"0.0", "1.0"} <= set(result["rewards"])  # and they are not all the same reward


@pytest.mark.extended  # CI runs test_fast_rewards_equal_tau2_on_a_spread_of_tasks (10-20 min here)
@pytest.mark.timeout(3600)  # the whole matrix: far past the suite's 300 s per test
@pytest.mark.parametrize("name", ["retail", "airline"])
def test_fast_rewards_equal_tau2_on_every_task(name, request):
    domain = request.getfixturevalue(name)
    result = compare_domain(domain)
    _check(result)
    assert result["tasks"] == len(domain.tasks)


def test_db_mismatch_is_seen_on_a_touched_but_different_record(retail):
    task = retail.tasks["5"]
    wrong = [t for t in trajectories(retail, task) if t.kind == "wrong_arg"][0]
    ours, ref = play(retail, task, wrong, "fast"), play(retail, task, wrong, "tau2")
    assert ours["info"] == ref["info"] and ours["info"]["db_match"] is False and ours["reward"] == 0.0
    undo = [t for t in trajectories(retail, task) if t.kind == "write_undo"][0]
    ours, ref = play(retail, task, undo, "fast"), play(retail, task, undo, "tau2")
    assert ours["info"] == ref["info"] and ours["info"]["db_match"] is True  # touched, equal again


# -- through Tau2Environment -----------------------------------------------------------------------
async def _episode(domain, task_id, evaluator, **cfg):
    task = domain.tasks[task_id]
    env = Tau2Environment(domain, ScriptedUser(task), EnvConfig(domain=domain.name, evaluator=evaluator, **cfg))
    await env.reset(task_id)
    for a in task.evaluation_criteria.actions:
        await env.step(Action(a.name, dict(a.arguments)))
    text = "\n".join(task.evaluation_criteria.communicate_info or ["Done."])
    res = await env.step(Action(RESPOND, content=text))
    assert res.done
    return env, res.reward, res.reward_info


@pytest.mark.parametrize("name,task_id", [("retail", "16"), ("airline", "12")])
async def test_both_evaluators_agree_through_the_environment(name, task_id, request):
    domain = request.getfixturevalue(name)
    fast_env, *fast = await _episode(domain, task_id, "fast")
    ref_env, *ref = await _episode(domain, task_id, "tau2")
    assert fast_env.fast and not ref_env.fast
    assert fast == ref and fast[0] == 1.0
    assert [m.content for m in fast_env.messages] == [m.content for m in ref_env.messages]


async def test_a_runaway_calculate_is_never_replayed_at_reward_time(retail):
    from tau2.data_model.message import AssistantMessage, ToolCall, ToolMessage

    task = retail.tasks["0"]
    env = Tau2Environment(retail, ScriptedUser(task), EnvConfig(domain="retail", reward_timeout_s=5.0))
    await env.reset("0")
    # as if it had answered at step time: tau2's evaluator would replay it (about 10**(3.7e8) digits)
    call = ToolCall(id="call_runaway", name="calculate", arguments={"expression": "9**9**9**9"})
    env.messages.append(AssistantMessage(role="assistant", content=None, tool_calls=[call]))
    env.messages.append(ToolMessage(id=call.id, role="tool", content="1.0", requestor="assistant", error=False))
    # nothing was replayed: a replay would run into reward_timeout_s (5 s) and raise RewardError
    reward, info = await env.evaluate("agent_stop")
    assert reward == 0.0 and info["db_match"] is False  # the gold writes were not made


# -- database tools do not queue behind other work --------------------------------------------------
async def test_a_database_tool_does_not_wait_behind_the_actors_other_work(retail):
    from concurrent.futures import ThreadPoolExecutor

    busy = ThreadPoolExecutor(max_workers=1)  # the actor's pool, taken by seconds-long work
    release = threading.Event()
    busy.submit(release.wait, 30)
    try:
        task = retail.tasks["0"]
        env = Tau2Environment(retail, ScriptedUser(task), EnvConfig(domain="retail", step_timeout_s=0.5), executor=busy)
        await env.reset("0")
        res = await env.step(Action("get_user_details", {"user_id": "yusuf_rossi_9620"}))
        assert not res.done and not res.tool_error and "yusuf_rossi_9620" in res.observation
    finally:
        release.set()
        busy.shutdown()


async def test_a_database_tool_that_cannot_start_is_not_a_tool_timeout(retail):
    task = retail.tasks["0"]
    env = Tau2Environment(retail, ScriptedUser(task), EnvConfig(domain="retail", step_timeout_s=0.3))
    await env.reset("0")
    release = threading.Event()
    pool = retail.tool_executor
    hogs = [pool.submit(release.wait, 30) for _ in range(pool._max_workers)]  # every tool thread busy
    try:
        with pytest.raises(EnvironmentStepError, match="without starting") as e:
            await env.step(Action("get_user_details", {"user_id": "yusuf_rossi_9620"}))
        assert not isinstance(e.value, ToolTimeoutError)
    finally:
        release.set()
        for h in hogs:
            h.result(5)
    # a call that runs too long is still a tool_timeout
    slow = Tau2Environment(retail, ScriptedUser(task), EnvConfig(domain="retail", step_timeout_s=0.2))
    await slow.reset("0")
    release, finished = threading.Event(), threading.Event()
    slow._env.get_response = lambda call: (release.wait(60), finished.set())
    try:
        with pytest.raises(ToolTimeoutError):
            await slow.step(Action("get_user_details", {"user_id": "yusuf_rossi_9620"}))
        assert not finished.is_set()  # cut while the call still ran, not waited out
    finally:
        release.set()
    assert await asyncio.to_thread(finished.wait, 120)  # the slow thread is done before the next test uses the pool


async def test_a_slow_calculate_costs_nothing_at_reward_time_through_the_worker(tokenizer):
    """The worker, fast evaluator: a calculate call that took seconds at step time (under the
    step timeout) is not run again for the reward, which a 1 s reward timeout shows (tau2's
    path would replay it: see test_reward_sandbox's eval_error counterpart)."""
    import json

    from support.scripted_policy import ScriptedPolicyServer

    from rollout.core.config import load_config
    from rollout.core.records import EpisodeSpec, EpisodeStatus
    from rollout.core.worker import RolloutWorker

    def script(eid, step, input_ids):
        call = "<tool_call>\n" + json.dumps({"name": "calculate", "arguments": {"expression": "9**9**7"}}) + "\n</tool_call>"
        return [(call, "stop"), ("Done.", "eos")][min(step, 1)]

    async with ScriptedPolicyServer(tokenizer, script) as server:
        cfg = load_config(None, [f"policy.router_url={server.url}", "env.step_timeout_s=60", "env.reward_timeout_s=1.0", "env.max_steps=4"])
        worker = RolloutWorker(cfg.policy, cfg.env, cfg.logging, max_concurrent_episodes=2)
        try:
            res = await asyncio.wait_for(worker.run(EpisodeSpec("slow", "retail", "0", "g", 0)), timeout=120)
        finally:
            await worker.close()
    assert res.status is EpisodeStatus.COMPLETED, res.metadata
    assert res.metadata["timings"]["reward_s"] < 1.0 and res.metadata["timings"]["tool_s"] > 0.5


# -- what the actor and its sandbox load --------------------------------------------------------------
def test_the_system_prompt_is_tau2s_without_importing_its_agent_module(retail):
    import subprocess
    import sys

    from tau2.agent.llm_agent import AGENT_INSTRUCTION, SYSTEM_PROMPT

    assert retail.system_prompt == SYSTEM_PROMPT.format(agent_instruction=AGENT_INSTRUCTION, domain_policy=retail.policy)
    code = ("import sys; from rollout.benchmarks.tau2.environment import Tau2Domain; d = Tau2Domain('retail'); d.system_prompt; "
            "print(sorted(m for m in ('litellm', 'tau2.agent.llm_agent') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env={**__import__("os").environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"})
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stderr[-2000:]


@pytest.mark.parametrize("name", ["retail", "airline"])
def test_a_sandbox_without_a_database_answers_database_free_tools_as_tau2(name, request):
    from tau2.data_model.message import ToolCall

    from rollout.benchmarks.tau2.fast import PURE_TOOL_TYPES

    domain = request.getfixturevalue(name)
    calls = {(a.name, repr(a.arguments)): a.arguments for t in domain.tasks.values() for a in (t.evaluation_criteria.actions or [])
             if domain.tool_types.get(a.name) in PURE_TOOL_TYPES}
    calls[("calculate", "bad")] = {"expression": "2 + abc"}
    calls[("transfer_to_human_agents", "x")] = {"summary": "wants a human"}
    fresh = domain.new_environment()
    sandbox = domain.new_sandbox(evaluator=False)
    try:
        for (tool, _), args in calls.items():
            want = fresh.get_response(ToolCall(id="c", name=tool, arguments=dict(args)))
            assert sandbox.call(tool, dict(args), 10.0) == (want.content, want.error)
        assert sandbox.tools_class is not None and not sandbox._evaluator_loaded
    finally:
        sandbox.close()
