"""``python -m rollout.bench pool``: the local server's injected latency, the actors' event-loop lag
probe, the row arithmetic, and one tiny end-to-end run of the bench."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

import pytest
from support.inprocess import serve
from support.retries import Attempts
from support.waits import until

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from rollout.core.tokenizer import load_tokenizer
from rollout.devtools.local.backend_api import SamplingParams


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("builtin:qwen3")


class CountingBackend:
    """Yields tokens 100, 101, ... with log-prob -0.5, at once (no sleep)."""

    name = "counting"

    def generate(self, input_ids, params: SamplingParams):
        i = 0
        while True:
            yield 100 + i, -0.5
            i += 1

    def chat(self, messages, params):
        return "ok"


def _body(rid: str, n: int = 3) -> dict:
    return {"input_ids": [1, 2, 3], "rid": rid, "return_logprob": True, "sampling_params": {"max_new_tokens": n, "temperature": 0.0}}


async def _post(session, url: str, path: str, body: dict) -> dict:
    async with session.post(url + path, json=body) as r:
        assert r.status == 200, await r.text()
        return await r.json()


async def _get(session, url: str, path: str) -> dict:
    async with session.get(url + path) as r:
        assert r.status == 200, await r.text()
        return await r.json()


# --------------------------------------------------------------------------- injected latency
async def test_concurrent_generate_calls_wait_the_latency_together(tok):
    n, latency = 32, 0.4
    # one generation thread: a latency that held it (or the loop) would take n x latency
    async with serve(CountingBackend(), tok, max_workers=1, generate_latency_s=latency) as (url, s):
        t0 = time.monotonic()

        async def one(i: int) -> tuple[dict, float]:
            out = await _post(s, url, "/generate", _body(f"r{i}"))
            return out, time.monotonic() - t0

        answers = await asyncio.gather(*[one(i) for i in range(n)])
    assert all(out["output_ids"] == [100, 101, 102] for out, _ in answers)
    assert all(out["meta_info"]["finish_reason"] == {"type": "length", "length": 3} for out, _ in answers)
    times = sorted(t for _, t in answers)
    assert times[0] >= latency * 0.95, "every call waits the injected latency"
    # waited one after another, the last answer would come (n - 1) latencies after the first,
    # however fast the machine; together, they come about at once (the rate: python -m rollout.bench pool)
    assert times[-1] - times[0] < (n - 1) * latency, f"answers {times[0]:.2f}..{times[-1]:.2f}s: they waited one after another"


async def test_zero_latency_changes_nothing(tok):
    async with serve(CountingBackend(), tok) as (url, s):
        plain = await _post(s, url, "/generate", _body("same", 5))
    async with serve(CountingBackend(), tok, generate_latency_s=0.0) as (url, s):
        zero = await _post(s, url, "/generate", _body("same", 5))
    assert zero == plain


async def test_abort_during_the_latency_answers_at_once(tok):
    async with serve(CountingBackend(), tok, generate_latency_s=3600.0) as (url, s):
        call = asyncio.ensure_future(_post(s, url, "/generate", _body("slow")))

        async def arrived() -> bool:
            return (await _get(s, url, "/get_server_info"))["num_inflight_requests"] == 1

        await until(arrived, "the request to arrive")
        assert (await _post(s, url, "/abort_request", {"rid": "slow"}))["aborted"] == 1
        out = await asyncio.wait_for(call, 120)  # answered during the hour's latency, not after it
    assert out["meta_info"]["finish_reason"]["type"] == "abort"
    assert out["output_ids"] == []


def test_negative_latency_is_refused(tok):
    from rollout.core.config import ConfigError, load_config
    from rollout.devtools.local.server import LocalSGLangServer

    with pytest.raises(ConfigError, match="local.generate_latency_s"):
        load_config(None, ["local.enabled=true", "local.generate_latency_s=-1"])
    assert load_config(None, ["local.enabled=true", "local.generate_latency_s=1.5"]).local.generate_latency_s == 1.5
    with pytest.raises(ValueError, match="generate_latency_s"):
        LocalSGLangServer(CountingBackend(), tok, generate_latency_s=-0.1)


# --------------------------------------------------------------------------- loop-lag probe
async def test_loop_lag_probe_sees_a_blocked_loop():
    from rollout.core.loop_health import LoopLagProbe
    from rollout.core.worker import RolloutWorker

    # RolloutWorker.loop_lag only needs the probe: no tokenizer, tau2 or router here
    worker = RolloutWorker.__new__(RolloutWorker)
    worker.lag_probe = LoopLagProbe(interval_s=0.005)
    first = await worker.loop_lag()  # starts the probe
    assert first["samples"] == 0 and first["p99_ms"] is None and first["pid"] == os.getpid()
    await until(lambda: worker.lag_probe.stats()["samples"] >= 5, "five lag samples")
    calm = await worker.loop_lag(reset=True)
    assert calm["samples"] >= 5
    assert calm["p50_ms"] < 250, calm  # the calm loop's median sample saw no block like the one below
    time.sleep(0.25)  # block the event loop
    await until(lambda: worker.lag_probe.stats()["samples"] >= 1, "the sample that spanned the block")
    blocked = await worker.loop_lag(reset=True)
    assert blocked["max_ms"] >= 200, blocked
    assert blocked["samples"] < calm["samples"]  # the calm samples were forgotten
    assert (await worker.loop_lag())["samples"] <= 2
    worker.lag_probe.stop()
    assert not worker.lag_probe.running


@pytest.mark.skipif(not os.path.exists(f"/proc/self/task/{os.getpid()}/schedstat"), reason="needs Linux schedstat")
async def test_loop_lag_probe_tells_the_loop_s_own_cpu_from_waiting_for_a_core():
    import subprocess

    from rollout.core.loop_health import LoopLagProbe

    def spin(seconds: float) -> None:  # busy on the loop, never letting it run
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            pass

    probe = LoopLagProbe(interval_s=0.005)
    probe.start()
    await asyncio.sleep(0.05)
    probe.stats(reset=True)
    time.sleep(0.4)  # blocked, but not on a CPU: neither share grows
    await asyncio.sleep(0.02)
    asleep = probe.stats(reset=True)
    # (waking up, the thread may wait for a core: a share of 0.23 was seen with the machine's load at 40 on 2 cores)
    assert asleep["loop_cpu_share"] < 0.2 and asleep["loop_wait_share"] < 0.5, asleep
    # the loop thread alone on one core, spinning: the CPU share is large
    cpu = sorted(os.sched_getaffinity(0))[0]
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})  # this thread (the loop's) only
    hogs: list[subprocess.Popen] = []
    try:
        # (other tests on this core can take it: at a load of 40 on 2 cores a 0.5 s spin once had a CPU
        # share of 0.05, waiting the rest; the spin is tried again, at most 5 times, until it gets the core)
        tries = Attempts(5, "the spinning loop thread gets its core")
        for _ in tries:
            spin(0.5)
            await asyncio.sleep(0.02)
            busy = probe.stats(reset=True)
            assert busy["loop_cpu_share"] + busy["loop_wait_share"] > 0.7, busy  # spinning: on the core or waiting for it
            if busy["loop_cpu_share"] <= asleep["loop_cpu_share"] + 0.1:
                tries.not_met(f"CPU share {busy['loop_cpu_share']} while spinning")
                continue
            break
        # and with two processes spinning on the same core it mostly waits for it (each says when it spins)
        hogs = [subprocess.Popen([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{cpu}}}); print('spinning', flush=True)\nwhile True: pass"],
                                 stdout=subprocess.PIPE, text=True)
                for _ in range(2)]
        for h in hogs:
            assert h.stdout.readline().strip() == "spinning"
        probe.stats(reset=True)
        spin(1.0)
        await asyncio.sleep(0.02)
        shared = probe.stats(reset=True)
    finally:
        for h in hogs:
            h.kill()
            h.wait()
        os.sched_setaffinity(0, allowed)
        probe.stop()
    # spinning, the loop is always either on the core or waiting for it: ~1 on the CPU alone, and
    # what a loaded machine (other tests on this core) takes from it shows as waiting, not as sleep
    assert busy["loop_cpu_share"] + busy["loop_wait_share"] > 0.7, busy
    assert busy["loop_cpu_share"] > asleep["loop_cpu_share"] + 0.1, (busy, asleep)
    # fair shares with two spinning processes: ~1/3 on the CPU, ~2/3 waiting for it
    assert shared["loop_wait_share"] > 0.3 and shared["loop_wait_share"] > shared["loop_cpu_share"], shared


def test_loop_lag_percentiles_are_nearest_rank():
    from rollout.core.loop_health import LoopLagProbe

    probe = LoopLagProbe()
    probe._samples.extend(i / 1000 for i in range(1, 101))  # 1 ms .. 100 ms
    st = probe.stats()
    assert (st["samples"], st["p50_ms"], st["p99_ms"], st["max_ms"]) == (100, 50.0, 99.0, 100.0)
    assert probe.stats(reset=True)["samples"] == 100 and probe.stats()["samples"] == 0
    with pytest.raises(ValueError):
        LoopLagProbe(interval_s=0)


# --------------------------------------------------------------------------- row arithmetic
def _raw(**kw) -> dict:
    raw = {
        "label": "", "concurrency": 256, "actors": 2, "latency_s": 1.0, "episodes": 768, "statuses": {"completed": 768},
        "window_from": "the C-th delivery", "window_episodes": 320, "window_s": 20.0, "calls_per_episode": 8.0,
        "window_generate_s": 320 * 8 * 1.1, "window_requests": 320 * 8, "window_episode_s": 9.0,
        "actor_cpu_s": [10.0, 6.0], "actor_own_cpu_s": [8.0, 4.0], "stack_cpu_s": 5.0, "driver_cpu_s": 2.0,
        "machine_busy_fraction": 0.5, "loop_lags": [{"samples": 10, "p50_ms": 1.0, "p99_ms": 30.0}, {"samples": 10, "p50_ms": 3.0, "p99_ms": 70.0}],
        "rss_peak_bytes": [500 * 2**20, 700 * 2**20], "wall_s": 60.0,
    }
    raw.update(kw)
    return raw


def test_floor_probe_measures_an_idle_loop_and_resets():
    import time

    import psutil

    from rollout.devtools.bench.pool import FloorProbe

    floor = FloorProbe(niceness=3)  # the actors' niceness in the bench
    try:
        assert psutil.Process(floor._proc.pid).nice() == 3
        deadline = time.monotonic() + 30  # the child's start-up (imports) comes first
        while (floor.stats() or {}).get("samples", 0) < 5 and time.monotonic() < deadline:
            time.sleep(0.1)
        first = floor.stats()
        assert first["samples"] >= 5 and 0 <= first["p50_ms"] <= first["p99_ms"] <= first["max_ms"]
        floor.reset()
        after = floor.stats()
        assert after["samples"] < first["samples"]  # counted from the reset
    finally:
        floor.close()
    assert floor._proc.poll() is not None  # the child has ended
    assert floor.stats() is None  # and says so


def test_summarize_computes_the_ideal_from_calls_and_latency():
    from rollout.devtools.bench.pool import judge, summarize

    r = summarize(_raw())
    assert r["episodes_per_s"] == 16.0
    assert r["ideal_episode_s"] == 8.0 and r["ideal_episodes_per_s"] == 32.0  # 256 / (8 calls x 1 s)
    assert r["ratio"] == 0.5 and r["ideal_basis"] == "injected latency"
    assert r["call_s"] == pytest.approx(1.1)
    assert r["actor_cpu_s_per_episode"] == 0.05  # 16 CPU-s / 320 episodes
    assert r["actor_cores_max"] == 0.4 and r["stack_cores"] == 0.25 and not r["cpu_bound"]
    assert (r["loop_lag_p50_ms"], r["loop_lag_p99_ms"], r["rss_mib_per_actor"]) == (2.0, 70.0, 700.0)
    v = judge(r, reference_cpu_s=0.75)
    assert (v["target_cpu"], v["target_lag"], v["target_ratio"]) == ("met", None, "not met")
    # at 1024 the lag target applies; a CPU-bound row is not judged on its ratio
    v = judge(summarize(_raw(concurrency=1024, machine_busy_fraction=0.97)), reference_cpu_s=0.3)
    assert (v["target_cpu"], v["target_lag"], v["target_ratio"]) == ("not met", "not met", None)
    assert v["target_ratio_why"] == "CPU-bound"
    # your own router: the ideal uses the measured call latency; latency 0: no ideal
    own = summarize(_raw(latency_s=None))
    assert own["ideal_basis"] == "measured /generate latency" and own["ideal_call_s"] == pytest.approx(1.1)
    assert summarize(_raw(latency_s=0.0))["ratio"] is None


def test_side_by_side_pairs_each_main_row_with_its_reference_row():
    from rollout.devtools.bench.pool import format_side_by_side, format_table, summarize

    ref = summarize(_raw(label="reference", window_episodes=160, actor_cpu_s=[20.0, 12.0], event_loop="asyncio", stack_event_loop="asyncio"))
    main = summarize(_raw(event_loop="uvloop", stack_event_loop="uvloop"))
    other = summarize(_raw(concurrency=1024))  # no reference row at 1024x2
    text = format_side_by_side([ref, main, other])
    # main 16 eps/s against 8; CPU 16 / 320 episodes against 32 / 160 episodes; same lags
    assert text.splitlines() == ["main / reference, measured side by side in this run:",
                                 "  256x2: episodes/s x2.00, actor CPU/episode x0.25, loop lag p50 x1.00, p99 x1.00"]
    assert format_side_by_side([main, other]) == ""
    assert "n/a" in format_side_by_side([summarize(_raw(label="reference", loop_lags=[])), main])
    table = format_table([ref, main, other]).splitlines()
    assert table[2].endswith("asyncio/asyncio") and table[3].endswith("uvloop/uvloop") and table[4].endswith("-/-")


# a small scale for the option tests, which must fail before anything starts (were one to run)
TINY = ["--concurrency", "1", "--actors", "1", "--episodes", "2", "--baseline", "none", "env.task_ids=[0]"]


def test_plot_needs_matplotlib_and_draws_the_rows(tmp_path, monkeypatch, capsys):
    from rollout.devtools.bench import main
    from rollout.devtools.bench.pool import plot_rows, summarize

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    assert main(["pool", *TINY, "--plot", str(tmp_path / "p.png")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "matplotlib" in err[0] and "[plot]" in err[0]
    monkeypatch.delitem(sys.modules, "matplotlib")
    pytest.importorskip("matplotlib")
    rows = [summarize(_raw(concurrency=c, actors=a)) for c in (256, 1024) for a in (1, 2)]
    plot_rows(rows, str(tmp_path / "p.png"))
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_options_are_one_line_errors(capsys):
    from rollout.devtools.bench import main

    assert main(["pool", "--concurrency", "3", "--actors", "2"]) == 2
    assert "multiples" in capsys.readouterr().err
    assert main(["pool", "--concurrency", "8", "--episodes", "8"]) == 2
    assert "--episodes" in capsys.readouterr().err
    assert main(["pool", *TINY, "--latency", "-1"]) == 2
    assert "--latency" in capsys.readouterr().err
    assert main(["pool", *TINY, "local.generate_latency_s=-1"]) == 2
    assert "local.generate_latency_s" in capsys.readouterr().err
    assert main(["pool", *TINY, "pool.num_actors=0"]) == 2
    assert main(["pool", *TINY, "--stack-nice", "20"]) == 2
    assert "--stack-nice" in capsys.readouterr().err


def test_renice_reaches_the_processes_and_their_descendants():
    import subprocess
    import sys
    import time

    import psutil

    from rollout.devtools.bench.pool import renice

    code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"
    parent = subprocess.Popen([sys.executable, "-c", code])
    try:
        proc = psutil.Process(parent.pid)
        deadline = time.monotonic() + 20
        while not proc.children() and time.monotonic() < deadline:
            time.sleep(0.05)
        (child,) = proc.children()
        assert proc.nice() == child.nice() == 0
        assert sorted(renice([parent.pid, 999_999_999], 7)) == sorted([parent.pid, child.pid])  # a gone pid is skipped
        assert proc.nice() == child.nice() == 7
    finally:
        for p in psutil.Process(parent.pid).children(recursive=True):
            p.kill()
        parent.kill()
        parent.wait()


# --------------------------------------------------------------------------- end to end
@pytest.mark.ray
@pytest.mark.slow
def test_bench_pool_end_to_end(ray_cluster, tmp_path, capsys):
    from rollout.devtools.bench import main

    out = tmp_path / "pool.json"
    # a reference row beside the main one, on asyncio's loop in the actors and in a stack of its own
    code = main(["pool", "--concurrency", "2", "--actors", "1", "--latency", "0.05", "--episodes", "6", "--stack-nice", "5",
                 "--baseline", "pool.event_loop=asyncio", "--baseline", "local.event_loop=asyncio", "--baseline-rows", "all",
                 "--json", str(out), f"rollout.output_dir={tmp_path / 'run'}", "env.task_ids=[0,1,2]", "rollout.n_samples_per_task=1"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    data = json.loads(out.read_text())
    assert data["cpu_count"] == os.cpu_count() and data["latency_s"] == 0.05
    assert "stack at niceness 5" in printed
    ref, row = data["rows"]
    # the loops as the actors and the servers report them, not as configured
    assert (ref["label"], ref["event_loop"], ref["stack_event_loop"]) == ("reference", "asyncio", "asyncio")
    assert (row["label"], row["event_loop"], row["stack_event_loop"]) == ("", "uvloop", "uvloop")
    assert ref["statuses"] == {"completed": 6} and ref["stack_niceness"] == [5]
    # rows side by side are no CPU reference: the CPU target stays against the figure before issue 8
    assert data["reference_cpu_s_per_episode"] == data["today_cpu_s_per_episode"] and data["reference_how"].startswith("before issue 8")
    assert "asyncio/asyncio" in printed and "uvloop/uvloop" in printed
    side = printed.split("main / reference, measured side by side in this run:")[1]
    assert f"2x1: episodes/s x{row['episodes_per_s'] / ref['episodes_per_s']:.2f}" in side
    assert row["stack_niceness"] == [5]  # servers and router, as they report it
    assert isinstance(row["actor_niceness"], int)  # as the actor process reports it (Ray's default is 15)
    for key in ("concurrency", "actors", "episodes", "episodes_per_s", "ideal_episodes_per_s", "ratio", "calls_per_episode",
                "actor_cpu_s_per_episode", "actor_cores_max", "machine_busy_fraction", "cpu_bound", "loop_lag_p50_ms",
                "loop_lag_p99_ms", "rss_mib_per_actor", "target_cpu", "target_lag", "target_ratio"):
        assert key in row, key
    assert (row["concurrency"], row["actors"], row["episodes"], row["statuses"]) == (2, 1, 6, {"completed": 6})
    assert row["window_episodes"] == 3  # deliveries 3, 4, 5: every slot busy until the 5th
    assert row["calls_per_episode"] >= 2 and row["call_s"] >= 0.05
    # ideal: 2 concurrent / (calls per episode x 0.05 s)
    assert row["ideal_episodes_per_s"] == pytest.approx(2 / (row["calls_per_episode"] * 0.05))
    assert row["actor_cpu_s_per_episode"] > 0 and row["rss_mib_per_actor"] > 100
    assert row["loop_lags"][0]["samples"] > 0
    assert "loop cpu/wait" in printed
    if os.path.exists(f"/proc/self/task/{os.getpid()}/schedstat"):  # Linux: the actor's loop thread, from the kernel
        assert 0 < row["loop_cpu_share"] < 1.5 and row["loop_wait_share"] >= 0, row
    assert row["floor_lag"]["samples"] > 0 and row["floor_lag_p99_ms"] is not None and "floor p99" in printed
    assert "os.cpu_count() = " in printed and "injected latency 0.05 s" in printed and "targets (issue 8)" in printed
