"""launch/train_grpo_tiny.py: every weight update but the last meets the next step's episodes
generating (an update placed by state, not by the machine's speed), and the exit code says so;
``--replay`` of its output gives the trainer the same groups in the same order (rollout replay's
acceptance test); ``--logger`` writes its figures to TensorBoard / W&B offline."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "launch" / "train_grpo_tiny.py"


def _load_script():
    spec = importlib.util.spec_from_file_location("train_grpo_tiny", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _line(step: int, checked: bool, calls: int) -> dict:
    return {"step": step, "update_checked": checked, "update_interrupted_calls": calls}


def _summary(log: list[dict], exactly_once: bool = True, diff: float = 0.0) -> dict:
    mod = _load_script()
    return {"exactly_once": exactly_once, "max_abs_logprob_diff": diff, "idle_updates": mod.idle_updates(log)}


def test_an_update_that_interrupted_nothing_fails_the_run_unless_allowed():
    mod = _load_script()
    busy = [_line(0, True, 4), _line(1, True, 1), _line(2, False, 0)]  # the last step's update is not checked
    idle = [_line(0, True, 4), _line(1, True, 0), _line(2, False, 3)]
    assert mod.idle_updates(busy) == [] and mod.idle_updates(idle) == [1]
    assert mod.run_ok(_summary(busy), 1e-3, allow_idle_updates=False)
    assert not mod.run_ok(_summary(idle), 1e-3, allow_idle_updates=False)
    assert mod.run_ok(_summary(idle), 1e-3, allow_idle_updates=True)
    # the exactly-once and log-prob checks still fail the run, idle updates allowed or not
    assert not mod.run_ok(_summary(busy, exactly_once=False), 1e-3, allow_idle_updates=True)
    assert not mod.run_ok(_summary(busy, diff=2e-3), 1e-3, allow_idle_updates=True)


def test_rollout_ahead_must_leave_part_of_the_next_batch_to_start_after_training(capsys):
    mod = _load_script()
    args = mod.parse_args(["--groups-per-step", "4"])
    assert mod.check_args(args) is None and args.rollout_ahead == 3  # default: B - 1
    assert mod.check_args(mod.parse_args(["--groups-per-step", "1"])) is None
    assert mod.main(["--groups-per-step", "4", "--rollout-ahead", "4", "local.backend=tiny"]) == 2
    assert "--rollout-ahead must be in [0, B - 1] = [0, 3], got 4" in capsys.readouterr().err
    assert mod.main(["--groups-per-step", "0"]) == 2


@pytest.fixture(scope="module")
def live_run(tmp_path_factory, shared_ray):
    """Two steps of one group on a local stack of its own (its weights are updated) and the
    session's shared Ray head, the figures also to TensorBoard (when the 'logging' extra is
    installed): ``(output dir, the finished process)``."""
    pytest.importorskip("torch")
    out = tmp_path_factory.mktemp("grpo") / "grpo"
    env = dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True")
    env.pop("RAY_ADDRESS", None)
    logger = ["--logger", "tensorboard"] if importlib.util.find_spec("tensorboard") else []
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--config", "configs/local.yaml", "local.backend=tiny", "--steps", "2", "--groups-per-step", "1",
         "env.task_ids=[10,25]", "rollout.n_samples_per_task=2", "policy.sampling.max_new_tokens=128", "pool.num_actors=1",
         shared_ray.override(), f"rollout.output_dir={out}", *logger],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=540,
    )
    return out, proc


def _log(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.timeout(600)
def test_every_update_but_the_last_interrupts_the_next_steps_generation(live_run):
    """Two steps of one group: step 0's update interrupts /generate calls of step 1's episodes,
    which step 1 delivers interrupted and continued; exit 0, exactly once, exact log-probs."""
    out, proc = live_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    log = _log(out / "train_log.jsonl")
    assert [line["step"] for line in log] == [0, 1]
    # step 0's update interrupted step 1's episodes: step 1 delivers them, their turn continued
    assert log[0]["episodes_interrupted"] == 0 and log[0]["episodes_outstanding_at_update"] >= 1, log[0]
    assert log[1]["episodes_interrupted"] >= 1 and log[1]["episodes_continued"] >= 1, log[1]
    # what step 0's update met: requests generating on the servers, /generate calls it interrupted
    assert [line["update_checked"] for line in log] == [True, False]
    assert log[0]["update_generating_requests"] >= 1 and log[0]["update_interrupted_calls"] >= 1, log[0]
    assert log[0]["update_episodes_running"] >= 1, log[0]
    assert "1" in log[1]["weight_versions_seen"] and all(line["max_abs_logprob_diff"] <= 1e-3 for line in log)
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["exactly_once"] and summary["idle_updates"] == []
    assert "idle checked updates: none" in proc.stdout


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.timeout(600)
def test_replaying_the_runs_output_gives_the_trainer_the_same_groups_in_the_same_order(live_run):
    """The acceptance test of rollout replay: ``--replay`` of the run's output folder (its
    journal) hands each step the groups the run's step got, in the same order, with the same
    exclusions, with nothing started; the training on them is the run's, to the bit (the same
    loss, update and log-prob check), so the replayed trainer reaches the weights the run's servers
    sampled with. Its figures go to W&B offline (when the 'logging' extra is installed); the run's
    went to TensorBoard, read back here with TensorBoard's own reader."""
    out, proc = live_run
    assert (out / "episodes.jsonl").is_file() and (out / "events.jsonl").is_file(), proc.stdout[-2000:] + proc.stderr[-2000:]
    live = _log(out / "train_log.jsonl")
    env = dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True")
    env.pop("RAY_ADDRESS", None)
    logger = ["--logger", "wandb"] if importlib.util.find_spec("wandb") else []
    rep = subprocess.run([sys.executable, str(SCRIPT), "--replay", str(out), "--steps", "2", "--groups-per-step", "1", *logger],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert rep.returncode == 0, rep.stdout[-3000:] + rep.stderr[-3000:]
    assert "the check that every update interrupted /generate calls needs live generation and is skipped" in rep.stdout
    replay = _log(out / "replay" / "train_log.jsonl")
    assert [line["group_episode_ids"] for line in replay] == [line["group_episode_ids"] for line in live]
    assert [line["excluded_episodes"] for line in replay] == [line["excluded_episodes"] for line in live]
    for key in ("reward_mean", "loss", "update_norm", "max_abs_logprob_diff", "logprob_tokens_checked", "weight_versions_seen",
                "episodes_interrupted", "episodes_continued"):
        assert [line[key] for line in replay] == [line[key] for line in live], key
    summary = json.loads((out / "replay" / "train_summary.json").read_text())
    assert summary["exactly_once"] and summary["replay_of"] == str(out)
    assert not (out / "replay" / "train_stack_logs").exists()  # no local stack was started
    if importlib.util.find_spec("tensorboard"):
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
        from tensorboard.util.tensor_util import make_ndarray

        acc = EventAccumulator(str(out / "tensorboard"))
        acc.Reload()
        assert [(e.step, float(make_ndarray(e.tensor_proto))) for e in acc.Tensors("train/reward_mean")] == \
            [(line["step"], pytest.approx(line["reward_mean"])) for line in live]
    if logger:
        from support.wandb_reader import read_wandb_history

        (run_file,) = (out / "replay" / "wandb").glob("offline-run-*/run-*.wandb")
        rows = read_wandb_history(run_file)
        assert [(r["_step"], r["train/loss"]) for r in rows] == [(line["step"], pytest.approx(line["loss"])) for line in replay]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_grpo_example_trains_on_per_turn_samples(tmp_path, shared_ray):
    """rollout.sample_mode=per_turn over a re-rendered history (policy.history=rerender): every
    sample of a group's episodes is trained with its episode's advantage; the log-probs of every
    per-turn sample (its own tokens, the weights that sampled each token) match, and every episode
    is delivered once."""
    pytest.importorskip("torch")
    out = tmp_path / "grpo"
    env = dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True")
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--config", "configs/local.yaml", "local.backend=tiny", "--steps", "2", "--groups-per-step", "1",
         "env.task_ids=[10,25]", "rollout.n_samples_per_task=2", "policy.sampling.max_new_tokens=64", "pool.num_actors=1",
         shared_ray.override(), "rollout.sample_mode=per_turn", "policy.history=rerender", f"rollout.output_dir={out}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=540,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert [line["step"] for line in log] == [0, 1]
    assert all(line["max_abs_logprob_diff"] <= 1e-3 for line in log), log
    assert json.loads((out / "train_summary.json").read_text())["exactly_once"]
