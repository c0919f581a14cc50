"""With ``env.evaluator: tau2`` (the reference path), tau2's evaluator runs in the sandbox
process: model output is never evaluated in the actor's own process at reward time, a replay
that would run for ever is killed within ``env.reward_timeout_s`` (eval_error), and rewards are
the ones tau2 computes in-process."""

from __future__ import annotations

import asyncio
import json
import os
import time

import pytest

from rollout.benchmarks.tau2.environment import Tau2Environment, ToolSandbox
from rollout.benchmarks.tau2.user import ScriptedUser
from rollout.core.config import EnvConfig
from rollout.core.environment import RESPOND, Action, RewardError

REWARD_TIMEOUT_S = 2.0


def _final_text(task) -> str:
    infos = (task.evaluation_criteria.communicate_info or []) if task.evaluation_criteria else []
    return "\n".join(["Here is the information you asked for:", *[f"- {s}" for s in infos], "Your request has been completed."])


@pytest.fixture(scope="module")
def retail_sandbox():
    sb = ToolSandbox("retail")
    sb._ensure()  # start-up (a tau2 import) outside the timings
    yield sb
    sb.close()


@pytest.fixture(scope="module")
def airline_sandbox():
    sb = ToolSandbox("airline")
    sb._ensure()
    yield sb
    sb.close()


def _env(domain, sandbox, task_id, **cfg) -> Tau2Environment:
    env_cfg = EnvConfig(domain=domain.name, **{"evaluator": "tau2", **cfg})
    return Tau2Environment(domain, ScriptedUser(domain.tasks[task_id]), env_cfg, sandbox=sandbox)


async def _gold_episode(domain, sandbox, task_id, skip_first_write=False):
    """Replay the task's gold actions through ``step`` (pure tools run in the sandbox), then say
    the communicate_info; the scripted user stops, so the last step returns tau2's reward."""
    env = _env(domain, sandbox, task_id)
    await env.reset(task_id)
    skipped = False
    for a in domain.tasks[task_id].evaluation_criteria.actions or []:
        assert a.requestor == "assistant"
        if skip_first_write and not skipped and domain.tool_types[a.name] == "write":
            skipped = True
            continue
        res = await env.step(Action(a.name, dict(a.arguments)))
        assert not res.done, res
    res = await env.step(Action(RESPOND, content=_final_text(domain.tasks[task_id])))
    assert res.done and res.termination == "user_stop"
    return env, res.reward, res.reward_info


def _old_way(domain, env, termination="user_stop"):
    """tau2's evaluate_simulation, in this process, as the pool computed it before."""
    from tau2.data_model.simulation import SimulationRun, TerminationReason
    from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation

    reason = TerminationReason.AGENT_STOP if termination == "agent_stop" else TerminationReason.USER_STOP
    sim = SimulationRun(id="old", task_id=env.task.id, start_time="0", end_time="1", duration=1.0, termination_reason=reason, messages=env.messages)
    ri = evaluate_simulation(sim, env.task, EvaluationType.ALL, solo_mode=False, domain=domain.name)
    info = {
        "reward_breakdown": {getattr(k, "value", str(k)): float(v) for k, v in (ri.reward_breakdown or {}).items()},
        "db_match": ri.db_check.db_match if ri.db_check is not None else None,
        "communicate_met": [c.met for c in ri.communicate_checks] if ri.communicate_checks else None,
        "action_match": [c.action_match for c in ri.action_checks] if ri.action_checks else None,
    }
    return float(ri.reward), info


def _tool_calls(env) -> list[str]:
    return [tc.name for m in env.messages for tc in (getattr(m, "tool_calls", None) or [])]


def _add_runaway_calculate(env) -> None:
    """Append a calculate call whose replay would run for ever (about 10**(3.7e8) digits), as if
    it had answered at step time: only the evaluator's replay would run it."""
    from tau2.data_model.message import AssistantMessage, ToolCall, ToolMessage

    call = ToolCall(id="call_runaway", name="calculate", arguments={"expression": "9**9**9**9"})
    env.messages.append(AssistantMessage(role="assistant", content=None, tool_calls=[call]))
    env.messages.append(ToolMessage(id=call.id, role="tool", content="1.0", requestor="assistant", error=False))


class Heartbeat:
    """Ticks every 20 ms on the event loop while it is entered; ``ticks`` counts them. A loop
    blocked for the whole block gets no tick in (at most one, at its edge)."""

    def __init__(self):
        self.ticks = 0
        self._task = None

    async def _run(self):
        while True:
            await asyncio.sleep(0.02)
            self.ticks += 1

    async def __aenter__(self):
        self._task = asyncio.ensure_future(self._run())
        await asyncio.sleep(0)
        return self

    async def __aexit__(self, *exc):
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# -- (a) a runaway replay is killed, in another process ---------------------------------------------
async def test_runaway_calculate_at_reward_time_is_killed_in_the_sandbox(retail, retail_sandbox):
    env = _env(retail, retail_sandbox, "0", reward_timeout_s=REWARD_TIMEOUT_S)
    await env.reset("0")
    _add_runaway_calculate(env)
    pid, kills = retail_sandbox.pid, retail_sandbox.kills
    assert pid is not None and pid != os.getpid()
    async with Heartbeat() as hb:
        t0 = time.monotonic()
        with pytest.raises(RewardError, match="killed"):
            # through step(): the agent ends the episode and the reward is due (the expression
            # runs for ever: a timeout that does not fire hangs, and the hang guard says so)
            await asyncio.wait_for(env.step(Action(RESPOND, content="###STOP###")), 120)
        elapsed = time.monotonic() - t0
    assert elapsed >= REWARD_TIMEOUT_S - 0.1  # killed at the reward timeout, not before
    assert hb.ticks >= 3  # this process's event loop ran while the eval ran elsewhere (a blocked one: 0-1 ticks)
    assert retail_sandbox.kills == kills + 1
    assert not _alive(pid)  # the process that ran the expression is gone: the work really stopped
    # the sandbox restarts and evaluates the next episode normally
    _, reward, reward_info = await _gold_episode(retail, retail_sandbox, "1")
    assert reward == 1.0, reward_info
    assert retail_sandbox.pid not in (None, pid)


async def test_evaluation_runs_in_the_sandbox_process(retail, retail_sandbox, monkeypatch):
    # tau2's evaluator must not be called in this process once a sandbox is given
    import tau2.evaluator.evaluator as ev

    def boom(*a, **k):
        raise AssertionError("evaluate_simulation ran in the test process")

    monkeypatch.setattr(ev, "evaluate_simulation", boom)
    _, reward, _ = await _gold_episode(retail, retail_sandbox, "16")  # has a calculate call
    assert reward == 1.0


async def test_an_evaluator_error_is_a_reward_error_and_keeps_the_sandbox(retail, retail_sandbox):
    env, _, _ = await _gold_episode(retail, retail_sandbox, "16")
    tool_msgs = [m for m in env.messages if getattr(m, "role", None) == "tool"]
    tool_msgs[0].content = json.dumps({"not": "what the tool answered"})  # tau2's replay check fails
    pid, kills = retail_sandbox.pid, retail_sandbox.kills
    with pytest.raises(RewardError, match="tau2 evaluation failed: ValueError"):
        await env.evaluate("user_stop")
    assert retail_sandbox.pid == pid and retail_sandbox.kills == kills


async def test_runaway_replay_in_a_real_episode_is_eval_error(tokenizer):
    """Through the worker: a calculate call that took ~1-5 s at step time (under the step timeout)
    is replayed at reward time past a 1 s reward timeout: the episode is eval_error, promptly."""
    from support.scripted_policy import ScriptedPolicyServer

    from rollout.core.config import load_config
    from rollout.core.records import EpisodeSpec, EpisodeStatus
    from rollout.core.worker import RolloutWorker

    def call(name, **args):
        return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>", "stop"

    def script(eid, step, input_ids):
        # 9**9**7 (about 4.6e7 digits) takes seconds; float() of it then overflows: a tool error
        return [call("calculate", expression="9**9**7"), ("Done.", "eos")][min(step, 1)]

    async with ScriptedPolicyServer(tokenizer, script) as server:
        cfg = load_config(None, [f"policy.router_url={server.url}", "env.step_timeout_s=60", "env.reward_timeout_s=1.0", "env.max_steps=4",
                                 "env.evaluator=tau2"])
        worker = RolloutWorker(cfg.policy, cfg.env, cfg.logging, max_concurrent_episodes=2)
        worker.sandbox._ensure()
        try:
            res = await asyncio.wait_for(worker.run(EpisodeSpec("slow", "retail", "0", "g", 0)), timeout=120)
        finally:
            await worker.close()
    assert res.status is EpisodeStatus.EVAL_ERROR, res.metadata
    assert res.status.is_infrastructure_failure
    # cut by the 1 s reward timeout: the sandbox process that ran the replay was killed (an
    # eval in this process could not have been)
    assert "killed" in res.metadata["error"]
    assert res.metadata["timings"]["reward_s"] >= 1.0 * 0.95, res.metadata["timings"]
    assert worker.sandbox.kills == 1


# -- (b) rewards equal tau2's own, computed in-process ----------------------------------------------
@pytest.mark.parametrize("task_id", ["0", "1", "16", "21"])
async def test_retail_gold_rewards_equal_tau2_in_process(retail, retail_sandbox, task_id):
    env, reward, reward_info = await _gold_episode(retail, retail_sandbox, task_id)
    old_reward, old_info = _old_way(retail, env)
    assert (reward, reward_info) == (old_reward, old_info)
    assert reward == 1.0
    if task_id in ("16", "21"):
        assert "calculate" in _tool_calls(env)


@pytest.mark.parametrize("task_id", ["0", "5", "12"])
async def test_airline_gold_rewards_equal_tau2_in_process(airline, airline_sandbox, task_id):
    env, reward, reward_info = await _gold_episode(airline, airline_sandbox, task_id)
    old_reward, old_info = _old_way(airline, env)
    assert (reward, reward_info) == (old_reward, old_info)
    assert reward == 1.0
    if task_id == "12":
        assert "calculate" in _tool_calls(env)


async def test_failed_trajectories_get_the_same_reward_and_breakdown(retail, retail_sandbox, airline, airline_sandbox):
    # a gold replay missing its first write action: the database differs (reward 0)
    env, reward, reward_info = await _gold_episode(retail, retail_sandbox, "0", skip_first_write=True)
    assert (reward, reward_info) == _old_way(retail, env)
    assert reward == 0.0 and reward_info["db_match"] is False
    # the agent stops without saying the communicate_info
    env = _env(airline, airline_sandbox, "12")
    await env.reset("12")
    for a in airline.tasks["12"].evaluation_criteria.actions:
        await env.step(Action(a.name, dict(a.arguments)))
    res = await env.step(Action(RESPOND, content="###STOP###"))
    assert res.done and res.termination == "agent_stop"
    assert (res.reward, res.reward_info) == _old_way(airline, env, "agent_stop")
