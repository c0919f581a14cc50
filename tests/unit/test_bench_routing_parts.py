"""The pure parts of ``python -m rollout.bench routing``: calls from a token record, the ideal hit
ratio (hand-computed), metric parsing and row assembly."""

import pytest

from rollout.devtools.bench.routing import (
    METRICS,
    ROUTINGS,
    episode_calls,
    format_table,
    ideal_hits,
    make_row,
    metrics_delta,
    parse_worker_metrics,
    row_overrides,
    row_plan,
    targets,
)
from rollout.devtools.local.kvmodel import KVModel, KVParams


def seq(start, n):
    return list(range(start, start + n))


def test_episode_calls_from_spans():
    prompt = seq(0, 10)
    response = seq(100, 5) + seq(200, 3) + seq(300, 4)  # call 0 sampled 5, context 3, call 1 sampled 4
    calls = episode_calls(prompt, response, [(0, 5), (8, 12)])
    assert calls[0] == (prompt, seq(100, 5))
    assert calls[1] == (prompt + seq(100, 5) + seq(200, 3), seq(300, 4))


def test_ideal_hits_hand_computed():
    system = seq(0, 100)  # shared by every task
    task_a, task_b = system + seq(1000, 50), system + seq(2000, 40)
    out = seq(9000, 10)

    def episode(first):  # two turns: the second re-sends the first prompt + its output + 20 new tokens
        return [(first, out), (first + out + seq(5000, 20), out)]

    # group A (2 members) then group B (1 member)
    cached, total = ideal_hits([episode(task_a), episode(task_a), episode(task_b)])
    # A0: call0 0, call1 160 (own prefix); A1: call0 150 (shared prompt), call1 180 (A0 sent it);
    # B0: call0 100 (the system prompt), call1 150 (own prefix)
    assert cached == 0 + 160 + 150 + 180 + 100 + 150
    assert total == (150 + 180) * 2 + 140 + 170


def test_parse_metrics_and_delta_from_a_real_model():
    kv = KVModel(KVParams(cache_tokens=1000))
    kv.start(seq(0, 30))
    text = kv.prometheus("local/x")
    m = parse_worker_metrics(text)
    assert set(m) == set(METRICS)
    assert m["sglang:prompt_tokens_total"] == 30 and m["sglang:num_requests_total"] == 1
    before = {k: 0.0 for k in METRICS}
    assert metrics_delta([before], [m])[0]["sglang:prompt_tokens_total"] == 30


def _w(prompt, cached, reqs, prefill=0.0, lost=0.0):
    return {"sglang:prompt_tokens_total": prompt, "sglang:cached_tokens_total": cached, "sglang:num_requests_total": reqs,
            "rollout_local_prefill_tokens_total": prefill, "rollout_local_retracted_prefill_tokens_total": lost,
            "rollout_local_retractions_total": 1.0 if lost else 0.0}


def test_make_row_and_targets():
    ca = make_row("cache_aware", False, [_w(1000, 800, 30), _w(1000, 700, 10)], (1800, 2000), 20, 10.0)
    assert ca["hit_ratio"] == pytest.approx(0.75) and ca["ideal_hit_ratio"] == pytest.approx(0.9)
    assert ca["imbalance"] == pytest.approx(1.5) and ca["episodes_per_s"] == 2.0 and ca["prefill_lost"] == 0.0
    off = make_row("group", False, [_w(1000, 880, 20, 200, 40), _w(1000, 880, 20, 200, 40)], (1800, 2000), 20, 10.0)
    on = make_row("group", True, [_w(1000, 880, 21, 120, 0), _w(1000, 880, 19, 120, 0)], (1800, 2000), 20, 8.0, placement="gate")
    slow = make_row("group", True, [_w(1000, 880, 21, 120, 0), _w(1000, 880, 19, 120, 0)], (1800, 2000), 20, 12.0, placement="router")
    assert off["prefill_lost"] == pytest.approx(0.2) and on["imbalance"] == pytest.approx(1.05)
    assert off["placement"] is None and on["placement"] == "gate"
    lines = targets([ca, off, on, slow])
    assert lines[0].endswith(": met") and "0.978 x ideal" in lines[0]  # 0.88 / 0.9
    assert lines[1].endswith(": met")
    assert any(x.startswith("group (placement gate):") and x.endswith(": met") for x in lines)
    assert any(x.startswith("group (placement router):") and x.endswith(": NOT met") for x in lines)  # no loss, but slower
    table = format_table([ca, off, on, slow])
    assert "cache_aware" in table and "gate" in table and "router" in table


def test_row_overrides_name_the_routing_keys():
    ov = row_overrides("group", True, 4, 512, 2, 8, "/tmp/x")
    assert "policy.routing=group" in ov and "local.router_policy=auto" in ov
    assert "pool.adaptive_concurrency.enabled=true" in ov and "pool.max_concurrent_episodes=256" in ov
    assert set(ROUTINGS) == {"round_robin", "cache_aware", "episode", "group"}
    assert "pool.adaptive_concurrency.placement=router" in ov
    assert "pool.adaptive_concurrency.placement=gate" in row_overrides("group", True, 4, 512, 2, 8, "/tmp/x", placement="gate")


def test_the_row_plan_places_only_keyed_rows_with_the_gate():
    both = row_plan(["round_robin", "group"], [False, True], "both")
    assert both == [("round_robin", False, None), ("round_robin", True, "router"),
                    ("group", False, None), ("group", True, "router"), ("group", True, "gate")]
    auto = row_plan(["cache_aware", "episode"], [True], "auto")
    assert auto == [("cache_aware", True, "router"), ("episode", True, "gate")]
    assert row_plan(["round_robin", "episode"], [True], "gate") == [("round_robin", True, "router"), ("episode", True, "gate")]
