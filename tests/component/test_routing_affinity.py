"""Routing affinity (``policy.routing``) through the real sglang-router 0.3.2 started as the local
stack starts it (``local.router_policy=auto``: ``--policy manual --assignment-mode min_group``), in
front of four workers that report who served each call and the ``X-SMG-Routing-Key`` they received
(:mod:`support.tagged_worker`). Also: the KV gate finds the workers through the router's
``GET /workers``."""

from __future__ import annotations

import asyncio
import collections
import inspect
import time

import aiohttp
import pytest
from support.tagged_cluster import tagged_cluster

from rollout.core.config import AdaptiveConcurrencyConfig, PolicyConfig
from rollout.core.policy import RouterAdmin, SGLangClient
from rollout.core.policy.kvgate import KVGate
from rollout.devtools.local.stack import router_policy_args

WORKERS = 4


@pytest.fixture(scope="module")
def routed(tmp_path_factory):
    """``(router_url, worker_urls)``: four tagged workers (each /generate waits 0.1 s, so that
    calls overlap) behind the real router with the ``auto`` policy, checking the workers' health
    every second (one failed check marks a worker unhealthy, one passed check healthy again)."""
    health = ["--health-check-interval-secs", "1", "--health-failure-threshold", "1", "--health-success-threshold", "1"]
    with tagged_cluster(router_policy_args("auto") + health, workers=WORKERS, delay_s=0.1, log_dir=tmp_path_factory.mktemp("routing")) as (router, urls, _):
        yield router, urls


async def _episodes(router: str, routing: str, groups: int, members: int, turns: int, prefix: str) -> dict[tuple[int, int], list[dict]]:
    """Run ``groups x members`` episodes of ``turns`` calls each, all at once, through an
    :class:`SGLangClient` with ``policy.routing=routing``; returns each episode's answers' meta."""
    async with aiohttp.ClientSession() as s:
        client = SGLangClient(PolicyConfig(router_url=router, routing=routing), s)

        async def episode(g: int, m: int) -> list[dict]:
            eid = f"{prefix}g{g}/{m}"
            client.groups[eid] = f"{prefix}g{g}"  # as RolloutWorker.run registers it
            out = []
            for t in range(turns):
                gen = await client.generate(list(range(1, 100)) + [g, m] * (t + 1), 1, rid=f"{eid}@0#{t}", routing_key=eid)
                out.append(gen.meta)
            return out

        keys = [(g, m) for g in range(groups) for m in range(members)]
        metas = await asyncio.gather(*[episode(g, m) for g, m in keys])
    return dict(zip(keys, metas))


def _imbalance(counts: collections.Counter) -> float:
    return max(counts.get(f"w{i}", 0) for i in range(WORKERS)) / (sum(counts.values()) / WORKERS)


def test_group_routing_keeps_a_group_on_one_worker_and_spreads_the_groups(routed):
    router, _ = routed
    res = asyncio.run(_episodes(router, "group", groups=16, members=4, turns=3, prefix="grp-"))
    by_group: dict[int, set[str]] = collections.defaultdict(set)
    for (g, m), metas in res.items():
        assert [x["routing_key"] for x in metas] == [f"grp-g{g}"] * 3  # the header reached the worker
        by_group[g] |= {x["worker"] for x in metas}
    assert all(len(w) == 1 for w in by_group.values()), by_group  # every member, every turn: one worker
    spread = collections.Counter(next(iter(w)) for w in by_group.values())
    assert len(spread) == WORKERS and _imbalance(spread) <= 1.5, spread  # 16 groups over 4 workers


def test_episode_routing_keeps_each_episode_on_one_worker_and_spreads_64_keys(routed):
    router, _ = routed
    res = asyncio.run(_episodes(router, "episode", groups=64, members=1, turns=3, prefix="ep-"))
    for (g, m), metas in res.items():
        assert [x["routing_key"] for x in metas] == [f"ep-g{g}/{m}"] * 3
        assert len({x["worker"] for x in metas}) == 1, metas
    spread = collections.Counter(metas[0]["worker"] for metas in res.values())
    # min_group gives a new key to the worker with the fewest keys in flight: 16 each when all
    # start at once (measured: 16/16/16/16); random assignment would give about 12-20.
    assert len(spread) == WORKERS and _imbalance(spread) <= 1.25, spread


def test_routing_none_sends_no_key(routed):
    router, _ = routed
    res = asyncio.run(_episodes(router, "none", groups=8, members=1, turns=2, prefix="none-"))
    assert all(x["routing_key"] is None for metas in res.values() for x in metas)


def test_the_kv_gate_reads_the_workers_the_router_lists(routed):
    router, urls = routed

    async def main():
        async with aiohttp.ClientSession() as s:
            for u in urls:
                async with s.post(u + "/token_usage", json={"value": 0.2}) as r:
                    assert r.status == 200
            admin = RouterAdmin(router, s)
            gate = KVGate(AdaptiveConcurrencyConfig(enabled=True, poll_interval_s=0.05, placement="router"), s, list_workers=admin.worker_health)
            try:
                assert await gate.poll_once() == pytest.approx(0.2) and sorted(gate.readings) == sorted(urls)
                async with s.post(urls[2] + "/token_usage", json={"value": 0.93}) as r:
                    assert r.status == 200
                assert await gate.poll_once() == pytest.approx(0.93) and gate.closed
            finally:
                gate.close()
                for u in urls:
                    async with s.post(u + "/token_usage", json={"value": 0.0}) as r:
                        assert r.status == 200

    asyncio.run(main())


def test_placement_gate_moves_keys_off_a_worker_the_router_counts_unhealthy(routed):
    """``placement=gate`` posts straight to the workers, around the router: a worker whose
    ``/health`` fails (its ``/metrics`` and ``/generate`` still answer) is marked unhealthy by the
    router, and the gate then moves its keys and places no new key on it until the router counts
    it healthy again."""
    router, urls = routed
    names = {u: f"w{i}" for i, u in enumerate(urls)}

    async def healthy(s: aiohttp.ClientSession, url: str, ok: bool) -> None:
        async with s.post(url + "/token_usage", json={"healthy": ok}) as r:
            assert r.status == 200

    async def until(cond, what: str, timeout_s: float = 20.0) -> None:  # cond: a bool, or a coroutine's
        t0 = time.monotonic()
        while not await _value(cond()):
            assert time.monotonic() - t0 < timeout_s, f"timed out waiting for {what}"
            await asyncio.sleep(0.1)

    async def main():
        async with aiohttp.ClientSession() as s:
            admin = RouterAdmin(router, s)
            assert await admin.worker_health() == {u: True for u in urls}
            gate = KVGate(AdaptiveConcurrencyConfig(enabled=True, poll_interval_s=0.05, placement="gate"), s,
                          list_workers=admin.worker_health)
            client = SGLangClient(PolicyConfig(router_url=router, routing="episode"), s, kv_gate=gate)

            async def served_by(key: str, n: int) -> str:
                return (await client.generate(list(range(1, 50)), 1, rid=f"{key}@0#{n}", routing_key=key)).meta["worker"]

            sick = None
            try:
                first = await served_by("k", 0)
                sick = next(u for u, name in names.items() if name == first)
                assert gate.placed["k"] == sick
                await healthy(s, sick, False)
                await until(lambda: _listed_healthy(admin, sick, False), "the router to count the worker unhealthy")
                await until(lambda: gate.stats()["per_worker"][sick]["down"], "the gate to take it out of placement")
                assert "k" not in gate.placed  # its key is placed afresh at its next call
                assert await served_by("k", 1) != first and gate.placed["k"] != sick
                new = [await served_by(f"n{i}", 0) for i in range(8)]
                assert first not in new, new  # no new key on the unhealthy worker
                await healthy(s, sick, True)
                await until(lambda: not gate.stats()["per_worker"][sick]["down"], "the gate to place keys on it again")
                assert await served_by("back", 0) == first  # the worker with the fewest keys gets the next one
            finally:
                gate.close()
                if sick is not None:  # the other tests of this module need every worker healthy
                    await healthy(s, sick, True)
                    await until(lambda: _listed_healthy(admin, sick, True), "every worker healthy")

    asyncio.run(main())


async def _listed_healthy(admin: RouterAdmin, url: str, ok: bool) -> bool:
    return (await admin.worker_health())[url] is ok


async def _value(x):
    return await x if inspect.isawaitable(x) else x


def test_the_worker_sends_each_episode_s_group_id(routed, retail):
    """RolloutWorker registers each episode's group with its client: a group's members, every
    turn of each, reach one worker with the group id as their key (the tagged workers count the
    keys they were sent)."""
    from rollout.core.config import load_config
    from rollout.core.pool.specs import make_specs
    from rollout.core.worker import RolloutWorker

    router, urls = routed
    cfg = load_config(None, [f"policy.router_url={router}", "policy.routing=group", "env.max_steps=3"])
    specs = make_specs("retail", retail.task_ids("base")[:4], 3, prefix="wk-")

    async def main():
        worker = RolloutWorker(cfg.policy, cfg.env, cfg.logging, max_concurrent_episodes=12)
        try:
            results = await asyncio.wait_for(asyncio.gather(*[worker.run(s) for s in specs]), timeout=120)
        finally:
            await worker.close()
        async with aiohttp.ClientSession() as s:
            served = []
            for u in urls:
                async with s.get(u + "/served") as r:
                    served.append((await r.json())["by_key"])
        return results, served

    results, served = asyncio.run(main())
    requests = sum(r.metadata["requests"] for r in results)
    assert requests >= len(specs)  # every episode made at least one call
    seen: dict[str, list[str]] = collections.defaultdict(list)
    for i, by_key in enumerate(served):
        for key, n in by_key.items():
            if key.startswith("wk-"):
                seen[key].append(f"w{i}")
                requests -= n
    assert requests == 0  # every call of these episodes carried a key of theirs
    assert sorted(seen) == sorted({s.group_id for s in specs})  # the group ids, never an episode id
    assert all(len(w) == 1 for w in seen.values()), seen  # each group on one worker
