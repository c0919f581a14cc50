"""The policy client for SGLang's native ``/generate`` API (token in, token out).

Every request sends ``input_ids``; the generated ids and their log-probs are read from
``meta_info.output_token_logprobs`` (``[[logprob, token_id, text], ...]``), never re-tokenized
from text (docs/design.md "SGLang native protocol"); a ``null`` log-prob on a generated token is a
malformed answer (:class:`PolicyServerError`), never read as 0.0. Requests carry ``rid`` (used to
abort) and, by ``policy.routing``, the header ``X-SMG-Routing-Key`` (the group id, the episode id
or none) so that a router that honours it keeps the calls that share a prefix on one worker, whose
prefix cache then holds that prefix (docs/local-stack.md "Routing" names the router policy).

:class:`SGLangClient` implements the policy seam (:class:`~rollout.core.policy.protocol.PolicyClient`);
it holds its calls at the actor's :class:`~rollout.core.policy.resilience.GenerationGate` during a
weight update and aborts earlier attempts through :class:`~rollout.core.policy.admin.RouterAdmin`.

Failures:

* An isolated failure (a connection error, a 5xx, a timeout of one call while other calls
  succeed) is retried ``policy.max_request_retries`` times with jittered exponential back-off.
  Each attempt has its own request id (``<rid>``, then ``<rid>.r1``, ``<rid>.r2``, ...); an attempt
  that may still be generating on a worker (it timed out or its connection dropped) is aborted
  there (``/abort_request``, best effort, at most :data:`ABORT_TIMEOUT_S` seconds) before the next
  one is sent.
* A backend outage (the router or every worker is down: connections refused or reset, 502/503
  from the router, for every call at once) opens the actor's :class:`BackendBreaker`: calls stop
  spending their retries and wait, with jittered exponential back-off capped at a few seconds and
  one probe request out at a time, until a call succeeds again, for at most
  ``policy.backend_outage_timeout_s`` seconds from the start of the outage; then they raise
  :class:`PolicyServerError` (the episode ends ``policy_error``). The client logs the outage's
  start (one WARNING) and end (one INFO).

Authentication: with ``policy.api_key_env`` set, the key is read from that environment variable
(:func:`api_key_from_env`) and sent as ``Authorization: Bearer <key>`` on every ``/generate`` call
and every :class:`RouterAdmin` call. The key never appears in a log record, an exception message
or a ``repr``: headers are never logged, aiohttp exceptions (whose ``repr`` carries the request
headers) are reported by class and ``str`` only, and any text taken from an answer is redacted.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from typing import TYPE_CHECKING

import aiohttp

from rollout.core import fastjson
from rollout.core.config import PolicyConfig, Routing
from rollout.core.policy.admin import RouterAdmin, WeightSyncError
from rollout.core.policy.auth import api_key_from_env, auth_headers, describe_error, redact
from rollout.core.policy.kvgate import KVGate
from rollout.core.policy.protocol import Generation, PolicyClient, PolicyServerError, parse_generate_response
from rollout.core.policy.resilience import BackendBreaker, GenerationGate
from rollout.core.telemetry.probes import PolicyMetrics
from rollout.core.telemetry.recorder import NULL_RECORDER, Recorder

if TYPE_CHECKING:
    import numpy as np

# The client's names, and (re-exported) those that lived here before the policy package was split.
__all__ = ["ABORT_TIMEOUT_S", "OUTAGE_STATUSES", "ROUTING_HEADER", "BackendBreaker", "Generation", "GenerationGate", "PolicyClient",
           "PolicyServerError", "RouterAdmin", "SGLangClient", "WeightSyncError", "api_key_from_env", "parse_generate_response"]

logger = logging.getLogger(__name__)

ROUTING_HEADER = "X-SMG-Routing-Key"
# Answers of the router that mean "no worker can take this request now" (not this request's fault).
OUTAGE_STATUSES = frozenset({502, 503})
# Bound (seconds) on the best-effort abort of an earlier attempt of a /generate call.
ABORT_TIMEOUT_S = 2.0


class SGLangClient:
    """``/generate`` client over one shared aiohttp session (see the module docstring).

    Args:
        cfg: the ``policy`` section (``router_url`` must be resolved; ``request_timeout_s``,
            ``max_request_retries``, ``backend_outage_timeout_s``, ``api_key_env`` are read).
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
            every attempt first waits while it is closed; ``None``: no KV-aware holding.

    Attributes:
        inflight: routing key (episode id) -> the ``rid`` of the attempt now out (or last out),
            so that a cancelled episode's request can be aborted.
        groups: episode id -> group id, for ``policy.routing=group`` (:meth:`routing_header`);
            the worker registers each episode it runs and forgets it at the end.
        kv_held_s: episode id -> seconds its calls waited at :attr:`kv_gate` (only episodes that
            waited; the worker pops it into the episode's ``metadata["kv_held_s"]``).
        admin: a :class:`RouterAdmin` on the same router and session, with the same key and a
            short timeout (:data:`ABORT_TIMEOUT_S`), used for aborts.
        retries: failures that spent a retry, over all calls.
        aborted_attempts: earlier attempts aborted on the workers before a retry.
        metrics: the bound instruments the calls record into.

    Raises:
        ValueError: ``cfg.router_url`` is not set, or ``cfg.api_key_env`` names a variable that is
            not set or empty.
    """

    def __init__(self, cfg: PolicyConfig, session: aiohttp.ClientSession, gate: GenerationGate | None = None,
                 breaker: BackendBreaker | None = None, recorder: Recorder | None = None, kv_gate: KVGate | None = None):
        if not cfg.router_url:
            raise ValueError("policy.router_url is not set")
        self.cfg = cfg
        self.session = session
        self.gate = gate
        self.breaker = breaker if breaker is not None else BackendBreaker(cfg.backend_outage_timeout_s)
        self.url = cfg.router_url.rstrip("/") + "/generate"
        self.inflight: dict[str, str] = {}
        self.groups: dict[str, str] = {}
        self.kv_gate = kv_gate
        self.kv_held_s: dict[str, float] = {}
        self._api_key = api_key_from_env(cfg.api_key_env)
        self._auth = auth_headers(self._api_key)
        self.admin = RouterAdmin(cfg.router_url, session, timeout_s=ABORT_TIMEOUT_S, api_key=self._api_key)
        self.retries = 0
        self.aborted_attempts = 0
        self.metrics = PolicyMetrics(recorder if recorder is not None else NULL_RECORDER)
        self._background: set[asyncio.Task] = set()

    def __repr__(self) -> str:
        return f"SGLangClient(url={self.url!r}, api_key={'<set>' if self._api_key else None}, breaker={self.breaker!r})"

    def payload(self, input_ids: list[int] | np.ndarray, max_new_tokens: int, rid: str, seed: int | None) -> dict:
        """The ``/generate`` body: ``input_ids``, ``sampling_params`` from ``cfg.sampling`` (with
        ``max_new_tokens`` and, if not ``None``, ``sampling_seed``), ``return_logprob``, ``rid``."""
        s = self.cfg.sampling
        sp = {
            "temperature": s.temperature,
            "top_p": s.top_p,
            "top_k": s.top_k,
            "max_new_tokens": max_new_tokens,
            "stop": list(s.stop),
            "skip_special_tokens": False,
            "no_stop_trim": True,
        }
        if seed is not None:
            sp["sampling_seed"] = seed
        return {"input_ids": input_ids, "sampling_params": sp, "return_logprob": True, "rid": rid}

    def routing_header(self, routing_key: str) -> str | None:
        """The ``X-SMG-Routing-Key`` of a call of episode ``routing_key``, by ``policy.routing``:
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
            routing_key: the episode id; what goes in ``X-SMG-Routing-Key`` is
                :meth:`routing_header`'s (``policy.routing``).
            seed: ``sampling_seed`` (the same for every attempt of the call).

        Returns:
            The :class:`Generation` (``n`` generated ids and their log-probs).

        Raises:
            PolicyServerError: the retries are spent on isolated failures (connection errors, 5xx,
                timeouts of ``cfg.request_timeout_s`` seconds), a backend outage lasted over
                ``cfg.backend_outage_timeout_s``, or a 4xx / malformed answer (not retried). The
                message never holds the API key.
        """
        body = self.payload(input_ids, max_new_tokens, rid, seed)
        headers = {"Content-Type": "application/json", **self._auth}
        route = self.routing_header(routing_key)
        if route is not None:
            headers[ROUTING_HEADER] = route
        timeout = aiohttp.ClientTimeout(total=self.cfg.request_timeout_s)
        breaker = self.breaker
        m = self.metrics
        counted = 0  # failures that spent a retry
        sent = 0  # attempts sent
        live: list[str] = []  # rids of earlier attempts that may still be generating on a worker
        self.inflight[routing_key] = rid
        try:
            while True:
                epoch = 0
                ticket, gen, url = None, None, self.url
                if self.kv_gate is not None:  # pool.adaptive_concurrency: held while the workers' KV is nearly full
                    # a slot of the actor's capped calls and KV tokens (placement=gate: on the key's worker)
                    ticket = await self.kv_gate.acquire(self.kv_gate.cost(len(input_ids), max_new_tokens), route)
                    if ticket.waited:
                        self.kv_held_s[routing_key] = self.kv_held_s.get(routing_key, 0.0) + ticket.waited
                    if ticket.worker is not None:
                        url = ticket.worker + "/generate"
                try:
                    if self.gate is not None:
                        await self.gate.wait_open()
                        epoch = self.gate.epoch
                    async with breaker.attempt():
                        if live:
                            await self._abort_attempts(live)
                        cur = rid if sent == 0 else f"{rid}.r{sent}"
                        sent += 1
                        body["rid"] = cur
                        self.inflight[routing_key] = cur
                        sent_at = time.monotonic()
                        outcome, error, gen = await self._send(url, body, headers, timeout, cur, live)
                        latency_s = time.monotonic() - sent_at
                        if outcome == "outage" and ticket is not None and ticket.worker is not None:
                            self.kv_gate.lost(ticket)  # type: ignore[union-attr]  # its keys move to another worker
                finally:
                    if ticket is not None:
                        self.kv_gate.release(ticket, len(gen.ids) if gen is not None and gen.finish_type != "abort" else None)  # type: ignore[union-attr]
                if gen is not None:
                    ended = breaker.record_success()
                    if ended is not None:
                        m.breaker_open.record(0)
                        logger.info("policy backend is back after %.1f s; /generate calls go on (outage %d, %.1f s waited in all)",
                                    ended, breaker.outages, breaker.waited_s)
                    if gen.finish_type == "abort" and self.gate is not None:
                        gen.interrupted = self.gate.closed or self.gate.epoch != epoch
                    m.answered(gen.finish_type, latency_s, len(input_ids), len(gen.ids), gen.weight_version)
                    return gen
                slept = False
                if outcome == "outage" and breaker.enabled:
                    if breaker.is_open:
                        excused = True
                    else:  # judge it after the ordinary back-off: did any call succeed meanwhile?
                        mark, failed_at = breaker.successes, time.monotonic()
                        await asyncio.sleep(self._retry_delay(counted + 1))
                        slept = True
                        outages = breaker.outages
                        excused = breaker.record_failure(mark, failed_at)
                        if breaker.outages > outages:  # this failure opened the breaker
                            m.outages.record(1)
                            m.breaker_open.record(1)
                            logger.warning("policy backend unreachable (every /generate call fails; last error: %s); calls wait "
                                           "for it for up to %.0f s (policy.backend_outage_timeout_s) instead of spending their "
                                           "retries", error or "?", breaker.outage_timeout_s)
                    if excused:
                        if breaker.expired():
                            raise PolicyServerError(
                                f"/generate failed after {sent} attempts: the policy backend has been unreachable for "
                                f"{breaker.outage_s:.0f} s (policy.backend_outage_timeout_s={breaker.outage_timeout_s:g}); "
                                f"last error: {error}")
                        logger.debug("rid=%s: /generate attempt %d failed during a backend outage: %s", cur, sent, error)
                        continue
                counted += 1
                self.retries += 1
                if counted > self.cfg.max_request_retries:
                    raise PolicyServerError(f"/generate failed after {sent} attempts: {error}")
                m.retries.record(1)
                logger.warning("rid=%s: /generate attempt %d failed (%s); retrying", cur, sent, error)
                if not slept:
                    await asyncio.sleep(self._retry_delay(counted))
        except PolicyServerError:
            m.failures.record(1)
            raise
        finally:
            self.inflight.pop(routing_key, None)
            if live:  # the call ends (error or cancellation) with attempts perhaps still generating
                task = asyncio.ensure_future(self._abort_in_background(list(live)))
                self._background.add(task)
                task.add_done_callback(self._background.discard)

    async def _send(self, url: str, body: dict, headers: dict, timeout: aiohttp.ClientTimeout, rid: str,
                    live: list[str]) -> tuple[str, str, Generation | None]:
        """One attempt, posted to ``url`` (the router's ``/generate``, or a worker's under the KV
        gate's ``placement=gate``): ``("ok", "", gen)``, or ``(kind, error, None)`` with kind ``outage`` (a
        transport-level failure: the backend may be down for every call) or ``retry`` (a failure
        of this request). Appends ``rid`` to ``live`` when the attempt may still be generating.

        Raises:
            PolicyServerError: a 4xx answer, or a 200 answer that is JSON but malformed (not retried).
        """
        try:
            # orjson: the body holds the whole prompt's ids, which json.dumps encodes 19x slower (docs/performance.md)
            async with self.session.post(url, data=fastjson.dumps(body), timeout=timeout, headers=headers) as resp:
                if resp.status != 200:
                    text = redact((await resp.text(errors="replace"))[:300], self._api_key)
                    msg = f"/generate answered {resp.status}: {text}"
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
            return "retry", f"/generate answered 200 with a body that is not JSON ({len(raw)} bytes)", None
        if not isinstance(data, dict):
            raise PolicyServerError(f"/generate answered 200 with JSON that is not an object ({type(data).__name__})")
        return "ok", "", parse_generate_response(data)

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
