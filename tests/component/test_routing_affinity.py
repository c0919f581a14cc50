"""Routing affinity (``policy.routing``) through the real sglang-router 0.3.2 started as the local
stack starts it (``local.router_policy=auto``: ``--policy manual --assignment-mode min_group``), in
front of four workers that report who served each call and the ``X-SMG-Routing-Key`` they received
(:mod:`support.tagged_worker`). Also: the KV gate finds the workers through the router's
``GET /workers``."""

from __future__ import annotations

import asyncio
import collections

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
    calls overlap) behind the real router with the ``auto`` policy."""
    with tagged_cluster(router_policy_args("auto"), workers=WORKERS, delay_s=0.1, log_dir=tmp_path_factory.mktemp("routing")) as (router, urls, _):
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
            gate = KVGate(AdaptiveConcurrencyConfig(enabled=True, poll_interval_s=0.05, placement="router"), s, list_workers=admin.worker_urls)
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
