"""Every metric the pool records, in one registry: :class:`MetricDef` records, one per metric.

A metric is defined once here (its name, kind, the process that records it, its unit, its tags and
what it means) and recorded through a :class:`~rollout.core.telemetry.recorder.Recorder`; nothing
else names a metric by a string. The docs (``docs/observability.md``) and the Grafana dashboard
(``docs/grafana/tau_rollout.json``, made by :mod:`rollout.devtools.grafana`) are checked against
:data:`METRICS` by the tests.

Names follow Prometheus' conventions (base units in the name: ``_seconds``; counters count events
and Prometheus adds ``_total``); Ray's export prefixes every application metric with ``ray_``
(seen with Ray 2.60: ``tau_rollout_episodes_finished`` is scraped as
``ray_tau_rollout_episodes_finished_total``), which :attr:`MetricDef.prometheus_name` gives.

Tags are bounded: a domain, an actor index, a status, an exclusion reason, a group outcome, a
finish type, a pause mode; never an episode, task or group id (each label value is a time series
kept by Prometheus for ever).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

__all__ = ["KNOWN_TAGS", "METRICS", "Kind", "MetricDef", "Side", "metric"]

PREFIX = "tau_rollout_"
_NAME = re.compile(r"^tau_rollout_[a-z0-9_]+$")


class Kind(str, enum.Enum):
    """A metric's kind: Prometheus' counter (only goes up), gauge (last value) or histogram
    (observations counted in buckets, with their count and sum)."""

    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"


class Side(str, enum.Enum):
    """The process that records a metric: the driver (the process that holds the
    :class:`~rollout.core.pool.RolloutPool`) or each rollout actor."""

    DRIVER = "driver"
    ACTOR = "actor"


# Every tag a metric may carry, with its values (all bounded).
KNOWN_TAGS: dict[str, str] = {
    "domain": "the benchmark's domain (`retail`; `tau_bench:retail` for a benchmark other than tau2)",
    "actor": "the rollout actor's index in the pool, `0` .. `pool.num_actors - 1` (a restarted actor keeps it)",
    "status": "an episode status (`completed`, `policy_error`, ...: docs/design.md#statuses)",
    "reason": "why an episode sample was kept out of training: its status, `stale`, `zero_variance`, `group_dropped`, `group_cancelled`",
    "outcome": "what became of a complete or abandoned group: `kept`, `filtered`, `dropped`, `cancelled`",
    "finish": "SGLang's `finish_reason.type` of a `/generate` answer: `stop`, `length`, `abort` (`other` for anything else)",
    "mode": "the pause mode: `abort`, `in_place`, `retract`",
}


@dataclass(frozen=True)
class MetricDef:
    """One metric.

    Attributes:
        name: the metric's name, ``tau_rollout_...`` (what ``ray.util.metrics`` is given).
        kind: counter, gauge or histogram.
        side: the process that records it.
        unit: what one unit of the value is (``episodes``, ``seconds``, ``tokens``, ...).
        tags: its tag keys (a subset of :data:`KNOWN_TAGS`), in a fixed order.
        description: what it measures (the Prometheus ``HELP`` text).
        boundaries: a histogram's bucket upper bounds, increasing and positive (Ray requires
            ``> 0``); empty for the other kinds.

    Raises:
        ValueError: a name without the prefix or with other characters than ``[a-z0-9_]``, an
            unknown tag, or boundaries that do not fit the kind.
    """

    name: str
    kind: Kind
    side: Side
    unit: str
    tags: tuple[str, ...]
    description: str
    boundaries: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"metric name {self.name!r} must match {_NAME.pattern}")
        unknown = [t for t in self.tags if t not in KNOWN_TAGS]
        if unknown:
            raise ValueError(f"metric {self.name}: unknown tag(s) {unknown} (known: {sorted(KNOWN_TAGS)})")
        if self.kind is Kind.HISTOGRAM:
            b = self.boundaries
            if not b or any(x <= 0 for x in b) or any(x >= y for x, y in zip(b, b[1:])):
                raise ValueError(f"histogram {self.name}: boundaries must be positive and increasing, got {b}")
        elif self.boundaries:
            raise ValueError(f"metric {self.name}: only a histogram has boundaries")

    @property
    def prometheus_name(self) -> str:
        """The name Prometheus scrapes from Ray's export: ``ray_`` + name, plus ``_total`` for a
        counter (a histogram's series add ``_bucket``, ``_count`` and ``_sum`` to it)."""
        return "ray_" + self.name + ("_total" if self.kind is Kind.COUNTER else "")


_ALL: dict[str, MetricDef] = {}


def _define(name: str, kind: Kind, side: Side, unit: str, tags: tuple[str, ...], description: str,
            boundaries: tuple[float, ...] = ()) -> MetricDef:
    m = MetricDef(PREFIX + name, kind, side, unit, tags, description, boundaries)
    if m.name in _ALL:
        raise ValueError(f"metric {m.name} is defined twice")
    _ALL[m.name] = m
    return m


C, G, H = Kind.COUNTER, Kind.GAUGE, Kind.HISTOGRAM
D, A = Side.DRIVER, Side.ACTOR
DA = ("domain", "actor")

# Bucket bounds (seconds unless said otherwise).
_EPISODE_S = (0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
_CALL_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_LAG_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0)
_PAUSE_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
_TURNS = (1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 15.0, 20.0, 25.0, 30.0, 40.0, 50.0)
# rewards lie in [0, 1]: 0.01 holds the zeros, 1.0 minus 0.99 the ones
_REWARD = (0.01, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.99, 1.0)

# -- the driver: episodes, the queue, training exclusions, weight updates ----------------------------
EPISODES_SUBMITTED = _define("episodes_submitted", C, D, "episodes", ("domain",),
                             "Episodes queued by the pool: submissions, group-member re-runs and resumed ones (RolloutPool.stats episodes_submitted).")
EPISODES_FINISHED = _define("episodes_finished", C, D, "episodes", ("domain", "status"),
                            "Episodes delivered by the pool, once each (exactly once, invariant 2), by final status.")
EPISODES_IN_FLIGHT = _define("episodes_in_flight", G, D, "episodes", DA,
                             "Episodes dispatched to an actor and not returned yet, per actor.")
QUEUE_DEPTH = _define("queue_depth", G, D, "episodes", ("domain",),
                      "Episodes queued at the driver, waiting for a free actor slot (pool.max_concurrent_episodes per actor).")
EPISODE_RETRIES = _define("episode_retries", C, D, "attempts", ("domain",),
                          "Episode attempts re-queued because their actor died, restarted or stopped answering (pool.max_episode_retries).")
EPISODE_DURATION = _define("episode_duration_seconds", H, D, "seconds", ("domain",),
                           "Wall time of each delivered episode the episode loop ended itself, from its start on an actor to its end "
                           "(metadata timings.total_s; not actor_lost, timeout, cancelled ones).",
                           _EPISODE_S)
EPISODE_TURNS = _define("episode_turns", H, D, "turns", ("domain",),
                        "Assistant turns of each delivered episode the episode loop ended itself (metadata turns).", _TURNS)
REWARD = _define("reward", H, D, "reward", ("domain",),
                 "Reward of each delivered episode that ended with a policy outcome (completed, max_steps, truncated, parse_error, "
                 "tool_timeout); infrastructure failures and cancelled episodes are left out.", _REWARD)
REWARDS = _define("rewards", C, D, "reward", ("domain",),
                  "Sum of the rewards the reward histogram observes: exact where the histogram's _sum is an estimate "
                  "(Ray rebuilds it from bucket midpoints), so rewards / reward_count is the exact mean reward.")
SAMPLES_EXCLUDED = _define("samples_excluded", C, D, "episodes", ("domain", "reason"),
                           "Episode samples kept out of training by the training streams (one per episode, RolloutPool.excluded), by reason.")
GROUPS = _define("groups", C, D, "groups", ("domain", "outcome"),
                 "GRPO groups complete or abandoned in the training streams: kept (handed out), filtered (rollout.filter_groups), "
                 "dropped (a member could not be trained), cancelled (abandoned).")
WEIGHT_VERSION = _define("weight_version", G, D, "version", ("domain",),
                         "The trainer's current weight version as the pool knows it (rollout.weight_version, then each update).")
WEIGHT_UPDATE_DURATION = _define("weight_update_seconds", H, D, "seconds", ("domain",),
                                 "Wall time of each successful RolloutPool.update_weights_from_disk (pause, load, check, continue).",
                                 _PAUSE_S)
PAUSE_DURATION = _define("pause_seconds", H, D, "seconds", ("domain", "mode"),
                         "How long generation stayed paused: from RolloutPool.pause (or the pause of a weight update) to the resume.",
                         _PAUSE_S)

# -- each actor: episodes running, /generate, the user simulator, tools, the event loop ---------------
EPISODES_STARTED = _define("episodes_started", C, A, "episodes", DA,
                           "Episode attempts that began running on an actor (a slot was free; re-run attempts count again).")
EPISODES_RUNNING = _define("actor_episodes_running", G, A, "episodes", DA,
                           "Episodes running on an actor now (inside its pool.max_concurrent_episodes slots).")
GENERATE_REQUESTS = _define("generate_requests", C, A, "requests", ("domain", "actor", "finish"),
                            "/generate calls that answered, by finish type (an episode's metadata requests counts the same calls).")
GENERATE_LATENCY = _define("generate_latency_seconds", H, A, "seconds", DA,
                           "Round trip of each answered /generate call's answering attempt (sent to answer read; retries and "
                           "waits at the generation gate or the circuit breaker are not in it).", _CALL_S)
GENERATE_INPUT_TOKENS = _define("generate_input_tokens", C, A, "tokens", DA,
                                "Token ids sent (input_ids) by the answered /generate calls.")
GENERATE_OUTPUT_TOKENS = _define("generate_output_tokens", C, A, "tokens", DA,
                                 "Token ids generated in the /generate answers (meta_info.output_token_logprobs).")
GENERATE_FAILURES = _define("generate_failures", C, A, "requests", DA,
                            "/generate calls that failed for good (after their retries or a backend outage; a 4xx or malformed answer): "
                            "the episode ends policy_error.")
GENERATE_RETRIES = _define("generate_retries", C, A, "attempts", DA,
                           "Failed /generate attempts that were retried (policy.max_request_retries; failures during a backend outage "
                           "wait for the backend instead and are not counted).")
BACKEND_OUTAGES = _define("backend_outages", C, A, "outages", DA,
                          "Times the actor's circuit breaker opened: every /generate call failed at once (policy.backend_outage_timeout_s).")
BREAKER_OPEN = _define("backend_breaker_open", G, A, "bool", DA,
                       "1 while the actor's circuit breaker is open (a backend outage), else 0.")
POLICY_WEIGHT_VERSION = _define("policy_weight_version", G, A, "version", DA,
                                "The weight version the policy servers reported in the actor's latest /generate answer "
                                "(meta_info.weight_version; set only when it is an integer).")
USER_LATENCY = _define("user_latency_seconds", H, A, "seconds", DA,
                       "Wall time of each user-simulator turn (the opening and each reply; a dual-control user's own tool calls included).",
                       _CALL_S)
USER_ERRORS = _define("user_errors", C, A, "errors", DA,
                      "User-simulator failures that ended an episode user_error (after the simulator's retries; set-up included).")
TOOL_LATENCY = _define("tool_latency_seconds", H, A, "seconds", DA,
                       "Wall time of each agent tool call (from the step's start to its result; a call cut at env.step_timeout_s included).",
                       _CALL_S)
TOOL_TIMEOUTS = _define("tool_timeouts", C, A, "calls", DA,
                        "Agent tool calls stopped at env.step_timeout_s (the episode ends tool_timeout).")
TOOL_ERRORS = _define("tool_errors", C, A, "calls", DA,
                      "Agent tool calls whose result is an error observation (the agent sees it and goes on).")
LOOP_LAG = _define("event_loop_lag_seconds", H, A, "seconds", DA,
                   "How late the actor's event loop wakes a coroutine sleeping 50 ms (one observation per wake-up): "
                   "blocking calls and CPU starvation show here.", _LAG_S)

METRICS: tuple[MetricDef, ...] = tuple(_ALL.values())
"""Every metric, in definition order (driver side first)."""


def metric(name: str) -> MetricDef:
    """The metric named ``name`` (with or without the ``tau_rollout_`` prefix).

    Raises:
        KeyError: no such metric.
    """
    key = name if name.startswith(PREFIX) else PREFIX + name
    try:
        return _ALL[key]
    except KeyError:
        raise KeyError(f"no metric {name!r} (known: {', '.join(sorted(_ALL))})") from None
