"""A fault-injecting HTTP proxy in front of a router, for Ray tests (whose driver is synchronous).

It runs its own event loop in a thread, binds 127.0.0.1 on a free port and forwards the generate
route (SGLang's ``/generate``, vLLM's ``/inference/v1/generate``) to the same route of the
upstream router, unless ``rule(key, body)`` says otherwise. ``key`` is the episode id of the
call: read from its ``rid`` (SGLang) or ``request_id`` (vLLM) where that is one of the episode
loop's (:func:`rollout.core.episode.request_id`), else the routing header (``X-SMG-Routing-Key``
or ``X-Session-ID``: a trainer's own client, e.g. verl's); under ``policy.routing=group`` the
header names the group, not the episode. ``rule`` may edit ``body`` in place before it is
forwarded (e.g. ``ignore_eos`` in vLLM's ``sampling_params``). What it returns:

* ``None``: forward;
* ``("status", code)``: answer ``code`` (e.g. 500: the policy server failed);
* ``("text", text)``: answer as an SGLang server would with ``text`` followed by the EOS id (a
  policy that says something else, e.g. a wrong answer earning reward 0), with weight version
  :attr:`FaultProxy.weight_version` (``"0"`` unless set); SGLang's route only;
* ``("delay", seconds)``: forward after ``seconds`` (a slow episode; cancelling the client's
  request cancels the wait);
* ``("hold", event)``: forward once the ``threading.Event`` is set (a call out on the client
  that has not reached an engine; cancelling the client's request cancels the wait); until then
  the call counts in :attr:`FaultProxy.holding`.

:attr:`FaultProxy.open` counts, per key, the calls forwarded whose answer has not come back: a
call the upstream engine may be running now.
"""

from __future__ import annotations

import asyncio
import collections
import threading
from typing import Callable

import aiohttp
from aiohttp import web

from rollout.core.episode import parse_request_id
from rollout.devtools.chaos import ThreadedApp

Rule = Callable[[str, dict], "tuple[str, object] | None"]
ROUTING_HEADERS = ("X-SMG-Routing-Key", "X-Session-ID")  # SGLang's, vLLM's
SGLANG_GENERATE, VLLM_GENERATE = "/generate", "/inference/v1/generate"


def _episode_of(rid) -> str | None:
    """The episode id in a ``rid`` of the episode loop's (``{episode_id}@{attempt}#{request}``,
    perhaps ``.r{n}``), else ``None``."""
    if not isinstance(rid, str):
        return None
    try:
        return parse_request_id(rid)[0]
    except ValueError:
        return None


class FaultProxy(ThreadedApp):
    def __init__(self, upstream: str, tokenizer, rule: Rule):
        super().__init__()
        self.upstream = upstream.rstrip("/")
        self.tok = tokenizer
        self.rule = rule
        self.eos = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)
        self.seen: list[str] = []  # keys (episode ids), in arrival order
        self.open: collections.Counter[str] = collections.Counter()  # key -> forwarded calls not answered yet
        self.weight_version = "0"  # what a "text" answer reports as meta_info.weight_version
        self.holding = 0  # calls held by a "hold" answer now

    async def _generate(self, request: web.Request) -> web.Response:
        body = await request.json()
        headers = {h: request.headers[h] for h in ROUTING_HEADERS if h in request.headers}
        key = _episode_of(body.get("rid", body.get("request_id"))) or next(iter(headers.values()), "")
        self.seen.append(key)
        action = self.rule(key, body)
        if action is not None and action[0] == "status":
            return web.json_response({"error": "injected failure"}, status=int(action[1]))
        if action is not None and action[0] == "text":
            if request.path != SGLANG_GENERATE:
                return web.json_response({"error": "a 'text' answer speaks SGLang's wire only"}, status=501)
            ids = self.tok.encode(str(action[1]), add_special_tokens=False) + [self.eos]
            return web.json_response({"text": str(action[1]), "output_ids": ids, "meta_info": {
                "id": body.get("rid"), "finish_reason": {"type": "stop", "matched": self.eos}, "weight_version": self.weight_version,
                "output_token_logprobs": [[-0.5, t, None] for t in ids]}})
        if action is not None and action[0] == "delay":
            await asyncio.sleep(float(action[1]))
        if action is not None and action[0] == "hold":
            event: threading.Event = action[1]  # type: ignore[assignment]
            self.holding += 1
            try:
                while not event.is_set():  # a condition on another thread; cancelled with the client's request
                    await asyncio.sleep(0.02)
            finally:
                self.holding -= 1
        self.open[key] += 1
        try:
            async with self._session.post(self.upstream + request.path, json=body, headers=headers or None) as r:
                return web.json_response(await r.json(content_type=None), status=r.status)
        finally:
            self.open[key] -= 1

    async def _workers(self, request: web.Request) -> web.Response:
        async with self._session.get(self.upstream + "/workers") as r:
            return web.json_response(await r.json(content_type=None), status=r.status)

    async def _health(self, request: web.Request) -> web.Response:
        async with self._session.get(self.upstream + "/health") as r:
            return web.Response(body=await r.read(), status=r.status)

    def _app(self) -> web.Application:
        app = web.Application(client_max_size=256 * 2**20)
        app.router.add_post(SGLANG_GENERATE, self._generate)
        app.router.add_post(VLLM_GENERATE, self._generate)
        app.router.add_get("/workers", self._workers)
        app.router.add_get("/health", self._health)
        return app  # served with handler_cancellation: a client that goes away cancels its delay

    async def _on_start(self) -> None:
        # no total bound: a long call takes what it takes (the client has its own request timeout)
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))

    async def _on_stop(self) -> None:
        await self._session.close()

    def __enter__(self) -> "FaultProxy":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
