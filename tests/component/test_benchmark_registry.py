"""A third benchmark from the test suite alone: a toy shop (two tasks, one tool, a deterministic
user, its own reward) is defined and registered in this file, and our worker and the seed's agent
run episodes on it through the benchmark registry, against a scripted policy server (real
tokenizer, real chat template, real HTTP). Nothing under ``rollout/`` knows of it.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from support.scripted_policy import ScriptedPolicyServer

from rollout.core.config import TaskSelectionError, load_config
from rollout.core.environment import Action, EnvironmentStepError, StepResult, benchmarks, register_benchmark, unregister_benchmark
from rollout.core.records import EpisodeSpec, EpisodeStatus
from rollout.core.worker import RolloutWorker
from rollout.integrations.seed import Status, TrainableAgent, make_env

STOP = "###STOP###"
COLOURS = {"apple": "red", "sky": "blue", "grass": "green"}  # the shop's database
LOOKUP = {"type": "function", "function": {
    "name": "lookup_colour", "description": "The colour of an item.",
    "parameters": {"type": "object", "properties": {"item": {"type": "string"}}, "required": ["item"]}}}


class ToyUser:
    """Deterministic: asks the task's question, stops at the agent's first answer."""

    def __init__(self, item: str):
        self.item = item

    def opening(self) -> str:
        return f"Hi! What colour is the {self.item}?"

    def reply(self, agent_text: str) -> str:
        return STOP


class ToyEnvironment:
    """One episode: a tool call reads the database; the agent's reply ends the episode, rewarded
    1.0 when it names the task's colour and the agent looked it up."""

    def __init__(self, bench: ToyBenchmark, task_id: str):
        self.bench = bench
        self.task = bench.tasks[task_id]
        self.user = ToyUser(self.task["item"])
        self.looked_up: list[str] = []
        self.timings = {"env_s": 0.0, "tool_s": 0.0, "user_s": 0.0, "reward_s": 0.0}

    async def reset(self, task_id: str) -> tuple[str, dict[str, Any]]:
        if task_id not in self.bench.tasks:
            raise EnvironmentStepError(f"no toy task {task_id!r}")
        return self.user.opening(), {"task_id": task_id, "domain": self.bench.name}

    async def step(self, action: Action) -> StepResult:
        if action.is_respond:
            said = self.task["colour"] in action.content.lower()
            reward = 1.0 if said and self.task["item"] in self.looked_up else 0.0
            return StepResult(self.user.reply(action.content), role="user", done=True, reward=reward, termination="user_stop",
                              reward_info={"said_colour": said, "looked_up": self.looked_up})
        item = str(action.arguments.get("item"))
        if action.name != "lookup_colour" or item not in COLOURS:
            return StepResult(f"Error: no item {item!r}", role="tool", tool_error=True)
        self.looked_up.append(item)
        return StepResult(json.dumps({"item": item, "colour": COLOURS[item]}), role="tool")


class ToyBenchmark:
    """The toy shop behind :class:`rollout.core.environment.Benchmark`."""

    def __init__(self, name: str):
        self.name = name
        self.tasks = {"apple-q": {"item": "apple", "colour": "red"}, "sky-q": {"item": "sky", "colour": "blue"}}
        self.tool_schemas = [LOOKUP]
        self.tool_names = ["lookup_colour"]
        self.closed = False

    @property
    def system_prompt(self) -> str:
        return "You are the toy shop's assistant. Look colours up with lookup_colour before you answer."

    def task_ids(self, split: str, ids: list[str] | None = None) -> list[str]:
        if split != "base":
            raise TaskSelectionError(f"env.task_split: the toy shop has no split {split!r}")
        return list(self.tasks) if ids is None else [str(i) for i in ids]

    def new_actor_sandbox(self, env_cfg, log_level: str = "ERROR"):
        return None  # nothing here runs model-controlled code

    def new_episode(self, env_cfg, task_id: str, *, seed: int = 0, executor=None, sandbox=None) -> ToyEnvironment:
        if task_id not in self.tasks:
            raise KeyError(task_id)
        return ToyEnvironment(self, task_id)

    def close(self) -> None:
        self.closed = True


def load_toy(env_cfg, log_level: str = "ERROR") -> ToyBenchmark:
    return ToyBenchmark(env_cfg.domain)


@pytest.fixture
def toy_cfg():
    """The toy registered as ``toy`` for the test, and a config factory selecting it."""
    register_benchmark("toy", load_toy)

    def cfg(router_url: str):
        base = load_config(None, [f"policy.router_url={router_url}", "env.max_steps=4"])
        return dataclasses.replace(base, env=dataclasses.replace(base.env, benchmark="toy", domain="shop"))

    yield cfg
    unregister_benchmark("toy")
    assert "toy" not in benchmarks()


def _call(item: str) -> str:
    return '<tool_call>\n{"name": "lookup_colour", "arguments": {"item": "%s"}}\n</tool_call>' % item


async def test_the_worker_runs_episodes_of_a_registered_toy_benchmark(tokenizer, toy_cfg):
    prompts: dict[str, list[int]] = {}

    def script(eid, step, input_ids):
        prompts.setdefault(eid, input_ids)
        item = "sky" if "sky" in eid else "apple"
        if step == 0:
            return _call(item), "stop"
        colour = "green" if eid.endswith("wrong") else COLOURS[item]  # the wrong episode names another colour
        return f"The {item} is {colour}.", "eos"

    async with ScriptedPolicyServer(tokenizer, script) as server:
        cfg = toy_cfg(server.url)
        worker = RolloutWorker(cfg.policy, cfg.env, cfg.logging, max_concurrent_episodes=2)
        try:
            assert isinstance(worker.domain, ToyBenchmark) and worker.sandbox is None
            assert worker.settings.system_prompt == worker.domain.system_prompt and worker.settings.tool_names == ("lookup_colour",)
            specs = [EpisodeSpec(f"toy/{tid}", "shop", tid, f"g/{tid}", 0) for tid in worker.domain.task_ids("base")]
            specs.append(EpisodeSpec("toy/sky-q/wrong", "shop", "sky-q", "g/sky-q", 1))
            specs.append(EpisodeSpec("toy/nope", "shop", "no-such-task", "g/nope", 0))
            results = {s.episode_id: await worker.run(s) for s in specs}
            info = worker.info()
        finally:
            await worker.close()
    assert worker.domain.closed  # the worker closes the benchmark it loaded
    assert info["domain"] == "shop" and info["sandbox_kills"] == 0
    for eid in ("toy/apple-q", "toy/sky-q"):
        res = results[eid]
        assert res.status is EpisodeStatus.COMPLETED and res.reward == 1.0, res.metadata
        assert res.metadata["termination_reason"] == "user_stop" and res.metadata["reward_info"]["said_colour"] is True
        roles = [m["role"] for m in res.messages]
        assert roles == ["system", "user", "assistant", "tool", "assistant", "user"], roles
        assert res.messages[-1]["content"] == STOP  # the toy user's last word
        assert json.loads(res.messages[3]["content"])["colour"] in ("red", "blue")
        traj = res.trajectory
        assert traj.response_length == len(traj.loss_mask) == len(traj.rollout_log_probs) and sum(traj.loss_mask) > 0
        # the toy's prompt and tool reached the policy
        first = tokenizer.decode(prompts[eid])
        assert worker.domain.system_prompt in first and "lookup_colour" in first and "What colour is the" in first
    wrong = results["toy/sky-q/wrong"]
    assert wrong.status is EpisodeStatus.COMPLETED and wrong.reward == 0.0 and wrong.metadata["reward_info"]["said_colour"] is False
    nope = results["toy/nope"]  # an unknown task: the benchmark's KeyError, an env_error, before any policy call
    assert nope.status is EpisodeStatus.ENV_ERROR and "no-such-task" in nope.metadata["error"] and "toy/nope" not in prompts


async def test_the_seed_agent_runs_a_registered_toy_benchmark(tokenizer, toy_cfg):
    from rollout.core.environment import load_benchmark

    def script(eid, step, input_ids):
        return (_call("apple"), "stop") if step == 0 else ("It is red.", "eos")

    async with ScriptedPolicyServer(tokenizer, script) as server:
        cfg = toy_cfg(server.url)
        bench = load_benchmark(cfg.env)
        env = make_env(bench, 0, env_cfg=cfg.env)  # an index into the split, as the seed's task_index
        assert (env.task_index, env.wiki, env.tools_info) == ("apple-q", bench.system_prompt, [LOOKUP])
        agent = TrainableAgent(tokenizer=tokenizer)
        res = await agent.asolve(env, {"router_url": server.url}, {"max_new_tokens": 64}, max_num_steps=4)
    assert res.status is Status.COMPLETED and res.episode_status is EpisodeStatus.COMPLETED and res.reward == 1.0, res.info
    assert res.info["domain"] == "shop" and res.info["task_id"] == "apple-q"
    assert res.to_sample().reward == 1.0 and len(res.loss_mask) == res.response_length
