"""The main job's ``startup_s`` counts from its interpreter's start, not from its process id's
creation (issue 28: ``bash -c "...; exec python -m rollout run ..."`` reported ``startup_s 362.9``
with ``wall_s 61.7``, since ``exec`` keeps the shell's process id and its start time). Here the
shell sleeps first, then execs the job: the start-up must fit in what the job itself ran, and in
its wall time, in ``summary.json`` as in the end-of-run table."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from pathlib import Path

import pytest
from support.cli import command

ROOT = Path(__file__).resolve().parents[2]
SLEEP_S = 8.0  # the shell's own work before the exec; more than the job spends after its actors are ready
pytestmark = pytest.mark.slow


def test_a_job_execd_after_shell_work_counts_its_startup_from_the_interpreter(tmp_path, local_stacks, shared_ray):
    out = tmp_path / "run"
    job = command(["run", "--config", "configs/local.yaml", "--no-progress", "env.task_ids=[0]", "rollout.n_samples_per_task=1",
                   "pool.num_actors=1", f"rollout.output_dir={out}"], stack=local_stacks, ray=shared_ray)
    env = dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True")
    env.pop("RAY_ADDRESS", None)
    t0 = time.monotonic()
    proc = subprocess.run(["bash", "-c", f"sleep {SLEEP_S}; exec {shlex.join(job)}"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    job_s = time.monotonic() - t0 - SLEEP_S  # what the job's own process ran, at most
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    s = json.loads((out / "summary.json").read_text())
    assert 0 < s["startup_s"] <= s["wall_s"] <= job_s, (s["startup_s"], s["wall_s"], job_s)
    assert s["startup_s"] + s["episodes_phase_s"] <= s["wall_s"], s  # both are parts of the wall time
    row = next(line for line in proc.stdout.splitlines() if line.strip().startswith("start-up, episodes (s)"))
    assert row.split()[-2] == f"{s['startup_s']:.2f}," and row.split()[-1] == f"{s['episodes_phase_s']:.2f}", row
