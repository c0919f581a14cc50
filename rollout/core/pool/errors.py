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


class JournalWriteError(RunAborted):
    """The run journal could not be written (the operating system refused a write: the output
    disk is full, or broken): the run stops at once. Every episode journaled before is kept (the
    line being written was taken back); the episodes in flight were cancelled on the actors and
    are in ``undelivered``, with the one whose line failed. Free space, then resume from the
    journal (``rollout run --resume``; ``RunJournal.open(dir, cfg, resume=True)``, ``pool.restore``).

    Attributes:
        path: the file that could not be written.
        disk_full: whether the storage is out of room (``ENOSPC`` and the like).
    """

    def __init__(self, message: str, undelivered: list[EpisodeSpec], path: str, disk_full: bool):
        super().__init__(message, undelivered)
        self.path = path
        self.disk_full = disk_full
