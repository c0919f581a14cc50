"""The LLM user simulator against a real OpenAI-compatible HTTP server on 127.0.0.1.

The server answers ``POST /v1/chat/completions`` in the OpenAI shape and ``GET /v1/models``, and
can be scripted, call by call, to answer 429 with Retry-After, 5xx, 4xx, a malformed body, drop
the connection or hang. It counts the calls it got, so retry counts are checked on the wire.
"""

from __future__ import annotations

import asyncio
import dataclasses
import email.utils
import logging
import socket
import threading
import time

import pytest
from aiohttp import web

from rollout.benchmarks.tau2.user import (
    AGENT_GREETING,
    LLMUser,
    UserSimulatorError,
    _parse_retry_after,
    check_user_simulator,
)
from rollout.core.config import UserConfig

KEY_ENV = "ROLLOUT_TEST_USER_KEY"
SECRET = "sk-test-very-secret-0123456789"


class FakeOpenAI:
    """Tiny OpenAI-compatible server. ``script`` holds one action per chat call (then "ok").

    Actions: "ok", "429:<retry-after>", "<status>" (e.g. "500", "401"), "drop", "hang",
    "badjson", "nochoices". ``models_status`` is what ``GET /v1/models`` answers; with
    ``required_key`` set, a request without that bearer key gets 401 on both paths.
    """

    def __init__(self, script=(), models_status: int = 200, required_key: str | None = None):
        self.script = list(script)
        self.models_status = models_status
        self.required_key = required_key
        self.chat_calls = 0
        self.models_calls = 0
        self.requests: list[dict] = []
        self.chat_arrivals: list[float] = []  # time.monotonic() at each chat call
        self.url = ""

    def _authorized(self, req) -> bool:
        return self.required_key is None or req.headers.get("Authorization") == f"Bearer {self.required_key}"

    async def models(self, req):
        self.models_calls += 1
        if not self._authorized(req):
            return web.json_response({"error": {"message": "bad key"}}, status=401)
        if self.models_status != 200:
            return web.json_response({"error": {"message": "nope"}}, status=self.models_status)
        return web.json_response({"object": "list", "data": [{"id": "sim", "object": "model"}]})

    async def chat(self, req):
        self.chat_calls += 1
        self.chat_arrivals.append(time.monotonic())
        body = await req.json()
        self.requests.append(body)
        if not self._authorized(req):
            return web.json_response({"error": {"message": "bad key"}}, status=401)
        action = self.script.pop(0) if self.script else "ok"
        if action.startswith("429"):
            _, _, ra = action.partition(":")
            return web.json_response({"error": {"message": "slow down"}}, status=429, headers={"Retry-After": ra} if ra else {})
        if action.isdigit():
            return web.json_response({"error": {"message": f"error {action}"}}, status=int(action))
        if action == "drop":
            req.transport.close()
            await asyncio.sleep(0.1)
            return web.Response()
        if action == "hang":
            await asyncio.sleep(60)
        if action == "badjson":
            return web.Response(text="this is not json", content_type="application/json")
        if action == "nochoices":
            return web.json_response({"id": "x", "object": "chat.completion", "created": 1, "model": "sim", "choices": []})
        n = len(body["messages"])
        return web.json_response({
            "id": "chatcmpl-1", "object": "chat.completion", "created": int(time.time()), "model": body.get("model", "sim"),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": f"user reply {n}"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        })

    async def __aenter__(self):
        app = web.Application()
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.chat)
        self._runner = web.AppRunner(app, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/v1"
        return self

    async def __aexit__(self, *exc):
        await self._runner.cleanup()


def _cfg(url: str, **kw) -> UserConfig:
    base = dict(kind="llm", base_url=url, model="sim", api_key_env=KEY_ENV, timeout_s=5.0, max_retries=3,
                retry_backoff_s=0.01, max_retry_wait_s=5.0)
    base.update(kw)
    return UserConfig(**base)


@pytest.fixture
def key(monkeypatch):
    monkeypatch.setenv(KEY_ENV, SECRET)
    return SECRET


@pytest.fixture(scope="module", autouse=True)
def _one_time_loads_done():
    """A process's one-time loads (tau2's guidelines, ``import litellm``) done before these tests,
    unbounded, as a long-lived actor has them after its first episode: the times asserted here are
    of retries and waits, and a CI runner under the suite's load once spent over 60 s importing
    litellm inside test_429_then_ok_waits_for_retry_after. The loads' own bound is tested by
    test_a_slow_first_import_is_not_held_to_the_per_call_timeout."""
    import rollout.benchmarks.tau2.user as user_mod

    user_mod.user_prompt_parts(use_tools=False)
    user_mod._import_litellm()


@pytest.fixture(scope="module")
def task():
    from rollout.benchmarks.tau2.environment import _domain_module

    return _domain_module("retail").get_tasks(None)[0]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- retries ---------------------------------------------------------------------------------------
async def test_429_then_ok_waits_for_retry_after(task, key):
    async with FakeOpenAI(["429:1"]) as srv:
        user = LLMUser(task, _cfg(srv.url, retry_backoff_s=0.01))
        text = await user.start()
    assert text.startswith("user reply")
    assert srv.chat_calls == 2
    # the wait between the 429 and the call again, as the server saw it: Retry-After: 1, not the
    # 0.01 s back-off. Timed at the server, from the 429's arrival to the next call's: a
    # CI-equivalent under the suite's load took 44 s for the whole start() (where those went was
    # not measured; the prompt, the first call's set-up and the answer's parsing were in it)
    gap = srv.chat_arrivals[1] - srv.chat_arrivals[0]
    assert gap >= 0.9, gap


async def test_retry_after_is_capped_by_max_retry_wait(task, key, caplog):
    async with FakeOpenAI(["429:120"]) as srv:
        user = LLMUser(task, _cfg(srv.url, max_retry_wait_s=0.3))
        with caplog.at_level(logging.WARNING, logger="rollout.benchmarks.tau2.user"):
            # a Retry-After of 120 s honoured in full runs into this hang guard
            await asyncio.wait_for(user.start(), 60)
    assert srv.chat_calls == 2
    # the wait the client chose is the cap, not the header's 120 s; and it did wait it
    assert [r.getMessage().rsplit(" in ", 1)[1] for r in caplog.records if "retry 1/" in r.getMessage()] == ["0.30s"]
    assert srv.chat_arrivals[1] - srv.chat_arrivals[0] >= 0.25


def test_retry_after_parsing():
    now = time.time()
    date = email.utils.formatdate(now + 7, usegmt=True)
    assert _parse_retry_after({"retry-after": "3"}) == 3.0
    assert _parse_retry_after({"Retry-After": "2.5"}) == 2.5
    assert 5.5 <= _parse_retry_after({"retry-after": date}, now=now) <= 7.0  # HTTP-date, 1 s resolution
    assert _parse_retry_after({"retry-after": email.utils.formatdate(now - 60, usegmt=True)}, now=now) == 0.0
    assert _parse_retry_after({"retry-after-ms": "250", "retry-after": "9"}) == 0.25
    assert _parse_retry_after({"retry-after": "soon"}) is None
    assert _parse_retry_after(None) is None


async def test_5xx_then_ok_succeeds(task, key):
    async with FakeOpenAI(["500", "503", "502"]) as srv:
        user = LLMUser(task, _cfg(srv.url))
        text = await user.start()
    assert text == "user reply 2"
    assert srv.chat_calls == 4 and user.retries == 3


async def test_persistent_500_fails_after_max_retries_plus_one_calls(task, key):
    async with FakeOpenAI(["500"] * 10) as srv:
        user = LLMUser(task, _cfg(srv.url, max_retries=3))
        with pytest.raises(UserSimulatorError, match="after 4 attempts.*HTTP 500"):
            await user.start()
    assert srv.chat_calls == 4
    assert len(user.history) == 1  # only the system prompt: nothing half-added


@pytest.mark.parametrize("status", ["400", "401", "403", "404"])
async def test_non_transient_status_fails_at_once(task, key, status):
    async with FakeOpenAI([status, "ok"]) as srv:
        user = LLMUser(task, _cfg(srv.url))
        with pytest.raises(UserSimulatorError, match=f"not retried.*HTTP {status}") as ei:
            await user.start()
    assert srv.chat_calls == 1
    assert SECRET not in str(ei.value)


@pytest.mark.parametrize("action", ["badjson", "nochoices"])
async def test_malformed_answer_fails_at_once(task, key, action):
    async with FakeOpenAI([action, "ok"]) as srv:
        user = LLMUser(task, _cfg(srv.url))
        with pytest.raises(UserSimulatorError, match="malformed"):
            await user.start()
    assert srv.chat_calls == 1


async def test_timeouts_and_dropped_connections_are_retried(task, key):
    async with FakeOpenAI(["hang", "drop", "hang"]) as srv:
        user = LLMUser(task, _cfg(srv.url, timeout_s=0.5))
        text = await user.start()
    assert text.startswith("user reply")
    # each hang was cut by the 0.5 s timeout and retried (a hang waited out answers after 60 s: 1 call)
    assert srv.chat_calls == 4 and user.retries == 3


async def test_persistent_timeout_fails(task, key):
    async with FakeOpenAI(["hang"] * 5) as srv:
        user = LLMUser(task, _cfg(srv.url, timeout_s=0.3, max_retries=1))
        with pytest.raises(UserSimulatorError, match="after 2 attempts.*timed out"):
            await user.start()
    assert srv.chat_calls == 2


async def test_history_holds_each_agent_message_once(task, key):
    async with FakeOpenAI(["500", "ok", "429:0", "drop", "ok"]) as srv:
        user = LLMUser(task, _cfg(srv.url))
        opening = await user.start()
        reply = await user.respond("Could you give me your order id?")
        last_request = srv.requests[-1]["messages"]
    assert srv.chat_calls == 5
    roles = [m["role"] for m in user.history]
    assert roles == ["system", "user", "assistant", "user", "assistant"]
    contents = [m["content"] for m in user.history]
    assert contents[1] == AGENT_GREETING and contents[2] == opening
    assert contents[3] == "Could you give me your order id?" and contents[4] == reply.text
    sent = [m["content"] for m in last_request]
    assert sent.count("Could you give me your order id?") == 1 and sent.count(AGENT_GREETING) == 1
    for body in srv.requests[2:]:  # every retry of the second turn sent the same 4 messages
        assert len(body["messages"]) == 4


async def test_one_warning_per_retry_without_the_key(task, key, caplog):
    async with FakeOpenAI(["429:0", "500"]) as srv:
        # a per-call timeout no loaded runner reaches: at load 66 a first call took over 5 s, and its
        # timeout was a third warning
        user = LLMUser(task, _cfg(srv.url, timeout_s=120.0))
        with caplog.at_level(logging.WARNING, logger="rollout.benchmarks.tau2.user"):
            await user.start()
    warnings = [r.getMessage() for r in caplog.records if r.name == "rollout.benchmarks.tau2.user" and r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings
    assert "HTTP 429" in warnings[0] and "retry 1/3 in 0.00s" in warnings[0]
    assert "HTTP 500" in warnings[1] and "retry 2/3 in" in warnings[1]
    assert all(SECRET not in w for w in warnings)
    assert SECRET not in caplog.text


def test_missing_key_fails_when_building_the_user(task, monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    with pytest.raises(UserSimulatorError, match=KEY_ENV):
        LLMUser(task, _cfg("http://127.0.0.1:9/v1"))


# -- check_user_simulator --------------------------------------------------------------------------
async def test_check_passes_for_a_good_endpoint(key):
    async with FakeOpenAI(required_key=SECRET) as srv:
        await check_user_simulator(_cfg(srv.url))
    assert srv.models_calls == 1 and srv.chat_calls == 0


async def test_check_returns_at_once_for_the_scripted_user(monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    await check_user_simulator(UserConfig(kind="scripted", api_key_env=KEY_ENV))


async def test_check_missing_key_is_one_line_naming_the_variable(monkeypatch):
    for value in (None, ""):
        if value is None:
            monkeypatch.delenv(KEY_ENV, raising=False)
        else:
            monkeypatch.setenv(KEY_ENV, value)
        with pytest.raises(UserSimulatorError) as ei:
            await check_user_simulator(_cfg("http://127.0.0.1:9/v1"))
        msg = str(ei.value)
        assert KEY_ENV in msg and "\n" not in msg


async def test_check_dead_endpoint_fails_within_seconds(key):
    url = f"http://127.0.0.1:{_free_port()}/v1"  # nothing listens there
    with pytest.raises(UserSimulatorError, match="does not answer") as ei:
        await asyncio.wait_for(check_user_simulator(_cfg(url), timeout_s=2.0), 120)
    assert "\n" not in str(ei.value) and SECRET not in str(ei.value)


async def test_check_hanging_endpoint_fails_within_the_timeout(key):
    started = asyncio.Event()

    async def hang(req):
        started.set()
        await asyncio.sleep(60)
        return web.Response()

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", hang)
    runner = web.AppRunner(app, shutdown_timeout=0.2)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        with pytest.raises(UserSimulatorError, match="no answer within 1s"):  # the check's bound, not the 60 s hang
            await check_user_simulator(_cfg(f"http://127.0.0.1:{port}/v1"), timeout_s=1.0)
        assert started.is_set()
    finally:
        await runner.cleanup()


async def test_check_rejected_key(monkeypatch):
    monkeypatch.setenv(KEY_ENV, SECRET)
    async with FakeOpenAI(required_key="sk-the-right-one") as srv:
        with pytest.raises(UserSimulatorError, match=f"rejected the API key from \\${KEY_ENV}.*401") as ei:
            await check_user_simulator(_cfg(srv.url))
    assert SECRET not in str(ei.value) and "\n" not in str(ei.value)


async def test_check_falls_back_to_a_chat_completion_when_models_is_404(key):
    async with FakeOpenAI(models_status=404) as srv:
        await check_user_simulator(_cfg(srv.url))
        assert srv.chat_calls == 1 and srv.requests[0]["max_tokens"] == 1
    async with FakeOpenAI(["401"], models_status=404) as srv:
        with pytest.raises(UserSimulatorError, match="rejected.*test chat completion: HTTP 401"):
            await check_user_simulator(_cfg(srv.url))
    async with FakeOpenAI(["404"], models_status=404) as srv:
        with pytest.raises(UserSimulatorError, match="failed a test chat completion for model 'sim'.*HTTP 404"):
            await check_user_simulator(_cfg(srv.url))


async def test_check_without_a_key_variable_against_an_open_endpoint():
    async with FakeOpenAI() as srv:
        await check_user_simulator(dataclasses.replace(_cfg(srv.url), api_key_env=None))


# -- nothing on the event loop ----------------------------------------------------------------------
async def test_guidelines_are_read_once_per_process_and_never_on_the_event_loop(task, key, monkeypatch):
    """tau2's guidelines file is read by one thread, once, whatever the number of episodes; the
    constructor (run on the actor's loop for every episode) reads nothing."""
    import threading

    import tau2.user.user_simulator as tau2_user

    import rollout.benchmarks.tau2.user as user_mod

    reads: list[int] = []  # thread ids of the reads of tau2's guidelines
    real = tau2_user.get_global_user_sim_guidelines

    def counting(*args, **kwargs):
        reads.append(threading.get_ident())
        return real(*args, **kwargs)

    monkeypatch.setattr(tau2_user, "get_global_user_sim_guidelines", counting)
    monkeypatch.setattr(user_mod, "_PROMPT_PARTS", None)  # as in a fresh process
    loop_thread = threading.get_ident()
    async with FakeOpenAI() as srv:
        users = [LLMUser(task, _cfg(srv.url)) for _ in range(5)]
        assert reads == [] and all(u.history == [] for u in users)
        openings = await asyncio.gather(*[u.start() for u in users])
        more = LLMUser(task, _cfg(srv.url))
        await more.start()
    assert openings == ["user reply 2"] * 5
    assert len(reads) == 1 and reads[0] != loop_thread
    guidelines = real(use_tools=False)
    for u in [*users, more]:
        system = u.history[0]
        assert system["role"] == "system" and guidelines in system["content"]
        assert str(task.user_scenario) in system["content"]
    assert srv.requests[0]["messages"][0] == users[0].history[0]  # what the endpoint got


async def test_a_slow_first_import_is_not_held_to_the_per_call_timeout(task, key, monkeypatch):
    """The first call of a process imports litellm (measured over 5 s on a loaded CI runner); that
    one-time load has its own bound (LOAD_TIMEOUT_S), so a tight ``timeout_s`` does not fail it,
    while a load that hangs past the load bound is still a typed UserSimulatorError."""
    import rollout.benchmarks.tau2.user as user_mod

    real = user_mod._import_litellm
    delay = {"s": 0.8}
    release, stuck_load_returned = threading.Event(), threading.Event()

    def slow_import():
        if delay["s"] is None:  # a load that hangs until the test lets it go
            release.wait(60)
            stuck_load_returned.set()
        else:
            time.sleep(delay["s"])
        return real()

    monkeypatch.setattr(user_mod, "_LITELLM", None)  # as in a fresh process
    monkeypatch.setattr(user_mod, "_import_litellm", slow_import)
    async with FakeOpenAI() as srv:
        user = LLMUser(task, _cfg(srv.url, timeout_s=0.3))
        assert (await user.start()).startswith("user reply")  # a 0.8 s load under a 0.3 s per-call timeout

        monkeypatch.setattr(user_mod, "_LITELLM", None)
        monkeypatch.setattr(user_mod, "LOAD_TIMEOUT_S", 0.5)
        delay["s"] = None
        try:
            with pytest.raises(UserSimulatorError, match=r"litellm took over 0.5s"):
                await LLMUser(task, _cfg(srv.url, timeout_s=0.3)).start()
            # cut at the 0.5 s load bound while the load still hung, not waited out
            assert not stuck_load_returned.is_set()
        finally:
            release.set()
