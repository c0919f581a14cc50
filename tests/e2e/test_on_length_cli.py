"""``policy.on_length`` through the CLI: the summary table and ``summary.json`` count turns cut at ``max_new_tokens`` (the episode-level behaviour is tested in tests/component/test_on_length.py)."""

from __future__ import annotations

import json

import pytest
from support.cli import run_cli


@pytest.mark.slow
@pytest.mark.ray
def test_the_cli_counts_cut_turns_in_its_table_and_summary(tmp_path, local_stacks, shared_ray):
    """The main job on the local stack with a budget below the gold replies: every first turn is
    cut; the table and summary.json count them. (With ``rollout.keep_messages=false``: the files
    carry no conversation. With ``pool.metrics=false``: the actors say they record no metrics.)"""
    out = tmp_path / "run"
    proc = run_cli(["run", "--config", "configs/local.yaml", "--no-progress", "env.task_ids=[0,1]", "rollout.n_samples_per_task=1",
                    "pool.num_actors=1", "policy.sampling.max_new_tokens=8", "rollout.keep_messages=false", "pool.metrics=false",
                    f"rollout.output_dir={out}"], stack=local_stacks, ray=shared_ray)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status_counts"] == {"truncated": 2} and summary["length_cut_turns"] == 2
    assert summary["episodes_ended_by_turn_length"] == 2
    for name in ("samples.jsonl", "episodes.jsonl"):
        assert [json.loads(x)["messages"] for x in (out / name).read_text().splitlines()] == [None, None], name
    assert "rollout actors ready" in proc.stderr and "metrics off" in proc.stderr, proc.stderr[-3000:]
    table = proc.stdout
    assert any(line.split()[-1] == "2" for line in table.splitlines() if line.startswith("turns cut at max_new_tokens")), table
