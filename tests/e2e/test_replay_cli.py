"""Rollout replay of a real run: the CLI main job (gold replay on the local stack, a few retail
tasks, groups of 2, some members failing the training policy so that members are re-run and a
group is dropped) is replayed through the trainer API (RolloutPool.replay) and through
``python -m rollout run --replay``: the same groups (episode ids, tokens, masks, log-probs) in the
same order, and the same exclusions, as the run delivered; nothing is started for the replay.

Tasks 0, 36 and 37 end within ``env.max_steps=8`` (gold replay: 5, 1 and 4 tool calls); task 2
(11 calls) ends ``max_steps``, which ``rollout.train_statuses=[completed]`` keeps out of training:
its members are re-run once, then the group is dropped.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.cli import run_cli

from rollout.core.groups import Excluded
from rollout.core.output import read_samples

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow]


def _env() -> dict[str, str]:
    env = dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True")
    env.pop("RAY_ADDRESS", None)
    return env


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, local_stacks, shared_ray) -> Path:
    """The CLI main job (on the session's shared head and stack), journaled in its output folder."""
    out = tmp_path_factory.mktemp("replay") / "run"
    proc = run_cli(["run", "--config", "configs/local.yaml", "--no-progress", "env.task_ids=[0,2,36,37]", "env.max_steps=8",
                    "rollout.n_samples_per_task=2", "rollout.train_statuses=[completed]", "rollout.max_member_reruns=1", "pool.num_actors=1",
                    "pool.max_concurrent_episodes=4", f"rollout.output_dir={out}"], stack=local_stacks, ray=shared_ray, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


def _view(s) -> tuple:
    return s.episode_id, s.tokens, s.loss_mask, s.rollout_log_probs, s.weight_versions, s.generation_spans, s.reward, s.status


def test_the_trainer_api_replays_the_runs_groups_and_exclusions(run_dir):
    import ray

    from rollout.core.pool import RolloutPool

    # Ray may already run in this pytest process (an earlier test file of the same xdist worker
    # started it: one CI run): the replay must not start it, which is what can be observed here
    ray_before = ray.is_initialized()
    kept = read_samples(run_dir / "samples.jsonl")
    excluded = read_samples(run_dir / "failed.jsonl") + read_samples(run_dir / "filtered.jsonl")
    reasons = {s.episode_id: s.metadata["excluded_reason"] for s in excluded}
    assert set(reasons.values()) == {"max_steps", "group_dropped"} and any("~r1" in i for i in reasons), reasons
    assert len(kept) == 6

    pool = RolloutPool.replay(run_dir)
    groups, out = [], []
    for item in pool.stream(excluded=True):
        if isinstance(item, Excluded):
            out.append((item.sample.episode_id, item.reason))
        else:
            groups.append(item)
    assert [_view(s) for g in groups for s in g] == [_view(s) for s in kept]  # the run's order: samples.jsonl's
    assert sorted(out) == sorted(reasons.items())
    failed = [s.episode_id for s in read_samples(run_dir / "failed.jsonl")]  # in the order the run excluded them, as filtered.jsonl
    assert [i for i, _ in out if i in failed] == failed
    assert [i for i, _ in out if i not in failed] == [s.episode_id for s in read_samples(run_dir / "filtered.jsonl")]
    st = pool.stats()
    assert st["members_rerun"] == 2 and st["groups_dropped"] == 1 and st["groups_kept"] == 3 and st["replay_skipped"] == 0
    assert ray.is_initialized() == ray_before  # the replay started no Ray (and stopped none)

    # collect_groups: the same groups, in the same order, B at a time (task_source is not read)
    pool = RolloutPool.replay(run_dir)
    collected = pool.collect_groups(2, itertools.cycle(["never read"])) + pool.collect_groups(2, None)
    assert [[s.episode_id for s in g] for g in collected] == [[s.episode_id for s in g] for g in groups]
    assert sorted((e.sample.episode_id, e.reason) for e in pool.excluded()) == sorted(reasons.items())


def test_run_replay_writes_the_runs_files_line_for_line(run_dir):
    proc = subprocess.run([sys.executable, "-m", "rollout", "run", "--replay", str(run_dir)], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = run_dir / "replay"
    for name in ("samples.jsonl", "failed.jsonl", "filtered.jsonl"):
        assert (out / name).read_text() == (run_dir / name).read_text(), name
    summary, original = json.loads((out / "summary.json").read_text()), json.loads((run_dir / "summary.json").read_text())
    assert summary["replay_of"] == str(run_dir) and summary["replayed_run_status"] == "finished"
    for key in ("episodes", "status_counts", "excluded_counts", "trained_samples", "groups", "mean_reward_per_domain"):
        assert summary[key] == original[key], key
    assert "local_stack_logs" not in {p.name for p in out.iterdir()}  # nothing was started

    again = subprocess.run([sys.executable, "-m", "rollout", "run", "--replay", str(run_dir)], cwd=ROOT, env=_env(),
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and "holds a run" in again.stderr and "--overwrite" in again.stderr, again.stderr[-2000:]
    assert subprocess.run([sys.executable, "-m", "rollout", "run", "--replay", str(run_dir), "--overwrite"], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=120).returncode == 0


def test_run_replay_refuses_what_is_not_a_run_and_the_runs_own_folder(run_dir, tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    proc = subprocess.run([sys.executable, "-m", "rollout", "run", "--replay", str(tmp_path)], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and f"{tmp_path} is not a run folder" in err[0], err
    own = subprocess.run([sys.executable, "-m", "rollout", "run", "--replay", str(run_dir), f"rollout.output_dir={run_dir}"], cwd=ROOT,
                         env=_env(), capture_output=True, text=True, timeout=120)
    assert own.returncode == 2 and "the replayed run's own folder" in own.stderr, own.stderr[-2000:]
    resumed = subprocess.run([sys.executable, "-m", "rollout", "run", "--replay", str(run_dir), "--resume"], cwd=ROOT, env=_env(),
                             capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 2 and "nothing to --resume" in resumed.stderr
