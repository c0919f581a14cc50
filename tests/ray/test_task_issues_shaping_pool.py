"""Issue 31 through the trainer API on the Ray pool (``open_pool`` + ``collect_groups``, what a
trainer's rollout function calls): the samples the pool hands a trainer carry the same fields as
the CLI's files (tests/e2e/test_task_issues_shaping_regrade_cli.py) and the trainers' task runner
(tests/component/test_task_issues_and_shaping.py): tau2's ``raw_reward`` beside the shaped
``reward`` with the shapers' steps, and each task's open issues (``task_issues``); and the task
selection ``open_pool`` gives with ``env.open_issues=skip`` (the default) leaves those tasks out.

The task set with open issues (``tau2_issues``: retail 4, 5, 7 open, 9 resolved;
tests/support/changed_tasks.py) is declared as an entry point of a ``*.dist-info`` folder on the
driver's ``PYTHONPATH``; the driver runs in a process of its own, starts its own local stack (its
servers need the entry points too) and runs its actors on the session's shared Ray head with that
``PYTHONPATH`` as its job's runtime environment, so that they find the task set by name, as they
would an installed plugin package (tests/ray/test_registered_plugins.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import changed_tasks
from support.cli import cli_env
from support.shared_ray import job_env

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
TASKS = ["0", "4", "9"]
CONFIG = f"""\
pool:
  num_actors: 1
  max_concurrent_episodes: 4
  num_cpus_per_actor: 0.5
env:
  benchmark: tau2_issues
  domain: retail
  task_split: base
  task_ids: [{", ".join(TASKS)}]
  open_issues: run
rollout:
  n_samples_per_task: 1
  reward_shaping:
    shapers: [action_aware, turn_discount]
    turn_discount: 0.9
local:
  enabled: true
  backend: gold_replay
"""

DRIVER = """
import json, sys
from rollout import load_config, open_pool
from rollout.app.preflight import check_task_selection
overrides = ["rollout.output_dir=" + sys.argv[2]] + sys.argv[3:]
skip = check_task_selection(load_config(sys.argv[1], overrides + ["env.open_issues=skip"]))
with open_pool(load_config(sys.argv[1], overrides)) as (cfg, pool, task_ids):
    groups = pool.collect_groups(len(task_ids), iter(task_ids), abort_surplus=False)
rows = [{"task_id": s.metadata["task_id"], "status": str(s.status), "reward": s.reward, "raw_reward": s.raw_reward,
         "turns": s.metadata["turns"], "shapers": [st["shaper"] for st in s.metadata.get("reward_shaping", [])],
         "task_issues": [i.to_dict() for i in s.task_issues]} for g in groups for s in g]
print("RESULT " + json.dumps({"task_ids": task_ids, "skip_task_ids": skip.task_ids, "skipped": list(skip.skipped), "rows": rows}))
"""


def test_the_pool_gives_a_trainer_the_raw_reward_shaping_and_task_issues(tmp_path, shared_ray):
    config = tmp_path / "issues.yaml"
    config.write_text(CONFIG)
    plugins = changed_tasks.write_entry_points(tmp_path / "plugins")
    path = os.pathsep.join(filter(None, [str(plugins), str(TESTS), os.environ.get("PYTHONPATH")]))
    env = job_env(cli_env(PYTHONPATH=path), {"env_vars": {"PYTHONPATH": path}})
    proc = subprocess.run([sys.executable, "-c", DRIVER, str(config), str(tmp_path / "run"), shared_ray.override()], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    got = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))[7:])
    assert got["task_ids"] == TASKS  # env.open_issues=run keeps task 4
    assert got["skip_task_ids"] == ["0", "9"] and got["skipped"] == ["4"]  # skip leaves it out (9's issue is resolved)
    rows = {r["task_id"]: r for r in got["rows"]}
    assert sorted(rows) == TASKS, got["rows"]
    for tid, r in rows.items():
        assert r["status"] == "completed" and r["raw_reward"] == 1.0 and r["turns"] > 1, r
        assert r["reward"] == pytest.approx(0.9 ** (r["turns"] - 1)) and r["shapers"] == ["action_aware", "turn_discount"], r
    assert [i["id"] for i in rows["4"]["task_issues"]] == ["issue_fixture_4"] and rows["4"]["task_issues"][0]["status"] == "open"
    assert rows["0"]["task_issues"] == [] and rows["9"]["task_issues"] == []
