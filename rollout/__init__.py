"""tau-rollout: a Ray-distributed rollout actor pool producing exact tau-bench training data.

Importing this package has no side effects and imports neither Ray nor tau2: the names below are
loaded on first use. Ray is imported only by :mod:`rollout.pool` and ``launch/`` (DESIGN.md
invariant 6).

The public API::

    from rollout import load_config, open_pool, RolloutPool, Batch, TrainingSample
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> the module that defines it (imported on first access)
_EXPORTS = {
    "Config": "rollout.config",
    "ConfigError": "rollout.config",
    "load_config": "rollout.config",
    "open_pool": "rollout.wiring",
    "RolloutPool": "rollout.pool",
    "RunAborted": "rollout.pool",
    "Batch": "rollout.records",
    "EpisodeSpec": "rollout.records",
    "EpisodeStatus": "rollout.records",
    "InteractionResult": "rollout.records",
    "TrainingSample": "rollout.records",
    "RunJournal": "rollout.journal",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rollout' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
