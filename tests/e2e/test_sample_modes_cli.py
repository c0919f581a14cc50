"""``rollout.sample_mode`` through the CLI (the main job on the local stack with gold replay), and
``rollout eval`` in per_turn mode (pass^k stays per episode). The same seeds in every mode: the
same turns are sampled, so the loss-masked tokens summed over all samples are equal."""

from __future__ import annotations

import collections
import itertools
import json
import subprocess
from pathlib import Path

import pytest
from support.cli import run_cli

TASKS = "env.task_ids=[0,1,2]"


@pytest.fixture
def _run(local_stacks, shared_ray):
    """The main job (or ``command="eval"``) on the session's shared head and gold-replay stack."""
    def run(out: Path, *overrides: str, command: str = "run") -> subprocess.CompletedProcess:
        proc = run_cli([command, "--config", "configs/local.yaml", "--no-progress", *overrides, f"rollout.output_dir={out}"],
                       stack=local_stacks, ray=shared_ray)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc
    return run


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.parametrize("tasks", [pytest.param(TASKS, id="3-tasks"),
                                   pytest.param("env.task_ids=null", id="all-retail", marks=pytest.mark.extended)])
def test_the_main_job_in_each_sample_mode(tmp_path, _run, tasks):
    masked, samples = {}, {}
    for mode in ("trajectory", "per_turn", "merge_prefix"):
        out = tmp_path / mode
        _run(out, tasks, f"rollout.sample_mode={mode}", *(["pool.num_actors=1"] if tasks == TASKS else []))
        lines = _lines(out / "samples.jsonl")
        summary = json.loads((out / "summary.json").read_text())
        assert summary["sample_mode"] == mode and summary["samples"] == len(lines)
        assert summary["episodes"] == (6 if tasks == TASKS else 228)
        assert all(x["reward"] == 1.0 and x["status"] == "completed" for x in lines)
        masked[mode] = sum(sum(x["loss_mask"]) for x in lines)
        assert summary["generated_tokens"] == masked[mode]
        samples[mode] = lines
        # every line names its episode and the turns it holds at the top level (the journal's too)
        assert all(x["episode_id"] == x["metadata"]["episode_id"] for x in lines)
        for eid, xs in itertools.groupby(lines, key=lambda x: x["episode_id"]):
            xs = list(xs)
            assert [t for x in xs for t in x["turn_indices"]] == list(range(xs[0]["metadata"]["turns"])), (mode, eid)
            assert len(xs) == (xs[0]["metadata"]["turns"] if mode == "per_turn" else 1), (mode, eid)
        journal = _lines(out / "episodes.jsonl")
        assert sorted((x["episode_id"], x["turn_indices"]) for x in journal) == sorted(
            (x["metadata"]["episode_id"], list(range(x["metadata"]["turns"]))) for x in journal)
    assert masked["trajectory"] == masked["per_turn"] == masked["merge_prefix"] > 0
    turns = sum(x["metadata"]["turns"] for x in samples["trajectory"])
    assert len(samples["per_turn"]) == turns
    per_episode = collections.Counter(x["metadata"]["episode_id"] for x in samples["per_turn"])
    assert all(per_episode[x["metadata"]["episode_id"]] == x["metadata"]["turns"] for x in samples["trajectory"])
    assert all(x["metadata"]["turn_indices"] == [i] for i, x in enumerate(samples["per_turn"][:per_episode[samples["per_turn"][0]["metadata"]["episode_id"]]]))
    # merge_prefix with the append-only history: one sample per episode, the trajectory's tokens
    traj = {x["metadata"]["episode_id"]: x for x in samples["trajectory"]}
    assert len(samples["merge_prefix"]) == len(traj)
    for x in samples["merge_prefix"]:
        t = traj[x["metadata"]["episode_id"]]
        assert (x["tokens"], x["loss_mask"], x["rollout_log_probs"]) == (t["tokens"], t["loss_mask"], t["rollout_log_probs"])
        assert x["metadata"]["sample_splits"] == 0
    # policy.history=rerender (each prompt the template's rendering of the conversation so far):
    # the same turns sampled, token for token, and every handed-out sample is one sequence
    for mode in ("per_turn", "merge_prefix"):
        out = tmp_path / f"{mode}_rerender"
        _run(out, tasks, f"rollout.sample_mode={mode}", "policy.history=rerender", *(["pool.num_actors=1"] if tasks == TASKS else []))
        lines = _lines(out / "samples.jsonl")
        summary = json.loads((out / "summary.json").read_text())
        assert summary["history"] == "rerender" and summary["samples"] == len(lines)
        assert all(x["reward"] == 1.0 and x["status"] == "completed" and "segment_starts" not in x for x in lines)
        assert sum(sum(x["loss_mask"]) for x in lines) == masked["trajectory"], mode
        if mode == "per_turn":
            assert len(lines) == turns

            def responses(rows):
                return sorted((x["metadata"]["episode_id"], x["metadata"]["turn_indices"][0], x["tokens"][-x["response_length"]:]) for x in rows)
            assert responses(lines) == responses(samples["per_turn"])


@pytest.mark.slow
@pytest.mark.ray
def test_eval_counts_episodes_not_samples_in_per_turn_mode(tmp_path, _run):
    _run(tmp_path / "eval", TASKS, "pool.num_actors=1", "rollout.sample_mode=per_turn", command="eval")
    summary = json.loads((tmp_path / "eval" / "eval.json").read_text())
    d = summary["domains"]["retail"]
    assert summary["episodes"] == 6 and d["tasks"] == 3 and d["trials"] == 6 and d["pass_hat_k"]["2"] == 1.0
