"""``python -m rollout run --replay DIR``: a finished run's journal replayed into the CLI's own
writer, with nothing started (no Ray, no router, no local stack, no episode).

:func:`replay_config` makes the config (the run's own, overrides on top, the output in
``DIR/replay`` unless ``rollout.output_dir`` is overridden) and :func:`replay_job` streams the run
through :class:`rollout.core.pool.replay.ReplayPool` (``stream(excluded=True)``, as ``run`` does)
into ``samples.jsonl``, ``failed.jsonl``, ``filtered.jsonl`` and ``summary.json``: the files the
run wrote itself, line for line, when the config is the run's.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from rollout.core.config import Config, load_config
from rollout.core.journal import CONFIG_FILE, RUN_FILES, JournalError, check_run_folder, check_run_target, holds_run, load_run_config

logger = logging.getLogger(__name__)

REPLAY_SUBDIR = "replay"  # the default output folder, inside the replayed run's


def replay_config(run_dir: str | Path, config_path: str | None, overrides: list[str]) -> Config:
    """The config of a replay of the run in ``run_dir``: ``config_path`` if given, else the run's
    own (:func:`rollout.core.journal.load_run_config`), with ``overrides`` on top;
    ``rollout.output_dir`` is ``run_dir/replay`` unless an override sets it.

    Raises:
        rollout.core.journal.JournalError: ``run_dir`` is not a run folder, or records no config
            (and none is given).
        rollout.core.config.ConfigError: a bad config value or override (naming the key).
        FileNotFoundError: ``config_path`` does not exist.
    """
    check_run_folder(run_dir)
    if not any(o.startswith("rollout.output_dir=") for o in overrides):
        overrides = [*overrides, f"rollout.output_dir={Path(run_dir) / REPLAY_SUBDIR}"]
    if config_path is not None:
        return load_config(config_path, overrides)
    return load_run_config(run_dir, overrides)


def replay_job(run_dir: str | Path, cfg: Config, overwrite: bool = False) -> dict[str, Any]:
    """Replay the run in ``run_dir`` into ``cfg.rollout.output_dir``; returns the summary (also
    written to ``summary.json``, with ``replay_of`` naming the run and ``replayed_run_status`` its
    journal's status).

    Raises:
        rollout.core.journal.JournalError: ``run_dir`` is not a run folder; the output folder is
            the run's own, or holds a run or other files and ``overwrite`` is false.
        rollout.app.preflight.PreflightError: the output folder cannot be written.
    """
    from rollout.app.preflight import check_output_dir
    from rollout.core.groups import Excluded
    from rollout.core.output import RunWriter
    from rollout.core.pool.replay import ReplayPool

    out = Path(cfg.rollout.output_dir)
    if out.resolve() == Path(run_dir).resolve():
        raise JournalError(f"rollout.output_dir={out} is the replayed run's own folder: its files would be replaced; "
                           f"leave rollout.output_dir unset (then {Path(run_dir) / REPLAY_SUBDIR}) or name another folder")
    pool = ReplayPool.open(run_dir, cfg)  # a folder that is not a run is refused before anything is written
    check_output_dir(str(out))
    if holds_run(out):
        if not overwrite:
            raise JournalError(f"{out} holds a run (an earlier replay?); pass --overwrite to replace it, or set rollout.output_dir")
        for f in RUN_FILES:
            (out / f).unlink(missing_ok=True)
    else:
        check_run_target(out, overwrite=overwrite)  # a folder of other files: refused unless --overwrite
    t0 = time.monotonic()
    writer = RunWriter(out, cfg.rollout.train_statuses)
    (out / CONFIG_FILE).write_text(cfg.to_yaml())
    for item in pool.stream(excluded=True):
        if isinstance(item, Excluded):
            writer.add_excluded(item)
        else:
            writer.add_group(item)
    st = pool.stats()
    return writer.close({
        "status": "finished", "reason": None, "undelivered": 0, "replay_of": str(run_dir),
        "replayed_run_status": pool.record.state.get("status", "unknown"), "replay_skipped": st["replay_skipped"],
        "domain": cfg.env.domain, "task_split": cfg.env.task_split, "n_samples_per_task": cfg.rollout.n_samples_per_task,
        "sample_mode": str(cfg.rollout.sample_mode), "history": str(cfg.policy.history),
        "context_strategy": cfg.policy.context_strategy, "max_context_tokens": cfg.policy.max_context_tokens,
        "groups": {k: st.get(k, 0) for k in ("groups_kept", "groups_filtered", "groups_dropped", "members_rerun")},
        "wall_s": time.monotonic() - t0,
    })
