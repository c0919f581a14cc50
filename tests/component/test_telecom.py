"""tau2 telecom (dual control) through our environment.

* Rewards: gold trajectories (the agent's and the user's gold actions, interleaved in the gold
  order, played through :class:`Tau2Environment` with the scripted user replaying the user's
  side through its tools, the reward computed as in production: tau2's evaluator in the sandbox
  process) earn exactly what tau2's ``evaluate_simulation``, called here in-process on the same
  messages, gives: reward, breakdown, action checks; every environment assertion met. CI plays a
  spread of base tasks (every shape of trajectory); the extended test plays all 114.
* A user tool call runs in the user's side of the episode's environment, in the domain's tool
  threads (not on the event loop), is recorded for the evaluator and never shown to the agent;
  one that hangs is cut at ``env.step_timeout_s`` while the event loop runs on.
* The LLM user gets the user's tools (OpenAI tool calling) and tau2's tool-using guidelines.
* End to end: episodes on telecom against the local stack (gold replay behind the real router,
  scripted user) earn 1.0.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from aiohttp import web

from rollout.benchmarks.tau2.environment import Tau2Domain, Tau2Environment
from rollout.benchmarks.tau2.user import LLMUser, ScriptedUser, case_reference, gold_segments
from rollout.core.config import EnvConfig, UserConfig, load_config
from rollout.core.environment import RESPOND, Action, EnvironmentStepError, StepResult

DONE = "Your request has been completed."


@pytest.fixture(scope="module")
def telecom():
    return Tau2Domain("telecom")


@pytest.fixture(scope="module")
def telecom_sandbox(telecom):
    sb = telecom.new_sandbox(evaluator=True)
    sb._ensure()  # start-up (tau2 and its evaluator imported) outside the episodes
    yield sb
    sb.close()


def _shape(task) -> tuple[str, ...]:
    return tuple(who for who, _ in gold_segments(task))


def _spread(telecom) -> list[str]:
    """Base tasks covering every shape of gold trajectory: agent actions only (with the ACTION
    reward basis), user actions only, user first then agent, agent first then user, three or more
    hand-overs, a transfer to a human agent."""
    tasks = [telecom.tasks[i] for i in telecom.task_ids("base")]
    wanted = [
        lambda t: _shape(t) == ("assistant",),
        lambda t: _shape(t) == ("user",),
        lambda t: _shape(t)[:2] == ("user", "assistant"),
        lambda t: _shape(t)[:2] == ("assistant", "user"),
        lambda t: _shape(t).count("user") >= 3,
        lambda t: any(a.name == "transfer_to_human_agents" for a in t.evaluation_criteria.actions or []),
    ]
    picked: list[str] = []
    for pred in wanted:
        picked.append(next(t.id for t in tasks if pred(t) and t.id not in picked))
    return picked


async def _gold_episode(telecom, sandbox, task_id: str, **cfg):
    """The gold trajectory of ``task_id`` through our environment: the agent's gold actions as
    tool calls, and before each run of the user's gold actions a hand-over message, which the
    scripted user answers by replaying that run through its tools; then the closing message
    (the user stops), unless the agent transferred. Returns ``(env, the last StepResult, observations)``."""
    task = telecom.tasks[task_id]
    env = Tau2Environment(telecom, ScriptedUser(task), EnvConfig(domain="telecom", **cfg), sandbox=sandbox)
    opening, _ = await env.reset(task_id)
    observations = [opening]
    for who, acts in gold_segments(task):
        if who == "user":
            res = await env.step(Action(RESPOND, content="Please do this on your phone: " + ", ".join(n for n, _ in acts)))
            assert not res.done and res.role == "user", res.observation
            observations.append(res.observation)
            continue
        for name, args in acts:
            res = await env.step(Action(name, dict(args)))
            assert not res.tool_error, (name, res.observation)
            observations.append(res.observation)
            if res.done:
                assert name == "transfer_to_human_agents" and res.termination == "transfer"
                return env, res, observations
    res = await env.step(Action(RESPOND, content=DONE))
    assert res.done and res.termination == "user_stop"
    return env, res, observations


def _tau2_reward(env: Tau2Environment):
    """tau2's own ``evaluate_simulation`` (``EvaluationType.ALL``), here, on the episode's messages."""
    from tau2.data_model.simulation import SimulationRun, TerminationReason
    from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation

    reason = TerminationReason.AGENT_STOP if env.termination == "agent_stop" else TerminationReason.USER_STOP
    sim = SimulationRun(id="t", task_id=env.task.id, start_time="0", end_time="1", duration=1.0, termination_reason=reason,
                        messages=list(env.messages))
    return evaluate_simulation(sim, env.task, EvaluationType.ALL, solo_mode=False, domain="telecom")


def _check_against_tau2(env, res: StepResult) -> None:
    ri = _tau2_reward(env)
    got = res.reward_info
    assert res.reward == ri.reward == 1.0, (env.task.id, got, ri)
    assert got["reward_breakdown"] == {k.value: float(v) for k, v in ri.reward_breakdown.items()}
    assert got["action_match"] == ([c.action_match for c in ri.action_checks] if ri.action_checks else None)
    assert got["db_match"] == (ri.db_check.db_match if ri.db_check is not None else None)
    criteria = env.task.evaluation_criteria
    assert len(ri.env_assertions) == len(criteria.env_assertions) and all(a.met for a in ri.env_assertions)
    # the user's gold actions are in the trajectory as the user's own calls, in the gold order
    user_calls = [(tc.name, tc.arguments) for m in env.messages if m.role == "user" and m.tool_calls for tc in m.tool_calls
                  if tc.requestor == "user"]
    assert user_calls == [(a.name, a.arguments) for a in criteria.actions or [] if a.requestor == "user"]
    assert env.fast is False  # telecom takes tau2's path (a TelecomEnvironment with user tools)


async def test_gold_rewards_equal_tau2_on_a_spread_of_telecom_tasks(telecom, telecom_sandbox):
    ids = _spread(telecom)
    assert len(ids) == 6
    assert not telecom.fast.enabled
    for tid in ids:
        env, res, _ = await _gold_episode(telecom, telecom_sandbox, tid)
        _check_against_tau2(env, res)


@pytest.mark.extended  # every base task (45-70 s here, with the sandbox start); CI runs test_gold_rewards_equal_tau2_on_a_spread_of_telecom_tasks
async def test_gold_rewards_equal_tau2_on_every_telecom_base_task(telecom, telecom_sandbox):
    ids = telecom.task_ids("base")
    assert len(ids) == 114
    for tid in ids:
        env, res, _ = await _gold_episode(telecom, telecom_sandbox, tid)
        _check_against_tau2(env, res)


async def test_a_wrong_user_side_earns_what_tau2_gives(telecom, telecom_sandbox):
    """The agent hands over, but the user's gold actions are never done (the agent closes at once):
    tau2's reward (the environment assertions fail) and ours agree, and it is not 1."""
    tid = next(t for t in telecom.task_ids("base") if _shape(telecom.tasks[t]) == ("user",))
    task = telecom.tasks[tid]
    env = Tau2Environment(telecom, ScriptedUser(task), EnvConfig(domain="telecom"), sandbox=telecom_sandbox)
    await env.reset(tid)
    res = await env.step(Action(RESPOND, content=DONE + " ###STOP###"))
    assert res.done and res.termination == "agent_stop"
    ri = _tau2_reward(env)
    assert res.reward == ri.reward == 0.0
    assert res.reward_info["reward_breakdown"] == {k.value: float(v) for k, v in ri.reward_breakdown.items()}


def test_telecom_splits_are_tau2s(telecom):
    assert {"train", "test", "base", "small", "full"} <= set(telecom.splits)
    assert len(telecom.task_ids("base")) == 114 and len(telecom.task_ids("full")) == 2285
    assert load_config(None, ["local.enabled=true", "env.domain=telecom", "env.task_split=full"]).env.task_split == "full"
    with pytest.raises(KeyError, match=r"env.task_split: domain telecom has no split 'dev' \(has .*'full'"):
        telecom.task_ids("dev")
    assert len({case_reference(t) for t in telecom.tasks}) == len(telecom.tasks)  # the scripted user's case numbers


def _first_with_user_actions(telecom) -> str:
    return next(t for t in telecom.task_ids("base") if _shape(telecom.tasks[t])[0] == "user")


async def test_user_tool_calls_run_in_the_users_environment_off_the_loop(telecom):
    tid = _first_with_user_actions(telecom)
    task = telecom.tasks[tid]
    block = gold_segments(task)[0][1]
    env = Tau2Environment(telecom, ScriptedUser(task), EnvConfig(domain="telecom"))
    opening, _ = await env.reset(tid)
    assert case_reference(tid) in opening
    toolkit = env._env.user_tools
    threads: list[str] = []
    for name in dict.fromkeys(n for n, _ in block):  # record where each of the block's tools runs, then run tau2's own
        real = getattr(toolkit, name)

        def recording(*args, _real=real, **kwargs):
            threads.append(threading.current_thread().name)
            return _real(*args, **kwargs)

        setattr(toolkit, name, recording)
    user_db_before = env._env.get_user_db_hash()
    agent_db_before = env._env.get_db_hash()
    n_messages = len(env.messages)
    res = await env.step(Action(RESPOND, content="Please check your phone."))
    assert not res.done and res.role == "user" and res.reward == 0.0
    assert len(threads) == len(block) and all(t.startswith("telecom-db-tools") for t in threads), threads
    assert threading.current_thread().name not in threads
    assert env._env.get_user_db_hash() != user_db_before  # the user's phone changed
    assert env._env.get_db_hash() == agent_db_before  # the agent's side did not
    # tau2's trajectory: the agent's message, each user call and its result (requestor "user"), the user's text
    new = env.messages[n_messages:]
    assert [m.role for m in new] == ["assistant"] + ["user", "tool"] * len(block) + ["user"]
    calls = [m.tool_calls[0] for m in new[1:-1:2]]
    assert [(c.name, c.requestor) for c in calls] == [(n, "user") for n, _ in block]
    assert all(m.requestor == "user" and not m.error for m in new[2:-1:2])
    # the agent sees the user's text only, never the calls
    assert res.observation == new[-1].content and not new[-1].tool_calls
    assert env.user_tool_calls == len(block) and env.timings["user_tool_s"] > 0
    assert not any(env._env.tools.has_tool(n) for n, _ in block)  # user tools are not the agent's


async def test_a_user_tool_that_hangs_is_cut_at_the_step_timeout_and_the_loop_runs_on(telecom):
    tid = _first_with_user_actions(telecom)
    task = telecom.tasks[tid]
    name = gold_segments(task)[0][1][0][0]
    env = Tau2Environment(telecom, ScriptedUser(task), EnvConfig(domain="telecom", step_timeout_s=0.5))
    await env.reset(tid)
    release, returned = threading.Event(), threading.Event()

    def hang(**kwargs):  # a user tool stuck in environment code
        release.wait(60)
        returned.set()
        return "too late"

    setattr(env._env.user_tools, name, hang)
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    tick_task = asyncio.create_task(ticker())
    n_messages = len(env.messages)
    t0 = time.monotonic()
    try:
        with pytest.raises(EnvironmentStepError, match=rf"user tool '{name}' ran longer than 0.5s"):
            await env.step(Action(RESPOND, content="Please check your phone."))
        elapsed = time.monotonic() - t0
        assert not returned.is_set()  # cut while the tool still hung, not waited out (60 s)
    finally:
        release.set()
        tick_task.cancel()
    assert elapsed >= 0.45  # cut at 0.5 s, not before
    assert ticks >= 2  # the event loop kept running while the tool hung (a blocked one: 0-1)
    assert [m.role for m in env.messages[n_messages:]] == ["assistant"]  # the hung call is not recorded


class _ToolCallingUserLLM:
    """An OpenAI-compatible chat endpoint playing a user with tools: while the last message is
    not a tool result it calls ``check_status_bar``; then it answers with what the tool said."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.url = ""
        self._n = 0

    async def chat(self, req: web.Request) -> web.Response:
        body = await req.json()
        self.requests.append(body)
        self._n += 1
        last = body["messages"][-1]
        if last["role"] == "tool":
            message = {"role": "assistant", "content": f"My status bar says: {last['content']}"}
        else:
            message = {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"call_{self._n}", "type": "function", "function": {"name": "check_status_bar", "arguments": "{}"}}]}
        return web.json_response({"id": f"c{self._n}", "object": "chat.completion", "created": 1, "model": "sim",
                                  "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                                  "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})

    async def __aenter__(self):
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        self._runner = web.AppRunner(app, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/v1"
        return self

    async def __aexit__(self, *exc):
        await self._runner.cleanup()


async def test_the_llm_user_gets_the_users_tools(telecom):
    from tau2.user.user_simulator import get_global_user_sim_guidelines

    tid = _first_with_user_actions(telecom)
    async with _ToolCallingUserLLM() as llm:
        cfg = UserConfig(kind="llm", base_url=llm.url, model="sim", timeout_s=10.0, max_retries=0)
        user = LLMUser(telecom.tasks[tid], cfg)
        env = Tau2Environment(telecom, user, EnvConfig(domain="telecom", user=cfg))
        opening, _ = await env.reset(tid)  # the user checks its phone before it speaks
        res = await env.step(Action(RESPOND, content="What does your status bar show?"))
    assert opening.startswith("My status bar says: ") and res.observation.startswith("My status bar says: ") and not res.done
    first = llm.requests[0]
    assert [t["function"]["name"] for t in first["tools"]] == [s["function"]["name"] for s in telecom.user_tool_schemas]
    assert get_global_user_sim_guidelines(use_tools=True) in first["messages"][0]["content"]
    second = llm.requests[1]["messages"]
    assert second[-2]["tool_calls"][0]["function"]["name"] == "check_status_bar"
    assert second[-1]["role"] == "tool" and second[-1]["tool_call_id"] == "call_1" and "Status Bar" in second[-1]["content"]
    user_calls = [m.tool_calls[0] for m in env.messages if m.role == "user" and m.tool_calls]
    assert [(c.name, c.requestor) for c in user_calls] == [("check_status_bar", "user")] * 2
    assert user.tool_calls == 2 and len(llm.requests) == 4


@pytest.fixture(scope="module")
def telecom_stack(tmp_path_factory):
    from conftest import _stack

    stack = _stack("gold_replay", "telecom", tmp_path_factory)
    yield stack
    stack.stop()


@pytest.mark.slow
async def test_telecom_episodes_on_the_local_stack_earn_full_reward(telecom, telecom_stack):
    from rollout.core.pool import make_specs
    from rollout.core.worker import RolloutWorker

    tasks = {t: telecom.tasks[t] for t in telecom.task_ids("base")}
    interleaved = next(t for t, task in tasks.items() if _shape(task).count("user") >= 2 and "assistant" in _shape(task))
    transfer = next(t for t, task in tasks.items() if any(a.name == "transfer_to_human_agents" for a in task.evaluation_criteria.actions or []))
    cfg = load_config(None, [f"policy.router_url={telecom_stack.router_url}", "env.domain=telecom"])
    worker = RolloutWorker(cfg.policy, cfg.env, cfg.logging)
    try:
        results = await asyncio.gather(*[worker.run(s) for s in make_specs("telecom", [interleaved, transfer], 1)])
    finally:
        await worker.close()
    for res in results:
        assert res.status.value == "completed" and res.reward == 1.0, res.metadata
        agent_calls = [m for m in res.messages if m["role"] == "assistant" and m.get("tool_calls")]
        tool_results = [m for m in res.messages if m["role"] == "tool"]
        assert len(tool_results) == len(agent_calls)  # the agent saw its own tool results only
        names = {m["tool_calls"][0]["function"]["name"] for m in agent_calls}
        assert not names & {s["function"]["name"] for s in telecom.user_tool_schemas}
    inter = results[0]
    assert inter.metadata["termination_reason"] == "user_stop"
    assert inter.metadata["timings"]["user_tool_s"] > 0
    assert results[1].metadata["termination_reason"] == "transfer"
