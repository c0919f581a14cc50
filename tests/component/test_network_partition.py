"""A network partition between the policy client and the router: the client reaches a stand-in
backend (``/generate``, ``/workers``, ``/abort_request`` on 127.0.0.1) through a
:class:`~rollout.devtools.chaos.proxies.PartitionProxy` (TCP), which stops forwarding both ways
without closing anything (no FIN, no RST), then heals. Only ``policy.request_timeout_s`` can see
it: a call times out, is retried with a fresh request id, and goes through once the partition
heals; a partition shorter than the timeout only delays the call."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web
from support.waits import until

from rollout.core.config import load_config
from rollout.core.policy import SGLangClient
from rollout.devtools.chaos.proxies import PartitionProxy
from rollout.devtools.local.stack import free_port

IDS = [11, 12, 13]


class Backend:
    """Answers ``/generate`` with three fixed tokens and records every request id and abort."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.rids: list[str] = []
        self.aborts: list[str] = []

    async def _generate(self, request):
        body = await request.json()
        self.rids.append(body["rid"])
        return web.json_response({"text": "abc", "output_ids": IDS, "meta_info": {
            "id": body["rid"], "finish_reason": {"type": "stop", "matched": IDS[-1]}, "weight_version": "0",
            "output_token_logprobs": [[-0.5, t, None] for t in IDS]}})

    async def _workers(self, request):
        return web.json_response({"workers": [{"url": self.url, "is_healthy": True}]})

    async def _abort(self, request):
        self.aborts.append((await request.json()).get("rid"))
        return web.json_response({"success": True})

    async def __aenter__(self) -> "Backend":
        app = web.Application()
        app.router.add_post("/generate", self._generate)
        app.router.add_get("/workers", self._workers)
        app.router.add_post("/abort_request", self._abort)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=0.5)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self._runner.cleanup()


@pytest.fixture
def partition():
    proxies: list[PartitionProxy] = []

    def make(upstream: str) -> PartitionProxy:
        proxies.append(PartitionProxy(upstream).start())
        return proxies[-1]

    yield make
    for p in proxies:
        p.stop()


async def test_a_partition_longer_than_the_timeout_is_met_by_timeouts_and_retries(partition):
    async with Backend() as backend, aiohttp.ClientSession() as session:
        proxy = partition(backend.url)
        cfg = load_config(None, [f"policy.router_url={proxy.url}", "policy.request_timeout_s=1", "policy.max_request_retries=6"])
        client = SGLangClient(cfg.policy, session)
        await client.generate([1, 2], 4, rid="warm#0", routing_key="warm")  # through the proxy, before the partition
        open_then = proxy.partition()
        call = asyncio.create_task(client.generate([1, 2], 4, rid="e#0", routing_key="e"))
        # the first attempt timed out (request_timeout_s=1) and its retry's new connection is held too
        await until(lambda: client.retries >= 1 and proxy.held >= 2, "a timed-out attempt and a held retry")
        assert not call.done() and backend.rids == ["warm#0"]  # nothing crossed
        proxy.heal()
        gen = await asyncio.wait_for(call, 120)
    assert gen.ids == IDS and client.retries >= 1  # timed out at least once, retried
    assert open_then >= 1 and proxy.held >= 2  # the pooled connection, and the retries' new ones, held without a reset
    assert any(r.startswith("e#0.r") for r in backend.rids)  # a retry, with a fresh request id, went through


async def test_a_partition_shorter_than_the_timeout_only_delays_the_call(partition):
    async with Backend() as backend, aiohttp.ClientSession() as session:
        proxy = partition(backend.url)
        cfg = load_config(None, [f"policy.router_url={proxy.url}", "policy.request_timeout_s=20"])
        client = SGLangClient(cfg.policy, session)
        proxy.partition()
        call = asyncio.create_task(client.generate([1, 2], 4, rid="e#0", routing_key="e"))
        await until(lambda: proxy.held >= 1, "the call's connection held by the partition")
        assert not call.done() and backend.rids == []  # held: nothing crossed
        proxy.heal()
        gen = await asyncio.wait_for(call, 120)
    assert gen.ids == IDS and client.retries == 0 and backend.rids == ["e#0"]  # held, then through, once
