"""Metrics of the pool and its actors, with no metrics system imported here.

* :mod:`~rollout.core.telemetry.registry`: every metric (:data:`METRICS`, :class:`MetricDef`):
  name, kind, the process that records it, unit, tags, meaning.
* :mod:`~rollout.core.telemetry.recorder`: the seam (:class:`Recorder`, :class:`Instrument`), the
  default :data:`NULL_RECORDER` and the in-memory :class:`MemoryRecorder`.
* :mod:`~rollout.core.telemetry.probes`: the places that record (the ``/generate`` client, the
  environment wrapper, delivered episodes).

The Ray-backed recorder, whose metrics Ray exports to Prometheus, is
``rollout.core.pool.raymetrics.RayRecorder`` (Ray is imported by the pool only: docs/design.md,
invariant 6). What each metric means and how to see it: docs/observability.md.
"""

from rollout.core.telemetry.recorder import (
           NULL_INSTRUMENT,
           NULL_RECORDER,
           BindingRecorder,
           Instrument,
           MemoryRecorder,
           NullRecorder,
           Recorder,
)
from rollout.core.telemetry.registry import KNOWN_TAGS, METRICS, Kind, MetricDef, Side, metric

__all__ = ["KNOWN_TAGS", "METRICS", "NULL_INSTRUMENT", "NULL_RECORDER", "BindingRecorder", "Instrument", "Kind", "MemoryRecorder",
           "MetricDef", "NullRecorder", "Recorder", "Side", "metric"]
