"""Re-grading journaled episodes (``python -m rollout regrade``, :mod:`rollout.app.regrade`,
:mod:`rollout.benchmarks.tau2.regrade`) on real retail episodes (gold replay through the real
sglang-router, and a scripted policy for a parse error and an agent that stops), no Ray.

* The conversation rebuilt from the journal's OpenAI messages is what tau2's evaluator got when
  the episode ended (the environment's own tau2 messages), message for message.
* Under the same tasks, tau2's evaluator gives every episode its recorded reward and breakdown.
* Under a changed task set (``support.changed_tasks``: a gold write removed from task 0's
  expected actions, an output added to task 2's, task 5's scenario reworded) exactly tasks 0
  and 2 change, with the breakdown the change implies; the command writes regrade.json and
  prints them; a run without conversations and a benchmark that cannot re-grade are refused in
  one line.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from support import changed_tasks
from support.scripted_policy import ScriptedPolicyServer

from rollout.benchmarks.tau2.regrade import tau2_messages
from rollout.core.config import load_config
from rollout.core.environment import RegradeError, register_benchmark, unregister_benchmark
from rollout.core.journal import RunJournal
from rollout.core.records import EpisodeSpec, EpisodeStatus
from rollout.core.worker import RolloutWorker

GOLD_TASKS = ["0", "1", "2", "5"]


def _key(m) -> tuple:
    """What tau2's evaluator reads of a message (ids and timestamps aside)."""
    calls = tuple((c.name, json.dumps(c.arguments, sort_keys=True), c.requestor) for c in (getattr(m, "tool_calls", None) or []))
    return (type(m).__name__, m.role, m.content, calls, getattr(m, "error", None), getattr(m, "requestor", None))


async def _episodes(router_url: str, task_ids: list[str], prefix: str, *overrides: str):
    """Run one episode per task through the worker; the results and each episode's environment."""
    cfg = load_config(None, [f"policy.router_url={router_url}", *overrides])
    worker = RolloutWorker(cfg.policy, cfg.env, cfg.logging, max_concurrent_episodes=4)
    envs = {}
    new_episode = worker.domain.new_episode

    def keep(env_cfg, task_id, **kw):  # the environment each episode runs on, to read its tau2 messages
        envs[task_id] = new_episode(env_cfg, task_id, **kw)
        return envs[task_id]

    worker.domain.new_episode = keep
    try:
        results = await asyncio.gather(*[worker.run(EpisodeSpec(f"{prefix}/{t}", "retail", t, f"{prefix}/{t}", 0)) for t in task_ids])
    finally:
        await worker.close()
    return results, envs


def _scripted(tokenizer):
    """Task 5 played badly: a call that does not parse, one good call, then the agent stops."""
    call = '<tool_call>{"name": "find_user_id_by_name_zip", "arguments": {"first_name": "Yusuf", "last_name": "Rossi", "zip": "19122"}}</tool_call>'

    def script(eid, step, ids):
        return [('<tool_call>{"name": "find_user_id_by_name_zip", "arguments": {"zip": 1,}}</tool_call>', "stop"),
                (call, "stop"), ("I cannot help further. ###STOP###", "eos")][min(step, 2)]
    return script


@pytest.fixture(scope="module")
def episodes(retail_stack, tokenizer):
    async def run():
        gold, gold_envs = await _episodes(retail_stack.router_url, GOLD_TASKS, "gold")
        async with ScriptedPolicyServer(tokenizer, _scripted(tokenizer)) as server:
            bad, bad_envs = await _episodes(server.url, ["5"], "bad")
        return gold + bad, [gold_envs[t] for t in GOLD_TASKS] + [bad_envs["5"]]
    return asyncio.run(run())


def test_the_rebuilt_conversation_is_what_tau2s_evaluator_got(episodes):
    results, envs = episodes
    terminations = [r.metadata["termination_reason"] for r in results]
    assert [r.status for r in results] == [EpisodeStatus.COMPLETED] * 5 and "agent_stop" in terminations and "user_stop" in terminations
    bad = results[-1]
    assert any(m.get("parse_error") for m in bad.messages) and any(m.get("format_feedback") for m in bad.messages)
    for res, env in zip(results, envs):
        rebuilt = tau2_messages(res.to_sample().messages, res.metadata["termination_reason"])
        assert [_key(m) for m in rebuilt] == [_key(m) for m in env.messages], res.spec.episode_id
        assert len(rebuilt) >= 4


def test_under_the_same_tasks_every_episode_gets_its_recorded_reward(episodes, retail):
    results, _ = episodes
    sandbox = retail.new_sandbox(evaluator=False)
    try:
        for res in results:
            reward, info = retail.regrade(res.spec.task_id, res.messages, res.metadata["termination_reason"], sandbox=sandbox, timeout_s=120)
            assert (reward, info["reward_breakdown"]) == (res.reward, res.metadata["reward_info"]["reward_breakdown"]), res.spec.episode_id
            assert info == res.metadata["reward_info"]
    finally:
        sandbox.close()
    assert sorted({r.reward for r in results}) == [0.0, 1.0]  # gold episodes and the bad one
    with pytest.raises(RegradeError, match="tool sandbox"):
        retail.regrade("0", results[0].messages, "user_stop", sandbox=None, timeout_s=120)
    with pytest.raises(RegradeError, match="not a task of the installed tau2's retail"):
        sandbox = retail.new_sandbox(evaluator=False)
        try:
            retail.regrade("9999", results[0].messages, "user_stop", sandbox=sandbox, timeout_s=120)
        finally:
            sandbox.close()


def _journal(tmp_path, results, *overrides):
    """A run folder of ``results``, as the pool journals them."""
    cfg = load_config(None, ["local.enabled=true", f"rollout.output_dir={tmp_path}", *overrides])
    journal = RunJournal.open(tmp_path, cfg)
    journal.record_specs([r.spec for r in results])
    for r in results:
        journal.record(r.to_sample(messages=cfg.rollout.keep_messages))
    journal.close("finished")
    (tmp_path / "config.yaml").write_text(cfg.to_yaml())
    return tmp_path


@pytest.fixture
def changed_benchmark():
    register_benchmark("tau2_changed", changed_tasks.CHANGED_ENTRY)
    yield "tau2_changed"
    unregister_benchmark("tau2_changed")


def test_regrade_under_a_changed_task_set_lists_exactly_the_changed_tasks(episodes, tmp_path, changed_benchmark, capsys):
    from rollout.app.cli import main

    results, _ = episodes
    run = _journal(tmp_path / "run", results)
    assert main(["regrade", str(run), f"env.benchmark={changed_benchmark}", "--no-progress", "--workers", "1"]) == 0
    printed = capsys.readouterr().out
    report = json.loads((run / "regrade.json").read_text())
    assert report["changed_tasks"] == sorted(changed_tasks.CHANGED) == ["0", "2"]
    assert (report["episodes"], report["graded"], report["errors"], report["changed_episodes"]) == (5, 5, 0, 2)
    for tid, (_, breakdown) in changed_tasks.CHANGED.items():
        t = report["tasks"][tid]
        assert (t["old_mean_reward"], t["new_mean_reward"], t["changed"]) == (1.0, 0.0, 1)
        assert t["old_breakdown"] == {"DB": 1.0, "COMMUNICATE": 1.0} and t["new_breakdown"] == breakdown
    assert report["tasks"][changed_tasks.REWORDED]["changed"] == 0 and report["tasks"]["1"]["changed"] == 0
    lines = printed.splitlines()
    assert lines[1].split()[:5] == ["task", "episodes", "changed", "old", "reward"]
    assert [ln.split()[:5] for ln in lines[2:4]] == [["0", "1", "1", "1.0000", "0.0000"], ["2", "1", "1", "1.0000", "0.0000"]]
    assert "2 of 4 tasks change reward (2 episodes): 0, 2" in printed


def test_regrade_reports_shaped_rewards_and_refuses_what_it_cannot_grade(episodes, tmp_path, changed_benchmark, capsys):
    from rollout.app.cli import main

    results, _ = episodes
    shaped = _journal(tmp_path / "shaped", results, "rollout.reward_shaping.shapers=[turn_discount]")
    assert main(["regrade", str(shaped), f"env.benchmark={changed_benchmark}", "--no-progress", "--workers", "1"]) == 0
    report = json.loads((shaped / "regrade.json").read_text())
    row = next(e for e in report["episode_rewards"] if e["task_id"] == "0")
    assert row["old_shaped_reward"] == row["old_reward"] == 1.0  # the journaled results were not shaped: the sample's reward
    assert row["new_reward"] == 0.0 and row["new_shaped_reward"] == 0.0
    gold1 = next(e for e in report["episode_rewards"] if e["task_id"] == "1")
    turns = next(r for r in results if r.spec.task_id == "1").metadata["turns"]
    assert gold1["new_shaped_reward"] == pytest.approx(0.99 ** (turns - 1)) and turns > 1
    capsys.readouterr()
    bare = _journal(tmp_path / "bare", results, "rollout.keep_messages=false")
    assert main(["regrade", str(bare), "--no-progress"]) == 2
    assert "kept its conversation (rollout.keep_messages=false)" in capsys.readouterr().err
    assert main(["regrade", str(tmp_path / "nothing"), "--no-progress"]) == 2
    assert "no such folder" in capsys.readouterr().err
