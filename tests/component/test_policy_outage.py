"""The policy client under backend failures (``rollout.core.policy.client``): the circuit breaker for outages,
bounded retries for isolated failures, a fresh rid per attempt with the previous one aborted, and
malformed answers.

A small SGLang-protocol stand-in on 127.0.0.1 plays router and worker at once (``GET /workers``
lists itself): it answers ``/generate`` with three fixed tokens, records every request id and
every ``/abort_request``, and can answer 503, delay, drop the connection, or go away (port
closed) and come back on the same port. The last test kills the real ``sglang-router`` in front
of a local server mid-run and restarts it on the same port.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from support.waits import until

from rollout.core.config import load_config
from rollout.core.policy import BackendBreaker, PolicyServerError, SGLangClient, parse_generate_response
from rollout.core.telemetry import MemoryRecorder
from rollout.core.telemetry import registry as R
from rollout.devtools.local.stack import free_port

IDS = [11, 12, 13]


class FakeBackend:
    """``/generate``, ``/workers``, ``/abort_request`` on a fixed loopback port.

    ``rule(routing_key, rid)`` returns ``None`` (answer normally), an int (answer that status),
    ``("delay", s)`` (answer after ``s`` seconds) or ``"drop"`` (close the connection unanswered).
    ``events`` lists ``("generate", rid)`` and ``("abort", rid)`` in arrival order;
    ``arrived`` the ``time.monotonic()`` of each ``/generate`` by rid.
    """

    def __init__(self, port: int | None = None):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.rule = lambda key, rid: None
        self.events: list[tuple[str, str]] = []
        self.statuses: list[int] = []  # status of every /generate answer
        self.arrived: list[tuple[str, float]] = []
        self._runner: web.AppRunner | None = None

    def rids(self, prefix: str = "") -> list[str]:
        return [rid for kind, rid in self.events if kind == "generate" and rid.startswith(prefix)]

    def aborts(self) -> list[str]:
        return [rid for kind, rid in self.events if kind == "abort"]

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        rid = body["rid"]
        self.events.append(("generate", rid))
        self.arrived.append((rid, time.monotonic()))
        action = self.rule(request.headers.get("X-SMG-Routing-Key", ""), rid)
        if action == "drop":
            request.transport.close()
            await asyncio.sleep(1)
            return web.Response(status=500)
        if isinstance(action, int):
            self.statuses.append(action)
            return web.json_response({"error": "injected"}, status=action)
        if isinstance(action, tuple) and action[0] == "delay":
            await asyncio.sleep(action[1])
        self.statuses.append(200)
        return web.json_response({"text": "abc", "output_ids": IDS, "meta_info": {
            "id": rid, "finish_reason": {"type": "stop", "matched": IDS[-1]}, "weight_version": "0",
            "output_token_logprobs": [[-0.5, t, None] for t in IDS]}})

    async def _workers(self, request: web.Request) -> web.Response:
        return web.json_response({"workers": [{"url": self.url, "is_healthy": True}]})

    async def _abort(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.events.append(("abort", body.get("rid")))
        return web.json_response({"success": True})

    async def start(self) -> FakeBackend:
        app = web.Application()
        app.router.add_post("/generate", self._generate)
        app.router.add_get("/workers", self._workers)
        app.router.add_post("/abort_request", self._abort)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=0.5)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


def _client(url: str, session: aiohttp.ClientSession, *overrides: str, breaker: BackendBreaker | None = None) -> SGLangClient:
    cfg = load_config(None, [f"policy.router_url={url}", *overrides])
    return SGLangClient(cfg.policy, session, breaker=breaker)


def _policy_records(caplog, level: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "rollout.core.policy.client" and r.levelno == level]


# --------------------------------------------------------------------------- outages
@pytest.mark.parametrize("how", ["port_closed", "503"])
async def test_an_outage_for_every_call_costs_no_retries(how, caplog):
    """16 calls start while the backend is down for everyone; it comes back once the breaker has
    opened (503: and three probes have gone out), whether or not every call's failure has been
    judged by then; all 16 succeed with max_request_retries=1, none spent a retry, one outage is
    reported and logged once, and while it lasted one probe at a time went out."""
    caplog.set_level(logging.DEBUG, logger="rollout.core.policy.client")
    backend = await FakeBackend().start()
    try:
        async with aiohttp.ClientSession() as session:
            client = _client(backend.url, session, "policy.max_request_retries=1", "policy.backend_outage_timeout_s=60")
            await client.generate([1, 2], 4, rid="warm#0", routing_key="warm")  # the backend was up
            if how == "port_closed":
                await backend.stop()
            else:
                backend.rule = lambda key, rid: 503
            calls = [asyncio.create_task(client.generate([1, 2], 4, rid=f"e{i}#0", routing_key=f"e{i}")) for i in range(16)]
            await until(lambda: client.breaker.is_open, "the breaker to open")
            if how == "503":  # three probes (one at a time) failed too
                await until(lambda: backend.statuses.count(503) >= 16 + 3, "three probes of the open breaker")
                probes = [t for rid, t in backend.arrived if ".r" in rid]  # all answered 503 (the rule has not changed)
            assert not any(c.done() for c in calls)
            if how == "port_closed":
                await backend.start()
            else:
                backend.rule = lambda key, rid: None
            gens = await asyncio.wait_for(asyncio.gather(*calls), 30)
        assert [g.ids for g in gens] == [IDS] * 16
        b = client.breaker
        assert b.outages == 1 and not b.is_open and b.waited_s > 0
        assert client.retries == 0  # no call spent a retry
        assert len(_policy_records(caplog, logging.WARNING)) == 1  # "policy backend unreachable"
        assert len([r for r in _policy_records(caplog, logging.INFO) if "is back" in r.getMessage()]) == 1
        if how == "503":
            # 16 first attempts failed, then probes one at a time until the third one's failure
            # was seen: 16 calls each retrying would have added 16 at once
            assert 16 + 3 <= backend.statuses.count(503) <= 16 + 5, backend.statuses.count(503)
            # one at a time: each probe went out a back-off (>= 0.125 s) after the one before had
            # failed, never alongside it (a lower bound: no machine makes it shorter)
            assert len(probes) >= 3 and all(b - a >= 0.1 for a, b in zip(probes, probes[1:])), probes
    finally:
        await backend.stop()


class _HeldJudgements:
    """Holds the client's judgement of its first failures until the test lets each one go.

    The client judges a transport-level failure after sleeping one ordinary back-off
    (``_retry_delay``); here the n-th such back-off is the marker ``n`` (1, 2, ...) and the
    client module's ``asyncio.sleep`` waits for ``release(n)`` on a marker instead of sleeping.
    Every other sleep (the breaker's probe back-off, aiohttp's) is the real one.
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch, client: SGLangClient):
        import rollout.core.policy.client as client_module

        self.held: set[int] = set()
        self._go: dict[int, asyncio.Event] = {}
        markers = iter(range(1, 100))
        monkeypatch.setattr(client, "_retry_delay", lambda n: next(markers))
        real_sleep = asyncio.sleep

        async def sleep(delay: float, *args):
            if isinstance(delay, int) and not isinstance(delay, bool):
                self.held.add(delay)
                await self._go.setdefault(delay, asyncio.Event()).wait()
                return args[0] if args else None
            return await real_sleep(delay, *args)

        class _Asyncio:
            def __getattr__(self, name: str):
                return sleep if name == "sleep" else getattr(asyncio, name)

        monkeypatch.setattr(client_module, "asyncio", _Asyncio())

    def release(self, n: int) -> None:
        self._go.setdefault(n, asyncio.Event()).set()


@pytest.mark.parametrize("order", ["inside", "just_before"])
async def test_a_failure_judged_after_its_outage_ended_spends_no_retry(order, monkeypatch):
    """max_request_retries=0; the backend answers 503 to every first attempt. Calls A and B fail;
    A's failure is judged first and opens the breaker, A's probe gets through and closes it, and
    only then is B's failure judged (each judgement held by the test). B failed inside the outage
    (``inside``: after A) or just before it with no success between (``just_before``), so it
    goes on and succeeds, instead of the failure being taken for an isolated one that spends a
    retry (PolicyServerError with no retries)."""
    backend = await FakeBackend().start()
    try:
        async with aiohttp.ClientSession() as session:
            breaker = BackendBreaker(60, base_backoff_s=0.01)
            client = _client(backend.url, session, "policy.max_request_retries=0", breaker=breaker)
            await client.generate([1, 2], 4, rid="warm#0", routing_key="warm")  # the backend was up
            backend.rule = lambda key, rid: 503 if rid.endswith("#0") else None
            held = _HeldJudgements(monkeypatch, client)
            first, second = ("a", "b") if order == "inside" else ("b", "a")
            tasks = {first: asyncio.create_task(client.generate([1, 2], 4, rid=f"{first}#0", routing_key=first))}
            await until(lambda: held.held == {1}, f"{first}'s failure waiting for its judgement")
            tasks[second] = asyncio.create_task(client.generate([1, 2], 4, rid=f"{second}#0", routing_key=second))
            await until(lambda: held.held == {1, 2}, f"{second}'s failure waiting for its judgement")
            assert not breaker.is_open and breaker.outages == 0
            held.release(1 if first == "a" else 2)  # A's judgement opens the outage, its probe ends it
            gen_a = await asyncio.wait_for(tasks["a"], 30)
            assert breaker.outages == 1 and not breaker.is_open
            held.release(1 if first == "b" else 2)  # B's failure is judged after the outage ended
            gen_b = await asyncio.wait_for(tasks["b"], 30)
    finally:
        await backend.stop()
    assert gen_a.ids == gen_b.ids == IDS and client.retries == 0
    assert backend.rids("a") == ["a#0", "a#0.r1"] and backend.rids("b") == ["b#0", "b#0.r1"]
    assert breaker.outages == 1 and not breaker.is_open


async def test_the_client_records_its_calls_retries_failures_and_outages():
    """With a recorder, the client counts what these tests check on its attributes: answered
    calls (latency, tokens, the servers' weight version), the retries it made, the call that
    failed for good, and the outage (the breaker's gauge goes 1, then 0)."""
    backend = await FakeBackend().start()
    rec = MemoryRecorder({"domain": "retail", "actor": "0"})
    try:
        async with aiohttp.ClientSession() as session:
            cfg = load_config(None, [f"policy.router_url={backend.url}", "policy.max_request_retries=1", "policy.backend_outage_timeout_s=60"])
            client = SGLangClient(cfg.policy, session, recorder=rec)
            await client.generate([1, 2], 4, rid="warm#0", routing_key="warm")
            # an isolated failure among successes: 500 (not an outage) on every attempt of one call
            backend.rule = lambda key, rid: 500 if key == "bad" else None
            out = await asyncio.gather(client.generate([1], 4, rid="bad#0", routing_key="bad"),
                                       *[client.generate([1, 2, 3], 4, rid=f"e{i}#0", routing_key=f"e{i}") for i in range(4)],
                                       return_exceptions=True)
            assert isinstance(out[0], PolicyServerError) and not any(isinstance(x, Exception) for x in out[1:])
            assert rec.value(R.GENERATE_FAILURES) == 1 and rec.value(R.GENERATE_RETRIES) == 1  # retried once, then failed
            assert rec.value(R.BREAKER_OPEN) == 0 and rec.value(R.BACKEND_OUTAGES) == 0
            # an outage for every call, over once the breaker has opened
            backend.rule = lambda key, rid: 503
            calls = [asyncio.create_task(client.generate([1, 2], 4, rid=f"o{i}#0", routing_key=f"o{i}")) for i in range(4)]
            await until(lambda: client.breaker.is_open, "the breaker to open")
            assert rec.value(R.BREAKER_OPEN) == 1
            backend.rule = lambda key, rid: None
            await asyncio.wait_for(asyncio.gather(*calls), 30)
    finally:
        await backend.stop()
    assert rec.value(R.BACKEND_OUTAGES) == client.breaker.outages == 1 and rec.value(R.BREAKER_OPEN) == 0
    assert rec.value(R.GENERATE_RETRIES) == 1  # the outage's failures waited for the backend instead
    assert rec.value(R.GENERATE_REQUESTS, finish="stop") == rec.value(R.GENERATE_REQUESTS) == 1 + 4 + 4
    assert len(rec.observations(R.GENERATE_LATENCY)) == 9
    assert rec.value(R.GENERATE_INPUT_TOKENS) == 2 + 4 * 3 + 4 * 2 and rec.value(R.GENERATE_OUTPUT_TOKENS) == 9 * len(IDS)
    assert rec.series()[R.POLICY_WEIGHT_VERSION.name] == [({"domain": "retail", "actor": "0"}, 0)]  # the backend answers "0"


async def test_an_outage_longer_than_the_bound_fails_within_it():
    backend = await FakeBackend().start()
    async with aiohttp.ClientSession() as session:
        client = _client(backend.url, session, "policy.max_request_retries=1", "policy.backend_outage_timeout_s=2")
        await client.generate([1, 2], 4, rid="warm#0", routing_key="warm")
        await backend.stop()  # and never comes back
        t0 = time.monotonic()
        results = await asyncio.wait_for(asyncio.gather(*[client.generate([1, 2], 4, rid=f"e{i}#0", routing_key=f"e{i}") for i in range(8)],
                                                        return_exceptions=True), 120)  # a hang guard: the bound is 2 s
        elapsed = time.monotonic() - t0
    assert all(isinstance(r, PolicyServerError) for r in results), results
    # they gave up because the outage outlasted its bound (the message names it), not before:
    # 2 s from the outage's first failure, which came after t0
    assert all("backend_outage_timeout_s" in str(r) and "attempts" in str(r) for r in results)
    assert elapsed >= 2.0, elapsed
    assert client.breaker.outages == 1 and client.breaker.is_open


async def test_a_backend_never_reached_is_not_waited_for():
    """A wrong router_url (nothing ever answered) fails after the retries, not after the bound."""
    async with aiohttp.ClientSession() as session:
        client = _client(f"http://127.0.0.1:{free_port()}", session, "policy.max_request_retries=1")
        with pytest.raises(PolicyServerError, match="after 2 attempts"):
            await asyncio.wait_for(client.generate([1, 2], 4, rid="e#0", routing_key="e"), 120)
        # no outage was opened, so nothing waited for its bound (the default: minutes)
        assert client.breaker.outages == 0 and not client.breaker.is_open


async def test_an_armed_breaker_waits_for_an_outage_from_the_first_call():
    """A breaker armed by a health check (the actor saw the router up when it started) waits for
    a backend that goes down before any call succeeded, instead of spending the retries (the
    backend comes back once the breaker has opened, perhaps before every call's failure was
    judged: those still spend none)."""
    backend = await FakeBackend().start()
    url = backend.url
    await backend.stop()  # down before the first call
    breaker = BackendBreaker(60)
    breaker.arm()
    try:
        async with aiohttp.ClientSession() as session:
            client = _client(url, session, "policy.max_request_retries=0", breaker=breaker)
            calls = [asyncio.create_task(client.generate([1, 2], 4, rid=f"e{i}#0", routing_key=f"e{i}")) for i in range(4)]
            await until(lambda: breaker.is_open, "the breaker to open")
            assert not any(c.done() for c in calls)
            await backend.start()
            gens = await asyncio.wait_for(asyncio.gather(*calls), 30)
        assert [g.ids for g in gens] == [IDS] * 4 and client.retries == 0
    finally:
        await backend.stop()


async def test_an_isolated_failure_spends_its_retries_while_others_succeed(caplog):
    """One episode's calls answer 503 while 15 others keep succeeding: it fails after
    1 + max_request_retries attempts, and the breaker never opens."""
    caplog.set_level(logging.DEBUG, logger="rollout.core.policy.client")
    backend = await FakeBackend().start()
    backend.rule = lambda key, rid: 503 if key == "bad" else ("delay", 0.02)
    try:
        async with aiohttp.ClientSession() as session:
            client = _client(backend.url, session, "policy.max_request_retries=1", "policy.backend_outage_timeout_s=60")
            stop = asyncio.Event()

            async def busy(i: int) -> int:
                n = 0
                while not stop.is_set():
                    await client.generate([1, 2], 4, rid=f"ok{i}#{n}", routing_key=f"ok{i}")
                    n += 1
                return n

            others = [asyncio.create_task(busy(i)) for i in range(15)]
            await client.generate([1, 2], 4, rid="warm#0", routing_key="warm")
            with pytest.raises(PolicyServerError, match="after 2 attempts: /generate answered 503"):
                await client.generate([1, 2], 4, rid="bad#0", routing_key="bad")
            stop.set()
            assert all(n > 0 for n in await asyncio.gather(*others))
    finally:
        await backend.stop()
    assert backend.rids("bad") == ["bad#0", "bad#0.r1"]  # a fresh rid per attempt
    assert client.breaker.outages == 0 and client.retries == 2
    assert not [r for r in caplog.records if "unreachable" in r.getMessage()]


# --------------------------------------------------------------------------- rids and aborts
@pytest.mark.parametrize("failure", ["timeout", "drop"])
async def test_a_retry_has_a_fresh_rid_and_the_previous_attempt_is_aborted_first(failure):
    backend = await FakeBackend().start()
    first = ("delay", 30) if failure == "timeout" else "drop"
    backend.rule = lambda key, rid: first if rid == "ep#3" else ("delay", 0.5)
    seen: list[str] = []
    try:
        async with aiohttp.ClientSession() as session:
            client = _client(backend.url, session, "policy.max_request_retries=1", "policy.request_timeout_s=1")
            call = asyncio.create_task(client.generate([1, 2], 4, rid="ep#3", routing_key="ep"))
            while not call.done():
                seen.append(client.inflight.get("ep", ""))
                await asyncio.sleep(0.01)
            gen = call.result()
            assert "ep" not in client.inflight
    finally:
        await backend.stop()
    assert gen.ids == IDS
    assert backend.events == [("generate", "ep#3"), ("abort", "ep#3"), ("generate", "ep#3.r1")]
    assert client.aborted_attempts == 1
    # the rid a cancel would abort is always the attempt out at the time
    seen = seen[1:]  # (the first sample was taken before the call started)
    assert seen[0] == "ep#3" and seen[-1] == "ep#3.r1" and set(seen) == {"ep#3", "ep#3.r1"}


async def test_a_call_that_fails_aborts_its_last_live_attempt(caplog):
    backend = await FakeBackend().start()
    backend.rule = lambda key, rid: ("delay", 30)
    try:
        async with aiohttp.ClientSession() as session:
            client = _client(backend.url, session, "policy.max_request_retries=1", "policy.request_timeout_s=0.5")
            with pytest.raises(PolicyServerError, match="after 2 attempts: timed out"):
                await client.generate([1, 2], 4, rid="ep#0", routing_key="ep")
            await asyncio.wait_for(asyncio.gather(*client._background), 30)
    finally:
        await backend.stop()
    assert backend.rids() == ["ep#0", "ep#0.r1"]
    assert backend.aborts() == ["ep#0", "ep#0.r1"]


# --------------------------------------------------------------------------- malformed answers
def test_a_null_log_prob_on_a_generated_token_is_a_server_error():
    ok = {"text": "", "output_ids": [5, 6], "meta_info": {
        "finish_reason": {"type": "stop", "matched": 6},
        "input_token_logprobs": [[None, 1, None], [-1.0, 2, None]],  # the first input token has none: fine
        "output_token_logprobs": [[-0.25, 5, None], [-0.5, 6, None]]}}
    assert parse_generate_response(ok).log_probs == [-0.25, -0.5]
    bad = {**ok, "meta_info": {**ok["meta_info"], "output_token_logprobs": [[-0.25, 5, None], [None, 6, None]]}}
    with pytest.raises(PolicyServerError, match="null log-prob for generated token 1"):
        parse_generate_response(bad)


async def test_a_null_log_prob_answer_is_not_retried():
    async def generate(request: web.Request) -> web.Response:
        calls.append(1)
        return web.json_response({"output_ids": [5], "meta_info": {"output_token_logprobs": [[None, 5, None]]}})

    calls: list[int] = []
    app = web.Application()
    app.router.add_post("/generate", generate)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        async with aiohttp.ClientSession() as session:
            client = _client(f"http://127.0.0.1:{port}", session, "policy.max_request_retries=3")
            with pytest.raises(PolicyServerError, match="null log-prob"):
                await client.generate([1], 4, rid="e#0", routing_key="e")
    finally:
        await runner.cleanup()
    assert calls == [1]


# --------------------------------------------------------------------------- the real router
def _start_router(port: int, worker_urls: list[str], log: Path) -> subprocess.Popen:
    from rollout.core.tokenizer import resolve_tokenizer_path

    cmd = [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port),
           "--worker-urls", *worker_urls, "--policy", "cache_aware", "--tokenizer-path", resolve_tokenizer_path("builtin:qwen3"),
           "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()), "--log-level", "warn",
           "--worker-startup-timeout-secs", "60", "--worker-startup-check-interval", "1"]
    with open(log, "ab") as fh:
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)


def _kill(proc: subprocess.Popen) -> None:
    """SIGKILL the process group of a router this test started (and only that)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(10)


async def _router_ready(session: aiohttp.ClientSession, url: str, worker: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            async with session.get(url + "/workers", timeout=aiohttp.ClientTimeout(total=2)) as r:
                data = await r.json(content_type=None)
            if any(w.get("url", "").rstrip("/") == worker and w.get("is_healthy") for w in data.get("workers", [])):
                return
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, AttributeError):
            pass
        assert time.monotonic() < deadline, "router did not list the worker as healthy"
        await asyncio.sleep(0.2)


@pytest.mark.slow
async def test_killing_and_restarting_the_real_router_mid_run_loses_no_call(tokenizer, tmp_path, caplog):
    """16 episodes call /generate in a loop through the real sglang-router; the router is killed
    (SIGKILL) mid-run and restarted on the same port once the client's breaker has opened. Every
    call succeeds, with max_request_retries=1: the calls waited for the router instead of
    spending retries."""
    from rollout.core.config import LocalConfig
    from rollout.devtools.local.stack import LocalStack

    caplog.set_level(logging.INFO, logger="rollout.core.policy.client")
    prompt = tokenizer.encode("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with LocalStack(LocalConfig(num_servers=1, startup_timeout_s=90), "retail", "builtin:qwen3", log_dir=tmp_path / "stack") as stack:
        [worker] = stack.worker_urls
        router = _start_router(port, [worker], tmp_path / "router.log")
        try:
            async with aiohttp.ClientSession() as session:
                await _router_ready(session, url, worker)
                client = _client(url, session, "policy.max_request_retries=1", "policy.backend_outage_timeout_s=60",
                                 "policy.request_timeout_s=30")
                stop = asyncio.Event()
                spans: list[tuple[float, float]] = []  # (start, end) of every call

                async def episode(i: int) -> int:
                    n = 0
                    while not stop.is_set():
                        t0 = time.monotonic()
                        gen = await client.generate(prompt, 8, rid=f"k{i}#{n}", routing_key=f"k{i}")
                        spans.append((t0, time.monotonic()))
                        assert gen.ids and len(gen.ids) == len(gen.log_probs)
                        n += 1
                    return n

                tasks = [asyncio.create_task(episode(i)) for i in range(16)]
                await until(lambda: len(spans) >= 16, "16 calls answered through the router")
                assert not any(t.done() for t in tasks)
                before = len(spans)
                kill_started = time.monotonic()
                _kill(router)
                killed_at = time.monotonic()
                await until(lambda: client.breaker.is_open, "the breaker to open while the router is down")
                router = _start_router(port, [worker], tmp_path / "router.log")
                restarted_at = time.monotonic()
                deadline = time.monotonic() + 60
                while sum(1 for s, _ in spans if s > restarted_at) < 32:  # calls go on after the restart
                    assert time.monotonic() < deadline and not any(t.done() for t in tasks), "no progress after the restart"
                    await asyncio.sleep(0.1)
                stop.set()
                counts = await asyncio.wait_for(asyncio.gather(*tasks), 60)  # any failure raises here
        finally:
            _kill(router)
    assert before > 0 and all(n > 0 for n in counts)
    # Calls out when the router died that ended only once it was back.
    assert [(s, e) for s, e in spans if s < kill_started and e > restarted_at]
    # Nothing answered while it was down: no call made after the kill ended before the restart
    # (one made before it may have its answer read after it: the event loop was blocked in _kill).
    assert not [(s, e) for s, e in spans if s > killed_at and e < restarted_at]
    print(f"calls {len(spans)}, out at the kill and answered after the restart "
          f"{len([1 for s, e in spans if s < kill_started and e > restarted_at])}, retries {client.retries}, "
          f"aborted attempts {client.aborted_attempts}, breaker {client.breaker.stats()}")
    assert client.breaker.outages == 1 and not client.breaker.is_open
    assert client.retries <= 16  # at most the one failure at the kill per call, judged before the outage opened
    assert len([r for r in caplog.records if r.name == "rollout.core.policy.client" and "unreachable" in r.getMessage()]) == 1
