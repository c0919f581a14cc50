"""``policy.context_strategy`` as a user meets it: the CLI's main job (table, ``summary.json``,
the sample files, ``--resume``) and the trainer API (``open_pool`` + ``collect_groups``).

Airline tasks 2, 14, 17 and 22 with gold replay grow past a 6000-token context (the first prompt
alone is about 4.9k tokens): with ``none`` all four end ``truncated``. ``drop_tool_results``
compacts them and goes on; every sample stays within the budget, and each compaction starts a
new sample (the tokens inside a sample are never changed).
"""

from __future__ import annotations

import collections
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.cli import ROOT, cli_env, run_cli, shared_overrides

from rollout.core.records import TrainingSample

BUDGET = 6000
SMALL = ["env.domain=airline", "env.task_ids=[2,14,17,22]", "rollout.n_samples_per_task=1", "pool.num_actors=1",
         f"policy.max_context_tokens={BUDGET}", "policy.context_headroom_tokens=256"]


@pytest.fixture
def run(local_stacks, shared_ray):
    """``python -m rollout run`` of the small airline job on the shared head and gold-replay stack."""
    def _run(out: Path, *overrides: str) -> subprocess.CompletedProcess:
        proc = run_cli(["run", "--config", "configs/local.yaml", "--no-progress", *SMALL, *overrides, f"rollout.output_dir={out}"],
                       stack=local_stacks, ray=shared_ray)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc
    return _run


def _lines(out: Path) -> list[dict]:
    return [json.loads(x) for f in ("samples.jsonl", "failed.jsonl", "filtered.jsonl") for x in (out / f).read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.ray
def test_the_main_job_compacts_where_none_ends_truncated_and_resumes(tmp_path, run):
    plain = run(tmp_path / "none")
    summary = json.loads((tmp_path / "none" / "summary.json").read_text())
    assert summary["status_counts"] == {"truncated": 4} and summary["compactions"] == 0, summary
    assert "compactions" not in plain.stdout  # the table shows them only with a strategy

    out = tmp_path / "drop"
    proc = run(out, "policy.context_strategy=drop_tool_results")
    summary = json.loads((out / "summary.json").read_text())
    truncated = summary["status_counts"].get("truncated", 0)
    assert truncated < 4 and summary["compactions"] >= 4, summary
    shown = re.search(r"^compactions \(drop_tool_results\) +(\d+)$", proc.stdout, re.M)
    assert shown and int(shown.group(1)) == summary["compactions"], proc.stdout
    lines = _lines(out)
    assert summary["max_sample_tokens"] == max(len(x["tokens"]) for x in lines) <= BUDGET
    per_episode = collections.defaultdict(list)
    for x in lines:
        assert "segment_starts" not in x and len(x["loss_mask"]) == len(x["rollout_log_probs"]) == x["response_length"]
        per_episode[x["metadata"]["episode_id"]].append(x)
    assert len(per_episode) == 4 and summary["samples"] == len(lines) > 4
    for eid, xs in per_episode.items():
        # trajectory mode: one sample per segment, turns in order, each episode's lines consecutive
        assert len(xs) <= xs[0]["metadata"]["compactions"] + 1, eid
        assert [t for x in xs for t in TrainingSample.from_dict(x).turn_indices] == list(range(xs[0]["metadata"]["turns"])), eid
        assert all(x["reward"] == (1.0 if x["status"] == "completed" else 0.0) for x in xs)
    assert sum(xs[0]["reward"] == 1.0 for xs in per_episode.values()) == 4 - truncated

    # a driver killed after its last episode was journaled, before its samples reached the files
    state = json.loads((out / "run.json").read_text())
    (out / "run.json").write_text(json.dumps(dict(state, status="running", reason=None)))
    (out / "summary.json").unlink()
    written = (out / "samples.jsonl").read_text().splitlines(keepends=True)
    last = json.loads(written[-1])["metadata"]["episode_id"]
    kept = [x for x in written if json.loads(x)["metadata"]["episode_id"] != last]
    (out / "samples.jsonl").write_text("".join(kept))
    done = run(out, "policy.context_strategy=drop_tool_results", "--resume")
    assert "4 episode(s) delivered before, 0 to run" in done.stderr
    assert (out / "samples.jsonl").read_text().splitlines(keepends=True) == kept + [x for x in written if x not in kept]
    assert json.loads((out / "summary.json").read_text())["compactions"] == summary["compactions"]


TRAINER_SCRIPT = """
import sys
from rollout import Batch, load_config, open_pool
cfg = load_config("configs/local.yaml", sys.argv[2:] + ["rollout.output_dir=" + sys.argv[1]])
with open_pool(cfg) as (cfg, pool, task_ids):
    groups = pool.collect_groups(4, iter(task_ids), abort_surplus=False)
samples = [s for g in groups for s in g]
assert all(len(s.tokens) <= cfg.policy.max_context_tokens and not s.segment_starts for s in samples), "a sample over the budget"
per_episode = {}
for s in samples:
    per_episode.setdefault(s.episode_id, []).append(s)
for eid, xs in per_episode.items():
    assert [t for s in xs for t in s.turn_indices] == list(range(xs[0].metadata["turns"])), eid
trainable = [s for s in samples if s.status in cfg.rollout.train_statuses]
batch = Batch.from_samples(trainable, train_statuses=cfg.rollout.train_statuses)
print("episodes", len(per_episode), "samples", len(samples), "compactions", sum(xs[0].metadata["compactions"] for xs in per_episode.values()),
      "completed", sum(xs[0].status == "completed" for xs in per_episode.values()), "rows", batch.tokens.shape[0])
"""


@pytest.mark.slow
@pytest.mark.ray
def test_the_trainer_api_hands_out_compacted_episodes_per_turn_within_the_budget(tmp_path, local_stacks, shared_ray):
    """The same guarantee on the trainer API, with per_turn samples over a re-rendered history."""
    overrides = [*SMALL, "policy.context_strategy=drop_tool_results", "rollout.sample_mode=per_turn", "policy.history=rerender"]
    overrides += shared_overrides("configs/local.yaml", overrides, stack=local_stacks, ray=shared_ray)
    proc = subprocess.run([sys.executable, "-c", TRAINER_SCRIPT, str(tmp_path / "run"), *overrides],
                          cwd=ROOT, env=cli_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    words = next(x for x in proc.stdout.splitlines() if x.startswith("episodes ")).split()
    got = dict(zip(words[::2], map(int, words[1::2])))
    assert got["episodes"] == 4 and got["compactions"] >= 4 and got["completed"] >= 2 and got["samples"] == got["rows"] > 4, got
