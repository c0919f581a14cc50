"""Episode specs for a submission: ids, groups and sampling seeds (pure; no Ray)."""

from __future__ import annotations

import hashlib
from typing import Iterable

from rollout.core.records import EpisodeSpec


def episode_seed(seed: int, group_id: str, sample_index: int) -> int:
    """The sampling seed of one episode, in ``[0, 2**31 - 1)``: a stable hash of the run's
    ``seed``, the group id (unique per submission) and the sample index, so that the same task
    submitted again (a new group) samples new trajectories, and a run is reproducible."""
    digest = hashlib.blake2b(f"{seed}:{group_id}:{sample_index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % (2**31 - 1)


def make_specs(domain: str, task_ids: Iterable[str], n_samples_per_task: int, seed: int = 0, weight_version: int = 0, prefix: str = "") -> list[EpisodeSpec]:
    """Episode specs for ``task_ids`` x ``n_samples_per_task``.

    Group ids are ``{prefix}{domain}/{task_id}``; episode ids ``{group_id}/{sample_index}``; seeds
    from :func:`episode_seed`.
    """
    specs = []
    for tid in task_ids:
        gid = f"{prefix}{domain}/{tid}"
        for i in range(n_samples_per_task):
            specs.append(
                EpisodeSpec(
                    episode_id=f"{gid}/{i}",
                    domain=domain,
                    task_id=str(tid),
                    group_id=gid,
                    sample_index=i,
                    seed=episode_seed(seed, gid, i),
                    weight_version=weight_version,
                )
            )
    return specs


def as_weight_version(v: int | str) -> int:
    """``v`` as an integer weight version.

    Raises:
        ValueError: ``v`` is not an integer (staleness is counted in versions).
    """
    try:
        return int(str(v))
    except ValueError:
        raise ValueError(f"weight_version must be an integer (staleness is counted in versions), got {v!r}") from None
