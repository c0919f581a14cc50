"""The local SGLang-protocol server in-process on 127.0.0.1 (aiohttp's TestServer), for tests."""

from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager

import aiohttp
from aiohttp.test_utils import TestServer

from rollout.devtools.local.server import create_app


@asynccontextmanager
async def serve(backend, tok, **kwargs):
    """An in-process server over ``backend`` (keyword args as for ``create_app``) plus a client
    session; yields ``(base_url, session)`` and stops the server afterwards."""
    server = TestServer(create_app(backend, tok, **kwargs), host="127.0.0.1")
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as session:
            yield str(server.make_url("")).rstrip("/"), session
    finally:
        await server.close()


async def wait_until(pred, timeout: float = 30.0) -> None:
    """Poll ``pred()`` every 10 ms until it is true; fail after ``timeout`` seconds (a hang guard:
    generous, so a loaded machine does not fail it)."""
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)
