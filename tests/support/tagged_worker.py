"""A worker for routing and KV-gate tests: it speaks enough of SGLang's HTTP protocol for the real
``sglang-router`` to register it and proxy ``/generate`` to it, and says who served each call.

* ``POST /generate`` answers a one-token generation whose ``meta_info`` carries ``worker`` (this
  worker's name) and ``routing_key`` (the ``X-SMG-Routing-Key`` header it received, or null), and
  counts the call under that key (``GET /served``: ``{"name", "calls", "by_key": {key: n}}``).
* ``GET /metrics`` answers Prometheus text with ``sglang:token_usage`` (and
  ``sglang:num_running_reqs``), whose value ``POST /token_usage {"value": float}`` sets (and
  ``sglang:num_retracted_requests_total``, once ``{"retractions": n}`` has set it, and
  ``sglang:max_total_num_tokens``, once ``{"kv_tokens": n}`` has); with
  ``{"fail": true}`` it answers 500 instead (a worker whose metrics cannot be read).
  ``{"healthy": false}`` makes ``GET /health`` answer 503 (a worker the router's health checks
  fail) while everything else still answers; ``{"healthy": true}`` mends it.
* ``GET /health``, ``/get_model_info`` (= ``/model_info``), ``/get_server_info`` (= ``/server_info``):
  what the router reads at registration (``model_path`` is the local tokenizer folder, so the
  router loads its tokenizer from disk).

Run it as ``python -m tests.support.tagged_worker --port P --name NAME --model-path DIR [--delay-s S]``, or
in-process with :func:`make_app`.
"""

from __future__ import annotations

import argparse
import asyncio
import collections

from aiohttp import web

ROUTING_HEADER = "X-SMG-Routing-Key"


def make_app(name: str, model_path: str, delay_s: float = 0.0, hold: asyncio.Event | None = None) -> web.Application:
    """The worker's aiohttp application (see the module docstring); each ``/generate`` waits
    ``delay_s`` seconds (an asyncio sleep) before it answers, so that calls overlap, and, in
    process, for ``hold`` to be set (``None``: no wait), so that a test decides when calls end."""
    state = {"usage": 0.0, "fail": False, "healthy": True, "calls": 0, "by_key": collections.Counter(), "retractions": None, "kv_tokens": None}

    async def generate(request: web.Request) -> web.Response:
        body = await request.json()
        key = request.headers.get(ROUTING_HEADER)
        state["calls"] += 1
        state["by_key"][key or ""] += 1
        ids = body.get("input_ids") or [0]
        if hold is not None:
            await hold.wait()
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        return web.json_response({
            "text": "x", "output_ids": [7],
            "meta_info": {"id": body.get("rid"), "finish_reason": {"type": "stop", "matched": 7},
                          "prompt_tokens": len(ids), "completion_tokens": 1, "cached_tokens": 0,
                          "weight_version": "0", "output_token_logprobs": [[-0.5, 7, None]],
                          "worker": name, "routing_key": key},
        })

    async def served(request: web.Request) -> web.Response:
        return web.json_response({"name": name, "calls": state["calls"], "by_key": dict(state["by_key"])})

    async def metrics(request: web.Request) -> web.Response:
        if state["fail"]:
            return web.Response(status=500, text="metrics unavailable")
        text = (
            "# HELP sglang:token_usage The token usage.\n# TYPE sglang:token_usage gauge\n"
            f'sglang:token_usage{{model_name="tagged",engine_type="unified"}} {state["usage"]}\n'
            "# HELP sglang:num_running_reqs The number of running requests.\n# TYPE sglang:num_running_reqs gauge\n"
            f'sglang:num_running_reqs{{model_name="tagged",engine_type="unified"}} 0.0\n'
        )
        if state["retractions"] is not None:
            text += ("# TYPE sglang:num_retracted_requests_total counter\n"
                     f'sglang:num_retracted_requests_total{{model_name="tagged"}} {state["retractions"]}\n')
        if state["kv_tokens"] is not None:
            text += ("# TYPE sglang:max_total_num_tokens gauge\n"
                     f'sglang:max_total_num_tokens{{model_name="tagged"}} {state["kv_tokens"]}\n')
        return web.Response(text=text, content_type="text/plain")

    async def set_usage(request: web.Request) -> web.Response:
        body = await request.json()
        state["fail"] = bool(body.get("fail", False))
        if "value" in body:
            state["usage"] = float(body["value"])
        if "retractions" in body:
            state["retractions"] = float(body["retractions"])
        if "kv_tokens" in body:
            state["kv_tokens"] = float(body["kv_tokens"])
        if "healthy" in body:
            state["healthy"] = bool(body["healthy"])
        return web.json_response({"value": state["usage"], "fail": state["fail"]})

    async def health(request: web.Request) -> web.Response:
        return web.Response(status=200 if state["healthy"] else 503)

    async def model_info(request: web.Request) -> web.Response:
        return web.json_response({"model_path": model_path, "tokenizer_path": model_path, "is_generation": True,
                                  "weight_version": "0"})

    async def server_info(request: web.Request) -> web.Response:
        return web.json_response({"model_path": model_path, "tokenizer_path": model_path, "served_model_name": name,
                                  "version": "tagged-worker", "weight_version": "0", "internal_states": [{}]})

    app = web.Application()
    app.add_routes([
        web.post("/generate", generate), web.get("/served", served), web.get("/metrics", metrics),
        web.post("/token_usage", set_usage), web.get("/health", health), web.get("/health_generate", health),
        web.get("/get_model_info", model_info), web.get("/model_info", model_info),
        web.get("/get_server_info", server_info), web.get("/server_info", server_info),
    ])
    return app


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--model-path", required=True)
    p.add_argument("--delay-s", type=float, default=0.0)
    args = p.parse_args()
    web.run_app(make_app(args.name, args.model_path, args.delay_s), host=args.host, port=args.port, print=None,
                loop=asyncio.new_event_loop())


if __name__ == "__main__":
    main()
