"""API keys for the policy backend (``policy.api_key_env``): the ``Authorization`` header reaches
the server on ``/generate`` and on every :class:`RouterAdmin` call, a missing variable is named,
and the key never shows in a log record, an exception or a repr, even when the server echoes it.

A small aiohttp server on 127.0.0.1 plays router and worker at once (``GET /workers`` lists
itself) and records the ``Authorization`` header of every request.
"""

from __future__ import annotations

import logging

import aiohttp
import pytest
from aiohttp import web

from rollout.core.config import load_config
from rollout.core.policy import PolicyServerError, RouterAdmin, SGLangClient, WeightSyncError, api_key_from_env
from rollout.devtools.local.stack import free_port

VAR = "TEST_POLICY_API_KEY"
SECRET = "sk-test-7f3a9c1e5b2d4680-very-secret"


class HeaderRecorder:
    """Records ``(method, path, Authorization header)`` of every request. ``status`` (default
    200) is every answer's status; non-200 answers echo the request's headers in their body, as
    a careless server or proxy might."""

    def __init__(self, status: int = 200):
        self.status = status
        self.seen: list[tuple[str, str, str | None]] = []
        self.url = ""

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.seen.append((request.method, request.path, request.headers.get("Authorization")))
        if request.path == "/redirect":
            raise web.HTTPFound("/redirect")  # a redirect loop: aiohttp raises TooManyRedirects
        if self.status != 200:
            return web.json_response({"error": "unauthorized", "you_sent": dict(request.headers)}, status=self.status)
        if request.path == "/workers":
            return web.json_response({"workers": [{"url": self.url, "is_healthy": True}]})
        if request.path == "/generate":
            body = await request.json()
            return web.json_response({"text": "x", "output_ids": [7], "meta_info": {
                "id": body["rid"], "finish_reason": {"type": "stop", "matched": 7}, "weight_version": "2",
                "output_token_logprobs": [[-0.1, 7, None]]}})
        if request.path == "/update_weights_from_disk":
            return web.json_response({"success": True, "message": "ok", "num_paused_requests": 0})
        if request.path == "/model_info":
            return web.json_response({"weight_version": "2"})
        return web.json_response({"status": "ok", "message": "ok"})

    async def __aenter__(self) -> HeaderRecorder:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        port = free_port()
        await web.TCPSite(self._runner, "127.0.0.1", port).start()
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc) -> None:
        await self._runner.cleanup()


def _cfg(url: str, *overrides: str):
    return load_config(None, [f"policy.router_url={url}", f"policy.api_key_env={VAR}", *overrides]).policy


async def _every_admin_call(admin: RouterAdmin) -> None:
    await admin.pause("abort")
    await admin.update_weights_from_disk("/ckpt/2", "2")
    await admin.resume()
    await admin.weight_versions()
    await admin.abort("r#1")


def _assert_no_secret(caplog, *texts: str) -> None:
    for r in caplog.records:
        assert SECRET not in r.getMessage(), r.getMessage()
        assert SECRET not in str(r.args)
        assert not r.exc_info or SECRET not in logging.Formatter().formatException(r.exc_info)
    assert SECRET not in caplog.text
    for t in texts:
        assert SECRET not in t


async def test_the_bearer_key_reaches_generate_and_every_admin_call(monkeypatch, caplog):
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv(VAR, SECRET)
    async with HeaderRecorder() as server, aiohttp.ClientSession() as session:
        client = SGLangClient(_cfg(server.url), session)
        gen = await client.generate([1, 2, 3], 4, rid="e#0", routing_key="e")
        assert gen.ids == [7] and gen.weight_version == "2"
        admin = RouterAdmin(server.url, session, timeout_s=5, api_key=api_key_from_env(VAR))
        await _every_admin_call(admin)
        await client.admin.abort("e#0")  # the client's own admin (aborts before retries) too
    paths = {(m, p) for m, p, _ in server.seen}
    assert paths == {("POST", "/generate"), ("GET", "/workers"), ("POST", "/pause_generation"),
                     ("POST", "/continue_generation"), ("POST", "/update_weights_from_disk"),
                     ("GET", "/model_info"), ("POST", "/abort_request")}
    assert all(auth == f"Bearer {SECRET}" for _, _, auth in server.seen), server.seen
    _assert_no_secret(caplog, repr(client), repr(admin), repr(client.admin))


async def test_no_key_configured_sends_no_authorization_header():
    async with HeaderRecorder() as server, aiohttp.ClientSession() as session:
        cfg = load_config(None, [f"policy.router_url={server.url}"]).policy
        await SGLangClient(cfg, session).generate([1], 4, rid="e#0", routing_key="e")
        await _every_admin_call(RouterAdmin(server.url, session, timeout_s=5))
    assert server.seen and all(auth is None for _, _, auth in server.seen)


@pytest.mark.parametrize("value", [None, "", "   "])
async def test_a_missing_or_empty_key_variable_is_named(monkeypatch, value):
    if value is None:
        monkeypatch.delenv(VAR, raising=False)
    else:
        monkeypatch.setenv(VAR, value)
    with pytest.raises(ValueError, match=VAR):
        api_key_from_env(VAR)
    async with aiohttp.ClientSession() as session:
        with pytest.raises(ValueError, match=VAR):
            SGLangClient(_cfg("http://127.0.0.1:9"), session)
    assert api_key_from_env(None) is None


async def test_the_key_is_in_no_log_or_error_even_when_the_server_echoes_it(monkeypatch, caplog):
    """401 answers that echo the request headers (Authorization included), a 503 that is
    retried, a redirect loop (aiohttp's TooManyRedirects, whose repr holds the request headers)
    and an unreachable router: the errors name what failed and never carry the key."""
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv(VAR, SECRET)
    texts: list[str] = []
    async with HeaderRecorder(status=401) as server, aiohttp.ClientSession() as session:
        client = SGLangClient(_cfg(server.url, "policy.max_request_retries=1"), session)
        with pytest.raises(PolicyServerError, match="answered 401") as e:
            await client.generate([1], 4, rid="e#0", routing_key="e")
        assert "Authorization" in str(e.value)  # the echo is there, the key is not
        texts += [str(e.value), repr(e.value)]
        admin = RouterAdmin(server.url, session, timeout_s=5, api_key=SECRET)
        with pytest.raises(PolicyServerError, match="answered 401") as e:
            await admin.pause()
        texts += [str(e.value), repr(e.value)]
        with pytest.raises(WeightSyncError, match="HTTP 401") as e:  # the worker itself says 401
            await admin.pause(urls=[server.url])
        texts += [str(e.value), repr(e.value)]
        assert await admin.abort("x", urls=[server.url]) == 0  # logged, not raised

        server.status = 503
        with pytest.raises(PolicyServerError, match="after 2 attempts: /generate answered 503") as e:
            await client.generate([1], 4, rid="e#1", routing_key="e")
        texts += [str(e.value), repr(e.value)]

        redirect = SGLangClient(_cfg(server.url, "policy.max_request_retries=0"), session)
        redirect.url = server.url + "/redirect"
        with pytest.raises(PolicyServerError, match="TooManyRedirects") as e:
            await redirect.generate([1], 4, rid="e#2", routing_key="e")
        texts += [str(e.value), repr(e.value)]

    async with aiohttp.ClientSession() as session:
        down = SGLangClient(_cfg(f"http://127.0.0.1:{free_port()}", "policy.max_request_retries=0"), session)
        with pytest.raises(PolicyServerError) as e:
            await down.generate([1], 4, rid="e#3", routing_key="e")
        texts += [str(e.value), repr(e.value), repr(down)]
    assert any(auth == f"Bearer {SECRET}" for _, _, auth in server.seen)
    _assert_no_secret(caplog, *texts)
