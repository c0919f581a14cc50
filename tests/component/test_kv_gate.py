"""KV-aware concurrency (``pool.adaptive_concurrency``, :mod:`rollout.core.policy.kvgate`) against
real aiohttp workers on 127.0.0.1 whose ``/metrics`` serve a ``sglang:token_usage`` the test sets
(:mod:`support.tagged_worker`)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time

import aiohttp
import pytest
from aiohttp import web
from support.tagged_worker import make_app
from support.waits import until

from rollout.core.config import AdaptiveConcurrencyConfig, PolicyConfig
from rollout.core.policy import PolicyServerError, SGLangClient
from rollout.core.policy.kvgate import KVGate
from rollout.devtools.local.stack import free_port


async def _worker(name: str, delay_s: float = 0.0, hold: asyncio.Event | None = None) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(make_app(name, "/nonexistent", delay_s, hold))
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


async def _set(session: aiohttp.ClientSession, url: str, **body) -> None:
    async with session.post(url + "/token_usage", json=body) as r:
        assert r.status == 200


def _cfg(urls: list[str], **kw) -> AdaptiveConcurrencyConfig:
    kw.setdefault("placement", "router")  # the workers as one pool; placement=gate has a test of its own
    return AdaptiveConcurrencyConfig(enabled=True, high_water=0.9, low_water=0.75, poll_interval_s=0.05, timeout_s=1.0,
                                     worker_urls=urls, **kw)


async def _until(cond, what: str = "the gate's state") -> None:
    await until(cond, what, interval_s=0.02)


def _waiting(gate: KVGate) -> int:
    return gate.stats()["waiting"]


def test_the_gate_holds_above_the_high_water_mark_and_releases_below_the_low_water_mark():
    async def main():
        (r1, u1), (r2, u2) = await _worker("w0"), await _worker("w1")
        async with aiohttp.ClientSession() as s:
            gate = KVGate(_cfg([u1, u2]), s)
            try:
                await _set(s, u1, value=0.5)
                await _set(s, u2, value=0.6)
                assert await gate.wait() == 0.0 and not gate.closed  # starts the poller; open
                await _until(lambda: gate.polls >= 1)
                assert gate.usage == pytest.approx(0.6)  # signal=max: the fullest worker
                await _set(s, u2, value=0.95)  # one worker past the high-water mark
                await _until(lambda: gate.closed)
                waiter = asyncio.ensure_future(gate.wait())
                await _until(lambda: _waiting(gate) == 1, "the call queued at the closed gate")
                held_since = time.monotonic()  # (the gate's clock for this wait started before it queued)
                assert not waiter.done()  # held
                await _set(s, u2, value=0.8)  # between the marks: still held (hysteresis)
                polls = gate.polls
                await _until(lambda: gate.polls >= polls + 3)
                assert gate.closed and not waiter.done() and gate.usage == pytest.approx(0.8)
                released_after = time.monotonic()  # the release can only follow this reading
                await _set(s, u2, value=0.7)  # below the low-water mark: released
                held = await asyncio.wait_for(waiter, 120)
                assert held >= released_after - held_since and not gate.closed and gate.holds == 1
                assert gate.held_s == pytest.approx(held)
                # between the marks from below: stays open
                await _set(s, u2, value=0.85)
                polls = gate.polls
                await _until(lambda: gate.polls >= polls + 3)
                assert not gate.closed and await gate.wait() == 0.0
            finally:
                gate.close()
                await r1.cleanup()
                await r2.cleanup()

    asyncio.run(main())


def test_signal_mean_averages_the_workers():
    async def main():
        (r1, u1), (r2, u2) = await _worker("w0"), await _worker("w1")
        async with aiohttp.ClientSession() as s:
            gate = KVGate(_cfg([u1, u2], signal="mean"), s)
            try:
                await _set(s, u1, value=0.95)
                await _set(s, u2, value=0.5)
                assert await gate.poll_once() == pytest.approx(0.725) and not gate.closed
                await _set(s, u2, value=0.9)
                assert await gate.poll_once() == pytest.approx(0.925) and gate.closed
            finally:
                gate.close()
                await r1.cleanup()
                await r2.cleanup()

    asyncio.run(main())


def test_unreadable_metrics_never_hold_and_are_logged_once(caplog):
    async def main():
        (r1, u1), (r2, u2) = await _worker("w0"), await _worker("w1")
        dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
        async with aiohttp.ClientSession() as s:
            gate = KVGate(_cfg([u1, u2, dead]), s)
            try:
                await _set(s, u1, value=0.95)
                await _set(s, u2, value=0.5)
                await gate.poll_once()
                assert gate.closed and gate.readings[dead] is None  # the readable worker decides
                await _set(s, u1, fail=True)  # its /metrics now answers 500
                await _set(s, u2, fail=True)
                for _ in range(4):
                    assert await gate.poll_once() is None
                assert not gate.closed and await gate.wait() == 0.0  # unknown: nothing is held
            finally:
                gate.close()
                await r1.cleanup()
                await r2.cleanup()

    with caplog.at_level(logging.WARNING, logger="rollout.core.policy.kvreadings"):
        asyncio.run(main())
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 3, warnings  # once per worker, not once per poll
    assert all("counts as unknown and nothing is held" in w for w in warnings)


def test_a_generate_call_waits_at_the_gate_and_its_episode_counts_the_held_time():
    async def main():
        (r1, u1) = await _worker("w0")
        async with aiohttp.ClientSession() as s:
            gate = KVGate(_cfg([u1]), s)
            client = SGLangClient(PolicyConfig(router_url=u1), s, kv_gate=gate)
            try:
                await _set(s, u1, value=0.97)
                await gate.poll_once()
                call = asyncio.ensure_future(client.generate([1, 2, 3], 4, rid="ep@0#0", routing_key="ep"))
                await _until(lambda: _waiting(gate) == 1, "the call queued at the closed gate")
                held_since = time.monotonic()
                assert not call.done()  # held before it was sent
                async with s.get(u1 + "/served") as r:
                    assert (await r.json())["calls"] == 0
                released_after = time.monotonic()
                await _set(s, u1, value=0.1)
                gen = await asyncio.wait_for(call, 120)
                assert gen.ids == [7] and gen.meta["worker"] == "w0"
                # the episode counts the time its call waited at the gate: at least the span the test saw it held
                assert client.kv_held_s["ep"] >= released_after - held_since > 0
            finally:
                gate.close()
                await r1.cleanup()

    asyncio.run(main())


def test_open_the_gate_caps_calls_in_flight_grows_the_cap_below_low_water_and_cuts_it_on_retractions():
    """The cap that keeps a reopening gate from releasing every held call at once: FIFO slots up to
    ``limit`` (start_calls_per_worker x workers), +1 per worker per poll while it binds below the
    low-water mark, cut by decrease_factor when the workers' retraction counter grows."""
    async def main():
        (r1, u1), (r2, u2) = await _worker("w0"), await _worker("w1")
        async with aiohttp.ClientSession() as s:
            cfg = dataclasses.replace(_cfg([u1, u2], start_calls_per_worker=2, decrease_factor=0.5), poll_interval_s=3600)
            gate = KVGate(cfg, s)
            try:
                for u in (u1, u2):
                    await _set(s, u, value=0.5, retractions=3)
                gate.start()  # the poller's first reading; then it sleeps for an hour and the test polls by hand
                await _until(lambda: gate.polls >= 1)
                assert gate.limit == 4 and gate.retractions == 6  # 2 per worker; the counter summed
                slots = [await gate.acquire() for _ in range(4)]
                assert [t.waited for t in slots] == [0.0] * 4 and gate.in_flight == 4
                assert all(t.worker is None for t in slots)  # placement=router: the calls go to the router
                late = [asyncio.ensure_future(gate.acquire()) for _ in range(3)]
                await _until(lambda: _waiting(gate) == 3, "three calls queued behind the cap")
                assert not any(f.done() for f in late)  # the cap binds: held, not sent
                gate.release(slots.pop())
                await _until(lambda: late[0].done(), "the first held call's slot")
                # FIFO, one for one: the gate grants at release, so the others are still queued
                assert not late[1].done() and _waiting(gate) == 2 and gate.in_flight == 4
                # below the low-water mark with the cap binding: +1 per worker per poll
                await gate.poll_once()
                await _until(lambda: all(f.done() for f in late), "the held calls' slots after the cap grew")
                assert gate.limit == 6 and gate.in_flight == 6
                # a retraction on a worker: the cap is cut by half (of the calls out), not below 1 per worker
                await _set(s, u1, value=0.5, retractions=4)
                await gate.poll_once()
                assert gate.limit == 3 and gate.cuts == 1
                extra = asyncio.ensure_future(gate.acquire())
                await _until(lambda: _waiting(gate) == 1, "the call queued behind the cut cap")
                assert not extra.done()
                out = slots + [f.result() for f in late]
                for _ in range(4):  # calls end: 6 -> 2 in flight, the waiter gets a slot
                    gate.release(out.pop())
                await _until(lambda: extra.done(), "the held call's slot")
                assert gate.in_flight == 3
                # a cancelled waiter keeps no slot
                ghost = asyncio.ensure_future(gate.acquire())
                await _until(lambda: _waiting(gate) == 1, "the call queued at the full cap")
                ghost.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await ghost
                gate.release(out.pop())
                assert gate.in_flight == 2
                # unknown readings lift the cap (nothing is held on a guess)
                await _set(s, u1, fail=True)
                await _set(s, u2, fail=True)
                assert await gate.poll_once() is None and gate.limit is None
            finally:
                gate.close()
                await r1.cleanup()
                await r2.cleanup()

    asyncio.run(main())


def test_placement_gate_keeps_each_key_on_one_worker_holds_per_worker_and_moves_a_dead_worker_s_keys():
    """``placement=gate``: the gate places each routing key on the worker with the most room in
    its KV share and the calls go straight to that worker; a worker past the high-water mark holds
    only the keys placed on it; a call that would pass a worker's reserved-token cap waits; a
    worker that refuses connections loses its keys to the others, and the retried call lands there."""
    async def main():
        answer = asyncio.Event()  # the workers answer once it is set: the first calls stay out until then
        (r1, u1), (r2, u2) = await _worker("w0", hold=answer), await _worker("w1", hold=answer)
        runners = {u1: r1, u2: r2}
        async with aiohttp.ClientSession() as s:
            for u in (u1, u2):
                await _set(s, u, value=0.1, kv_tokens=1000)  # cap per worker: 0.9 x 1000 = 900 tokens
            gate = KVGate(_cfg([u1, u2], placement="gate"), s)
            client = SGLangClient(PolicyConfig(router_url="http://127.0.0.1:9", routing="group"), s, kv_gate=gate)
            client.groups.update({"a1": "g1", "a2": "g1", "a3": "g1", "b1": "g2", "b2": "g2", "b3": "g2"})

            def gen(eid: str, n: int = 0):  # prompt 300 + max_new_tokens 100: 400 KV tokens reserved
                return asyncio.ensure_future(client.generate([1] * 300, 100, rid=f"{eid}@{n}", routing_key=eid))

            try:
                first = [gen("a1"), gen("a2"), gen("b1"), gen("b2")]
                await _until(lambda: gate.in_flight == 4, "the first four calls placed and sent")
                third = gen("a3")  # g1's worker has 800 of its 900 tokens reserved: held
                await _until(lambda: _waiting(gate) == 1, "the third call of g1 queued at its worker")
                held_since = time.monotonic()
                assert not third.done() and gate.in_flight == 4
                released_after = time.monotonic()
                answer.set()
                got = [(await asyncio.wait_for(f, 120)).meta["worker"] for f in first]
                assert got[0] == got[1] and got[2] == got[3] and got[0] != got[2]  # a group on one worker, groups apart
                assert (await asyncio.wait_for(third, 120)).meta["worker"] == got[0]
                assert client.kv_held_s["a3"] >= released_after - held_since > 0
                g1, g2 = gate.placed["g1"], gate.placed["g2"]
                assert {g1, g2} == {u1, u2}
                # g1's worker past the high-water mark: g1's calls wait, g2's go on
                await _set(s, g1, value=0.95, kv_tokens=1000)
                await _until(lambda: gate.stats()["per_worker"][g1]["closed"])
                held, free = gen("a1", 1), gen("b1", 1)
                assert (await asyncio.wait_for(free, 120)).meta["worker"] == got[2]
                assert not held.done() and not gate.closed  # only g1's worker is closed
                await _set(s, g1, value=0.5, kv_tokens=1000)
                assert (await asyncio.wait_for(held, 120)).meta["worker"] == got[0]
                # g2's worker goes away: the call is refused, g2 moves to the other worker, the retry lands there
                await runners.pop(g2).cleanup()
                moved = await asyncio.wait_for(client.generate([1] * 300, 100, rid="b2@1", routing_key="b2"), 120)
                assert moved.meta["worker"] == got[0] and gate.placed["g2"] == g1
                assert gate.stats()["per_worker"][g2]["down"]
            finally:
                gate.close()
                for r in runners.values():
                    await r.cleanup()

    asyncio.run(main())


def test_placement_gate_holds_nothing_when_every_worker_is_gone():
    """Every worker refuses connections and its /metrics cannot be read: each refusal takes a worker
    out of placement, and once every worker is out they all count again (unknown is never held), so
    each retry goes out, fails, and the call ends as the client's own error after its retries
    instead of waiting for a worker forever."""
    async def main():
        dead = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]
        async with aiohttp.ClientSession() as s:
            gate = KVGate(dataclasses.replace(_cfg(dead, placement="gate"), timeout_s=0.2), s)
            cfg = PolicyConfig(router_url="http://127.0.0.1:9", routing="episode", max_request_retries=3, backend_outage_timeout_s=60.0)
            client = SGLangClient(cfg, s, kv_gate=gate)
            try:
                with pytest.raises(PolicyServerError):
                    await asyncio.wait_for(client.generate([1] * 10, 4, rid="e@0", routing_key="e"), 30.0)
                stats = gate.stats()
                assert stats["in_flight"] == 0 and stats["waiting"] == 0
                assert all(w["down"] for w in stats["per_worker"].values())  # each refused a call
            finally:
                gate.close()

    asyncio.run(main())
