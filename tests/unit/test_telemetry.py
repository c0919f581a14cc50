"""The metrics seam (no Ray cluster, no server): the registry, the recorders, and each place that
records, fed by hand: delivered episodes, the group assembler, the environment wrapper, the
scheduler's gauges, the loop-lag probe. Through Ray and Prometheus: tests/ray/test_metrics.py."""

from __future__ import annotations

import asyncio
import collections
import json
import math
import re
from pathlib import Path

import pytest
from support.waits import until

from rollout.core.config import load_config
from rollout.core.environment import Action, StepResult, ToolTimeoutError, UserSimulatorError
from rollout.core.groups import GroupAssembler, TrainingPolicy
from rollout.core.loop_health import LoopLagProbe
from rollout.core.pool.ledger import EpisodeLedger
from rollout.core.pool.scheduler import Scheduler
from rollout.core.pool.specs import make_specs
from rollout.core.records import DEFAULT_TRAIN_STATUSES, EpisodeSpec, EpisodeStatus, InteractionResult, TrainingSample
from rollout.core.telemetry import KNOWN_TAGS, METRICS, NULL_INSTRUMENT, NULL_RECORDER, Kind, MemoryRecorder, MetricDef, Side, metric
from rollout.core.telemetry import registry as R
from rollout.core.telemetry.probes import DeliveryMetrics, EnvironmentMetrics, MeteredEnvironment
from rollout.core.telemetry.recorder import resolve_tags


# -- the registry ---------------------------------------------------------------------------------
def test_every_metric_is_named_typed_and_tagged_within_bounds():
    names = [m.name for m in METRICS]
    assert len(names) == len(set(names)) >= 30
    for m in METRICS:
        assert re.fullmatch(r"tau_rollout_[a-z0-9_]+", m.name) and m.description and m.unit
        assert set(m.tags) <= set(KNOWN_TAGS) and m.tags[0] == "domain"  # every series says its domain
        if m.side is Side.ACTOR:
            assert m.tags[:2] == ("domain", "actor")
        assert m.prometheus_name == "ray_" + m.name + ("_total" if m.kind is Kind.COUNTER else "")
        assert not m.name.endswith("_total")  # Prometheus adds it to counters
        if m.kind is Kind.HISTOGRAM:
            assert list(m.boundaries) == sorted(set(m.boundaries)) and m.boundaries[0] > 0
    assert metric("reward") is metric("tau_rollout_reward") is R.REWARD
    with pytest.raises(KeyError, match="no metric 'nope'"):
        metric("nope")


@pytest.mark.parametrize("kw, match", [
    ({"name": "rollout_x"}, "must match"),
    ({"tags": ("domain", "episode_id")}, "unknown tag"),
    ({"kind": Kind.HISTOGRAM, "boundaries": (1.0, 0.5)}, "increasing"),
    ({"kind": Kind.HISTOGRAM, "boundaries": (0.0, 1.0)}, "positive"),
    ({"kind": Kind.HISTOGRAM}, "positive"),
    ({"boundaries": (1.0,)}, "only a histogram"),
])
def test_a_bad_metric_definition_is_refused(kw, match):
    args = {"name": "tau_rollout_x", "kind": Kind.COUNTER, "side": Side.DRIVER, "unit": "x", "tags": ("domain",), "description": "x"} | kw
    with pytest.raises(ValueError, match=match):
        MetricDef(**args)


# -- the recorders ----------------------------------------------------------------------------------
def test_tags_are_resolved_once_from_the_bind_over_the_defaults():
    assert resolve_tags(R.GENERATE_REQUESTS, {"domain": "retail", "actor": 3, "other": "x"}, {"finish": "stop"}) == \
        {"domain": "retail", "actor": "3", "finish": "stop"}
    with pytest.raises(ValueError, match="no value for tag 'finish'"):
        resolve_tags(R.GENERATE_REQUESTS, {"domain": "retail", "actor": "3"}, {})
    with pytest.raises(ValueError, match=r"has no tag\(s\) \['episode_id'\]"):
        resolve_tags(R.EPISODES_FINISHED, {"domain": "retail"}, {"status": "completed", "episode_id": "b0:retail/0/0"})


def test_the_memory_recorder_counts_sets_and_observes_per_series():
    rec = MemoryRecorder({"domain": "retail", "actor": "0"})
    done = rec.bind(R.EPISODES_FINISHED, status="completed")
    assert rec.bind(R.EPISODES_FINISHED, status="completed") is done  # bound once
    done.record()
    done.record(2)
    rec.bind(R.EPISODES_FINISHED, status="policy_error").record(1)
    assert rec.value(R.EPISODES_FINISHED) == 4 and rec.value(R.EPISODES_FINISHED, status="completed") == 3
    with pytest.raises(ValueError, match="only goes up"):
        done.record(-1)
    depth = rec.bind(R.QUEUE_DEPTH)
    depth.record(5)
    depth.record(2)
    assert rec.value(R.QUEUE_DEPTH) == 2
    lat = rec.bind(R.GENERATE_LATENCY)
    lat.record(0.5)
    lat.record(1.5)
    assert rec.observations(R.GENERATE_LATENCY) == [0.5, 1.5] and rec.observations(R.GENERATE_LATENCY, actor="1") == []
    with pytest.raises(TypeError):
        rec.value(R.GENERATE_LATENCY)
    with pytest.raises(TypeError):
        rec.observations(R.QUEUE_DEPTH)
    assert rec.series()["tau_rollout_queue_depth"] == [({"domain": "retail"}, 2)]  # only the tags it declares


def test_the_null_recorder_binds_anything_to_nothing():
    assert not NULL_RECORDER.enabled
    assert NULL_RECORDER.bind(R.EPISODES_FINISHED) is NULL_INSTRUMENT  # no tag checks: nothing is recorded
    NULL_INSTRUMENT.record(1)


def test_a_finish_type_outside_sglang_s_three_is_tagged_other():
    from rollout.core.telemetry.probes import PolicyMetrics

    rec = MemoryRecorder({"domain": "retail", "actor": "0"})
    pm = PolicyMetrics(rec)
    for finish in ("stop", "length", "weird", "weirder", "stop"):
        pm.answered(finish, 0.1, 10, 2, "1")
    assert {tags["finish"]: v for tags, v in rec.series()[R.GENERATE_REQUESTS.name]} == {"stop": 2, "length": 1, "other": 2}
    assert rec.value(R.GENERATE_INPUT_TOKENS) == 50 and rec.value(R.GENERATE_OUTPUT_TOKENS) == 10 and rec.value(R.POLICY_WEIGHT_VERSION) == 1


# -- delivered episodes (the ledger) -----------------------------------------------------------------
def _result(eid: str, status: EpisodeStatus, reward: float = 0.0, **meta) -> InteractionResult:
    return InteractionResult(EpisodeSpec(eid, "retail", "0", eid.rsplit("/", 1)[0], 0), status, reward, None, metadata=dict(meta))


def test_a_delivered_episode_records_its_status_and_what_it_ran():
    rec = MemoryRecorder({"domain": "retail"})
    m = DeliveryMetrics(rec)
    m.delivered(_result("g/0", EpisodeStatus.COMPLETED, 1.0, turns=4, timings={"total_s": 2.5}))
    m.delivered(_result("g/1", EpisodeStatus.MAX_STEPS, 0.0, turns=6, timings={"total_s": 9.0}))
    m.delivered(_result("g/2", EpisodeStatus.POLICY_ERROR, 0.0, turns=1, timings={"total_s": 0.3}))
    m.delivered(_result("g/3", EpisodeStatus.ACTOR_LOST, termination_reason="actor_lost", error="gone"))  # never ran to its end
    m.delivered(_result("g/4", EpisodeStatus.CANCELLED, termination_reason="cancelled", error=None))
    assert {st.value: rec.value(R.EPISODES_FINISHED, status=st.value) for st in EpisodeStatus if rec.value(R.EPISODES_FINISHED, status=st.value)} \
        == {"completed": 1, "max_steps": 1, "policy_error": 1, "actor_lost": 1, "cancelled": 1}
    assert rec.observations(R.EPISODE_DURATION) == [2.5, 9.0, 0.3]
    assert rec.observations(R.EPISODE_TURNS) == [4, 6, 1]
    assert rec.observations(R.REWARD) == [1.0, 0.0]  # policy outcomes only
    assert rec.value(R.REWARDS) == 1.0


def test_the_ledger_records_submissions_and_deliveries_once():
    rec = MemoryRecorder({"domain": "retail"})
    ledger = EpisodeLedger(recorder=rec)
    specs = make_specs("retail", ["0"], 2)
    for s in specs:
        ledger.submitted(s)
    ledger.deliver(InteractionResult(specs[0], EpisodeStatus.ENV_ERROR, 0.0, None, metadata={}))
    assert rec.value(R.EPISODES_SUBMITTED) == 2 and rec.value(R.EPISODES_FINISHED, status="env_error") == 1


# -- exclusions and groups --------------------------------------------------------------------------
def _sample(gid: str, idx: int, reward: float = 1.0, status: str = "completed") -> TrainingSample:
    return TrainingSample(tokens=[1, 2, 10], response_length=1, loss_mask=[1], rollout_log_probs=[-0.5], reward=reward, status=status,
                          group_id=gid, sample_index=idx, metadata={"episode_id": f"{gid}/{idx}"}, weight_versions=["0"],
                          generation_spans=[[0, 1]])


def test_the_group_assembler_records_what_it_counts():
    rec = MemoryRecorder({"domain": "retail"})
    asm = GroupAssembler(TrainingPolicy(frozenset(DEFAULT_TRAIN_STATUSES)), on_member_failure="drop", filter_groups="zero_variance", recorder=rec)
    for gid in ("same", "mixed", "failed", "open"):
        asm.expect(gid, 2)
    for s in (_sample("same", 0), _sample("same", 1), _sample("mixed", 0, 1.0), _sample("mixed", 1, 0.0),
              _sample("failed", 0, status="policy_error"), _sample("failed", 1), _sample("open", 0)):
        asm.add(s, 0)
    asm.pop_ready(0)
    asm.abandon_open_groups()
    reasons = collections.Counter(e.reason for e in asm.excluded)
    assert reasons == {"zero_variance": 2, "policy_error": 1, "group_dropped": 1, "group_cancelled": 1}
    for reason, n in reasons.items():
        assert rec.value(R.SAMPLES_EXCLUDED, reason=reason) == n == asm.counts[f"excluded_{reason}"]
    for outcome in ("kept", "filtered", "dropped", "cancelled"):
        assert rec.value(R.GROUPS, outcome=outcome) == asm.counts[f"groups_{outcome}"] == 1


# -- the environment wrapper --------------------------------------------------------------------------
class FakeEnv:
    """Spends the seconds it is told in the user simulator or a tool, as the adapters count them."""

    def __init__(self):
        self.timings = {"user_s": 0.0, "tool_s": 0.0}
        self.task = "the task"
        self.next: tuple[str, float, BaseException | None, bool] = ("user_s", 0.5, None, False)

    async def reset(self, task_id):
        return (await self.step(Action("respond"))).observation, {}

    async def step(self, action):
        key, seconds, error, tool_error = self.next
        self.timings[key] += seconds
        if error is not None:
            raise error
        return StepResult("obs", role="user" if action.is_respond else "tool", tool_error=tool_error)


def test_the_metered_environment_records_user_turns_tool_calls_and_their_failures():
    rec = MemoryRecorder({"domain": "retail", "actor": "1"})
    env = FakeEnv()
    metered = MeteredEnvironment(env, EnvironmentMetrics(rec))
    assert metered.task == "the task" and metered.timings is env.timings  # the rest is the environment's

    async def go():
        await metered.reset("0")  # the opening: 0.5 s
        env.next = ("tool_s", 0.25, None, True)
        await metered.step(Action("get_order_details", {"order_id": "#1"}))
        env.next = ("reward_s", 1.0, None, False)  # the agent ends the conversation: no user turn, no tool
        await metered.step(Action("respond", content="###STOP###"))
        env.next = ("tool_s", 2.0, ToolTimeoutError("ran too long"), False)
        with pytest.raises(ToolTimeoutError):
            await metered.step(Action("calculate", {"expression": "9**9**9"}))
        env.next = ("user_s", 0.125, UserSimulatorError("endpoint down"), False)
        with pytest.raises(UserSimulatorError):
            await metered.step(Action("respond", content="hello"))

    env.timings["reward_s"] = 0.0
    asyncio.run(go())
    assert rec.observations(R.USER_LATENCY) == [0.5, 0.125]  # a failed turn's time is observed too
    assert rec.observations(R.TOOL_LATENCY) == [0.25, 2.0]
    assert rec.value(R.TOOL_ERRORS) == 1 and rec.value(R.TOOL_TIMEOUTS) == 1 and rec.value(R.USER_ERRORS) == 1


# -- the scheduler's gauges ---------------------------------------------------------------------------
class FakeActors:
    def __init__(self, n: int):
        self.actors = [object()] * n
        self.runs: list[tuple[int, str]] = []

    def run(self, index, spec, timeout_s):
        self.runs.append((index, spec.episode_id))
        return object()


def test_the_scheduler_records_the_queue_and_each_actor_s_episodes_in_flight():
    rec = MemoryRecorder({"domain": "retail"})
    cfg = load_config(None, ["policy.router_url=http://127.0.0.1:9", "pool.max_concurrent_episodes=2"])
    sched = Scheduler(cfg.pool, FakeActors(2), EpisodeLedger(), on_actor_back=lambda i: None, recorder=rec)
    sched.reset()
    assert rec.value(R.QUEUE_DEPTH) == 0 and rec.value(R.EPISODES_IN_FLIGHT, actor="1") == 0  # published at start
    for spec in make_specs("retail", ["0", "1", "2"], 3):
        sched.enqueue(spec)
    sched.dispatch()  # 2 slots per actor: 4 go out, 5 wait
    assert rec.value(R.QUEUE_DEPTH) == 5
    assert rec.value(R.EPISODES_IN_FLIGHT, actor="0") == rec.value(R.EPISODES_IN_FLIGHT, actor="1") == 2
    assert len(sched.take_pending()) == 5 and rec.value(R.QUEUE_DEPTH) == 0
    sched.clear()
    assert rec.value(R.EPISODES_IN_FLIGHT) == 0


# -- the loop-lag probe --------------------------------------------------------------------------------
def test_the_lag_probe_hands_each_sample_to_its_callback():
    seen: list[float] = []

    async def go():
        probe = LoopLagProbe(interval_s=0.01, max_samples=1, on_sample=seen.append)
        probe.start()
        await until(lambda: len(seen) >= 5, "five lag samples")
        probe.stop()
        return probe.stats()

    stats = asyncio.run(go())
    assert len(seen) >= 5 and all(x >= 0 for x in seen)
    assert stats["samples"] == 1  # max_samples bounds what it keeps, not what it hands on


# -- the dashboard, the docs page, the preview ----------------------------------------------------------
ROOT = Path(__file__).resolve().parents[2]


def test_the_committed_dashboard_is_the_generated_one_and_queries_every_metric():
    from rollout.devtools.grafana import DEFAULT_OUT, dashboard_json, panel_metrics

    assert DEFAULT_OUT == ROOT / "docs" / "grafana" / "tau_rollout.json"
    assert DEFAULT_OUT.read_text() == dashboard_json(), "run: python -m rollout.devtools.grafana dashboard"
    assert panel_metrics() == {m.name for m in METRICS}
    d = json.loads(DEFAULT_OUT.read_text())
    exprs = [t["expr"] for p in d["panels"] for t in p.get("targets", [])]
    assert all(any(m.prometheus_name in e for e in exprs) for m in METRICS)
    assert all('domain=~"$domain", SessionName=~"$session"' in e for e in exprs)  # every target follows the filters
    assert [v["name"] for v in d["templating"]["list"]] == ["datasource", "session", "domain"]
    assert d["templating"]["list"][0]["type"] == "datasource" and d["templating"]["list"][0]["query"] == "prometheus"
    assert len({p["id"] for p in d["panels"]}) == len(d["panels"])
    cells = [(x, y) for p in d["panels"] for x in range(p["gridPos"]["x"], p["gridPos"]["x"] + p["gridPos"]["w"])
             for y in range(p["gridPos"]["y"], p["gridPos"]["y"] + p["gridPos"]["h"])]
    assert len(cells) == len(set(cells))  # no two panels overlap


def test_the_docs_page_holds_the_registry_s_tables_and_the_preview():
    from rollout.devtools.grafana import metrics_table

    page = (ROOT / "docs" / "observability.md").read_text()
    for side in Side:
        assert metrics_table(side) in page, "run: python -m rollout.devtools.grafana table"
    assert (ROOT / "docs" / "observability_dashboard.png").stat().st_size > 50_000
    assert "(observability_dashboard.png)" in page and "not a Grafana screenshot" in page
    assert "[docs/observability.md](docs/observability.md)" in (ROOT / "README.md").read_text()


def test_the_preview_evaluates_the_queries_as_prometheus_does():
    from rollout.core.telemetry.promtext import parse
    from rollout.devtools.grafana import Query, evaluate, histogram_quantile

    inf = float("inf")
    assert histogram_quantile(0.5, {0.1: 0, 0.5: 10, 1.0: 20, inf: 20}) == pytest.approx(0.5)
    assert histogram_quantile(0.75, {0.1: 0, 0.5: 10, 1.0: 20, inf: 20}) == pytest.approx(0.75)
    assert histogram_quantile(0.9, {0.1: 0, 1.0: 5, inf: 10}) == 1.0  # in +Inf: the highest finite bound
    assert math.isnan(histogram_quantile(0.5, {1.0: 0, inf: 0}))

    def scrape(t, finished, buckets):
        lines = [f'ray_tau_rollout_episodes_finished_total{{domain="retail",status="{st}",WorkerId="w"}} {n}' for st, n in finished.items()]
        lines += [f'ray_tau_rollout_episode_turns_bucket{{domain="retail",le="{le}"}} {n}' for le, n in buckets.items()]
        return t, parse("\n".join(lines))

    scrapes = [scrape(0.0, {"completed": 5}, {"1.0": 0, "2.0": 0, "+Inf": 0}),
               scrape(10.0, {"completed": 25, "policy_error": 3}, {"1.0": 4, "2.0": 8, "+Inf": 8})]
    rate = evaluate(Query("rate", R.EPISODES_FINISHED, "{{status}}", ("status",)), scrapes, 1, 10.0)
    assert rate == {("completed",): 2.0, ("policy_error",): 0.3}  # a series new since then counted from 0
    p50 = evaluate(Query("quantile", R.EPISODE_TURNS, "p50", (), 0.5), scrapes, 1, 10.0)
    assert p50 == {(): pytest.approx(1.0)}


def test_the_exposition_parser_reads_what_ray_writes():
    from rollout.core.telemetry.promtext import parse, select, total

    text = "\n".join([
        "# HELP ray_x_total x",
        "# TYPE ray_x_total counter",
        'ray_x_total{a="1",b="with \\"quotes\\", a comma and a } brace",le="+Inf"} 3.0',
        'ray_x_total{a="2"} 4 1700000000000',
        "ray_y NaN",
        'other_z{a="1"} 1',
    ])
    samples = parse(text, prefix="ray_")
    assert [s.name for s in samples] == ["ray_x_total", "ray_x_total", "ray_y"]
    assert samples[0].labels == {"a": "1", "b": 'with "quotes", a comma and a } brace', "le": "+Inf"}
    assert total(samples, "ray_x_total") == 7 and len(select(samples, "ray_x_total", a="2")) == 1
    assert math.isnan(samples[2].value)
    with pytest.raises(ValueError, match="unclosed"):
        parse('ray_x{a="1" 2')
