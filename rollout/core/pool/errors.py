"""The ways a pool run ends early: :class:`RunAborted` and its kinds, each carrying every episode
submitted and not delivered (so that nothing submitted is lost: re-submit them, or
``rollout run --resume`` runs them)."""

from __future__ import annotations

from rollout.core.records import EpisodeSpec


class RunAborted(RuntimeError):
    """The pool cannot go on; ``undelivered`` holds every episode submitted and not delivered
    (the pool forgets them: re-submit them, or ``rollout run --resume`` runs them).

    Attributes:
        undelivered: the specs, each as its first attempt (``attempt == 0``).
    """

    def __init__(self, message: str, undelivered: list[EpisodeSpec]):
        super().__init__(message)
        self.undelivered = list(undelivered)


class RunInterrupted(RunAborted):
    """:meth:`rollout.core.pool.RolloutPool.interrupt` was called (e.g. from a SIGINT / SIGTERM
    handler); the in-flight episodes were cancelled on the actors and are not delivered."""


class NoHealthyActorError(RunAborted):
    """No rollout actor was healthy for ``pool.no_actor_timeout_s`` seconds."""


class RayHeadLostError(RunAborted):
    """The Ray head (GCS) stopped answering for
    :data:`rollout.core.pool.scheduler.HEAD_LOST_AFTER_S` seconds."""
