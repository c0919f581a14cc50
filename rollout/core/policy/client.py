"""The policy client over an engine's token-in / token-out HTTP API, whatever the engine: every
guarantee the episode loop relies on, with the engine's wire protocol
(:class:`~rollout.core.policy.wire.WireProtocol`: SGLang's or vLLM's) as its one seam.

Every request sends the trajectory's token ids; the generated ids and their log-probs are read from
the answer by the wire protocol, never re-tokenized from text (docs/design.md "SGLang native
protocol", docs/engines.md for vLLM); a ``null`` log-prob on a generated token is a
malformed answer (:class:`PolicyServerError`), never read as 0.0. Requests carry a request id
(used to abort) and, by ``policy.routing``, the wire's routing header (SGLang's
``X-SMG-Routing-Key``, vLLM's ``X-Session-ID``: the group id, the episode id or none) so that a
router that honours it keeps the calls that share a prefix on one worker, whose prefix cache then
holds that prefix (docs/local-stack.md "Routing" names the router policy).

:class:`HTTPPolicyClient` implements the policy seam (:class:`~rollout.core.policy.protocol.PolicyClient`);
it holds its calls at the actor's :class:`~rollout.core.policy.resilience.GenerationGate` during a
weight update and aborts earlier attempts through the wire's admin
(:class:`~rollout.core.policy.admin.EngineAdmin`) on every worker.

Failures:

* An isolated failure (a connection error, a 5xx, a timeout of one call while other calls
  succeed, an answer the wire says failed on the server) is retried ``policy.max_request_retries``
  times with jittered exponential back-off.
  Each attempt has its own request id (``<rid>``, then ``<rid>.r1``, ``<rid>.r2``, ...); an attempt
  that may still be generating on a worker (it timed out or its connection dropped) is aborted
  there (best effort, at most :data:`ABORT_TIMEOUT_S` seconds) before the next one is sent.
* A backend outage (the router or every worker is down: connections refused or reset, 502/503
  from the router, for every call at once) opens the actor's :class:`BackendBreaker`: calls stop
  spending their retries and wait, with jittered exponential back-off capped at a few seconds and
  one probe request out at a time, until a call succeeds again, for at most
  ``policy.backend_outage_timeout_s`` seconds from the start of the outage; then they raise
  :class:`PolicyServerError` (the episode ends ``policy_error``). The client logs the outage's
  start (one WARNING) and end (one INFO).
* A 4xx answer, or a 200 answer that is malformed, raises :class:`PolicyServerError` at once.

Authentication: with ``policy.api_key_env`` set, the key is read from that environment variable
(:func:`api_key_from_env`) and sent as ``Authorization: Bearer <key>`` on every generate call
and every admin call. The key never appears in a log record, an exception message
or a ``repr``: headers are never logged, aiohttp exceptions (whose ``repr`` carries the request
headers) are reported by class and ``str`` only, and any text taken from an answer is redacted.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import aiohttp

from rollout.core import fastjson
from rollout.core.config import PolicyConfig, Routing
from rollout.core.policy.auth import api_key_from_env, auth_headers, describe_error, redact
from rollout.core.policy.kvgate import KVGate
from rollout.core.policy.protocol import Generation, PolicyServerError
from rollout.core.policy.resilience import BackendBreaker, GenerationGate
from rollout.core.policy.wire import RetryableAnswer, WireProtocol
from rollout.core.policy_engines import get_policy_engine
from rollout.core.telemetry.probes import PolicyMetrics
from rollout.core.telemetry.recorder import NULL_RECORDER, Recorder

if TYPE_CHECKING:
    import numpy as np

__all__ = ["ABORT_TIMEOUT_S", "OUTAGE_STATUSES", "HTTPPolicyClient"]

logger = logging.getLogger(__name__)

# Answers of the router that mean "no worker can take this request now" (not this request's fault).
OUTAGE_STATUSES = frozenset({502, 503})
# Bound (seconds) on the best-effort abort of an earlier attempt of a generate call.
ABORT_TIMEOUT_S = 2.0


@dataclass
class _Call:
    """One :meth:`HTTPPolicyClient.generate` call's request and its state across attempts."""

    rid: str  # the call's request id; attempt n > 0 is sent as f"{rid}.r{n}"
    routing_key: str  # the episode id
    route: str | None  # the routing header's value (None: no header)
    body: dict  # the generate body; the request id is set per attempt
    headers: dict[str, str]
    timeout: aiohttp.ClientTimeout
    input_tokens: int  # len(input_ids)
    max_new_tokens: int
    counted: int = 0  # failures that spent a retry
    sent: int = 0  # attempts sent
    cur: str = ""  # the rid of the attempt now out (or last out)
    epoch: int = 0  # the generation gate's epoch when the attempt went out
    live: list[str] = field(default_factory=list)  # rids of earlier attempts that may still be generating on a worker


class HTTPPolicyClient:
    """Token-in / token-out client over one shared aiohttp session, for the engine the wire
    protocol speaks to (see the module docstring).

    Args:
        cfg: the ``policy`` section (``router_url`` must be resolved; ``engine``,
            ``request_timeout_s``, ``max_request_retries``, ``backend_outage_timeout_s``,
            ``api_key_env``, ``routing``, ``sampling`` are read).
        session: an aiohttp session owned by the caller (one per actor).
        gate: the actor's :class:`GenerationGate`; every attempt first waits until it is open (a
            weight update is not in progress), and an abort answer is marked ``interrupted`` when
            the gate closed meanwhile.
        breaker: the actor's :class:`BackendBreaker`, shared by all its clients; ``None``: a new
            one with ``cfg.backend_outage_timeout_s``.
        recorder: where the calls' metrics go (:class:`~rollout.core.telemetry.probes.PolicyMetrics`:
            answered calls by finish type, their latency and tokens, failures, retries, breaker
            openings, the servers' weight version); ``None``: nowhere.
        kv_gate: the actor's :class:`~rollout.core.policy.kvgate.KVGate` (``pool.adaptive_concurrency``):
            every attempt first waits while it is closed; ``None``: no KV-aware holding. Build it
            with the wire's ``kv_metrics``.
        wire: the engine's :class:`~rollout.core.policy.wire.WireProtocol`; ``None``: the one
            ``cfg.engine`` names (:func:`rollout.core.policy_engines.get_policy_engine`), unless
            the class fixes one (:attr:`WIRE`).

    Attributes:
        inflight: routing key (episode id) -> the ``rid`` of the attempt now out (or last out),
            so that a cancelled episode's request can be aborted.
        groups: episode id -> group id, for ``policy.routing=group`` (:meth:`routing_header`);
            the worker registers each episode it runs and forgets it at the end.
        kv_held_s: episode id -> seconds its calls waited at :attr:`kv_gate` (only episodes that
            waited; the worker pops it into the episode's ``metadata["kv_held_s"]``).
        wire: the engine's wire protocol.
        admin: the wire's :class:`~rollout.core.policy.admin.EngineAdmin` on the same router and
            session, with the same key and a short timeout (:data:`ABORT_TIMEOUT_S`), used for aborts.
        retries: failures that spent a retry, over all calls.
        aborted_attempts: earlier attempts aborted on the workers before a retry.
        metrics: the bound instruments the calls record into.

    Raises:
        ValueError: ``cfg.router_url`` is not set, or ``cfg.api_key_env`` names a variable that is
            not set or empty.
        rollout.core.registry.UnknownNameError: ``cfg.engine`` names no registered engine.
    """

    WIRE: WireProtocol | None = None  # a subclass for one engine fixes its wire here

    def __init__(self, cfg: PolicyConfig, session: aiohttp.ClientSession, gate: GenerationGate | None = None,
                 breaker: BackendBreaker | None = None, recorder: Recorder | None = None, kv_gate: KVGate | None = None,
                 wire: WireProtocol | None = None):
        if not cfg.router_url:
            raise ValueError("policy.router_url is not set")
        self.cfg = cfg
        self.wire: WireProtocol = wire or self.WIRE or get_policy_engine(cfg.engine)
        self.session = session
        self.gate = gate
        self.breaker = breaker if breaker is not None else BackendBreaker(cfg.backend_outage_timeout_s)
        self.url = cfg.router_url.rstrip("/") + self.wire.generate_path
        self.inflight: dict[str, str] = {}
        self.groups: dict[str, str] = {}
        self.kv_gate = kv_gate
        self.kv_held_s: dict[str, float] = {}
        self._api_key = api_key_from_env(cfg.api_key_env)
        self._auth = auth_headers(self._api_key)
        self.admin = self.wire.admin(cfg.router_url, session, timeout_s=ABORT_TIMEOUT_S, api_key=self._api_key)
        self.retries = 0
        self.aborted_attempts = 0
        self.metrics = PolicyMetrics(recorder if recorder is not None else NULL_RECORDER)
        self._background: set[asyncio.Task] = set()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(url={self.url!r}, api_key={'<set>' if self._api_key else None}, breaker={self.breaker!r})"

    def payload(self, input_ids: list[int] | np.ndarray, max_new_tokens: int, rid: str, seed: int | None) -> dict:
        """The generate body of a call (the wire's :meth:`~rollout.core.policy.wire.WireProtocol.generate_body`
        with ``cfg.sampling``): token ids in, ``max_new_tokens``, the sampling parameters, the
        log-probs asked for, ``seed`` when not ``None``, request id ``rid``."""
        return self.wire.generate_body(input_ids, max_new_tokens, rid, seed, self.cfg.sampling)

    def routing_header(self, routing_key: str) -> str | None:
        """The routing header's value (the wire's ``routing_header``) of a call of episode
        ``routing_key``, by ``policy.routing``:
        ``None`` (no header) for ``none``, the episode id for ``episode``, and for ``group`` the
        group id :attr:`groups` holds for the episode (the episode id when none is registered:
        a client used outside :class:`~rollout.core.worker.RolloutWorker`)."""
        mode = self.cfg.routing
        if mode == Routing.NONE:
            return None
        if mode == Routing.GROUP:
            return self.groups.get(routing_key, routing_key)
        return routing_key

    @staticmethod
    def _retry_delay(n: int) -> float:
        """Jittered exponential back-off before the ``n``-th retry (seconds)."""
        return min(8.0, 0.25 * 2**n) * (0.5 + random.random())

    async def generate(self, input_ids: list[int] | np.ndarray, max_new_tokens: int, rid: str, routing_key: str, seed: int | None = None) -> Generation:
        """Sample one assistant turn.

        Args:
            input_ids: the full token sequence so far (prompt + response), token ids: a list or
                a 1-D numpy integer array (sent as it is, without a Python int per id).
            max_new_tokens: at most this many new tokens (>= 1).
            rid: request id (for aborts), unique per call; retries send ``<rid>.r1``, ``<rid>.r2``...
            routing_key: the episode id; what goes in the routing header is
                :meth:`routing_header`'s (``policy.routing``).
            seed: the sampling seed (the same for every attempt of the call).

        Returns:
            The :class:`Generation` (``n`` generated ids and their log-probs).

        Raises:
            PolicyServerError: the retries are spent on isolated failures (connection errors, 5xx,
                timeouts of ``cfg.request_timeout_s`` seconds, answers the wire says failed), a backend outage lasted over
                ``cfg.backend_outage_timeout_s``, or a 4xx / malformed answer (not retried). The
                message never holds the API key.
        """
        call = self._new_call(input_ids, max_new_tokens, rid, routing_key, seed)
        self.inflight[routing_key] = rid
        try:
            while True:
                outcome, error, gen, latency_s = await self._attempt(call)
                if gen is not None:
                    return self._answered(call, gen, latency_s)
                await self._after_failure(call, outcome, error)  # raises once the call may not go on
        except PolicyServerError:
            self.metrics.failures.record(1)
            raise
        finally:
            self.inflight.pop(routing_key, None)
            if call.live:  # the call ends (error or cancellation) with attempts perhaps still generating
                task = asyncio.ensure_future(self._abort_in_background(list(call.live)))
                self._background.add(task)
                task.add_done_callback(self._background.discard)

    def _new_call(self, input_ids: list[int] | np.ndarray, max_new_tokens: int, rid: str, routing_key: str,
                  seed: int | None) -> _Call:
        """A call's request: its body (:meth:`payload`), headers (content type, the key, the
        routing header by :meth:`routing_header`) and timeout, and its state before any attempt."""
        body = self.payload(input_ids, max_new_tokens, rid, seed)
        headers = {"Content-Type": "application/json", **self._auth}
        route = self.routing_header(routing_key)
        if route is not None:
            headers[self.wire.routing_header] = route
        return _Call(rid=rid, routing_key=routing_key, route=route, body=body, headers=headers,
                     timeout=aiohttp.ClientTimeout(total=self.cfg.request_timeout_s), input_tokens=len(input_ids),
                     max_new_tokens=max_new_tokens)

    async def _attempt(self, call: _Call) -> tuple[str, str, Generation | None, float]:
        """One attempt of ``call``: held at the KV gate (``pool.adaptive_concurrency``), the
        generation gate and the breaker; earlier attempts that may still be generating are
        aborted first. ``(outcome, error, gen, latency_s)`` as :meth:`_send`, with the attempt's
        latency in seconds.

        Raises:
            PolicyServerError: what :meth:`_send` raises.
        """
        ticket, gen, url = None, None, self.url
        if self.kv_gate is not None:  # pool.adaptive_concurrency: held while the workers' KV is nearly full
            # a slot of the actor's capped calls and KV tokens (placement=gate: on the key's worker)
            ticket = await self.kv_gate.acquire(self.kv_gate.cost(call.input_tokens, call.max_new_tokens), call.route)
            if ticket.waited:
                self.kv_held_s[call.routing_key] = self.kv_held_s.get(call.routing_key, 0.0) + ticket.waited
            if ticket.worker is not None:
                url = ticket.worker + self.wire.generate_path
        call.epoch = 0
        try:
            if self.gate is not None:
                await self.gate.wait_open()
                call.epoch = self.gate.epoch
            async with self.breaker.attempt():
                if call.live:
                    await self._abort_attempts(call.live)
                call.cur = call.rid if call.sent == 0 else f"{call.rid}.r{call.sent}"
                call.sent += 1
                self.wire.set_request_id(call.body, call.cur)
                self.inflight[call.routing_key] = call.cur
                sent_at = time.monotonic()
                outcome, error, gen = await self._send(url, call.body, call.headers, call.timeout, call.cur, call.live)
                latency_s = time.monotonic() - sent_at
                if outcome == "outage" and ticket is not None and ticket.worker is not None:
                    self.kv_gate.lost(ticket)  # type: ignore[union-attr]  # its keys move to another worker
        finally:
            if ticket is not None:
                self.kv_gate.release(ticket, len(gen.ids) if gen is not None and gen.finish_type != "abort" else None)  # type: ignore[union-attr]
        return outcome, error, gen, latency_s

    def _answered(self, call: _Call, gen: Generation, latency_s: float) -> Generation:
        """An answer: it closes the breaker (an outage's end is logged), an abort while the gate
        closed (a weight update) is marked ``interrupted``, and the call's metrics are recorded."""
        ended = self.breaker.record_success()
        if ended is not None:
            self.metrics.breaker_open.record(0)
            logger.info("policy backend is back after %.1f s; %s calls go on (outage %d, %.1f s waited in all)",
                        ended, self.wire.generate_path, self.breaker.outages, self.breaker.waited_s)
        if gen.finish_type == "abort" and self.gate is not None:
            gen.interrupted = self.gate.closed or self.gate.epoch != call.epoch
        self.metrics.answered(gen.finish_type, latency_s, call.input_tokens, len(gen.ids), gen.weight_version)
        return gen

    async def _after_failure(self, call: _Call, outcome: str, error: str) -> None:
        """Decide what follows a failed attempt: during a backend outage (the breaker is open, or
        this failure opens it) the call waits without spending a retry; otherwise it spends one
        and, after a jittered back-off, goes on.

        Raises:
            PolicyServerError: the outage lasted over ``policy.backend_outage_timeout_s``, or the
                call's retries (``policy.max_request_retries``) are spent.
        """
        slept = False
        if outcome == "outage" and self.breaker.enabled:
            excused, slept = await self._judge_outage(call, error)
            if excused:
                if self.breaker.expired():
                    raise PolicyServerError(
                        f"{self.wire.generate_path} failed after {call.sent} attempts: the policy backend has been unreachable for "
                        f"{self.breaker.outage_s:.0f} s (policy.backend_outage_timeout_s={self.breaker.outage_timeout_s:g}); "
                        f"last error: {error}")
                logger.debug("rid=%s: %s attempt %d failed during a backend outage: %s", call.cur, self.wire.generate_path, call.sent, error)
                return
        call.counted += 1
        self.retries += 1
        if call.counted > self.cfg.max_request_retries:
            raise PolicyServerError(f"{self.wire.generate_path} failed after {call.sent} attempts: {error}")
        self.metrics.retries.record(1)
        logger.warning("rid=%s: %s attempt %d failed (%s); retrying", call.cur, self.wire.generate_path, call.sent, error)
        if not slept:
            await asyncio.sleep(self._retry_delay(call.counted))

    async def _judge_outage(self, call: _Call, error: str) -> tuple[bool, bool]:
        """``(excused, slept)`` for an attempt that failed as in an outage: excused (it spends no
        retry) while the breaker is open; else judged after the ordinary back-off (slept) by
        :meth:`BackendBreaker.record_failure`: excused unless a call succeeded after the failure
        and before any outage opened (an outage that opened and ended meanwhile still excuses
        it). When this failure opens the breaker, that is logged (one WARNING)."""
        breaker = self.breaker
        if breaker.is_open:
            return True, False
        mark, failed_at = breaker.successes, time.monotonic()
        await asyncio.sleep(self._retry_delay(call.counted + 1))
        outages = breaker.outages
        excused = breaker.record_failure(mark, failed_at)
        if breaker.outages > outages:  # this failure opened the breaker
            self.metrics.outages.record(1)
            self.metrics.breaker_open.record(1)
            logger.warning("policy backend unreachable (every %s call fails; last error: %s); calls wait "
                           "for it for up to %.0f s (policy.backend_outage_timeout_s) instead of spending their "
                           "retries", self.wire.generate_path, error or "?", breaker.outage_timeout_s)
        return excused, True

    async def _send(self, url: str, body: dict, headers: dict, timeout: aiohttp.ClientTimeout, rid: str,
                    live: list[str]) -> tuple[str, str, Generation | None]:
        """One attempt, posted to ``url`` (the router's generate route, or a worker's under the KV
        gate's ``placement=gate``): ``("ok", "", gen)``, or ``(kind, error, None)`` with kind ``outage`` (a
        transport-level failure: the backend may be down for every call) or ``retry`` (a failure
        of this request, or an answer the wire says failed). Appends ``rid`` to ``live`` when the
        attempt may still be generating.

        Raises:
            PolicyServerError: a 4xx answer, or a 200 answer that is JSON but malformed (not retried).
        """
        try:
            # orjson: the body holds the whole prompt's ids, which json.dumps encodes 19x slower (docs/performance.md)
            async with self.session.post(url, data=fastjson.dumps(body), timeout=timeout, headers=headers) as resp:
                if resp.status != 200:
                    text = redact((await resp.text(errors="replace"))[:300], self._api_key)
                    msg = f"{self.wire.generate_path} answered {resp.status}: {text}"
                    if resp.status in OUTAGE_STATUSES:
                        return "outage", msg, None
                    if resp.status >= 500:
                        return "retry", msg, None
                    raise PolicyServerError(msg)
                raw = await resp.read()
        except aiohttp.ClientConnectorError as e:  # nothing was sent
            return "outage", describe_error(e, self._api_key), None
        except asyncio.TimeoutError:
            live.append(rid)
            return "retry", f"timed out after {self.cfg.request_timeout_s:g} s (policy.request_timeout_s)", None
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as e:  # dropped or reset
            live.append(rid)
            return "outage", describe_error(e, self._api_key), None
        except aiohttp.ClientError as e:
            return "retry", describe_error(e, self._api_key), None
        try:
            data = fastjson.loads(raw)
        except ValueError:  # e.g. cut short by a proxy: a failure of this request, retried
            live.append(rid)
            return "retry", f"{self.wire.generate_path} answered 200 with a body that is not JSON ({len(raw)} bytes)", None
        if not isinstance(data, dict):
            raise PolicyServerError(f"{self.wire.generate_path} answered 200 with JSON that is not an object ({type(data).__name__})")
        try:
            return "ok", "", self.wire.parse_generate(data)
        except RetryableAnswer as e:
            return "retry", redact(str(e), self._api_key), None

    async def _abort_rids(self, rids: list[str]) -> None:
        urls = await self.admin.worker_urls()
        if not urls:
            raise PolicyServerError("the router lists no workers")
        await asyncio.gather(*[self.admin.abort(r, urls=urls, quiet=True) for r in rids])
        self.aborted_attempts += len(rids)

    async def _abort_attempts(self, live: list[str]) -> None:
        """Abort earlier attempts on every worker, best effort, within :data:`ABORT_TIMEOUT_S`.
        The rids are forgotten once the workers were reached; kept (for the next attempt) while
        the router cannot list them."""
        try:
            await asyncio.wait_for(self._abort_rids(list(live)), ABORT_TIMEOUT_S)
        except (PolicyServerError, asyncio.TimeoutError) as e:
            logger.debug("abort of earlier attempts %s not done yet: %s", live, describe_error(e, self._api_key))
            return
        live.clear()

    async def _abort_in_background(self, rids: list[str]) -> None:
        try:
            await asyncio.wait_for(self._abort_rids(rids), ABORT_TIMEOUT_S)
        except Exception as e:  # best effort: the session may be closed, the router down
            logger.debug("abort of attempts %s failed: %s", rids, describe_error(e, self._api_key))
