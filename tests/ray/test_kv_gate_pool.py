"""KV-aware concurrency on the Ray pool: with the workers' KV usage forced past the high-water mark
the actors hold every episode's calls; once it falls below the low-water mark they go on, and every
episode id is delivered exactly once.

The KV reading comes from a real aiohttp server on 127.0.0.1 (:mod:`support.tagged_worker`'s
``/metrics``, ``pool.adaptive_concurrency.worker_urls``), run in a thread of the test; the episodes
run against the gold-replay stack."""

from __future__ import annotations

import asyncio
import collections
import json
import threading
import time
import urllib.request

import pytest
from aiohttp import web
from support.tagged_worker import make_app

from rollout.core.config import load_config
from rollout.core.records import EpisodeStatus
from rollout.devtools.local.stack import free_port

pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.fixture()
def metrics_server():
    """URL of a tagged worker whose /metrics the test drives, served from a thread's event loop."""
    loop = asyncio.new_event_loop()
    port = free_port()
    runner = web.AppRunner(make_app("kv", "/nonexistent"))
    ready = threading.Event()

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
        ready.set()
        loop.run_forever()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    assert ready.wait(10)
    yield f"http://127.0.0.1:{port}"
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    t.join(10)


def _set_usage(url: str, value: float) -> None:
    req = urllib.request.Request(url + "/token_usage", data=json.dumps({"value": value}).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as r:
        assert r.status == 200


def _steps(stack) -> int:
    total = 0
    for u in stack.worker_urls:
        with urllib.request.urlopen(u + "/get_server_info", timeout=10) as r:
            total += json.loads(r.read())["num_backend_steps"]
    return total


def test_held_episodes_are_released_below_the_low_water_mark_and_delivered_exactly_once(ray_cluster, retail_stack, retail, metrics_server):
    from rollout.core.pool import RolloutPool

    _set_usage(metrics_server, 0.99)  # past the high-water mark from the start
    cfg = load_config(None, [f"policy.router_url={retail_stack.router_url}", "pool.num_actors=2", "pool.max_concurrent_episodes=4",
                             "pool.num_cpus_per_actor=0.5", "rollout.n_samples_per_task=2", "pool.adaptive_concurrency.enabled=true",
                             "pool.adaptive_concurrency.placement=router",  # the metrics server is no worker
                             "pool.adaptive_concurrency.poll_interval_s=0.1", f"pool.adaptive_concurrency.worker_urls=[{metrics_server}]"])
    ids = retail.task_ids("base")[:6]
    with RolloutPool(cfg) as pool:
        specs = pool.submit_tasks(ids)
        assert len(specs) == 12
        # every slot fills (2 actors x 4) and every episode waits at its first /generate call
        t0 = time.monotonic()
        while True:
            infos = pool.worker_infos()
            if sum(i["running"] for i in infos) == 8 and all(i["kv_gate"] and i["kv_gate"]["closed"] for i in infos):
                break
            assert time.monotonic() - t0 < 120, infos
            time.sleep(0.2)
        steps = _steps(retail_stack)
        time.sleep(1.5)
        assert _steps(retail_stack) == steps  # nothing was generated while held
        assert sum(i["running"] for i in pool.worker_infos()) == 8
        _set_usage(metrics_server, 0.5)  # below the low-water mark: released
        results = list(pool.results())
        infos = pool.worker_infos()
    delivered = collections.Counter(r.spec.episode_id for r in results)
    assert sorted(delivered) == sorted(s.episode_id for s in specs) and set(delivered.values()) == {1}
    assert all(r.status == EpisodeStatus.COMPLETED and r.reward == 1.0 for r in results)
    held = [r.metadata.get("kv_held_s", 0.0) for r in results]
    assert sum(h >= 1.5 for h in held) == 8, held  # the eight held episodes counted their wait
    assert sum(i["kv_gate"]["holds"] for i in infos) == 2  # each actor's gate closed once


@pytest.fixture(scope="module")
def two_worker_stack(tmp_path_factory):
    """Gold replay for retail on two local servers behind the real router (their /metrics are the
    KV model's: sglang:token_usage and sglang:max_total_num_tokens 0, an unbounded budget)."""
    from rollout.core.config import LocalConfig
    from rollout.devtools.local.stack import LocalStack

    stack = LocalStack(LocalConfig(enabled=True, backend="gold_replay", num_servers=2), "retail", "builtin:qwen3",
                       log_dir=tmp_path_factory.mktemp("stack-two-workers"))
    stack.start()
    yield stack
    stack.stop()


def _requests(url: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("sglang:num_requests_total"))


def test_placement_gate_sends_each_actor_s_calls_to_its_own_workers_and_delivers_every_episode_once(ray_cluster, two_worker_stack, retail):
    """``pool.adaptive_concurrency.placement=gate`` on the pool: the actors read the workers from the
    router, each places its keys on its own part of them (2 workers, 2 actors: one each) and posts
    ``/generate`` there directly; every episode is delivered exactly once, completed with reward 1."""
    from rollout.core.pool import RolloutPool

    stack = two_worker_stack
    before = {u: _requests(u) for u in stack.worker_urls}
    cfg = load_config(None, [f"policy.router_url={stack.router_url}", "pool.num_actors=2", "pool.max_concurrent_episodes=4",
                             "pool.num_cpus_per_actor=0.5", "rollout.n_samples_per_task=2", "policy.routing=group",
                             "pool.adaptive_concurrency.enabled=true", "pool.adaptive_concurrency.placement=gate",
                             "pool.adaptive_concurrency.poll_interval_s=0.1"])
    ids = retail.task_ids("base")[:6]
    with RolloutPool(cfg) as pool:
        specs = pool.submit_tasks(ids)
        results = list(pool.results())
        infos = pool.worker_infos()
    delivered = collections.Counter(r.spec.episode_id for r in results)
    assert sorted(delivered) == sorted(s.episode_id for s in specs) and set(delivered.values()) == {1}
    assert all(r.status == EpisodeStatus.COMPLETED and r.reward == 1.0 for r in results)
    gates = [i["kv_gate"] for i in infos]
    assert all(g["placement"] == "gate" for g in gates)
    own = [set(g["per_worker"]) for g in gates]
    assert all(len(o) == 1 for o in own) and own[0] != own[1] and own[0] | own[1] == set(stack.worker_urls)
    assert all(g["keys"] >= 1 and g["in_flight"] == 0 for g in gates)
    served = {u: _requests(u) - before[u] for u in stack.worker_urls}
    assert all(n > 0 for n in served.values()), served  # both workers generated, each for its actor
