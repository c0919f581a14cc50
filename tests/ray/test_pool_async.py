"""The pool's async API driven from an event loop, on the shared Ray cluster against the gold-replay
stack: exactly once, complete groups, cancellation that loses nothing, and a weight update with
episodes in flight while a stream runs in another task (the gold-replay server's update only
relabels its weight version)."""

from __future__ import annotations

import asyncio
import collections
import json
import time
import urllib.request

import pytest

from rollout.core.config import load_config
from rollout.core.pool import RolloutPool

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def _cfg(router_url: str, *overrides: str):
    return load_config(None, [f"policy.router_url={router_url}", "pool.num_actors=2", "pool.max_concurrent_episodes=4",
                              "pool.num_cpus_per_actor=0.5", "rollout.n_samples_per_task=2", *overrides])


async def _start(cfg) -> RolloutPool:
    return await asyncio.to_thread(RolloutPool(cfg).start)  # the start blocks: off the loop


async def _stats(pool) -> dict:
    return await asyncio.to_thread(pool.stats)  # waits for the lock: for the step under way to end


async def test_async_streams_deliver_each_episode_once_and_a_cancelled_step_loses_nothing(ray_cluster, retail_stack, retail):
    """results_async: the consumer's task is cancelled mid-step until a cancelled step has
    delivered an episode it did not hand out; the same iterator then goes on, and every episode
    comes out once. groups_async: complete groups, every episode once."""
    ids = retail.task_ids("base")[:4]
    pool = await _start(_cfg(retail_stack.router_url))
    try:
        specs = pool.submit_tasks(ids)
        it = pool.results_async(timeout_s=120)
        got, lost_to_cancel = [], 0
        for _ in range(60):
            task = asyncio.create_task(it.__anext__())
            await asyncio.sleep(0.15)
            task.cancel()
            try:
                got.append(await task)  # it ended before the cancellation
            except asyncio.CancelledError:
                pass
            lost_to_cancel = (await _stats(pool))["episodes_delivered"] - len(got)
            if lost_to_cancel:
                break
        assert lost_to_cancel == 1, "no cancelled step delivered an episode"
        got += [r async for r in it]
        assert collections.Counter(r.spec.episode_id for r in got) == collections.Counter(s.episode_id for s in specs)

        again = pool.submit_tasks(ids[:3])
        groups = [g async for g in pool.groups_async(timeout_s=120)]
        assert pool.num_outstanding == 0 and not list(pool.excluded())
    finally:
        await asyncio.to_thread(pool.shutdown)
    assert sorted(s.episode_id for g in groups for s in g) == sorted(s.episode_id for s in again)
    assert all([s.sample_index for s in g] == [0, 1] and len({s.group_id for s in g}) == 1 for g in groups)
    assert all(s.status == "completed" and s.reward == 1.0 for g in groups for s in g)


async def test_collect_groups_async_cancelled_hands_its_groups_to_the_next_call(ray_cluster, retail_stack, retail):
    """collect_groups_async(3) is cancelled once it has gathered a group; the next call returns 3
    groups, the gathered one(s) among them: every group handed over is returned, every episode
    delivered once (kept, or excluded as the cancelled surplus).

    One actor runs one episode at a time, so once the first group is kept the first call still
    has four episodes to run one after another: the cancellation lands while it collects (with
    eight episodes at once, the three groups could all finish while the poll waited for a slice)."""
    pool = await _start(_cfg(retail_stack.router_url, "pool.num_actors=1", "pool.max_concurrent_episodes=1"))
    try:
        source = iter(retail.task_ids("base")[:8])
        first = asyncio.create_task(pool.collect_groups_async(3, source, abort_surplus=False, max_outstanding_groups=4, timeout_s=120))
        deadline = time.monotonic() + 120
        while (await _stats(pool))["groups_kept"] < 1:
            assert time.monotonic() < deadline and not first.done()
            await asyncio.sleep(0.05)
        assert not first.done()
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        gathered = (await _stats(pool))["groups_kept"]
        assert 1 <= gathered < 3
        kept = await pool.collect_groups_async(3, source, max_outstanding_groups=4, timeout_s=120)
        excluded = list(pool.excluded())
        st = await _stats(pool)
        submitted = pool.submitted_ids
    finally:
        await asyncio.to_thread(pool.shutdown)
    assert len(kept) == 3 == st["groups_kept"]
    assert all(len(g) == 2 and g[0].group_id == g[1].group_id for g in kept)
    delivered = [s.metadata["episode_id"] for g in kept for s in g] + [e.sample.metadata["episode_id"] for e in excluded]
    assert collections.Counter(delivered) == collections.Counter(submitted)
    assert {e.reason for e in excluded} <= {"group_cancelled"}


def _version(url: str) -> str:
    with urllib.request.urlopen(url + "/get_server_info", timeout=10) as r:
        return str(json.loads(r.read())["weight_version"])


async def test_update_weights_from_disk_async_with_episodes_in_flight_while_a_stream_runs(ray_cluster, retail_stack, retail, tmp_path):
    """A trainer's loop: groups_async runs in one task; another pauses (episodes held) and updates
    the weights while it waits for them. Every worker takes the new version, the held episodes go
    on under it, and every group comes out complete, every episode once."""
    before = int(_version(retail_stack.worker_urls[0]))
    pool = await _start(_cfg(retail_stack.router_url))
    try:
        pool.set_weight_version(before)
        specs = pool.submit_tasks(retail.task_ids("base")[:6])
        groups: list = []

        async def consume():
            async for g in pool.groups_async(timeout_s=120):
                groups.append(g)

        consumer = asyncio.create_task(consume())
        deadline = time.monotonic() + 60
        while sum(i["running"] for i in await asyncio.to_thread(pool.worker_infos)) < 4:
            assert time.monotonic() < deadline, "episodes never ran"
            await asyncio.sleep(0.05)
        await pool.pause_async("abort")  # gets in between two slices of the stream
        assert pool.paused == "abort" and pool.last_pause.episodes_running >= 1
        answers = await pool.update_weights_from_disk_async(str(tmp_path), before + 1)
        assert sorted(answers) == sorted(retail_stack.worker_urls) and all(a["success"] for a in answers.values())
        assert pool.weight_version == before + 1 and pool.paused is None and pool.last_pause.episodes_running >= 1
        assert {_version(u) for u in retail_stack.worker_urls} == {str(before + 1)}
        await asyncio.wait_for(consumer, 180)
        st = await _stats(pool)
    finally:
        try:  # the stack is shared by the session: its version back as it was
            await pool.update_weights_from_disk_async(str(tmp_path), before)
        finally:
            await asyncio.to_thread(pool.shutdown)
    assert sorted(s.episode_id for g in groups for s in g) == sorted(s.episode_id for s in specs)
    assert all(len(g) == 2 and len({s.group_id for s in g}) == 1 for g in groups)
    versions = [set(s.weight_versions) for g in groups for s in g]
    assert any(str(before + 1) in v for v in versions) and all(v <= {str(before), str(before + 1)} for v in versions)
    assert st["weight_updates"] == 1 and st["episodes_delivered"] == len(specs)
