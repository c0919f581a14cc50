"""Helper servers of the faults, each on 127.0.0.1 with its own event loop in a thread
(:class:`ThreadedApp`): the fault-injecting proxy, the fake user simulator; and the pause
/ continue of the local servers' generation."""

from __future__ import annotations

import asyncio
import collections
import hashlib
import json
import logging
import socket
import struct
import threading
import time
from typing import Callable

from rollout.devtools.chaos.progress import Progress

logger = logging.getLogger(__name__)

# user_sim_429_500: the user simulator's chat calls, in arrival order, are answered by this
# pattern, repeated: 2 in 10 with 429 (Retry-After: 1), 2 in 10 with 500.
USER_FAULT_PATTERN = ("ok", "429", "ok", "500", "ok", "ok", "429", "ok", "ok", "500")



class ThreadedApp:
    """An aiohttp application on 127.0.0.1 (a free port) served from a thread of its own, for
    callers whose own code is synchronous (the bench, Ray drivers in tests). Subclasses build the
    app in ``_app()`` and may open and close resources in ``_on_start`` / ``_on_stop``;
    ``start()`` returns once :attr:`url` serves, ``stop()`` tears it down."""

    def __init__(self) -> None:
        self.url = ""
        self.port = 0  # the port to bind (0: a free one); set before start()
        self._loop: asyncio.AbstractEventLoop | None = None

    def _app(self):  # pragma: no cover - overridden
        raise NotImplementedError

    async def _on_start(self) -> None:
        pass

    async def _on_stop(self) -> None:
        pass

    async def _start(self) -> None:
        from aiohttp import web

        await self._on_start()
        self._runner = web.AppRunner(self._app(), access_log=None, handler_cancellation=True, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"

    async def _stop(self) -> None:
        await self._runner.cleanup()
        await self._on_stop()

    def start(self):
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=type(self).__name__, daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(30)
        return self

    def stop(self) -> None:
        if self._loop is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(30)
        except Exception as e:  # noqa: BLE001 (best effort at the end of a fault)
            logger.debug("stopping %s: %r", type(self).__name__, e)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
        self._loop = None


_HOP = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}


class ForwardingApp(ThreadedApp):
    """A :class:`ThreadedApp` that stands for the HTTP server at ``upstream`` and forwards what its
    subclass's ``_handle(request)`` does not answer itself (:meth:`_forward`); the base of the
    fault-injecting proxy and :class:`~rollout.devtools.chaos.proxies.WorkerProxy`.

    Args:
        upstream: the server's base URL.
        progress: called at the first injection of each kind (e.g. a :class:`JournalProgress`).

    Attributes:
        counts: kind -> calls (the subclass's kinds).
        first_at: kind -> ``progress()`` at its first injection, as ``{"delivered",
            "outstanding"}`` (``None`` without ``progress``).
    """

    def __init__(self, upstream: str, progress: Callable[[], Progress] | None = None):
        super().__init__()
        self.upstream = upstream.rstrip("/")
        self.progress = progress
        self.counts: collections.Counter[str] = collections.Counter()
        self.first_at: dict[str, dict | None] = {}

    def _first(self, kind: str) -> None:
        """Count one call of ``kind`` and note the progress at its first."""
        self.counts[kind] += 1
        if kind not in self.first_at:
            self.first_at[kind] = self.progress().as_dict() if self.progress is not None else None

    @staticmethod
    def _rid(body: bytes) -> str | None:
        """The ``rid`` of a ``/generate`` body, or ``None`` (not JSON, no string ``rid``)."""
        try:
            rid = json.loads(body).get("rid")
        except (ValueError, AttributeError):
            return None
        return rid if isinstance(rid, str) else None

    def _app(self):
        from aiohttp import web

        from rollout.app.webguard import local_guard

        app = web.Application(client_max_size=256 * 2**20, middlewares=[local_guard()])
        app.router.add_route("*", "/{tail:.*}", self._handle)
        return app

    async def _handle(self, request):  # pragma: no cover - overridden
        raise NotImplementedError

    async def _on_start(self) -> None:
        import aiohttp

        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600))

    async def _on_stop(self) -> None:
        await self._session.close()

    async def _forward(self, request, body: bytes) -> tuple[bytes, int, str]:
        """Send ``request`` (its ``body`` already read) to the upstream server: ``(its answer's
        bytes, HTTP status, Content-Type)``. Raises what aiohttp raises when it cannot."""
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        async with self._session.request(request.method, self.upstream + request.path_qs, data=body or None, headers=headers) as r:
            return await r.read(), r.status, r.headers.get("Content-Type", "application/json")


class FaultInjectingProxy(ForwardingApp):
    """An HTTP proxy that stands for an SGLang worker in front of ``upstream`` (a real server):
    every request is forwarded, except that a fraction of the episodes' ``/generate`` calls (a
    ``rid`` of the form ``<episode>@<attempt>#<n>[.r<k>]``) get a fault instead, picked by a hash
    of ``seed`` and the ``rid`` (deterministic; a retry has a new ``rid``, so a fresh draw):

    * ``503``: HTTP 503 with a JSON error;
    * ``reset``: the connection is reset (RST) without an answer;
    * ``hang``: no answer for ``hang_s`` seconds (then 504);
    * ``truncated``: the server's answer cut to half its bytes, HTTP 200;
    * ``abort``: the server's answer with ``meta_info.finish_reason = {"type": "abort"}``.

    With ``topup_every`` = ``n`` > 0, every ``n``-th episode call (in arrival order) that the
    hash leaves alone gets the first kind of ``rates`` not injected yet, so that every kind is
    injected within the first ``n x len(rates)`` episode calls, whatever the hash draws.

    Args:
        upstream: the server's base URL.
        rates: fault -> fraction of those calls (their sum at most 1).
        hang_s: seconds a hung call waits.
        topup_every: see above (0: the hash alone).
        progress: called at each kind's first injection (e.g. a :class:`JournalProgress`).

    Attributes:
        counts: fault -> calls it was injected into; ``forwarded``: calls passed through.
        episode_calls: episode ``/generate`` calls seen.
        topped_up: fault -> calls it was injected into by the top-up.
        first_at: fault -> ``progress()`` at its first injection, as ``{"delivered",
            "outstanding"}`` (``None`` without ``progress``).
    """

    def __init__(self, upstream: str, rates: dict[str, float], hang_s: float, seed: int = 0, topup_every: int = 0,
                 progress: Callable[[], Progress] | None = None):
        super().__init__(upstream, progress)
        self.rates = dict(rates)
        self.hang_s = hang_s
        self.seed = seed
        self.topup_every = topup_every
        self.topped_up: collections.Counter[str] = collections.Counter()
        self.episode_calls = 0

    @staticmethod
    def _episode_call(rid: str | None) -> bool:
        return bool(rid) and "@" in rid and "#" in rid  # not the stack's / preflight's own probes

    def pick(self, rid: str | None) -> str | None:
        """The fault the hash draws for the call with this ``rid`` (``None``: forward it)."""
        if not self._episode_call(rid):
            return None
        u = int.from_bytes(hashlib.sha256(f"{self.seed}:{rid}".encode()).digest()[:8], "big") / 2**64
        acc = 0.0
        for kind, rate in self.rates.items():
            acc += rate
            if u < acc:
                return kind
        return None

    def choose(self, rid: str | None) -> str | None:
        """The fault for the next call, with this ``rid``: :meth:`pick`, or the top-up (see the
        class docstring); counts it (``counts``, ``first_at``). ``None``: forward it."""
        if not self._episode_call(rid):
            return None
        self.episode_calls += 1
        kind = self.pick(rid)
        if kind is None and self.topup_every > 0 and self.episode_calls % self.topup_every == 0:
            kind = next((k for k in self.rates if self.counts.get(k, 0) == 0), None)
            if kind is not None:
                self.topped_up[kind] += 1
        if kind is not None:
            self._first(kind)
        return kind

    async def _handle(self, request):
        from aiohttp import web

        body = await request.read()
        kind = None
        if request.method == "POST" and request.path == "/generate":
            kind = self.choose(self._rid(body))  # counts an injected kind
        if kind is None:
            self.counts["forwarded" if request.path == "/generate" else "other"] += 1
        if kind == "503":
            return web.json_response({"error": {"message": "injected: service unavailable"}}, status=503)
        if kind == "reset":
            sock = request.transport.get_extra_info("socket") if request.transport else None
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            if request.transport is not None:
                request.transport.abort()
            return web.Response(status=500)  # never sent: the connection is gone
        if kind == "hang":
            await asyncio.sleep(self.hang_s)
            return web.json_response({"error": {"message": "injected: gateway timeout"}}, status=504)
        data, status, ctype = await self._forward(request, body)
        if kind == "truncated" and status == 200:
            return web.Response(body=data[: len(data) // 2], status=200, content_type="application/json")
        if kind == "abort" and status == 200:
            d = json.loads(data)
            d.setdefault("meta_info", {})["finish_reason"] = {"type": "abort", "message": "injected abort"}
            return web.json_response(d)
        return web.Response(body=data, status=status, headers={"Content-Type": ctype})


class FakeUserLLM(ThreadedApp):
    """An OpenAI-compatible user simulator endpoint (``GET /v1/models``, ``POST
    /v1/chat/completions``): the chat calls, in arrival order, are answered as ``pattern`` says
    (repeated): ``429`` (with ``Retry-After: 1``), ``500``, or ``ok``: a fixed user line, which
    says ``###STOP###`` from the user's ``stop_at``-th turn on (counted by the simulator's own
    earlier turns in the request, role ``assistant``).

    Args:
        pattern: ``"ok"`` / ``"429"`` / ``"500"`` per chat call, repeated.
        stop_at: the user's turn from which it says ``###STOP###``.
        progress: called at the first 429 and the first 500 (e.g. a :class:`JournalProgress`).

    Attributes:
        counts: ``429`` / ``500`` / ``ok`` / ``stop`` -> calls answered so.
        first_at: ``429`` / ``500`` -> ``progress()`` at the first such answer, as
            ``{"delivered", "outstanding"}`` (``None`` without ``progress``).
    """

    def __init__(self, pattern: tuple[str, ...] = USER_FAULT_PATTERN, stop_at: int = 2, progress: Callable[[], Progress] | None = None):
        super().__init__()
        self.pattern = pattern
        self.stop_at = stop_at
        self.progress = progress
        self._calls = 0
        self.counts: collections.Counter[str] = collections.Counter()
        self.first_at: dict[str, dict | None] = {}

    def _app(self):
        from aiohttp import web

        from rollout.app.webguard import local_guard

        app = web.Application(middlewares=[local_guard()])
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)
        return app

    async def _models(self, request):
        from aiohttp import web

        return web.json_response({"object": "list", "data": [{"id": "sim", "object": "model"}]})

    async def _chat(self, request):
        from aiohttp import web

        body = await request.json()
        msgs = body.get("messages") or []
        if not (len(msgs) == 1 and msgs[0].get("content") == "ping"):  # not the pre-flight probe
            action = self.pattern[self._calls % len(self.pattern)]
            self._calls += 1
            if action in ("429", "500") and action not in self.first_at:
                self.first_at[action] = self.progress().as_dict() if self.progress is not None else None
            if action == "429":
                self.counts["429"] += 1
                return web.json_response({"error": {"message": "injected: rate limited"}}, status=429, headers={"Retry-After": "1"})
            if action == "500":
                self.counts["500"] += 1
                return web.json_response({"error": {"message": "injected: internal error"}}, status=500)
        turn = sum(1 for m in msgs if m.get("role") == "assistant") + 1
        if turn >= self.stop_at:
            text = "Thank you, that is everything I needed. ###STOP###"
            self.counts["stop"] += 1
        else:
            text = "Hi, I need some help with my order, please go ahead with what is needed."
            self.counts["ok"] += 1
        return web.json_response({
            "id": "chatcmpl-chaos", "object": "chat.completion", "created": int(time.time()), "model": body.get("model", "sim"),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        })


def http_ok(url: str, body: dict | None = None, timeout_s: float = 5.0) -> tuple[int, bytes]:
    from rollout.devtools.local.stack import _http

    try:
        return _http("GET" if body is None else "POST", url, body, timeout=timeout_s)
    except OSError:
        return 0, b""


def set_generation(urls: list[str], paused: bool, timeout_s: float = 30.0) -> None:
    """Pause generation in place on every server of ``urls`` (``POST /pause_generation {"mode":
    "in_place"}``: running requests stop between two steps and keep their state, new ones are
    held), or continue it (``POST /continue_generation``), as SGLang's endpoints do.

    Raises:
        RuntimeError: a server did not answer 200 within ``timeout_s`` seconds (after every
            server was asked, so that a continue reaches all that answer).
    """
    path, body = ("/pause_generation", {"mode": "in_place"}) if paused else ("/continue_generation", {})
    bad = []
    for url in urls:
        status, text = http_ok(url.rstrip("/") + path, body, timeout_s)
        if status != 200:
            bad.append(f"{url}{path}: HTTP {status} {text[:200]!r}")
    if bad:
        raise RuntimeError("; ".join(bad))


def user_sim_main(argv: list[str]) -> int:
    """``python -m rollout.devtools.chaos user-sim PORT``: a :class:`FakeUserLLM` that answers every
    call (no injected 429 / 500) on ``127.0.0.1:PORT``, in a process of its own (a user simulator's
    model server the bench can kill and start again on the same port); prints its URL as one JSON
    line and serves until SIGTERM or the parent's death."""
    import json
    import signal
    import sys

    from rollout.core.fate import set_parent_death_signal

    set_parent_death_signal(signal.SIGTERM)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    app = FakeUserLLM(pattern=("ok",))
    app.port = int(argv[0])
    app.start()
    print(json.dumps({"url": app.url}), flush=True)
    stop.wait()
    app.stop()
    sys.stdout.flush()
    return 0
