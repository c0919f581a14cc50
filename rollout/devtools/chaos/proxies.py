"""Proxies the faults put between the parts of a run, each on 127.0.0.1 with its own event loop in
a thread: :class:`WorkerProxy` stands for one SGLang worker behind the router (it fails weight
updates, or makes the worker a straggler, once armed); :class:`PartitionProxy` stands between the
actors and the router at the TCP level (a network partition: traffic dropped, no reset)."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Callable

from rollout.devtools.chaos.progress import Progress
from rollout.devtools.chaos.servers import ForwardingApp

logger = logging.getLogger(__name__)


class WorkerProxy(ForwardingApp):
    """An HTTP proxy standing for the worker at ``upstream`` (a real server): everything is
    forwarded, except what it was armed for:

    * :meth:`fail_updates` ``(n)``: the next ``n`` ``POST /update_weights_from_disk`` calls are
      answered as SGLang answers a failed load (HTTP 400, ``{"success": false, "message"}``),
      without reaching the worker (its weights and version unchanged);
    * :meth:`slow_down` ``(seconds)``: from then on every episode ``/generate`` call (a ``rid`` of
      the episode loop's) waits ``seconds`` before it is forwarded: a straggler worker (a client
      that gives up cancels the wait).

    Args:
        upstream: the worker's base URL.
        progress: called at the first injection of each kind (e.g. a
            :class:`~rollout.devtools.chaos.progress.JournalProgress`).

    Attributes:
        counts: ``update_failed`` / ``update_forwarded`` / ``generate_delayed`` /
            ``generate_forwarded`` / ``other`` -> calls.
        first_at: kind -> ``progress()`` at its first injection, as ``{"delivered", "outstanding"}``.
    """

    def __init__(self, upstream: str, progress: Callable[[], Progress] | None = None):
        super().__init__(upstream, progress)
        self._fail_updates = 0
        self._delay_s = 0.0

    def fail_updates(self, n: int = 1) -> None:
        """Fail the next ``n`` weight updates (thread-safe: a plain assignment)."""
        self._fail_updates = n

    def slow_down(self, seconds: float) -> None:
        """Delay every episode ``/generate`` call by ``seconds`` from now on."""
        self._delay_s = float(seconds)

    async def _handle(self, request):
        from aiohttp import web

        body = await request.read()
        if request.path == "/update_weights_from_disk" and self._fail_updates > 0:
            self._fail_updates -= 1
            self._first("update_failed")
            return web.json_response({"success": False, "message": "injected: Failed to update weights: the checkpoint could not be read on "
                                      "this worker. The weights and weight_version are unchanged.", "num_paused_requests": 0}, status=400)
        if request.path == "/generate" and self._delay_s > 0:
            rid = self._rid(body)
            if rid is not None and "@" in rid and "#" in rid:  # an episode's call, not a probe
                self._first("generate_delayed")
                await asyncio.sleep(self._delay_s)
        kind = {"/update_weights_from_disk": "update_forwarded", "/generate": "generate_forwarded"}.get(request.path, "other")
        self.counts[kind] += 1
        data, status, ctype = await self._forward(request, body)
        return web.Response(body=data, status=status, headers={"Content-Type": ctype})


class PartitionProxy:
    """A TCP proxy on 127.0.0.1 in front of ``upstream`` (``host:port``), for the traffic between
    the actors and the router. :meth:`partition` cuts it as a network partition does: nothing is
    forwarded either way and nothing is closed (no FIN, no RST: every open connection stays open,
    its bytes held; a new connection is accepted and held the same way), so the two sides only
    learn of it from their timeouts. :meth:`heal` lets the held bytes through, in order, and
    forwarding goes on (what TCP's retransmissions do once a partition heals).

    Attributes:
        url: ``http://127.0.0.1:<port>`` (after :meth:`start`).
        held: connections that met the partition (open when it began, or opened during it).
        connections: connections accepted in all.
    """

    def __init__(self, upstream: str):
        host, _, port = upstream.replace("http://", "").rstrip("/").rpartition(":")
        self._up = (host, int(port))
        self.url = ""
        self.held = 0
        self.connections = 0
        self._open: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()

    def start(self) -> "PartitionProxy":
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="chaos-partition", daemon=True)
        self._thread.start()

        async def serve() -> int:
            self._healed = asyncio.Event()
            self._healed.set()
            self._server = await asyncio.start_server(self._conn, "127.0.0.1", 0)
            return self._server.sockets[0].getsockname()[1]

        self.url = f"http://127.0.0.1:{asyncio.run_coroutine_threadsafe(serve(), self._loop).result(10)}"
        return self

    def partition(self) -> int:
        """Cut the traffic (see the class docstring); returns the connections open then."""

        def cut() -> int:
            self._healed.clear()
            self.held += len(self._open)
            return len(self._open)

        return self._call(cut)

    def heal(self) -> None:
        """Let the traffic through again."""
        self._call(self._healed.set)

    def _call(self, fn):
        fut = asyncio.run_coroutine_threadsafe(self._run(fn), self._loop)
        return fut.result(10)

    @staticmethod
    async def _run(fn):
        return fn()

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        if not self._healed.is_set():
            self.held += 1
        await self._healed.wait()
        try:
            up_r, up_w = await asyncio.open_connection(*self._up)
        except OSError:
            writer.close()
            return
        pair = (writer, up_w)
        self._open.add(pair)
        try:
            await asyncio.gather(self._pump(reader, up_w), self._pump(up_r, writer), return_exceptions=True)
        finally:
            self._open.discard(pair)
            for w in pair:
                w.close()

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        while True:
            await self._healed.wait()  # partitioned: read nothing (the sender's bytes wait in its buffers)
            data = await src.read(65536)
            await self._healed.wait()  # read before the cut: held until it heals
            if not data:
                if dst.can_write_eof():
                    dst.write_eof()
                return
            dst.write(data)
            await dst.drain()

    def stop(self) -> None:
        """Close the listener and every connection; stop the loop."""
        if getattr(self, "_loop", None) is None:
            return

        async def close() -> None:
            self._healed.set()
            self._server.close()
            for pair in list(self._open):
                for w in pair:
                    w.close()

        try:
            asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        except Exception as e:  # noqa: BLE001 (best effort at the end of a fault)
            logger.debug("stopping the partition proxy: %r", e)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
        self._loop = None
