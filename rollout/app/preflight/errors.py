"""The preflight's error and its one-line helpers (defined in :mod:`rollout.core.startup`, which
the pool's own start-up checks use too)."""

from rollout.core.startup import PreflightError, one_line, reason

__all__ = ["PreflightError", "one_line", "reason"]
