"""A fault-injecting HTTP proxy in front of a router, for Ray tests (whose driver is synchronous).

It runs its own event loop in a thread, binds 127.0.0.1 on a free port and forwards ``/generate``
to the upstream router, unless ``rule(key, body)`` says otherwise. ``key`` is the episode id of
the call: read from its ``rid`` where that is one of the episode loop's
(:func:`rollout.core.episode.request_id`), else the ``X-SMG-Routing-Key`` header (a trainer's own
client, e.g. verl's); under ``policy.routing=group`` the header names the group, not the episode.

* ``None``: forward;
* ``("status", code)``: answer ``code`` (e.g. 500: the policy server failed);
* ``("text", text)``: answer as a server would with ``text`` followed by the EOS id (a policy
  that says something else, e.g. a wrong answer earning reward 0), with weight version
  :attr:`FaultProxy.weight_version` (``"0"`` unless set);
* ``("delay", seconds)``: forward after ``seconds`` (a slow episode; cancelling the client's
  request cancels the wait).
* ``("hold", event)``: forward once ``event`` (a :class:`threading.Event`) is set; until then the
  call counts in :attr:`FaultProxy.holding` (a client that goes away cancels the hold).
"""

from __future__ import annotations

import asyncio
from typing import Callable

import aiohttp
from aiohttp import web

from rollout.core.episode import parse_request_id
from rollout.devtools.chaos import ThreadedApp

Rule = Callable[[str, dict], "tuple[str, object] | None"]


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
        self.weight_version = "0"  # what a "text" answer reports as meta_info.weight_version
        self.holding = 0  # calls held by a "hold" answer now

    async def _generate(self, request: web.Request) -> web.Response:
        body = await request.json()
        header = request.headers.get("X-SMG-Routing-Key")
        key = _episode_of(body.get("rid")) or header or ""
        self.seen.append(key)
        action = self.rule(key, body)
        if action is not None and action[0] == "status":
            return web.json_response({"error": "injected failure"}, status=int(action[1]))
        if action is not None and action[0] == "text":
            ids = self.tok.encode(str(action[1]), add_special_tokens=False) + [self.eos]
            return web.json_response({"text": str(action[1]), "output_ids": ids, "meta_info": {
                "id": body.get("rid"), "finish_reason": {"type": "stop", "matched": self.eos}, "weight_version": self.weight_version,
                "output_token_logprobs": [[-0.5, t, None] for t in ids]}})
        if action is not None and action[0] == "delay":
            await asyncio.sleep(float(action[1]))
        if action is not None and action[0] == "hold":
            self.holding += 1
            try:
                while not action[1].is_set():
                    await asyncio.sleep(0.05)
            finally:
                self.holding -= 1
        async with self._session.post(self.upstream + "/generate", json=body, headers={"X-SMG-Routing-Key": header} if header else None) as r:
            return web.json_response(await r.json(content_type=None), status=r.status)

    async def _workers(self, request: web.Request) -> web.Response:
        async with self._session.get(self.upstream + "/workers") as r:
            return web.json_response(await r.json(content_type=None), status=r.status)

    async def _health(self, request: web.Request) -> web.Response:
        async with self._session.get(self.upstream + "/health") as r:
            return web.Response(body=await r.read(), status=r.status)

    def _app(self) -> web.Application:
        app = web.Application(client_max_size=256 * 2**20)
        app.router.add_post("/generate", self._generate)
        app.router.add_get("/workers", self._workers)
        app.router.add_get("/health", self._health)
        return app  # served with handler_cancellation: a client that goes away cancels its delay

    async def _on_start(self) -> None:
        self._session = aiohttp.ClientSession()

    async def _on_stop(self) -> None:
        await self._session.close()

    def __enter__(self) -> "FaultProxy":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
