"""The original tau-bench through its adapter (``rollout/benchmarks/tau_bench/``), tested against the
stand-in package ``tests/support/tau_bench_standin/tau_bench`` (tau-bench's interface, a tiny shop of its
own; the real package is not installable here, see docs/domains.md).

What runs is real: the stand-in's environments, tools, data, reward and user simulators, our
episode loop and worker, the local server with its gold-replay backend. The only replaced part is
litellm's network call in the user-simulator failure test (importing litellm takes 10+ s here).
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import re
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from rollout.benchmarks.tau2.user import STOP
from rollout.core.config import ConfigError, load_config
from rollout.core.environment import Action, EnvironmentStepError, RewardError, ToolTimeoutError, UserSimulatorError
from rollout.core.episode import run_episode
from rollout.core.records import EpisodeSpec, EpisodeStatus
from rollout.core.settings import EpisodeSettings

STANDIN = str(Path(__file__).resolve().parents[1] / "support" / "tau_bench_standin")
INSTALL = "pip install git+https://github.com/sierra-research/tau-bench"
_ENDPOINT_VARS = ("OPENAI_BASE_URL", "OPENAI_API_BASE", "USER_MODEL_API_BASE", "OPENAI_API_KEY")


def _purge_tau_bench() -> None:
    for name in [m for m in sys.modules if m == "tau_bench" or m.startswith("tau_bench.")]:
        del sys.modules[name]
    importlib.invalidate_caches()


@pytest.fixture
def standin(monkeypatch):
    """The stand-in on sys.path (and on PYTHONPATH, for the tool sandbox's child process), removed
    afterwards; litellm's endpoint variables and the adapter's endpoint restored."""
    from rollout.benchmarks.tau_bench import environment as tau_bench_env

    monkeypatch.syspath_prepend(STANDIN)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (STANDIN, os.environ.get("PYTHONPATH", "")) if p))
    for var in _ENDPOINT_VARS:  # set then deleted: monkeypatch restores the original state, absent included
        monkeypatch.setenv(var, "")
        monkeypatch.delenv(var)
    monkeypatch.setattr(tau_bench_env, "_ENDPOINT", None)
    _purge_tau_bench()
    yield tau_bench_env
    _purge_tau_bench()


@pytest.fixture
def no_tau_bench(monkeypatch):
    """tau_bench is not importable (whatever the machine has installed)."""
    _purge_tau_bench()
    monkeypatch.setattr(sys, "path", [p for p in sys.path if "tau_bench" not in p])
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name.split(".")[0] == "tau_bench" else real_find_spec(name, *a))
    yield
    _purge_tau_bench()


def _cfg(*overrides: str):
    return load_config(None, ["env.benchmark=tau_bench", "env.domain=retail", "local.enabled=false",
                              "policy.router_url=http://127.0.0.1:9", *overrides])


def _gold_steps(domain, tid: str) -> list[Action]:
    return [Action(a.name, dict(a.kwargs)) for a in domain.tasks[tid].actions]


# -- the domain ----------------------------------------------------------------------------------------
def test_domain_exposes_tau_bench_tasks_splits_policy_and_tools(standin):
    dom = standin.make_domain(_cfg().env)
    assert isinstance(dom, standin.TauBenchDomain) and dom.benchmark == "tau_bench"
    assert dom.splits == {"test": ["test-0", "test-1"], "train": ["train-0"], "dev": ["dev-0"],
                          "base": ["test-0", "test-1", "train-0", "dev-0"]}
    import tau_bench.envs.retail.wiki as wiki

    assert dom.system_prompt == wiki.WIKI  # the wiki is the agent's prompt, as in tau-bench's agents
    assert dom.tool_names == ["find_user_by_email", "get_order", "cancel_order", "update_order_address", "calculate", "transfer_to_human_agents"]
    assert all(s["type"] == "function" and s["function"]["parameters"]["type"] == "object" for s in dom.tool_schemas)
    assert dom.terminate_tools == ["transfer_to_human_agents"]
    assert dom.tasks["test-1"].outputs == ["54.0"]
    assert dom.task_ids("test", ["1", "dev-0"]) == ["test-1", "dev-0"]  # bare indices in the configured split
    with pytest.raises(KeyError, match="no split 'full'"):
        dom.task_ids("full")
    with pytest.raises(KeyError, match="test-7"):
        dom.task_ids("base", ["test-7"])
    with pytest.raises(standin.UnknownTauBenchDomain, match="env.domain: tau-bench has no environment 'telecom'"):
        standin.make_domain(_cfg("env.domain=telecom").env)


def test_config_validates_the_benchmark_key():
    assert load_config(None, ["local.enabled=true"]).env.benchmark == "tau2"
    with pytest.raises(ConfigError, match="env.benchmark"):
        load_config(None, ["local.enabled=true", "env.benchmark=tau3"])
    # tau-bench's environments are not tau2's registry: checked when the domain loads, not here
    assert load_config(None, ["local.enabled=true", "env.benchmark=tau_bench", "env.domain=some_env", "env.task_split=dev"]).env.domain == "some_env"
    with pytest.raises(ConfigError, match="env.domain"):
        load_config(None, ["local.enabled=true", "env.benchmark=tau_bench", "env.domain= "])


# -- episodes on the adapter -----------------------------------------------------------------------------
async def test_gold_trajectories_earn_tau_bench_rewards_and_wrong_ones_do_not(standin):
    cfg = _cfg()
    dom = standin.make_domain(cfg.env)
    # data check: replaying the gold writes matches the gold data hash
    env = dom.new_episode(cfg.env)
    obs, info = await env.reset("test-0")
    assert obs == "Hi! " + dom.tasks["test-0"].instruction and info["split"] == "test" and info["task_index"] == 0
    for a in _gold_steps(dom, "test-0"):
        res = await env.step(a)
        assert not res.done and res.reward == 0.0 and res.role == "tool" and not res.tool_error
    res = await env.step(Action("respond", content="Is there anything else?"))
    assert not res.done and res.role == "user" and "Yes, please go ahead." in res.observation
    res = await env.step(Action("respond", content="Your order is cancelled."))
    assert (res.observation, res.reward, res.done, res.termination) == (STOP, 1.0, True, "user_stop")
    assert res.reward_info["db_match"] is True and res.reward_info["gold_actions"] == 3
    assert set(env.timings) == {"env_s", "tool_s", "user_s", "reward_s"} and env.timings["reward_s"] > 0

    # outputs check: the answer must be said; the same trajectory without it earns 0
    for said, expected in (("With the discount it is 54.0 dollars.", 1.0), ("I cannot tell.", 0.0)):
        env = dom.new_episode(cfg.env)
        await env.reset("test-1")
        for a in _gold_steps(dom, "test-1"):
            await env.step(a)
        res = await env.step(Action("respond", content=said))
        assert res.done and res.reward == expected and res.reward_info["outputs"] == {"54.0": bool(expected)}

    # a missing write: the data hash differs
    env = dom.new_episode(cfg.env)
    await env.reset("test-0")
    await env.step(Action("get_order", {"order_id": "#1001"}))
    res = await env.step(Action("respond", content="Done."))
    assert res.done and res.reward == 0.0 and res.reward_info["db_match"] is False

    # a terminate tool ends the episode (transfer), rewarded by tau-bench
    env = dom.new_episode(cfg.env)
    await env.reset("dev-0")
    res = await env.step(_gold_steps(dom, "dev-0")[0])
    assert (res.observation, res.reward, res.done, res.termination, res.role) == ("Transfer successful", 1.0, True, "transfer", "tool")


async def test_a_tool_that_raises_is_an_observation_not_an_error(standin):
    cfg = _cfg()
    env = standin.make_domain(cfg.env).new_episode(cfg.env)
    await env.reset("test-0")
    res = await env.step(Action("get_order", {"order_id": "#9999"}))  # the tool raises KeyError
    assert res.observation == "Error: '#9999'" and res.tool_error is True and not res.done
    res = await env.step(Action("get_order", {"order_id": "#1001", "verbose": True}))  # a bad argument
    assert res.observation.startswith("Error:") and "verbose" in res.observation and res.tool_error is True and not res.done
    res = await env.step(Action("get_order", {"order_id": "#1001"}))  # the episode goes on
    assert json.loads(res.observation)["status"] == "pending" and res.tool_error is False


def _settings(dom) -> EpisodeSettings:
    return EpisodeSettings(max_steps=5, max_new_tokens=64, max_context_tokens=4096, on_parse_error="feedback",
                           system_prompt=dom.system_prompt, tool_names=tuple(dom.tool_names))


async def _episode_status(env, dom, task_id: str):
    """Our episode loop on ``env``; these failures happen at reset, before any policy call."""
    spec = EpisodeSpec(episode_id="e0", domain="retail", task_id=task_id, group_id="g", sample_index=0)
    return await run_episode(spec, env, policy=None, chat=None, settings=_settings(dom))


async def test_reset_of_an_unknown_task_and_an_env_crash_are_env_error(standin, monkeypatch):
    cfg = _cfg()
    dom = standin.make_domain(cfg.env)
    with pytest.raises(EnvironmentStepError, match="not a task of tau-bench retail"):
        await dom.new_episode(cfg.env).reset("test-99")
    res = await _episode_status(dom.new_episode(cfg.env), dom, "test-99")
    assert res.status is EpisodeStatus.ENV_ERROR and res.status.is_infrastructure_failure

    # the environment's own code fails: its data cannot be read
    import tau_bench.envs.retail.data as data

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(data, "DATA_PATH", data.DATA_PATH + ".missing")
        res = await _episode_status(dom.new_episode(cfg.env), dom, "test-0")
    assert res.status is EpisodeStatus.ENV_ERROR and "FileNotFoundError" in res.metadata["error"], res.metadata

    # a crash inside tau-bench's step (not a tool's: those are observations)
    from tau_bench.envs.base import Env

    env = dom.new_episode(cfg.env)
    await env.reset("test-0")

    def broken_step(self, action):
        raise RuntimeError("corrupted state")

    monkeypatch.setattr(Env, "step", broken_step)
    with pytest.raises(EnvironmentStepError, match="RuntimeError: corrupted state"):
        await env.step(Action("get_order", {"order_id": "#1001"}))


async def test_reward_failure_and_reward_timeout_are_eval_errors(standin, monkeypatch):
    cfg = _cfg("env.reward_timeout_s=0.5")
    dom = standin.make_domain(cfg.env)
    from tau_bench.envs.base import Env

    def broken_hash(self):
        raise ValueError("unhashable data")

    monkeypatch.setattr(Env, "get_data_hash", broken_hash)
    env = dom.new_episode(cfg.env)
    await env.reset("test-0")
    with pytest.raises(RewardError, match="reward failed: ValueError: unhashable data"):
        await env.step(Action("respond", content="Goodbye."))

    release, returned = threading.Event(), threading.Event()

    def slow_hash(self):
        release.wait(60)
        returned.set()
        return "x"

    monkeypatch.setattr(Env, "get_data_hash", slow_hash)
    threads = ThreadPoolExecutor(2)  # not the loop's: its slow thread is not waited for at the end
    try:
        env = dom.new_episode(cfg.env, executor=threads)
        await env.reset("test-0")
        with pytest.raises(RewardError, match="took over 0.5s"):
            await env.step(Action("respond", content="Goodbye."))
        assert not returned.is_set()  # cut while the hash still ran, not waited out (60 s)
        with pytest.raises(EnvironmentStepError, match="refused"):  # its thread may still run: no more calls
            await env.step(Action("respond", content="Hello?"))
    finally:
        release.set()
        threads.shutdown(wait=False)


async def test_user_simulator_failures_are_user_errors(standin, monkeypatch):
    """tau-bench's own llm user (its load_user, its LLMUserSimulationEnv) whose litellm call fails or
    hangs; the user key variable missing."""
    import tau_bench.envs.user as tb_user

    calls = []

    def refused(**kwargs):
        calls.append(kwargs)
        raise ConnectionError("Connection refused")

    monkeypatch.setattr(tb_user, "completion", refused)
    cfg = _cfg("env.user.kind=llm", "env.user.base_url=http://127.0.0.1:9/v1", "env.user.model=user-sim", "env.user.timeout_s=0.5")
    dom = standin.make_domain(cfg.env)
    res = await _episode_status(dom.new_episode(cfg.env), dom, "test-0")
    assert res.status is EpisodeStatus.USER_ERROR and "ConnectionError: Connection refused" in res.metadata["error"], res.metadata
    assert calls and calls[0]["model"] == "user-sim" and calls[0]["custom_llm_provider"] == "openai"
    # tau-bench's users pass no endpoint: it reaches litellm through its environment variables
    assert os.environ["OPENAI_BASE_URL"] == os.environ["OPENAI_API_BASE"] == "http://127.0.0.1:9/v1"

    release, returned = threading.Event(), threading.Event()

    def hangs(**kwargs):
        release.wait(60)
        returned.set()
        raise ConnectionError("too late")

    monkeypatch.setattr(tb_user, "completion", hangs)
    threads = ThreadPoolExecutor(2)
    try:
        with pytest.raises(UserSimulatorError, match=r"took over 0.5s \(env.user.timeout_s\)"):
            await dom.new_episode(cfg.env, executor=threads).reset("test-0")
        assert not returned.is_set()  # cut while the call still hung, not waited out (60 s)
    finally:
        release.set()
        threads.shutdown(wait=False)

    monkeypatch.delenv("TB_USER_KEY", raising=False)
    keyed = _cfg("env.user.kind=llm", "env.user.base_url=http://127.0.0.1:9/v1", "env.user.model=user-sim", "env.user.api_key_env=TB_USER_KEY")
    with pytest.raises(UserSimulatorError, match="TB_USER_KEY"):
        await dom.new_episode(keyed.env).reset("test-0")


async def test_a_slow_tool_is_a_tool_timeout(standin, monkeypatch):
    cfg = _cfg("env.step_timeout_s=0.5")
    dom = standin.make_domain(cfg.env)
    from tau_bench.envs.retail.tools.orders import GetOrder

    real = GetOrder.invoke

    release, returned = threading.Event(), threading.Event()

    def slow(data, order_id):
        release.wait(60)
        returned.set()
        return real(data, order_id)

    monkeypatch.setattr(GetOrder, "invoke", staticmethod(slow))
    threads = ThreadPoolExecutor(2)
    try:
        env = dom.new_episode(cfg.env, executor=threads)
        await env.reset("test-0")
        with pytest.raises(ToolTimeoutError, match="tool get_order ran longer than 0.5s"):
            await env.step(Action("get_order", {"order_id": "#1001"}))
        assert not returned.is_set()  # cut while the tool still ran, not waited out (60 s)
    finally:
        release.set()
        threads.shutdown(wait=False)


async def test_runaway_calculator_is_killed_in_the_sandbox_and_the_loop_keeps_running(standin):
    cfg = _cfg("env.step_timeout_s=1.5")
    dom = standin.make_domain(cfg.env)
    sandbox = dom.new_sandbox()
    try:
        sandbox.start()  # start-up (a spawn and an import) is not part of any call
        env = dom.new_episode(cfg.env, sandbox=sandbox)
        await env.reset("test-1")
        assert (await env.step(Action("calculate", {"expression": "(40 + 20) * 0.9"}))).observation == "54.0"
        pid = sandbox.pid
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.05)
                ticks += 1

        tick = asyncio.ensure_future(ticker())
        t0 = time.monotonic()
        with pytest.raises(ToolTimeoutError, match=r"tool calculate ran longer than 1.5s \(.*\) and was killed"):
            # the expression alone would run for ever: a timeout that does not fire hangs here
            await asyncio.wait_for(env.step(Action("calculate", {"expression": "9**9**9**9"})), 120)  # passes the character filter
        elapsed = time.monotonic() - t0
        tick.cancel()
        assert elapsed >= 1.5  # cut at 1.5 s, not before
        assert ticks >= 2  # the event loop ran while the sandbox computed (a blocked one: 0-1 ticks)
        assert sandbox.kills == 1
        with pytest.raises(ProcessLookupError):  # the work really stopped
            os.kill(pid, 0)
    finally:
        sandbox.close()


# -- the package missing ---------------------------------------------------------------------------------
def test_missing_package_is_one_line_with_the_install_command(no_tau_bench, tmp_path, capsys):
    from rollout.app import cli
    from rollout.app.preflight import PreflightError, check_benchmark, run_preflight
    from rollout.benchmarks.tau_bench import environment as tau_bench_env
    from rollout.core.worker import RolloutWorker

    cfg = _cfg(f"rollout.output_dir={tmp_path / 'out'}")
    with pytest.raises(tau_bench_env.TauBenchNotInstalled) as e:
        tau_bench_env.make_domain(cfg.env)
    msg = str(e.value)
    assert "\n" not in msg and msg.endswith(INSTALL) and "env.benchmark=tau_bench" in msg
    with pytest.raises(tau_bench_env.TauBenchNotInstalled, match=re.escape(INSTALL)):  # an actor's start
        RolloutWorker(cfg.policy, cfg.env, cfg.logging)
    for check in (check_benchmark, run_preflight):
        with pytest.raises(PreflightError) as e:
            check(cfg)
        assert str(e.value) == msg
    check_benchmark(load_config(None, ["local.enabled=true"]))  # tau2 needs no tau_bench

    # the CLI: one line, exit 2, before anything starts
    code = cli.main(["run", "--no-progress", "--config", str(Path(__file__).resolve().parents[2] / "configs" / "local.yaml"),
                     "env.benchmark=tau_bench", f"rollout.output_dir={tmp_path / 'cli'}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1] == f"error: {msg}", err


# -- the whole episode loop with the local gold replay ---------------------------------------------------
async def test_worker_with_gold_replay_earns_full_reward_on_every_standin_task(standin, tokenizer):
    """The local server's gold-replay backend indexes tau-bench's tasks (``--domain
    tau_bench:retail``), and our worker's episode loop (token in / token out) against it earns
    tau-bench's reward 1.0 on every task; skipping a gold write earns 0 where the task writes."""
    from support.inprocess import serve

    from rollout.core.worker import RolloutWorker
    from rollout.devtools.local.gold import GoldReplayBackend

    assert standin.stack_domain(_cfg().env) == "tau_bench:retail"
    results = {}
    for skip_write in (False, True):
        backend = GoldReplayBackend(standin.stack_domain(_cfg().env), tokenizer, skip_write=skip_write)
        async with serve(backend, tokenizer) as (url, _):
            cfg = _cfg(f"policy.router_url={url}", "env.max_steps=10")
            worker = RolloutWorker(cfg.policy, cfg.env, cfg.logging, max_concurrent_episodes=4)
            assert worker.settings.tool_names == tuple(worker.domain.tool_names) and worker.settings.system_prompt == worker.domain.policy
            # the wrong policy on one task that writes and one that does not
            tids = ["test-0", "dev-0"] if skip_write else worker.domain.task_ids("base")
            specs = [EpisodeSpec(f"{skip_write}/{tid}", "retail", tid, f"g/{tid}", 0) for tid in tids]
            try:
                results[skip_write] = await asyncio.wait_for(asyncio.gather(*[worker.run(s) for s in specs]), timeout=120)
            finally:
                await worker.close()
    for res in results[False]:
        assert res.status is EpisodeStatus.COMPLETED and res.reward == 1.0, (res.spec.task_id, res.metadata)
        traj = res.trajectory
        assert len(traj.loss_mask) == len(traj.rollout_log_probs) == traj.response_length and sum(traj.loss_mask) > 0
        assert res.metadata["requests"] >= 1 and res.metadata["tool_errors"] == 0
    by_task = {r.spec.task_id: r for r in results[False]}
    assert by_task["dev-0"].metadata["termination_reason"] == "transfer"
    assert by_task["test-1"].metadata["reward_info"]["outputs"] == {"54.0": True}
    tool_calls = [m for m in by_task["test-0"].messages if m["role"] == "tool"]
    assert len(tool_calls) == 3 and by_task["test-0"].metadata["termination_reason"] == "user_stop"
    skipped = {r.spec.task_id: r.reward for r in results[True]}
    assert all(r.status is EpisodeStatus.COMPLETED for r in results[True])
    # test-0 cancels an order: without that write it earns 0; dev-0 writes nothing
    assert skipped == {"test-0": 0.0, "dev-0": 1.0}


@pytest.mark.extended  # about 45 s (Ray, the local stack); CI runs test_worker_with_gold_replay_earns_full_reward_on_every_standin_task
@pytest.mark.ray
def test_main_job_on_the_standin_earns_full_reward(tmp_path):
    """``python -m rollout run ... env.benchmark=tau_bench env.domain=retail`` with the stand-in on
    PYTHONPATH: the local stack's gold replay (``--domain tau_bench:retail``), a Ray actor, our
    episode loop; every episode completes with tau-bench's reward 1.0."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (STANDIN, os.environ.get("PYTHONPATH", "")) if p))
    out = tmp_path / "job"
    proc = subprocess.run([sys.executable, "-m", "rollout", "run", "--no-progress", "--config", str(root / "configs" / "local.yaml"),
                           "env.benchmark=tau_bench", "env.domain=retail", "pool.num_actors=1", f"rollout.output_dir={out}"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["status_counts"] == {"completed": 8}  # 4 tasks x 2 samples
    assert summary["mean_reward_per_domain"] == {"retail": 1.0}
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert sorted({s["metadata"]["task_id"] for s in samples}) == ["dev-0", "test-0", "test-1", "train-0"]
