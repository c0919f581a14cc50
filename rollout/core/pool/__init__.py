"""The driver-side pool of Ray rollout actors (the only core package that imports Ray): see
:class:`RolloutPool`."""

from rollout.core.pool.pool import (
    PAUSE_MODES,
    POOL_COUNTERS,
    NoHealthyActorError,
    PauseReport,
    RayHeadLostError,
    RolloutPool,
    RunAborted,
    RunInterrupted,
    episode_seed,
    make_specs,
)

__all__ = ["PAUSE_MODES", "POOL_COUNTERS", "NoHealthyActorError", "PauseReport", "RayHeadLostError", "RolloutPool", "RunAborted",
           "RunInterrupted", "episode_seed", "make_specs"]
