"""Trainer-side logging (rollout.integrations.step_logger, launch/train_grpo_tiny.py --logger):
the figures are read back with TensorBoard's own event reader and from W&B's offline run file,
and a missing package is one line naming the extra, before anything starts.

The packages are the ``logging`` extra (``pip install -e ".[logging]"``); without them the tests
that need them are skipped, saying so."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from support.wandb_reader import read_wandb_history

from rollout.integrations import step_logger
from rollout.integrations.step_logger import MissingLoggerPackage, check_logger, open_step_logger, scalar_figures

ROOT = Path(__file__).resolve().parents[2]
LINES = [  # what launch/train_grpo_tiny.py writes to train_log.jsonl, abridged
    {"step": 0, "weight_version": 1, "groups_used": 4, "groups_filtered": 1, "reward_mean": 0.5, "max_abs_logprob_diff": 1.9e-06,
     "loss": -0.0123, "update_checked": True, "weight_versions_seen": ["0"], "group_episode_ids": [["b0:retail/10/0"]], "seconds": 168.2},
    {"step": 1, "weight_version": 2, "groups_used": 4, "groups_filtered": 0, "reward_mean": 0.4375, "max_abs_logprob_diff": 2.9e-06,
     "loss": 0.004, "update_checked": False, "weight_versions_seen": ["0", "1"], "group_episode_ids": [], "seconds": 128.0},
]


def _needs(package: str):
    if importlib.util.find_spec(package) is None:
        pytest.skip(f"{package} is not installed: pip install -e \".[logging]\"")


def test_scalar_figures_keep_the_numbers_of_a_line():
    figs = scalar_figures(LINES[0])
    assert figs == {"train/weight_version": 1.0, "train/groups_used": 4.0, "train/groups_filtered": 1.0, "train/reward_mean": 0.5,
                    "train/max_abs_logprob_diff": 1.9e-06, "train/loss": -0.0123, "train/update_checked": 1.0, "train/seconds": 168.2}
    assert scalar_figures({"x": float("nan"), "y": None, "z": "s"}) == {}


def test_tensorboard_figures_read_back_with_tensorboards_own_reader(tmp_path):
    _needs("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util.tensor_util import make_ndarray

    with open_step_logger("tensorboard", tmp_path) as log:
        for line in LINES:
            log.log(line["step"], scalar_figures(line))
    events = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert len(events) == 1
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    got = {tag: [(e.step, float(make_ndarray(e.tensor_proto))) for e in acc.Tensors(tag)] for tag in acc.Tags()["tensors"]}
    want: dict[str, list] = {}
    for line in LINES:
        for k, v in scalar_figures(line).items():
            want.setdefault(k, []).append((line["step"], v))
    assert got.keys() == want.keys()
    for tag in want:
        assert [s for s, _ in got[tag]] == [s for s, _ in want[tag]]
        assert [v for _, v in got[tag]] == pytest.approx([v for _, v in want[tag]], rel=1e-6)  # stored as float32


def test_wandb_offline_run_holds_the_figures(tmp_path, monkeypatch):
    _needs("wandb")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    with open_step_logger("wandb", tmp_path, run_name="unit", config={"b": 4}) as log:
        for line in LINES:
            log.log(line["step"], scalar_figures(line))
    (run_dir,) = list((tmp_path / "wandb").glob("offline-run-*"))
    (run_file,) = list(run_dir.glob("run-*.wandb"))
    rows = read_wandb_history(run_file)
    assert [r["_step"] for r in rows] == [0, 1]
    for row, line in zip(rows, LINES):
        assert {k: v for k, v in row.items() if not k.startswith("_")} == pytest.approx(scalar_figures(line))


def test_a_missing_package_is_one_line_naming_the_extra(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(step_logger.importlib.util, "find_spec", lambda name, *a: None if name in ("wandb", "tensorboard") else real(name, *a))
    for kind in ("tensorboard", "wandb"):
        with pytest.raises(MissingLoggerPackage, match=rf"--logger {kind} needs the '{kind}' package.*pip install -e \"\.\[logging\]\"") as e:
            check_logger(kind)
        assert "\n" not in str(e.value)
    check_logger("none")
    with pytest.raises(ValueError, match="none, tensorboard, wandb"):
        check_logger("mlflow")


def test_the_grpo_example_refuses_a_missing_logger_package_before_anything_starts(tmp_path, monkeypatch, capsys):
    import importlib.util as iu

    spec = iu.spec_from_file_location("train_grpo_tiny", ROOT / "launch" / "train_grpo_tiny.py")
    mod = iu.module_from_spec(spec)
    spec.loader.exec_module(mod)
    real = importlib.util.find_spec
    monkeypatch.setattr(step_logger.importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    out = tmp_path / "never"
    assert mod.main(["--logger", "wandb", "local.backend=tiny", f"rollout.output_dir={out}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and 'pip install -e ".[logging]"' in err[0], err
    assert not out.exists()
