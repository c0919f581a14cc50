"""``python -m rollout.bench scale`` end to end with tiny settings: the real main job in a fresh
process per actor count (1 and 2 actors, one local server, two tasks), the rows it prints and the
JSON it writes."""

from __future__ import annotations

import json
import os

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

pytestmark = [pytest.mark.slow, pytest.mark.ray]


def test_the_scale_bench_runs_the_main_job_per_actor_count_and_compares_their_episode_phases(tmp_path, capsys):
    from rollout.devtools.bench import main

    out = tmp_path / "scale.json"
    code = main(["scale", "--actors", "1,2", "--servers", "1", "--json", str(out), "env.task_ids=[0,1]", "rollout.n_samples_per_task=1"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    data = json.loads(out.read_text())
    assert [r["actors"] for r in data["runs"]] == [1, 2] and all(r["exit_code"] == 0 for r in data["runs"])
    for r in data["runs"]:
        assert r["episodes"] == 2 and r["status_counts"] == {"completed": 2}
        assert r["episodes_phase_s"] > 0 and r["startup_s"] > 0
    rows = data["rows"]
    assert rows[0]["speedup"] == 1.0 and rows[1]["speedup"] == pytest.approx(rows[0]["episodes_phase_s"] / rows[1]["episodes_phase_s"])
    assert "2 actors against 1 (local.num_servers=1)" in printed
