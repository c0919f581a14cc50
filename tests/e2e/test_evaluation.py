"""Evaluation metrics (rollout.app.evaluation) against tau2's own, and ``python -m rollout eval`` end to end."""

from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.cli import run_cli

from rollout.app.evaluation import Outcome, format_eval, pass_at_k, summarize
from rollout.core.records import EpisodeSpec, EpisodeStatus, InteractionResult

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _env():
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", LITELLM_LOCAL_MODEL_COST_MAP="True")
    env.pop("RAY_ADDRESS", None)
    return env


def _tau2_results(tasks_by_id, rewards_by_task: dict[str, list[float]], num_trials: int):
    """A tau2 ``Results`` with one SimulationRun per reward, for tau2's own ``compute_metrics``."""
    from tau2.data_model.simulation import AgentInfo, Info, Results, RewardInfo, SimulationRun, TerminationReason, UserInfo
    from tau2.environment.environment import EnvironmentInfo

    info = Info(
        git_commit="test", num_trials=num_trials, max_steps=30, max_errors=10,
        user_info=UserInfo(implementation="scripted"), agent_info=AgentInfo(implementation="gold"),
        environment_info=EnvironmentInfo(domain_name="retail", policy=""),
    )
    sims = [
        SimulationRun(
            id=f"{tid}-{i}", task_id=tid, start_time="0", end_time="0", duration=0.0,
            termination_reason=TerminationReason.AGENT_STOP, reward_info=RewardInfo(reward=r), messages=[], trial=i,
        )
        for tid, rewards in rewards_by_task.items() for i, r in enumerate(rewards)
    ]
    return Results(info=info, tasks=[tasks_by_id[t] for t in rewards_by_task], simulations=sims)


def _tau2_metrics(rewards_by_task: dict[str, list[float]]):
    from tau2.metrics.agent_metrics import compute_metrics

    from rollout.benchmarks.tau2.environment import _domain_module

    tasks = {t.id: t for t in _domain_module("retail").get_tasks(None)}
    n = len(next(iter(rewards_by_task.values())))
    return compute_metrics(_tau2_results(tasks, rewards_by_task, n))


def _brute(n: int, c: int, k: int) -> tuple[float, float]:
    """(pass^k, pass@k) by enumerating every k-subset of n trials of which the first c succeed."""
    subsets = list(itertools.combinations(range(n), k))
    all_ok = sum(all(i < c for i in s) for s in subsets)
    any_ok = sum(any(i < c for i in s) for s in subsets)
    return all_ok / len(subsets), any_ok / len(subsets)


# -- pure ------------------------------------------------------------------------------------------
def test_pass_at_k_hand_cases_and_brute_force():
    assert pass_at_k(1, 1, 1) == 1.0
    assert pass_at_k(1, 0, 1) == 0.0
    assert pass_at_k(2, 1, 1) == 0.5
    assert pass_at_k(2, 1, 2) == 1.0  # any 2 of 2 trials hold the success
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(5, 0, 3) == 0.0
    assert pass_at_k(5, 2, 4) == 1.0  # n - c < k
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    for n in range(1, 8):
        for c in range(n + 1):
            for k in range(1, n + 1):
                hat, at = _brute(n, c, k)
                assert pass_at_k(n, c, k) == pytest.approx(at, abs=1e-12), (n, c, k)
                from tau2.metrics.agent_metrics import pass_hat_k

                assert pass_hat_k(n, c, k) == pytest.approx(hat, abs=1e-12), (n, c, k)
    # exact integers: no overflow for large n
    assert pass_at_k(2000, 1, 1000) == pytest.approx(0.5)
    for bad in [(2, 1, 3), (2, 1, 0), (2, 3, 1), (2, -1, 1)]:
        with pytest.raises(ValueError):
            pass_at_k(*bad)


def test_per_task_pass_hat_k_is_tau2s():
    from tau2.metrics.agent_metrics import pass_hat_k

    n = 5
    outcomes = [("retail", str(c), "completed", 1.0 if i < c else 0.0) for c in range(n + 1) for i in range(n)]
    for c in range(n + 1):
        s = summarize([o for o in outcomes if o[1] == str(c)], max_k=n)["domains"]["retail"]
        assert s["per_task"][str(c)]["trials"] == n and s["per_task"][str(c)]["successes"] == c
        for k in range(1, n + 1):
            assert s["pass_hat_k"][str(k)] == pass_hat_k(n, c, k)
            assert s["pass_at_k"][str(k)] == pass_at_k(n, c, k)


def test_domain_average_equals_tau2_compute_metrics():
    # partial rewards (0.5) are failures for both; 1 - 1e-7 is a success for both
    rewards = {
        "0": [1.0, 1.0, 1.0, 1.0],
        "1": [1.0, 0.0, 1.0, 0.0],
        "2": [0.0, 0.0, 0.5, 0.0],
        "3": [1.0 - 1e-7, 1.0, 1.0, 0.0],
        "10": [0.0, 0.0, 0.0, 0.0],
    }
    ours = summarize([("retail", t, "completed", r) for t, rs in rewards.items() for r in rs], max_k=4)["domains"]["retail"]
    theirs = _tau2_metrics(rewards)
    assert sorted(theirs.pass_hat_ks) == [1, 2, 3, 4]
    for k, v in theirs.pass_hat_ks.items():
        assert ours["pass_hat_k"][str(k)] == pytest.approx(v, abs=1e-12)
        assert ours["tasks_counted"][str(k)] == 5 and ours["tasks_left_out"][str(k)] == 0
    assert ours["mean_reward"] == pytest.approx(theirs.avg_reward, abs=1e-12)
    assert ours["trials"] == 20 and ours["tasks"] == 5 and ours["infrastructure_failures"] == {}
    assert list(ours["per_task"]) == ["0", "1", "2", "3", "10"]
    assert [ours["per_task"][t]["successes"] for t in ours["per_task"]] == [4, 2, 0, 3, 0]


def test_infrastructure_failures_are_left_out_and_counted():
    rewards = {"0": [1.0, 0.0], "1": [1.0, 1.0], "2": [0.0, 1.0]}
    valid = [("retail", t, "completed", r) for t, rs in rewards.items() for r in rs]
    noise = [
        ("retail", "0", EpisodeStatus.POLICY_ERROR, 0.0),
        ("retail", "1", "env_error", 0.0),
        ("retail", "1", "env_error", 0.0),
        ("retail", "2", "cancelled", 0.0),
        ("retail", "2", "truncated", 0.0),  # a policy outcome: a valid trial
    ]
    s = summarize(valid + noise, max_k=3)
    d = s["domains"]["retail"]
    assert s["episodes"] == 11 and s["infrastructure_failures"] == 3 and s["cancelled"] == 1
    assert d["infrastructure_failures"] == {"env_error": 2, "policy_error": 1}
    assert d["cancelled"] == 1 and d["episodes"] == 11 and d["trials"] == 7
    assert d["status_counts"] == {"cancelled": 1, "completed": 6, "env_error": 2, "policy_error": 1, "truncated": 1}
    assert d["per_task"]["1"] == {"trials": 2, "successes": 2, "rewards": [1.0, 1.0], "excluded": {"env_error": 2}}
    assert d["per_task"]["2"]["trials"] == 3 and d["per_task"]["2"]["excluded"] == {"cancelled": 1}
    # k = 1, 2: every task counts, and the average equals tau2's on the valid trials alone
    # (task 2's truncated episode is a valid trial with reward 0)
    theirs = _tau2_metrics({"0": [1.0, 0.0], "1": [1.0, 1.0], "2": [0.0, 1.0, 0.0]})
    assert sorted(theirs.pass_hat_ks) == [1, 2]
    for k in (1, 2):
        assert d["pass_hat_k"][str(k)] == pytest.approx(theirs.pass_hat_ks[k], abs=1e-12)
        assert d["tasks_counted"][str(k)] == 3 and d["tasks_left_out"][str(k)] == 0
    assert d["mean_reward"] == pytest.approx(theirs.avg_reward)
    # k = 3: only task 2 has three valid trials
    assert d["tasks_counted"]["3"] == 1 and d["tasks_left_out"]["3"] == 2
    assert d["pass_hat_k"]["3"] == 0.0 and d["pass_at_k"]["3"] == 1.0
    # only infrastructure failures: no valid trials, nothing averaged
    only = summarize([("airline", "5", "user_error", 0.0)], max_k=2)["domains"]["airline"]
    assert only["trials"] == 0 and only["mean_reward"] is None
    assert only["pass_hat_k"] == {"1": None, "2": None} and only["tasks_left_out"] == {"1": 1, "2": 1}
    assert "-" in format_eval({"domains": {"airline": only}})


def test_summarize_reads_interaction_results_and_validates():
    def res(task, i, status, reward, domain="retail"):
        spec = EpisodeSpec(episode_id=f"{task}-{i}", domain=domain, task_id=task, group_id=task, sample_index=i)
        return InteractionResult(spec=spec, status=status, reward=reward, trajectory=None)

    items = [res("7", 0, EpisodeStatus.COMPLETED, 1.0), res("7", 1, EpisodeStatus.ABORTED, 0.0), res("3", 0, EpisodeStatus.COMPLETED, 0.0),
             res("1", 0, EpisodeStatus.COMPLETED, 1.0, domain="airline")]
    s = summarize(items)  # max_k None: up to the largest number of valid trials
    assert sorted(s["domains"]) == ["airline", "retail"]
    r = s["domains"]["retail"]
    assert list(r["per_task"]) == ["3", "7"] and r["pass_hat_k"] == {"1": 0.5} and r["infrastructure_failures"] == {"aborted": 1}
    assert s["domains"]["airline"]["pass_at_k"] == {"1": 1.0}
    assert Outcome.of(items[0]) == Outcome("retail", "7", EpisodeStatus.COMPLETED, 1.0)
    table = format_eval(s)
    assert "retail: 2 tasks, 2 trials, 1 infrastructure failures" in table and "aborted: 1" in table
    with pytest.raises(ValueError):
        summarize([("retail", "1", "no_such_status", 1.0)])
    with pytest.raises(ValueError):
        summarize([("retail", "1", 1.0)])
    with pytest.raises(ValueError):
        summarize([], max_k=0)
    assert summarize([]) == {"episodes": 0, "infrastructure_failures": 0, "cancelled": 0, "domains": {}}
    assert math.isclose(summarize([("retail", "1", "completed", 1.0)] * 3, max_k=3)["domains"]["retail"]["pass_hat_k"]["3"], 1.0)


# -- the CLI's exit statuses ----------------------------------------------------------------------
def test_cli_eval_exits_3_on_infrastructure_failures(monkeypatch, capsys):
    import rollout.app.evaluation as evaluation
    from rollout.app.cli import main

    def fake_run_eval(cfg, progress=True, overwrite=False):
        assert progress is False and overwrite is False and cfg.rollout.n_samples_per_task == 2
        outcomes = [("retail", "0", "completed", 1.0), ("retail", "0", "policy_error", 0.0), ("retail", "1", "completed", 0.0)]
        return {"n_samples_per_task": 2, **summarize(outcomes, max_k=2)}

    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(evaluation, "run_eval", fake_run_eval)
    assert main(["eval", "--config", "configs/local.yaml", "--no-progress", "rollout.n_samples_per_task=2"]) == 3
    out = capsys.readouterr().out
    assert "policy_error: 1" in out and "eval.json" in out
    monkeypatch.setattr(evaluation, "run_eval", lambda cfg, progress=True, overwrite=False: {"n_samples_per_task": 1, **summarize([("retail", "0", "cancelled", 0.0)], max_k=1)})
    assert main(["eval", "--no-progress"]) == 0  # cancelled is not an infrastructure failure


def test_cli_eval_bad_config_exits_2():
    proc = subprocess.run([sys.executable, "-m", "rollout", "eval", "--config", "configs/local.yaml", "rollout.n_samples_per_task=0"],
                          cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "rollout.n_samples_per_task" in proc.stderr


@pytest.mark.slow
def test_cli_eval_unknown_task_exits_2(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "rollout", "eval", "--config", "configs/local.yaml", "env.task_ids=[99999]",
                           f"rollout.output_dir={tmp_path}"], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "env.task_ids" in proc.stderr


# -- end to end: the CLI on the local stack ----------------------------------------------------------
@pytest.fixture
def run_eval(local_stacks, shared_ray):
    """``python -m rollout eval`` of retail tasks, twice each, on the shared head and the backend's shared stack."""
    def _run_eval(out: Path, backend: str, task_ids: list[int]) -> subprocess.CompletedProcess:
        return run_cli(["eval", "--config", "configs/local.yaml", "--no-progress", f"env.task_ids=[{','.join(map(str, task_ids))}]",
                        "rollout.n_samples_per_task=2", "pool.num_actors=1", f"local.backend={backend}", f"rollout.output_dir={out}"],
                       stack=local_stacks, ray=shared_ray, timeout=300)
    return _run_eval


@pytest.mark.slow
@pytest.mark.ray
def test_cli_eval_gold_replay_passes_every_k(tmp_path, run_eval):
    out = tmp_path / "eval"
    proc = run_eval(out, "gold_replay", [0, 1, 2])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "pass^k" in proc.stdout and "pass@k" in proc.stdout and "retail: 3 tasks, 6 trials" in proc.stdout
    ev = json.loads((out / "eval.json").read_text())
    d = ev["domains"]["retail"]
    assert ev["n_samples_per_task"] == 2 and ev["infrastructure_failures"] == 0
    assert d["pass_hat_k"] == {"1": 1.0, "2": 1.0} and d["pass_at_k"] == {"1": 1.0, "2": 1.0}
    assert d["tasks_counted"] == {"1": 3, "2": 3} and d["mean_reward"] == 1.0
    assert {t: (p["trials"], p["successes"]) for t, p in d["per_task"].items()} == {"0": (2, 2), "1": (2, 2), "2": (2, 2)}
    # the folder is a run folder (the viewer opens it: tests/e2e/test_viewer.py): every episode journaled with
    # its conversation and tokens, the valid trials in samples.jsonl, a summary; a second eval does not replace it
    journal = [json.loads(x) for x in (out / "episodes.jsonl").read_text().splitlines()]
    samples = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    assert len(journal) == len(samples) == 6 and (out / "failed.jsonl").read_text() == ""
    assert all(x["messages"] and x["tokens"] and sum(x["loss_mask"]) > 0 for x in journal)
    assert sorted(x["episode_id"] for x in journal) == sorted(x["episode_id"] for x in samples)
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["command"], summary["status"], summary["episodes"]) == ("eval", "finished", 6)
    assert json.loads((out / "run.json").read_text())["status"] == "finished"
    again = run_eval(out, "gold_replay", [0])
    assert again.returncode == 2 and "holds a run" in again.stderr and "--overwrite" in again.stderr, again.stderr[-2000:]
    assert json.loads((out / "eval.json").read_text())["n_samples_per_task"] == 2 and len((out / "episodes.jsonl").read_text().splitlines()) == 6


@pytest.mark.slow
@pytest.mark.ray
def test_cli_eval_skip_write_matches_tau2_compute_metrics(tmp_path, run_eval):
    # retail 0 and 5 have a gold write action (skipped: reward 0); 10 and 25 have none (reward 1)
    out = tmp_path / "eval"
    proc = run_eval(out, "gold_replay_skip_write", [0, 5, 10, 25])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    d = json.loads((out / "eval.json").read_text())["domains"]["retail"]
    rewards = {t: p["rewards"] for t, p in d["per_task"].items()}
    assert all(len(r) == 2 for r in rewards.values())
    assert {t: p["successes"] for t, p in d["per_task"].items()} == {"0": 0, "5": 0, "10": 2, "25": 2}
    theirs = _tau2_metrics(rewards)
    assert {int(k): v for k, v in d["pass_hat_k"].items()} == pytest.approx(theirs.pass_hat_ks)
    assert d["pass_hat_k"] == {"1": 0.5, "2": 0.5}
    assert d["mean_reward"] == pytest.approx(theirs.avg_reward)
