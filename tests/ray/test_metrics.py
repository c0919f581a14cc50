"""The pool's metrics through Ray's own metrics system, read where Prometheus reads them.

A throwaway Ray head (``ray start --head --metrics-export-port=PORT`` in a session of its own,
stopped by killing that process group) and a driver process of its own
(tests/support/metrics_driver.py: the pool, 2 actors, against the gold-replay stack behind a
fault proxy) run retail episodes that end ``completed`` (reward 1 and 0) and ``policy_error``, with
a weight update in between; the test scrapes the head's metrics export port until the figures
the driver reports are there (Ray exports every second here, ``RAY_metrics_report_interval_ms``),
then checks every metric against them: episode counts by status, per-actor episodes and
``/generate`` calls, tokens, user-simulator turns, tool calls, durations, turns, rewards,
exclusions by reason, groups, weight versions, pauses, the loop-lag probe and the gauges at rest.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.ray_head import ray_head
from support.stacks import versions_kept

from rollout.core.telemetry import METRICS, Kind
from rollout.core.telemetry import registry as R
from rollout.core.telemetry.promtext import Sample, scrape, select

pytestmark = [pytest.mark.ray, pytest.mark.slow]

DRIVER = Path(__file__).resolve().parents[1] / "support" / "metrics_driver.py"
DEADLINE_S = 90.0  # from the driver's report to every figure scraped (seen: a few seconds)
POLICY_OUTCOMES = {"completed", "max_steps", "truncated", "parse_error", "tool_timeout"}


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["RAY_metrics_report_interval_ms"] = "1000"  # Ray's floor; the default is 10 s
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    return env


def _value(samples: list[Sample], metric, suffix: str = "", **labels: str) -> float:
    return sum(s.value for s in select(samples, metric.prometheus_name + suffix, **labels))


def _count(samples, metric, **labels) -> float:
    return _value(samples, metric, "_count", **labels)


def _buckets(samples, metric, **labels) -> dict[float, float]:
    """A histogram's cumulative bucket counts by upper bound (summed over the matching series)."""
    out: dict[float, float] = collections.defaultdict(float)
    for s in select(samples, metric.prometheus_name + "_bucket", **labels):
        out[float(s.labels["le"])] += s.value
    return dict(out)


def _bucket_problems(samples, metric, values: list[float], **labels) -> list[str]:
    """Where the scraped buckets of ``metric`` differ from those of ``values`` (exact: Ray's
    export keeps bucket counts; its ``_sum`` is rebuilt from bucket midpoints, an estimate)."""
    got = _buckets(samples, metric, **labels)
    want = {b: float(sum(v <= b for v in values)) for b in (*metric.boundaries, float("inf"))}
    return [] if got == want else [f"{metric.name} buckets: scraped {got}, expected {want}"]


def expected_problems(samples: list[Sample], report: dict) -> list[str]:
    """Every way the scraped metrics differ from the driver's report (empty: they agree)."""
    eps = report["episodes"]
    stats = report["stats"]
    pids = report["actor_pids"]
    problems: list[str] = []

    def check(what: str, got: float, want: float, tol: float = 0.0) -> None:
        if abs(got - want) > tol:
            problems.append(f"{what}: scraped {got}, expected {want}")

    # -- driver: episodes, queue, exclusions, groups, weights ---------------------------------
    check("episodes submitted", _value(samples, R.EPISODES_SUBMITTED, domain="retail"), stats["episodes_submitted"])
    by_status = collections.Counter(e["status"] for e in eps)
    for st in set(by_status) | {"completed", "policy_error", "max_steps", "env_error"}:
        check(f"finished {st}", _value(samples, R.EPISODES_FINISHED, status=st), by_status.get(st, 0))
        check(f"finished {st} (stats)", _value(samples, R.EPISODES_FINISHED, status=st), stats[f"status_{st}"])
    ran = [e for e in eps if e["timings"]]
    check("durations observed", _count(samples, R.EPISODE_DURATION), len(ran))
    problems += _bucket_problems(samples, R.EPISODE_DURATION, [e["timings"]["total_s"] for e in ran])
    check("turns observed", _count(samples, R.EPISODE_TURNS), len(ran))
    problems += _bucket_problems(samples, R.EPISODE_TURNS, [e["turns"] for e in ran])
    rewarded = [e for e in eps if e["status"] in POLICY_OUTCOMES]
    check("rewards observed", _count(samples, R.REWARD), len(rewarded))
    problems += _bucket_problems(samples, R.REWARD, [e["reward"] for e in rewarded])
    check("rewards' exact sum", _value(samples, R.REWARDS), sum(e["reward"] for e in rewarded), 1e-9)
    for reason, n in report["excluded"].items():
        check(f"excluded {reason}", _value(samples, R.SAMPLES_EXCLUDED, reason=reason), n)
        check(f"excluded {reason} (stats)", _value(samples, R.SAMPLES_EXCLUDED, reason=reason), stats[f"excluded_{reason}"])
    for outcome in ("kept", "filtered", "dropped", "cancelled"):
        check(f"groups {outcome}", _value(samples, R.GROUPS, outcome=outcome), stats[f"groups_{outcome}"])
    check("queue depth at rest", _value(samples, R.QUEUE_DEPTH), 0)
    check("episode retries", _value(samples, R.EPISODE_RETRIES), stats["episode_retries"])
    check("trainer's weight version", _value(samples, R.WEIGHT_VERSION, domain="retail"), report["weight_version"])
    check("weight updates", _count(samples, R.WEIGHT_UPDATE_DURATION), stats["weight_updates"])
    check("pauses (abort, each update's)", _count(samples, R.PAUSE_DURATION, mode="abort"), stats["weight_updates"])

    # -- each actor ------------------------------------------------------------------------
    for i, pid in enumerate(pids):
        mine = [e for e in eps if e["worker_pid"] == pid]
        a = {"actor": str(i)}
        check(f"actor {i} in flight at rest (driver)", len(select(samples, R.EPISODES_IN_FLIGHT.prometheus_name, **a)), 1)
        check(f"actor {i} in flight at rest", _value(samples, R.EPISODES_IN_FLIGHT, **a), 0)
        check(f"actor {i} running at rest", _value(samples, R.EPISODES_RUNNING, **a), 0)
        check(f"actor {i} episodes started", _value(samples, R.EPISODES_STARTED, **a), len(mine))
        check(f"actor {i} /generate answered", _value(samples, R.GENERATE_REQUESTS, **a), sum(e["requests"] for e in mine))
        check(f"actor {i} /generate latencies", _count(samples, R.GENERATE_LATENCY, **a), sum(e["requests"] for e in mine))
        check(f"actor {i} tokens in", _value(samples, R.GENERATE_INPUT_TOKENS, **a), sum(e["input_tokens"] for e in mine))
        check(f"actor {i} tokens out", _value(samples, R.GENERATE_OUTPUT_TOKENS, **a), sum(e["generated_tokens"] for e in mine))
        failed = sum(e["status"] == "policy_error" for e in mine)
        check(f"actor {i} /generate failures", _value(samples, R.GENERATE_FAILURES, **a), failed)
        check(f"actor {i} /generate retries (one per failed call)", _value(samples, R.GENERATE_RETRIES, **a), failed)
        check(f"actor {i} user turns", _count(samples, R.USER_LATENCY, **a), sum(e["user_turns"] for e in mine))
        check(f"actor {i} tool calls", _count(samples, R.TOOL_LATENCY, **a), sum(e["tool_calls"] for e in mine))
        check(f"actor {i} tool errors", _value(samples, R.TOOL_ERRORS, **a), sum(e["tool_errors"] for e in mine))
        # the last round ran on both actors after the update: the servers' version is the new one
        check(f"actor {i} servers' weight version", _value(samples, R.POLICY_WEIGHT_VERSION, **a), report["weight_version"])
        if _count(samples, R.LOOP_LAG, **a) < 10:
            problems.append(f"actor {i}: {_count(samples, R.LOOP_LAG, **a)} loop-lag samples")
    return problems


def test_a_run_s_metrics_are_scraped_from_ray_s_export_port_with_the_right_counts(retail_stack, tmp_path):
    report_path = tmp_path / "report.json"
    with versions_kept(retail_stack), ray_head(_env(), include_dashboard=False) as head, open(tmp_path / "driver.log", "w") as log:
        driver = subprocess.Popen([sys.executable, str(DRIVER), "--address", head.gcs_address, "--router-url", retail_stack.router_url,
                                   "--out", str(report_path)], env=head.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                  text=True, start_new_session=True)
        try:
            line = driver.stdout.readline()  # READY once the run is over and its report written
            assert line.strip() == "READY", f"driver: {line!r}\n{(tmp_path / 'driver.log').read_text()[-3000:]}"
            report = json.loads(report_path.read_text())
            statuses = collections.Counter(e["status"] for e in report["episodes"])
            rewards = collections.Counter(e["reward"] for e in report["episodes"] if e["status"] == "completed")
            # something to count: solved and unsolved episodes, and failed ones
            assert set(statuses) == {"completed", "policy_error"} and set(rewards) == {0.0, 1.0}, (statuses, rewards)
            assert report["weight_version"] == 1 and len(report["actor_pids"]) == 2

            deadline = time.monotonic() + DEADLINE_S
            samples: list[Sample] = []
            problems = ["nothing scraped"]
            while time.monotonic() < deadline:
                with contextlib.suppress(OSError):
                    samples = scrape(head.metrics_url, prefix="ray_tau_rollout_")
                    problems = expected_problems(samples, report)
                    if not problems:
                        break
                time.sleep(1.0)
            assert not problems, "\n".join(problems) + "\n\nscraped:\n" + "\n".join(
                f"{s.name}{ {k: v for k, v in s.labels.items() if k in ('domain', 'actor', 'status', 'reason', 'outcome', 'finish', 'mode', 'le')} } {s.value}"
                for s in samples)
            # every series carries our tags, plus Ray's; none carries an episode's id
            for s in samples:
                assert s.labels.get("domain") == "retail", s
                assert not any("/" in v for k, v in s.labels.items() if k not in ("otel_scope_schema_url",)), s
            # every metric the run could produce is there (the breaker, actor retries and user
            # errors never fired in this run: a counter that never counted is not exported)
            names = {s.name.removesuffix("_bucket").removesuffix("_count").removesuffix("_sum") for s in samples}
            idle = {R.EPISODE_RETRIES, R.BACKEND_OUTAGES, R.BREAKER_OPEN, R.USER_ERRORS, R.TOOL_TIMEOUTS, R.TOOL_ERRORS}
            assert {m.prometheus_name for m in METRICS if m not in idle} <= names, sorted({m.prometheus_name for m in METRICS} - names)
            types = {m.prometheus_name: m.kind for m in METRICS}
            assert all(types[n] is Kind.HISTOGRAM for n in names if select(samples, n + "_bucket"))
        finally:
            with contextlib.suppress(OSError):
                driver.stdin.close()
            try:
                driver.wait(timeout=60)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(driver.pid, signal.SIGKILL)
                driver.wait(timeout=30)
    assert driver.returncode == 0, (tmp_path / "driver.log").read_text()[-3000:]


def test_the_ray_recorder_travels_as_its_tags_and_records_nowhere_else():
    """What the pool hands each actor: pickled, a RayRecorder is its default tags (the metric
    objects are made in the process that records); a failing record is dropped, never raised."""
    from rollout.core.pool.raymetrics import RayRecorder

    rec = RayRecorder({"domain": "retail", "actor": "3"})
    inst = rec.bind(R.GENERATE_REQUESTS, finish="stop")
    assert rec.bind(R.GENERATE_REQUESTS, finish="stop") is inst  # bound once
    back = pickle.loads(pickle.dumps(rec))
    assert isinstance(back, RayRecorder) and back.default_tags == {"domain": "retail", "actor": "3"}
    assert back.bind(R.GENERATE_REQUESTS, finish="stop") is not inst
    inst.record(1)  # connected to Ray or not (then the value goes nowhere), nothing raises
    rec.bind(R.QUEUE_DEPTH).record(float("nan"))
    rec.bind(R.EPISODES_STARTED).record(0)  # Ray's Counter.inc refuses 0: skipped
    with pytest.raises(ValueError, match="no value for tag 'status'"):
        rec.bind(R.EPISODES_FINISHED)
