"""The viewer's web server (aiohttp): the page's static files and a small JSON API over
:class:`~rollout.app.viewer.data.RunIndex`.

Routes (``run`` is ``a``, or ``b`` for the ``--compare`` folder; episode ids go in the query,
they hold ``/`` and ``:``):

* ``GET /``: the page; ``GET /static/...``: its script and style (package data, nothing fetched
  from the network);
* ``GET /api/state?run=``: the run's status and counts (:meth:`RunIndex.state`), plus ``runs``
  (the names served);
* ``GET /api/episodes?run=&since=REV``: the rows changed after revision ``REV`` (all for 0),
  with the current ``revision`` and ``epoch``;
* ``GET /api/episode?run=&id=``: one episode's sample without its token arrays
  (:meth:`RunIndex.episode`);
* ``GET /api/tokens?run=&id=``: its token view (:func:`~rollout.app.viewer.tokens.token_part`),
  decoded with the run's tokenizer in a worker thread;
* ``GET /api/summary?run=``: ``live`` (counts over the rows read), ``file`` (``summary.json``) and
  ``eval`` (``eval.json`` of an evaluation, else null);
* ``GET /api/trainlog?run=``: the lines of ``train_log.jsonl``;
* ``GET /api/compare``: :func:`~rollout.app.viewer.compare.compare_runs` (404 without ``--compare``).

Every API call first reads what the run's files gained (at most every
:data:`REFRESH_INTERVAL_S`); every read of a file happens in a worker thread, so neither a large
journal nor a run file that is not a regular file stalls the event loop (such a file is not read at
all: :func:`rollout.app.viewer.tail.open_regular`). An error in a handler answers a JSON
``{"error": ...}`` with its status and is logged; the server goes on.

Only requests of the page itself and of non-browser clients are served
(:func:`rollout.app.webguard.local_guard`): a ``Host`` that is not the address the viewer listens on
(DNS rebinding) is answered 421, a request from a page of another site 403.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import signal
import socket
import time
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterable, TypeVar

import orjson
from aiohttp import web

from rollout.app.viewer.compare import compare_runs
from rollout.app.viewer.data import RunIndex
from rollout.app.viewer.tokens import DecoderCache, token_part
from rollout.app.webguard import listen_names, local_guard

logger = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).resolve().parent / "static"
# An API call re-reads the run's files when the last read is older than this (seconds).
REFRESH_INTERVAL_S = 0.5

T = TypeVar("T")


async def _off_loop(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in the default executor's thread (a file read must never block the event loop)."""
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data, option=orjson.OPT_NON_STR_KEYS), status=status, content_type="application/json")


class Viewer:
    """What one viewer serves: the run (``a``), the run it is compared with (``b``, optional), the
    tokenizer decoders.

    Args:
        run: the run's index.
        other: the ``--compare`` run's index, or None.
        tokenizer: a tokenizer name for every run's token view instead of the runs' own
            ``policy.tokenizer`` (``--tokenizer``), or None.
        refresh_interval_s: how stale the indexes may be when an API call reads them (seconds).
    """

    def __init__(self, run: RunIndex, other: RunIndex | None = None, tokenizer: str | None = None,
                 refresh_interval_s: float = REFRESH_INTERVAL_S):
        self.runs = {"a": run} if other is None else {"a": run, "b": other}
        self.tokenizer = tokenizer
        self.refresh_interval_s = refresh_interval_s
        self.decoders = DecoderCache()
        self._read_at: dict[str, float] = {}
        self._locks = {name: asyncio.Lock() for name in self.runs}

    async def index(self, name: str) -> RunIndex:
        """The run called ``name``, refreshed when its last read is older than the interval.

        Raises:
            web.HTTPNotFound: no run of that name.
        """
        run = self.runs.get(name)
        if run is None:
            raise web.HTTPNotFound(text=f"no run {name!r} (runs: {', '.join(self.runs)})")
        async with self._locks[name]:
            if time.monotonic() - self._read_at.get(name, -1e9) >= self.refresh_interval_s:
                await _off_loop(run.refresh)
                self._read_at[name] = time.monotonic()
        return run

    # -- handlers -----------------------------------------------------------------------------
    async def page(self, request: web.Request) -> web.StreamResponse:
        """``GET /``: the page (``static/index.html``)."""
        return web.FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})

    async def state(self, request: web.Request) -> web.Response:
        """``GET /api/state``: :meth:`RunIndex.state`, ``runs`` and the tokenizer in use."""
        run = await self.index(request.query.get("run", "a"))
        state, tokenizer = await _off_loop(lambda: (run.state(), self.tokenizer or run.tokenizer_name()))
        return _json({**state, "runs": list(self.runs), "tokenizer": tokenizer})

    async def episodes(self, request: web.Request) -> web.Response:
        """``GET /api/episodes?since=REV``: the rows changed after ``REV``; 400 for a bad ``since``."""
        run = await self.index(request.query.get("run", "a"))
        try:
            since = int(request.query.get("since", "0"))
        except ValueError:
            raise web.HTTPBadRequest(text="since must be an integer") from None
        return _json(await _off_loop(run.changes, since))

    def _episode_id(self, request: web.Request) -> str:
        """The ``id`` query parameter (400 without one)."""
        eid = request.query.get("id")
        if not eid:
            raise web.HTTPBadRequest(text="id is required")
        return eid

    async def episode(self, request: web.Request) -> web.Response:
        """``GET /api/episode?id=``: :meth:`RunIndex.episode`; 400 without ``id``, 404 for an unknown one."""
        run = await self.index(request.query.get("run", "a"))
        eid = self._episode_id(request)
        try:
            data = await _off_loop(run.episode, eid)
        except KeyError:
            raise web.HTTPNotFound(text=f"no episode {eid!r} in {run.dir}") from None
        return _json(data)

    async def tokens(self, request: web.Request) -> web.Response:
        """``GET /api/tokens?id=``: ``{"tokenizer", "tokenizer_error", "parts"}`` (one
        :func:`token_part` per record of :meth:`RunIndex.sample_parts`); 400 / 404 as above."""
        run = await self.index(request.query.get("run", "a"))
        eid = self._episode_id(request)

        def build() -> dict[str, Any]:
            name = self.tokenizer or run.tokenizer_name()
            parts = run.sample_parts(eid)
            decoder, why = self.decoders.get(name)
            return {"tokenizer": name, "tokenizer_error": why, "parts": [token_part(label, s, decoder) for label, s in parts]}

        try:
            data = await _off_loop(build)
        except KeyError:
            raise web.HTTPNotFound(text=f"no episode {eid!r} in {run.dir}") from None
        return _json(data)

    async def summary(self, request: web.Request) -> web.Response:
        """``GET /api/summary``: ``live`` (:meth:`RunIndex.live_summary`), ``file`` (``summary.json``),
        ``eval`` (``eval.json``), ``run``."""
        run = await self.index(request.query.get("run", "a"))
        return _json(await _off_loop(lambda: {"live": run.live_summary(), "file": run.summary_file(), "eval": run.eval_file(),
                                              "run": run.state_file()}))

    async def train_log(self, request: web.Request) -> web.Response:
        """``GET /api/trainlog``: ``{"lines": [...]}``, the lines of ``train_log.jsonl``."""
        run = await self.index(request.query.get("run", "a"))
        return _json({"lines": await _off_loop(run.train_log)})

    async def compare(self, request: web.Request) -> web.Response:
        """``GET /api/compare``: :func:`compare_runs` of ``a`` and ``b``; 404 without ``--compare``."""
        if "b" not in self.runs:
            raise web.HTTPNotFound(text="no --compare run")
        a, b = await self.index("a"), await self.index("b")
        return _json(await _off_loop(compare_runs, a, b))


@web.middleware
async def _errors(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    """Answer errors as JSON for the API; log the unexpected ones; never stop the server."""
    try:
        return await handler(request)
    except web.HTTPException as e:
        if not request.path.startswith("/api/"):
            raise
        return _json({"error": e.text or e.reason}, e.status)
    except (OSError, ValueError) as e:  # a file replaced under us, a line that cannot be read back
        logger.warning("%s %s: %s", request.method, request.path_qs, e)
        return _json({"error": f"{type(e).__name__}: {e}"}, 500)
    except Exception:
        logger.exception("%s %s failed", request.method, request.path_qs)
        return _json({"error": "internal error (see the viewer's log)"}, 500)


def make_app(viewer: Viewer, hosts: Iterable[str] | None = None) -> web.Application:
    """The aiohttp application of ``viewer`` (see the module docstring for the routes).

    Args:
        hosts: the names the viewer answers to (:func:`rollout.app.webguard.listen_names` of the
            address it listens on); None: any ``Host`` (requests from other sites are refused
            either way).
    """
    app = web.Application(middlewares=[local_guard(hosts), _errors])
    app.router.add_get("/", viewer.page)
    app.router.add_get("/api/state", viewer.state)
    app.router.add_get("/api/episodes", viewer.episodes)
    app.router.add_get("/api/episode", viewer.episode)
    app.router.add_get("/api/tokens", viewer.tokens)
    app.router.add_get("/api/summary", viewer.summary)
    app.router.add_get("/api/trainlog", viewer.train_log)
    app.router.add_get("/api/compare", viewer.compare)
    app.router.add_static("/static/", STATIC_DIR, show_index=False, follow_symlinks=False)
    return app


def is_loopback(host: str) -> bool:
    """Whether ``host`` names a loopback address (``localhost`` counts)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (``port`` 0: a free port; read it back with
    ``getsockname()``).

    Raises:
        OSError: the address cannot be had (in use, not this machine's, not resolvable).
    """
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


async def serve(viewer: Viewer, sock: socket.socket, stop: asyncio.Event | None = None, host: str | None = None) -> None:
    """Serve ``viewer`` on ``sock`` until ``stop`` is set, or SIGINT / SIGTERM arrives (main thread
    only); then close the server. The runs' files are read once at the start (a request that
    comes meanwhile waits for that read). A request whose ``Host`` names neither ``sock``'s
    address nor ``host`` (the name the viewer was told to listen on, e.g. ``--host``) is answered
    421 (:func:`rollout.app.webguard.local_guard`)."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    handled = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
            handled.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no signals here
            pass
    names = listen_names(str(sock.getsockname()[0])) | (listen_names(host) if host else frozenset())
    runner = web.AppRunner(make_app(viewer, names), access_log=None)
    await runner.setup()
    try:
        site = web.SockSite(runner, sock)
        await site.start()
        for name in viewer.runs:  # the first read of a long run's files, before the page asks
            await viewer.index(name)
        await stop.wait()
    finally:
        await runner.cleanup()
        for sig in handled:
            loop.remove_signal_handler(sig)
