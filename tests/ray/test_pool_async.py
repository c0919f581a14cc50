"""The pool's async API driven from an event loop, on the shared Ray cluster against the gold-replay
stack: exactly once, complete groups, cancellation that loses nothing, and a weight update with
episodes in flight while a stream runs in another task (the gold-replay server's update only
relabels its weight version)."""

from __future__ import annotations

import asyncio
import collections
import json
import threading
import time
import urllib.request

import pytest
from support.raypool import pool_config

from rollout.core.pool import RolloutPool

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def _cfg(router_url: str, *overrides: str):
    return pool_config(router_url, "rollout.n_samples_per_task=2", *overrides, num_actors=2)


async def _start(cfg) -> RolloutPool:
    return await asyncio.to_thread(RolloutPool(cfg).start)  # the start blocks: off the loop


async def _stats(pool) -> dict:
    return await asyncio.to_thread(pool.stats)  # waits for the lock: for the step under way to end


class _HeldStep:
    """Wraps the pool's ``ensure_result`` (what each slice of ``results_async`` runs in its worker
    thread): its first call delivers an episode, waiting as long as that takes (not one slice),
    then holds in the thread, the episode delivered and not handed out, until :attr:`release` is
    set; later calls are the pool's own. The awaiting task is cancelled while it holds."""

    def __init__(self, ensure):
        self._ensure = ensure
        self._first = True
        self.delivered: bool | None = None
        self.holding = threading.Event()
        self.release = threading.Event()

    def __call__(self, timeout_s):
        if not self._first:
            return self._ensure(timeout_s)
        self._first = False
        self.delivered = self._ensure(120)
        self.holding.set()
        if not self.release.wait(120):
            raise TimeoutError("the held step was never released")
        return self.delivered


async def test_async_streams_deliver_each_episode_once_and_a_cancelled_step_loses_nothing(ray_cluster, retail_stack, retail, monkeypatch):
    """results_async: the consumer's task is cancelled while its step holds an episode it has
    delivered and not handed out; the same iterator then goes on, hands that episode out first
    (no new delivery), and every episode comes out once. groups_async: complete groups, every
    episode once."""
    ids = retail.task_ids("base")[:4]
    pool = await _start(_cfg(retail_stack.router_url))
    held = _HeldStep(pool._streams.ensure_result)
    monkeypatch.setattr(pool._streams, "ensure_result", held)  # before results_async, which binds it
    try:
        specs = pool.submit_tasks(ids)
        it = pool.results_async(timeout_s=120)
        task = asyncio.create_task(it.__anext__())
        assert await asyncio.to_thread(held.holding.wait, 120), "the first step delivered no episode"
        assert held.delivered is True and not task.done()
        task.cancel()  # the step is in its thread, holding the episode it delivered
        with pytest.raises(asyncio.CancelledError):
            await task
        held.release.set()
        assert (await _stats(pool))["episodes_delivered"] == 1  # the cancelled step's, handed out to no one
        got = [await it.__anext__()]
        assert (await _stats(pool))["episodes_delivered"] == 1  # that one: handed out now, not a new delivery
        got += [r async for r in it]
        assert collections.Counter(r.spec.episode_id for r in got) == collections.Counter(s.episode_id for s in specs)

        again = pool.submit_tasks(ids[:3])
        groups = [g async for g in pool.groups_async(timeout_s=120)]
        assert pool.num_outstanding == 0 and not list(pool.excluded())
    finally:
        held.release.set()  # a failure while the step held: let it end, or the shutdown waits for its lock
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
