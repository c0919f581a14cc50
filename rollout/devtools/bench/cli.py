"""What the bench commands share at their start: the config loaded and checked as
``python -m rollout run`` loads and checks it, a bad one printed as a config error (exit 2)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["load_checked_config"]


def load_checked_config(config: str | None, overrides: Sequence[str], check: bool = True) -> Any | None:
    """The config ``config`` (a YAML path; None: the defaults) with ``overrides`` (``key=value``)
    merged (:func:`rollout.core.config.load_config`) and, with ``check`` (the default), checked
    against this machine (:func:`rollout.app.preflight.check_config`). Imports them when called, so that a bench's
    ``--help`` stays fast.

    Returns:
        the :class:`rollout.core.config.Config`, or None when it is bad (a ``ConfigError``, or a
        file that is not there): ``config error: ...`` is then printed to stderr and the bench
        exits 2.
    """
    from rollout.app.preflight import check_config
    from rollout.core.config import ConfigError, load_config

    try:
        cfg = load_config(config, list(overrides))
        if check:
            check_config(cfg)
    except (ConfigError, FileNotFoundError) as e:
        print(f"config error: {e}", file=sys.stderr)
        return None
    return cfg
