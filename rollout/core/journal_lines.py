"""The journal's episode line (``episodes.jsonl``, :mod:`rollout.core.journal`): a delivered
sample's JSON with the trainer's weight version at delivery in its metadata, written and read."""

from __future__ import annotations

import dataclasses
from typing import Any

from rollout.core.fastjson import dumps_line
from rollout.core.records import TrainingSample

# The metadata key of an episodes.jsonl line that holds the trainer's weight version at delivery
# (written by the journal, taken out when it is read).
DELIVERY_VERSION_KEY = "delivered_at_weight_version"

_SAMPLE_FIELDS = tuple(f.name for f in dataclasses.fields(TrainingSample))


def sample_line(sample: TrainingSample, weight_version: int | None = None) -> bytes:
    """``sample``'s journal line: the JSON of :meth:`TrainingSample.to_dict` (``weight_version``,
    when given, in its metadata as :data:`DELIVERY_VERSION_KEY`), encoded from the sample's own
    containers without copying them (encoding does not change them); a sample whose containers
    the encoder does not take (e.g. an ``array.array``) goes through ``to_dict``'s copies."""
    line = {name: getattr(sample, name) for name in _SAMPLE_FIELDS}
    line["task_issues"] = [i.to_dict() for i in sample.task_issues]  # records, as to_dict writes them (usually none)
    if not line["segment_starts"]:
        del line["segment_starts"]  # as to_dict leaves it out
    if weight_version is not None:
        line["metadata"] = {**line["metadata"], DELIVERY_VERSION_KEY: int(weight_version)}
    try:
        return dumps_line(line)
    except TypeError:
        full = sample.to_dict()
        if weight_version is not None:
            full["metadata"][DELIVERY_VERSION_KEY] = int(weight_version)
        return dumps_line(full)


def episode_from_line(line: dict[str, Any]) -> tuple[TrainingSample, int | None]:
    """A journaled episode line as ``(sample, the trainer's version at delivery or None)``; the
    version is taken out of the sample's metadata."""
    v = (line.get("metadata") or {}).pop(DELIVERY_VERSION_KEY, None)
    return TrainingSample.from_dict(line), (None if v is None else int(v))
