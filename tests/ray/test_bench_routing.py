"""``python -m rollout.bench routing`` end to end with tiny settings: 2 workers, a few tasks, two
rows; the JSON's rows and their invariants."""

from __future__ import annotations

import json
import os

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


@pytest.mark.ray
@pytest.mark.slow
def test_bench_routing_tiny_run(ray_cluster, tmp_path, capsys):
    from rollout.devtools.bench import main

    out = tmp_path / "routing.json"
    code = main(["routing", "--workers", "2", "--concurrency", "8", "--n", "2", "--tasks", "3", "--rows", "round_robin,group",
                 "--adaptive", "off", "--json", str(out), "--out-dir", str(tmp_path / "runs"),
                 "local.kv.kv_budget_tokens=20000"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    rows = json.loads(out.read_text())
    assert [(r["routing"], r["adaptive"]) for r in rows] == [("round_robin", False), ("group", False)]
    for r in rows:
        for key in ("routing", "adaptive", "hit_ratio", "ideal_hit_ratio", "imbalance", "prefill_lost", "episodes_per_s"):
            assert r[key] is not None, key
        assert r["statuses"] == {"completed": 6} and r["episodes"] == 6
        # the servers saw exactly the prompts the episodes' records say they sent
        assert r["prompt_tokens"] == r["ideal_prompt_tokens"]
        assert 0 < r["hit_ratio"] <= r["ideal_hit_ratio"] <= 1
        assert 0 <= r["prefill_lost"] <= 1 and r["imbalance"] >= 1 and r["episodes_per_s"] > 0
        assert sum(r["requests_per_worker"]) > 6
    rr = rows[0]
    assert rr["imbalance"] <= 1.2  # round robin alternates the two workers
    assert "target:" in printed and "routing" in printed
