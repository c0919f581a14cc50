"""The recorder seam: where the pool's code records metrics, with no metrics system imported.

Code that records asks a :class:`Recorder` once for a bound :class:`Instrument` (a metric of
:mod:`~rollout.core.telemetry.registry` with all its tags fixed) and then calls
``instrument.record(value)`` per event: a counter adds ``value``, a gauge takes it, a histogram
observes it. Binding resolves and checks the tags once; recording does nothing else, so it is cheap
enough for an actor's event loop that runs a thousand episodes (with Ray's metrics, 2 to 5 us per
record measured here, docs/observability.md#cost; nothing blocks: Ray aggregates in memory and
exports from a thread of its own).

Recorders:

* :data:`NULL_RECORDER` (:class:`NullRecorder`): records nothing; the default everywhere, so the
  episode loop, the worker and their tests run without any metrics system (docs/design.md,
  invariant 6).
* :class:`MemoryRecorder`: keeps every value in memory (tests, and a trainer that wants the
  figures in-process).
* ``rollout.core.pool.raymetrics.RayRecorder``: ``ray.util.metrics``, which Ray exports to
  Prometheus; the pool gives one to the driver and one to each actor.

A recorder's *default tags* (e.g. ``{"domain": "retail", "actor": "3"}``) fill the tags a metric
declares and a bind does not give; tags a metric does not declare are left out.
"""

from __future__ import annotations

import collections
import threading
from typing import Protocol

from rollout.core.telemetry.registry import Kind, MetricDef

__all__ = ["NULL_INSTRUMENT", "NULL_RECORDER", "BindingRecorder", "Instrument", "MemoryRecorder", "NullRecorder", "Recorder", "resolve_tags"]


class Instrument(Protocol):
    """One metric with its tags fixed."""

    def record(self, value: float = 1.0) -> None:
        """Count ``value`` (counter; 0 is ignored), set it (gauge) or observe it (histogram)."""
        ...


class Recorder(Protocol):
    """Where metrics go (see the module docstring).

    Attributes:
        enabled: False for a recorder that drops everything (callers may skip work that only
            feeds metrics, e.g. wrapping an environment).
    """

    enabled: bool

    def bind(self, metric: MetricDef, **tags: str) -> Instrument:
        """The instrument of ``metric`` with ``tags`` (plus the recorder's default tags); the same
        object for the same metric and tags.

        Raises:
            ValueError: a tag the metric does not declare, or a declared tag with no value (a
                recorder that records; the null recorder checks nothing).
        """
        ...


class _NullInstrument:
    __slots__ = ()

    def record(self, value: float = 1.0) -> None:
        """Drop ``value``."""


NULL_INSTRUMENT: Instrument = _NullInstrument()


class NullRecorder:
    """Records nothing (the default recorder)."""

    enabled = False

    def bind(self, metric: MetricDef, **tags: str) -> Instrument:
        """:data:`NULL_INSTRUMENT`, whatever the metric and tags."""
        return NULL_INSTRUMENT

    def __repr__(self) -> str:
        return "NullRecorder()"


NULL_RECORDER: Recorder = NullRecorder()


def resolve_tags(metric: MetricDef, defaults: dict[str, str], tags: dict[str, str]) -> dict[str, str]:
    """The full tags of one record of ``metric``: ``tags`` over ``defaults``, for the keys the
    metric declares (in its order), every value a ``str``.

    Raises:
        ValueError: ``tags`` names a key ``metric`` does not declare, or a declared key has no value.
    """
    extra = [k for k in tags if k not in metric.tags]
    if extra:
        raise ValueError(f"metric {metric.name} has no tag(s) {extra} (its tags: {list(metric.tags)})")
    out = {}
    for k in metric.tags:
        v = tags.get(k, defaults.get(k))
        if v is None:
            raise ValueError(f"metric {metric.name}: no value for tag {k!r} (given {tags}, defaults {defaults})")
        out[k] = str(v)
    return out


class BindingRecorder:
    """A recorder's common part: resolves a bind's tags once (:func:`resolve_tags`) and caches
    the instrument per metric and tags; a subclass makes the instrument (:meth:`_make`).
    Thread-safe (the driver's pool may run its calls in several threads, one at a time).

    Args:
        default_tags: tag values used where a bind gives none (``None``: none).
    """

    enabled = True

    def __init__(self, default_tags: dict[str, str] | None = None):
        self.default_tags = {k: str(v) for k, v in (default_tags or {}).items()}
        self._bound: dict[tuple, Instrument] = {}
        self._lock = threading.Lock()

    def bind(self, metric: MetricDef, **tags: str) -> Instrument:
        """See :meth:`Recorder.bind`."""
        key = (metric.name, *sorted(tags.items()))
        inst = self._bound.get(key)
        if inst is None:
            with self._lock:
                inst = self._bound.get(key)
                if inst is None:
                    inst = self._bound[key] = self._make(metric, resolve_tags(metric, self.default_tags, tags))
        return inst

    def _make(self, metric: MetricDef, tags: dict[str, str]) -> Instrument:
        raise NotImplementedError


class _MemoryInstrument:
    __slots__ = ("_store", "_key", "_kind")

    def __init__(self, store: MemoryRecorder, key: tuple, kind: Kind):
        self._store, self._key, self._kind = store, key, kind

    def record(self, value: float = 1.0) -> None:
        s = self._store
        with s._lock:
            if self._kind is Kind.COUNTER:
                if value < 0:
                    raise ValueError(f"a counter only goes up, got {value}")
                s._values[self._key] += value
            elif self._kind is Kind.GAUGE:
                s._values[self._key] = value
            else:
                s._observed[self._key].append(value)


class MemoryRecorder(BindingRecorder):
    """Keeps every record in memory, per metric and tags.

    Args:
        default_tags: see :class:`BindingRecorder`.
    """

    def __init__(self, default_tags: dict[str, str] | None = None):
        super().__init__(default_tags)
        self._values: collections.defaultdict[tuple, float] = collections.defaultdict(float)
        self._observed: collections.defaultdict[tuple, list[float]] = collections.defaultdict(list)

    def _make(self, metric: MetricDef, tags: dict[str, str]) -> Instrument:
        return _MemoryInstrument(self, (metric.name, tuple(tags.items())), metric.kind)

    def _matching(self, store: dict, metric: MetricDef, tags: dict[str, str]) -> list:
        want = {k: str(v) for k, v in tags.items()}
        return [v for (name, items), v in list(store.items()) if name == metric.name and want.items() <= dict(items).items()]

    def value(self, metric: MetricDef, **tags: str) -> float:
        """A counter's total, or a gauge's values summed, over the series whose tags include
        ``tags`` (0.0 when none).

        Raises:
            TypeError: ``metric`` is a histogram (see :meth:`observations`).
        """
        if metric.kind is Kind.HISTOGRAM:
            raise TypeError(f"{metric.name} is a histogram: use observations()")
        with self._lock:
            return float(sum(self._matching(self._values, metric, tags)))

    def observations(self, metric: MetricDef, **tags: str) -> list[float]:
        """A histogram's observed values over the series whose tags include ``tags``, each
        series' in record order, series in first-record order.

        Raises:
            TypeError: ``metric`` is not a histogram.
        """
        if metric.kind is not Kind.HISTOGRAM:
            raise TypeError(f"{metric.name} is a {metric.kind.value}: use value()")
        with self._lock:
            return [x for series in self._matching(self._observed, metric, tags) for x in series]

    def series(self) -> dict[str, list[tuple[dict[str, str], float | list[float]]]]:
        """Every series recorded: metric name -> ``[(tags, total or last value or observations)]``."""
        out: dict[str, list] = collections.defaultdict(list)
        with self._lock:
            for (name, items), v in self._values.items():
                out[name].append((dict(items), v))
            for (name, items), obs in self._observed.items():
                out[name].append((dict(items), list(obs)))
        return dict(out)
