"""The Ray-backed recorder: :class:`RayRecorder` records the metrics of
:mod:`rollout.core.telemetry.registry` through ``ray.util.metrics`` (Counter, Gauge, Histogram),
which Ray's metrics agent on each node exports in Prometheus' text format on the node's metrics
export port (``ray start --metrics-export-port=PORT``); the Ray dashboard's Grafana and any
Prometheus that scrapes Ray see them with nothing else to run. Seen with Ray 2.60: each series
gets Ray's labels besides ours (``SessionName``, ``NodeAddress``, ``WorkerId``, ``Component``,
``Version``), a counter is exported as ``ray_<name>_total``, and a value recorded before the
process is connected to Ray (``ray.init``) is dropped. Two facts of that Ray shape what is here:

* A gauge is exported only while it is being set: the metrics agent drops a gauge value that was
  not set again within two export intervals (``RAY_metrics_report_interval_ms``, 10 s by default;
  Ray's ``open_telemetry_metric_recorder``, and seen here: a gauge set once was gone 3 s later at a
  1 s interval). A gauge here keeps its last value: a daemon thread (``tau-rollout-gauges``, one per
  process) sets every gauge again every :data:`GAUGE_REFRESH_S` seconds, so a queue that stays
  empty or a weight version that stays put stays on the dashboard while the process lives.
* A histogram's ``_sum`` is not the sum of the values observed: the agent rebuilds each
  histogram from its bucket counts, each observation at its bucket's midpoint. The bucket counts
  and ``_count`` are exact; a mean from ``_sum / _count`` is an estimate (hence the exact
  ``tau_rollout_rewards`` counter beside the reward histogram).

The pool gives one to the driver (default tag ``domain``) and one to each actor (``domain`` and
``actor``, its index): pickled as its default tags only (:meth:`RayRecorder.__reduce__`), it makes
its own metric objects in the process that uses it, so it can go to an actor as a constructor
argument and come back the same after Ray restarts the actor.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref

from ray.util import metrics as ray_metrics

from rollout.core.telemetry.recorder import BindingRecorder, Instrument
from rollout.core.telemetry.registry import Kind, MetricDef

logger = logging.getLogger(__name__)

__all__ = ["GAUGE_REFRESH_S", "RayRecorder"]

GAUGE_REFRESH_S = 0.5  # under Ray's floor of 1 s between exports, so every export carries every gauge


class _RayInstrument:
    """One Ray metric object with one set of tags; never raises (a metric must not end an
    episode): a failing record is logged once per instrument (WARNING) and dropped."""

    __slots__ = ("_record", "_tags", "_name", "_warned")

    def __init__(self, metric: MetricDef, obj, tags: dict[str, str]):
        self._record = getattr(obj, {Kind.COUNTER: "inc", Kind.GAUGE: "set", Kind.HISTOGRAM: "observe"}[metric.kind])
        self._tags = tags
        self._name = metric.name
        self._warned = False

    def record(self, value: float = 1.0) -> None:
        try:
            self._record(float(value), self._tags)
        except Exception as e:  # noqa: BLE001 (dropped, logged once)
            if not self._warned:
                self._warned = True
                logger.warning("metric %s %s: record(%r) failed: %r (further failures of it are not logged)", self._name, self._tags, value, e)


class _RayCounter(_RayInstrument):
    __slots__ = ()

    def record(self, value: float = 1.0) -> None:
        if value > 0:  # Ray's Counter.inc refuses 0
            super().record(value)


class _RayGauge(_RayInstrument):
    """A gauge that the refresher sets again (its last value) until the process ends."""

    __slots__ = ("last", "__weakref__")

    def __init__(self, metric: MetricDef, obj, tags: dict[str, str]):
        super().__init__(metric, obj, tags)
        self.last: float | None = None
        _refresher.add(self)

    def record(self, value: float = 1.0) -> None:
        self.last = float(value)
        super().record(value)


class _GaugeRefresher:
    """Sets every live gauge of the process again every :data:`GAUGE_REFRESH_S` seconds, from a
    daemon thread started with the first gauge (see the module docstring)."""

    def __init__(self) -> None:
        self._gauges: weakref.WeakSet[_RayGauge] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def add(self, gauge: _RayGauge) -> None:
        with self._lock:
            self._gauges.add(gauge)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="tau-rollout-gauges", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            time.sleep(GAUGE_REFRESH_S)
            with self._lock:
                gauges = list(self._gauges)
            for g in gauges:
                last = g.last
                if last is not None:
                    _RayInstrument.record(g, last)


_refresher = _GaugeRefresher()


class RayRecorder(BindingRecorder):
    """Records through ``ray.util.metrics`` (see the module docstring).

    Args:
        default_tags: tag values for every bind that gives none (``{"domain": ...}`` in the
            driver, plus ``"actor"`` in an actor).

    Attributes:
        default_tags: as given (values as ``str``).
    """

    def __reduce__(self):
        return (RayRecorder, (dict(self.default_tags),))

    def __repr__(self) -> str:
        return f"RayRecorder({self.default_tags})"

    def _make(self, metric: MetricDef, tags: dict[str, str]) -> Instrument:
        cls = {Kind.COUNTER: _RayCounter, Kind.GAUGE: _RayGauge}.get(metric.kind, _RayInstrument)
        return cls(metric, _ray_metric(metric), tags)


# One Ray metric object per metric and process, shared by the process's recorders (a driver that
# opens one pool after another makes a recorder per pool).
_OBJECTS: dict[str, object] = {}
_OBJECTS_LOCK = threading.Lock()


def _ray_metric(metric: MetricDef):
    """The process's Ray metric object of ``metric`` (made on first use)."""
    with _OBJECTS_LOCK:
        obj = _OBJECTS.get(metric.name)
        if obj is None:
            if metric.kind is Kind.COUNTER:
                obj = ray_metrics.Counter(metric.name, metric.description, tag_keys=metric.tags)
            elif metric.kind is Kind.GAUGE:
                obj = ray_metrics.Gauge(metric.name, metric.description, tag_keys=metric.tags)
            else:
                obj = ray_metrics.Histogram(metric.name, metric.description, boundaries=list(metric.boundaries), tag_keys=metric.tags)
            _OBJECTS[metric.name] = obj
        return obj
