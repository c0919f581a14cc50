"""A trainer's per-step figures to TensorBoard or Weights & Biases (offline), besides its own log.

    from rollout.integrations.step_logger import check_logger, open_step_logger, scalar_figures

    check_logger("tensorboard")                       # before anything starts: one line if missing
    with open_step_logger("tensorboard", out_dir) as log:
        for step in ...:
            line = {...}                              # what the trainer writes to train_log.jsonl
            log.log(step, scalar_figures(line))

Kinds (:data:`LOGGERS`): ``none``; ``tensorboard`` (an event file under ``out_dir/tensorboard``,
written with TensorBoard's own ``tensorboard.summary.Writer``, no TensorFlow or torch needed;
``tensorboard --logdir out_dir/tensorboard``); ``wandb`` (Weights & Biases in offline mode,
``WANDB_MODE=offline``: the run's files under ``out_dir/wandb/offline-run-*``, nothing sent; upload
later with ``wandb sync``). The packages are the ``logging`` extra (``pip install -e
".[logging]"``), imported only when a logger of theirs is opened. ``launch/train_grpo_tiny.py
--logger`` uses this module.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

LOGGERS = ("none", "tensorboard", "wandb")
EXTRA = "logging"  # the pyproject extra that installs the packages
_PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb"}
TENSORBOARD_DIR = "tensorboard"
WANDB_DIR = "wandb"


class MissingLoggerPackage(ImportError):
    """The package a logger needs is not installed (the message is one line naming the extra)."""


def check_logger(kind: str) -> None:
    """Check that logger ``kind`` can be opened here, without importing its package.

    Raises:
        ValueError: ``kind`` is not one of :data:`LOGGERS`.
        MissingLoggerPackage: its package is not installed; the message names the extra to install.
    """
    if kind not in LOGGERS:
        raise ValueError(f"logger must be one of {', '.join(LOGGERS)}, got {kind!r}")
    package = _PACKAGES.get(kind)
    if package is not None and importlib.util.find_spec(package) is None:
        raise MissingLoggerPackage(f"--logger {kind} needs the {package!r} package, which is not installed: "
                                   f"pip install -e \".[{EXTRA}]\" (or pip install {package})")


def scalar_figures(line: dict[str, Any], prefix: str = "train/", skip: tuple[str, ...] = ("step",)) -> dict[str, float]:
    """The numbers of one step's log line as ``{prefix + key: float}``: ints, floats and bools
    (as 0 / 1); lists, strings, ``None``, NaN and the keys in ``skip`` are left out."""
    out: dict[str, float] = {}
    for k, v in line.items():
        if k in skip or not isinstance(v, (int, float)):  # bool is an int
            continue
        v = float(v)
        if math.isfinite(v):
            out[prefix + k] = v
    return out


class StepLogger:
    """Where a trainer's per-step figures go (a context manager that closes it); this base
    records nothing (``none``)."""

    def log(self, step: int, figures: dict[str, float]) -> None:
        """Record ``figures`` (name -> value) at training step ``step``."""

    def close(self) -> None:
        """Flush and close (the files are complete afterwards)."""

    def __enter__(self) -> "StepLogger":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class NullLogger(StepLogger):
    """``none``: records nothing."""


class TensorBoardLogger(StepLogger):
    """``tensorboard``: one scalar per figure and step in an event file under ``log_dir``.

    Args:
        log_dir: the event files' folder (created).

    Raises:
        MissingLoggerPackage: ``tensorboard`` is not installed.
    """

    def __init__(self, log_dir: str | Path):
        check_logger("tensorboard")
        from tensorboard.summary import Writer

        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._writer = Writer(str(self.log_dir))

    def log(self, step: int, figures: dict[str, float]) -> None:
        for name, value in figures.items():
            self._writer.add_scalar(name, value, step=int(step))
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbLogger(StepLogger):
    """``wandb``: a W&B run in offline mode (``WANDB_MODE=offline`` is set for it), its files
    under ``root/wandb/offline-run-*``; nothing is sent over the network.

    Args:
        root: the folder W&B writes its ``wandb/`` folder into (created).
        project: the W&B project name (used when the run is synced).
        run_name: the run's display name.
        config: the run's config (shown with the run once synced).

    Raises:
        MissingLoggerPackage: ``wandb`` is not installed.
    """

    def __init__(self, root: str | Path, project: str = "tau-rollout", run_name: str | None = None, config: dict[str, Any] | None = None):
        check_logger("wandb")
        os.environ["WANDB_MODE"] = "offline"
        import wandb

        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        settings = wandb.Settings(console="off", silent=True, disable_git=True, save_code=False)
        self._run = wandb.init(project=project, name=run_name, dir=str(self.root), mode="offline", config=config or {}, settings=settings)
        self.run_dir = Path(self._run.dir).parent  # .../wandb/offline-run-<time>-<id>

    def log(self, step: int, figures: dict[str, float]) -> None:
        self._run.log(dict(figures), step=int(step))

    def close(self) -> None:
        """Finish the run. W&B's service process writes the run file after ``finish`` returns (seen
        here: up to a second later), so when no other W&B run is active in this process the
        service is shut down too (``wandb.teardown``, as at exit), and the files are complete."""
        import wandb

        self._run.finish()
        if wandb.run is None:
            wandb.teardown()


def open_step_logger(kind: str, out_dir: str | Path, *, run_name: str | None = None, config: dict[str, Any] | None = None) -> StepLogger:
    """Open logger ``kind`` (:data:`LOGGERS`) for a run whose output folder is ``out_dir``:
    TensorBoard under ``out_dir/tensorboard``, W&B under ``out_dir/wandb``.

    Raises:
        ValueError: unknown ``kind``.
        MissingLoggerPackage: its package is not installed (one line naming the extra).
    """
    check_logger(kind)
    out = Path(out_dir)
    if kind == "tensorboard":
        tb = TensorBoardLogger(out / TENSORBOARD_DIR)
        logger.info("per-step figures to TensorBoard: tensorboard --logdir %s", out / TENSORBOARD_DIR)
        return tb
    if kind == "wandb":
        wb = WandbLogger(out, run_name=run_name, config=config)
        logger.info("per-step figures to W&B (offline): %s (upload: wandb sync %s)", wb.run_dir, wb.run_dir)
        return wb
    return NullLogger()
