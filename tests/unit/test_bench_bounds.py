"""Which resource bounds a pool-bench row (rollout.devtools.bench.pool.bound_by), and the start-up
bench's summary (pure: no Ray, no processes)."""

from rollout.devtools.bench.pool import bound_by
from rollout.devtools.bench.startup import format_rows, summarize


def _row(**kw):
    base = {"ratio": 0.5, "actor_cores_max": 0.3, "driver_cores": 0.2, "machine_busy_fraction": 0.4,
            "call_s": 1.1, "ideal_call_s": 1.0, "latency_s": 1.0}
    return {**base, **kw}


def test_each_bound_is_named_in_order():
    assert bound_by(_row(ratio=0.93, actor_cores_max=0.95)) == "call latency"
    assert bound_by(_row(actor_cores_max=0.9, machine_busy_fraction=0.95)) == "actor CPU"
    assert bound_by(_row(driver_cores=0.88)) == "driver"
    assert bound_by(_row(machine_busy_fraction=0.9)) == "machine CPU"
    # the 16-core machine's one-server rows: calls took 3.8-7.2 s against 1 s injected, nothing saturated
    assert bound_by(_row(call_s=3.8)) == "local server"
    assert bound_by(_row()) == "unknown"
    assert bound_by(_row(latency_s=None, call_s=3.0, ratio=None)) == "unknown"  # nothing injected to compare with


def test_the_startup_summary_takes_medians_per_way_and_prints_the_ratio():
    def run(way, mode, ready, stack):
        return {"way": way, "mode": mode, "process_start_to_ready_s": ready, "process_age_at_open_pool_s": 0.6,
                "phases": {"checks": [0.0, 0.1], "local_stack": [0.1, 0.1 + stack]}}

    runs = [run("before", "serial", r, 3.0) for r in (12.0, 10.0, 11.0)] + [run("after", "overlapped", r, 4.0) for r in (8.0, 7.0, 9.0)]
    rows = summarize(runs)
    assert [(r["way"], r["ready_s"], r["ready_min_s"], r["ready_max_s"]) for r in rows] == [("before", 11.0, 10.0, 12.0), ("after", 8.0, 7.0, 9.0)]
    assert rows[1]["phases_s"] == {"checks": 0.1, "local_stack": 4.0}
    assert "after / before: x0.73 (11.00 s -> 8.00 s" in format_rows(rows)
