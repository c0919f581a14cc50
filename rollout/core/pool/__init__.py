"""The driver-side pool of Ray rollout actors (the only core package that imports Ray): see
:class:`RolloutPool` (a facade over the parts in this package: actors, scheduler, ledger,
streams, weights, steps)."""

from rollout.core.pool.errors import JournalWriteError, NoHealthyActorError, RayHeadLostError, RunAborted, RunInterrupted
from rollout.core.pool.ledger import POOL_COUNTERS
from rollout.core.pool.pool import RolloutPool
from rollout.core.pool.replay import ReplayPool
from rollout.core.pool.specs import episode_seed, make_specs
from rollout.core.pool.weights import PAUSE_MODES, PauseReport

__all__ = ["PAUSE_MODES", "POOL_COUNTERS", "JournalWriteError", "NoHealthyActorError", "PauseReport", "RayHeadLostError", "ReplayPool", "RolloutPool", "RunAborted",
           "RunInterrupted", "episode_seed", "make_specs"]
