"""``python -m rollout.bench startup`` end to end with tiny settings: the real main job in a fresh
process per way, ``before`` (the serial start-up order) and ``after`` (the overlapped one), each
run's timeline read from ``open_pool``'s ``timeline`` argument (the wiring keeps no module global
for it), the rows it prints and the JSON it writes."""

from __future__ import annotations

import json
import os

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

pytestmark = [pytest.mark.slow, pytest.mark.ray]


def test_the_startup_bench_runs_both_orders_and_reads_each_timeline(tmp_path, capsys, monkeypatch):
    from rollout.devtools.bench import main

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    out = tmp_path / "startup.json"
    code = main(["startup", "--reps", "1", "--tasks", "1", "--ways", "before,after", "--json", str(out), "pool.num_actors=1"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    runs = {r["way"]: r for r in json.loads(out.read_text())["runs"]}
    assert set(runs) == {"before", "after"} and all(r["rc"] == 0 and r["exit_code"] == 0 for r in runs.values())
    before, after = runs["before"], runs["after"]
    assert (before["mode"], after["mode"]) == ("serial", "overlapped")  # each run started the way asked
    assert list(before["phases"]) == ["checks", "local_stack", "preflight", "ray_and_actors"]
    assert set(after["phases"]) == {"checks", "ray_and_actor_launch", "local_stack", "preflight", "actors_ready"}
    for r in runs.values():
        assert 0 < r["actors_ready_s"] <= r["process_start_to_ready_s"]
        assert max(end for _, end in r["phases"].values()) <= r["actors_ready_s"]
    assert "after / before: x" in printed
