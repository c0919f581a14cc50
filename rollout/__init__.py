"""tau-rollout: a Ray-distributed rollout actor pool producing exact tau-bench training data.

Importing this package has no side effects and imports neither Ray nor tau2: the names below are
loaded on first use. Ray is imported only by :mod:`rollout.core.pool` and ``launch/`` (docs/design.md,
invariant 6).

The public API::

    from rollout import load_config, open_pool, RolloutPool, Batch, TrainingSample, Excluded
    from rollout import register_benchmark, register_chat_format, register_sample_mode, register_context_strategy
"""

from __future__ import annotations

# First: the clock of this process's start-up (``python -m rollout`` imports this package before
# anything else runs; rollout.core.uptime).
from rollout.core import uptime as _uptime  # noqa: F401  isort: skip

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> the module that defines it (imported on first access)
_EXPORTS = {
    # configuration
    "Config": "rollout.core.config",
    "ConfigError": "rollout.core.config",
    "load_config": "rollout.core.config",
    # a started pool, the local stack included (the wiring the CLI uses too)
    "open_pool": "rollout.app.wiring",
    "register_engine": "rollout.core.engines",
    # the pool and how a run ends early
    "RolloutPool": "rollout.core.pool",
    "ReplayPool": "rollout.core.pool",
    "RunAborted": "rollout.core.pool",
    "RunInterrupted": "rollout.core.pool",
    "NoHealthyActorError": "rollout.core.pool",
    "RayHeadLostError": "rollout.core.pool",
    "PauseReport": "rollout.core.pool",
    "make_specs": "rollout.core.pool",
    # records
    "Batch": "rollout.core.records",
    "EpisodeSpec": "rollout.core.records",
    "EpisodeStatus": "rollout.core.records",
    "InteractionResult": "rollout.core.records",
    "TrainingSample": "rollout.core.records",
    "EpisodeMetrics": "rollout.core.metrics",
    "Excluded": "rollout.core.groups",
    # the run journal (resume)
    "RunJournal": "rollout.core.journal",
    # the seams' registries (rollout.core.registry): a name registered here is selectable in the
    # config (env.benchmark, policy.chat_format, rollout.sample_mode, policy.context_strategy)
    "register_benchmark": "rollout.core.environment",
    "register_chat_format": "rollout.core.formats.registry",
    "register_sample_mode": "rollout.core.export",
    "register_context_strategy": "rollout.core.context",
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
