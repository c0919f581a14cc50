"""Policy client for SGLang's native ``/generate`` API (token in, token out), and the RL endpoints.

Every request sends ``input_ids``; the generated ids and their log-probs are read from
``meta_info.output_token_logprobs`` (``[[logprob, token_id, text], ...]``), never re-tokenized
from text (docs/design.md "SGLang native protocol"); a ``null`` log-prob on a generated token is a
malformed answer (:class:`PolicyServerError`), never read as 0.0. Requests carry ``rid`` (used to
abort) and the header ``X-SMG-Routing-Key: <episode id>`` so that a consistent-hashing router keeps
an episode's turns on one worker (prefix-cache reuse).

Failures (:class:`SGLangClient`):

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
  :class:`PolicyServerError` (the episode ends ``policy_error``).

Authentication: with ``policy.api_key_env`` set, the key is read from that environment variable
(:func:`api_key_from_env`) and sent as ``Authorization: Bearer <key>`` on every ``/generate`` call
and every :class:`RouterAdmin` call. The key never appears in a log record, an exception message
or a ``repr``: headers are never logged, aiohttp exceptions (whose ``repr`` carries the request
headers) are reported by class and ``str`` only, and any text taken from an answer is redacted.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, AsyncIterator, Protocol

import aiohttp

from rollout.core import fastjson
from rollout.core.config import PolicyConfig

if TYPE_CHECKING:
    import numpy as np

logger = logging.getLogger(__name__)

ROUTING_HEADER = "X-SMG-Routing-Key"
# Answers of the router that mean "no worker can take this request now" (not this request's fault).
OUTAGE_STATUSES = frozenset({502, 503})
# Bound (seconds) on the best-effort abort of an earlier attempt of a /generate call.
ABORT_TIMEOUT_S = 2.0
_REDACTED = "<redacted>"


class PolicyServerError(RuntimeError):
    """The router or a policy server failed (connection, 5xx, timeout, outage past
    ``policy.backend_outage_timeout_s``, malformed response, 4xx answer)."""


def api_key_from_env(var_name: str | None) -> str | None:
    """The API key held by the environment variable ``var_name`` (surrounding whitespace removed).

    Args:
        var_name: name of the environment variable (e.g. ``policy.api_key_env``); ``None`` or
            ``""``: no key.

    Returns:
        The key, or ``None`` when ``var_name`` is ``None`` / empty.

    Raises:
        ValueError: the variable is not set or is empty. The message names the variable, never a
            value.
    """
    if not var_name:
        return None
    key = os.environ.get(var_name, "").strip()
    if not key:
        raise ValueError(f"environment variable {var_name} is not set or is empty (it must hold the API key)")
    return key


def _auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _redact(text: str, api_key: str | None) -> str:
    """``text`` with every occurrence of ``api_key`` replaced (for messages built from answers)."""
    return text.replace(api_key, _REDACTED) if api_key and api_key in text else text


def _describe(e: BaseException, api_key: str | None) -> str:
    """``ClassName: message`` of an exception. Never ``repr``: aiohttp's ``ClientResponseError``
    repr carries the request's headers (the ``Authorization`` header included)."""
    msg = str(e)
    return _redact(f"{type(e).__name__}: {msg}" if msg else type(e).__name__, api_key)


@dataclass
class Generation:
    """One ``/generate`` answer.

    Attributes:
        ids: generated token ids (length ``n``), as sampled by the server.
        log_probs: their rollout log-probs (length ``n``, natural log), as the server computed them.
        finish_type: ``stop`` | ``length`` | ``abort``.
        matched: the stop token id or stop string that ended generation, if any.
        text: the server's decoded text (informational only; never re-tokenized).
        meta: the server's ``meta_info`` minus the log-prob lists (ids, token counts, timings).
        weight_version: the server's ``meta_info["weight_version"]`` (a string; ``None`` if the
            server sent none).
        interrupted: the call ended with ``finish_type == "abort"`` because the pool paused
            generation for a weight update (see :class:`GenerationGate`), not for another reason.
    """

    ids: list[int]
    log_probs: list[float]
    finish_type: str
    matched: int | str | None = None
    text: str = ""
    meta: dict = field(default_factory=dict)
    weight_version: str | None = None
    interrupted: bool = False


class PolicyClient(Protocol):
    """What the episode loop needs from a policy: :meth:`SGLangClient.generate`'s signature.

    ``generate`` samples one assistant turn after ``input_ids`` (at most ``max_new_tokens`` new
    tokens) and returns a :class:`Generation`; it raises :class:`PolicyServerError` when the
    policy backend fails.
    """

    async def generate(self, input_ids: list[int] | np.ndarray, max_new_tokens: int, rid: str, routing_key: str, seed: int | None = None) -> Generation:
        """Sample one assistant turn (see :meth:`SGLangClient.generate`)."""
        ...


def parse_generate_response(body: dict) -> Generation:
    """Read ids and log-probs from a ``/generate`` response body.

    Args:
        body: the decoded JSON answer (``{"text", "output_ids"?, "meta_info": {...}}``).

    Returns:
        A :class:`Generation` whose ``ids`` and ``log_probs`` (length ``n`` each) come from
        ``meta_info.output_token_logprobs`` (``[[logprob, token_id, text], ...]``); input log-probs
        are not read.

    Raises:
        PolicyServerError: the body lacks ``meta_info.output_token_logprobs``, a generated token's
            log-prob is ``null`` or not a number, or the ids disagree with ``output_ids``.
    """
    try:
        meta = body["meta_info"]
        fr = meta.get("finish_reason") or {}
        finish_type = fr.get("type", "stop") if isinstance(fr, dict) else str(fr)
        pairs = meta["output_token_logprobs"]
        ids = [int(p[1]) for p in pairs]
        lps: list[float] = []
        for i, p in enumerate(pairs):
            if p[0] is None:
                raise PolicyServerError(f"malformed /generate response: null log-prob for generated token {i} (id {ids[i]})")
            lps.append(float(p[0]))
    except (KeyError, TypeError, IndexError, ValueError, AttributeError) as e:
        raise PolicyServerError(f"malformed /generate response (need meta_info.output_token_logprobs): {e!r}") from None
    out_ids = body.get("output_ids")
    if out_ids is not None and list(out_ids) != ids:
        raise PolicyServerError("output_ids disagree with output_token_logprobs")
    meta = {k: v for k, v in meta.items() if k not in ("output_token_logprobs", "input_token_logprobs")}
    version = meta.get("weight_version")
    return Generation(
        ids=ids, log_probs=lps, finish_type=finish_type, matched=fr.get("matched") if isinstance(fr, dict) else None,
        text=body.get("text", ""), meta=meta, weight_version=None if version is None else str(version),
    )


class GenerationGate:
    """Holds an actor's ``/generate`` calls while the trainer updates weights.

    The pool closes the gate of every actor *before* it pauses the servers, and opens it after
    they continue. A call waits at the gate before each attempt is sent; an answer with
    ``finish_reason.type == "abort"`` is a pause interruption (``Generation.interrupted``) when the
    gate closed while the attempt was out, which tells it from an abort of any other origin. Lives
    in one event loop (the actor's); not thread-safe.

    Attributes:
        epoch: incremented at every close (an attempt compares it before and after).
    """

    def __init__(self) -> None:
        self._open = asyncio.Event()
        self._open.set()
        self.epoch = 0  # incremented at every close

    @property
    def closed(self) -> bool:
        """Whether a weight update is in progress (calls wait)."""
        return not self._open.is_set()

    def close(self) -> None:
        """Hold new calls (idempotent; a new close increments :attr:`epoch`)."""
        if not self.closed:
            self.epoch += 1
            self._open.clear()

    def open(self) -> None:
        """Let held and new calls go."""
        self._open.set()

    async def wait_open(self) -> None:
        """Return once the gate is open (at once if it is)."""
        await self._open.wait()


class BackendBreaker:
    """Circuit breaker for the policy backend, shared by every ``/generate`` call of one actor.

    *Closed* (normal): calls go out at once and a failed call spends its own retries.

    It *opens* on evidence that the backend is down for every call: a call failed at the
    transport level (connection refused or reset, 502/503 from the router) and no call succeeded
    between that failure and the end of the call's ordinary retry back-off (about a second); see
    :meth:`record_failure`. It is armed only once some call has succeeded: a backend that was
    never reached (a wrong ``router_url``) is not waited for; calls fail after their retries.
    :meth:`arm` counts a health check as such a success.

    *Open*: calls do not spend retries on transport-level failures; they wait in
    :meth:`attempt`, one probe at a time going out after a jittered exponential back-off
    (``base_backoff_s * 2**k`` times a factor in [0.5, 1], capped at ``max_backoff_s``), the
    others waiting for the breaker to close (or for the probe to have been out ``probe_grace_s``,
    when each goes after its own back-off). The first success *closes* it. Once the outage has
    lasted ``outage_timeout_s`` (from its first failure) each call gets one more attempt and then
    raises :class:`PolicyServerError` (in :class:`SGLangClient`); a call that arrives later tries
    once, so the breaker still closes when the backend comes back.

    Logs one WARNING when it opens and one INFO when it closes. Lives in one event loop (the
    actor's); not thread-safe.

    Args:
        outage_timeout_s: how long (seconds) calls wait for the backend, measured from the first
            failure of the outage (``policy.backend_outage_timeout_s``); ``0`` disables the breaker
            (every failure spends retries).
        max_backoff_s: cap on the back-off before a probe (seconds).
        base_backoff_s: back-off before the first probe of an outage (seconds).
        probe_grace_s: a probe out longer than this (seconds) no longer holds the other calls back
            (a probe that the backend answers slowly, e.g. a long generation); default
            ``2 * max_backoff_s``.

    Attributes:
        outages: how many times it opened.
        waited_s: seconds that calls spent waiting in :meth:`attempt` while it was open, summed
            over calls.
        successes: successful calls recorded (a sequence number, see :meth:`record_failure`).
        opened_at: ``time.monotonic()`` of the outage's first failure; ``None`` while closed.
    """

    def __init__(self, outage_timeout_s: float = 300.0, max_backoff_s: float = 5.0, base_backoff_s: float = 0.25,
                 probe_grace_s: float | None = None) -> None:
        if outage_timeout_s < 0 or max_backoff_s <= 0 or base_backoff_s <= 0:
            raise ValueError("outage_timeout_s must be >= 0, max_backoff_s and base_backoff_s > 0")
        self.outage_timeout_s = float(outage_timeout_s)
        self.max_backoff_s = float(max_backoff_s)
        self.base_backoff_s = float(base_backoff_s)
        self.probe_grace_s = 2 * self.max_backoff_s if probe_grace_s is None else float(probe_grace_s)
        self.outages = 0
        self.waited_s = 0.0
        self.successes = 0
        self.opened_at: float | None = None
        self._probe: object | None = None  # the attempt holding the probe slot
        self._probe_since = 0.0
        self._probes = 0  # probes of this outage (the back-off's exponent)
        self._changed = asyncio.Event()

    def __repr__(self) -> str:
        return (f"BackendBreaker(open={self.is_open}, outages={self.outages}, waited_s={self.waited_s:.1f}, "
                f"outage_timeout_s={self.outage_timeout_s})")

    @property
    def enabled(self) -> bool:
        """False when ``outage_timeout_s == 0``."""
        return self.outage_timeout_s > 0

    @property
    def is_open(self) -> bool:
        """Whether an outage is in progress."""
        return self.opened_at is not None

    @property
    def outage_s(self) -> float:
        """Seconds since the current outage's first failure (0.0 while closed)."""
        return 0.0 if self.opened_at is None else time.monotonic() - self.opened_at

    def expired(self) -> bool:
        """Whether the current outage has lasted ``outage_timeout_s`` (False while closed)."""
        return self.opened_at is not None and self.outage_s >= self.outage_timeout_s

    def stats(self) -> dict[str, Any]:
        """``{"outages": int, "waited_s": float, "open": bool, "outage_s": float}`` for logs."""
        return {"outages": self.outages, "waited_s": round(self.waited_s, 3), "open": self.is_open, "outage_s": round(self.outage_s, 3)}

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def arm(self) -> None:
        """Record that the backend was seen answering (e.g. a health check when the actor
        started), so that an outage from the very first call is waited for too."""
        self.successes = max(self.successes, 1)

    def record_success(self) -> None:
        """A call succeeded (the backend answered 200): close the breaker if it was open."""
        self.successes += 1
        if self.opened_at is not None:
            logger.info("policy backend is back after %.1f s; /generate calls go on (outage %d, %.1f s waited in all)",
                        self.outage_s, self.outages, self.waited_s)
            self.opened_at = None
            self._probes = 0
            self._notify()

    def record_failure(self, successes_at_failure: int, failed_at: float, error: str = "") -> bool:
        """Judge a transport-level failure, some time after it happened.

        Args:
            successes_at_failure: :attr:`successes` right after the call failed.
            failed_at: ``time.monotonic()`` when it failed (the outage's start if it opens one).
            error: what failed, for the one WARNING logged when the breaker opens (must not hold
                secrets).

        Returns:
            True when the failure belongs to an outage: the breaker is open (it opens now if no
            call has succeeded since the failure and it is enabled and armed); the call must not
            count it against its retries. False: an isolated failure (or the breaker is disabled
            or not armed); the call spends a retry.
        """
        if not self.enabled:
            return False
        if self.opened_at is not None:
            return True
        if self.successes == 0 or self.successes != successes_at_failure:
            return False
        self.opened_at = failed_at
        self.outages += 1
        self._probes = 0
        logger.warning("policy backend unreachable (every /generate call fails; last error: %s); calls wait for it "
                       "for up to %.0f s (policy.backend_outage_timeout_s) instead of spending their retries",
                       error or "?", self.outage_timeout_s)
        return True

    def _backoff(self) -> float:
        delay = min(self.max_backoff_s, self.base_backoff_s * 2 ** min(self._probes, 30)) * random.uniform(0.5, 1.0)
        self._probes += 1
        return delay

    @asynccontextmanager
    async def attempt(self) -> AsyncIterator[None]:
        """Wrap one attempt of a call: wait while the breaker is open, then let it go.

        While closed (or past ``outage_timeout_s``) it returns at once. While open, the attempt
        either takes the probe slot (it goes after a back-off) or waits until the breaker closes,
        the slot frees or the probe has been out ``probe_grace_s``; the slot is given back when
        the ``async with`` block ends. Cancellation-safe. Raises nothing of its own.
        """
        owner = object()
        t0 = time.monotonic()
        waited = False
        try:
            while self.opened_at is not None and not self.expired():
                waited = True
                now = time.monotonic()
                remaining = self.opened_at + self.outage_timeout_s - now
                stale = self._probe is not None and now - self._probe_since >= self.probe_grace_s
                if self._probe is None or stale:
                    if self._probe is None:
                        self._probe, self._probe_since = owner, now
                    await asyncio.sleep(max(0.0, min(self._backoff(), remaining)))
                    break
                changed = self._changed
                timeout = max(0.01, min(remaining, self._probe_since + self.probe_grace_s - now))
                try:
                    await asyncio.wait_for(changed.wait(), timeout)
                except asyncio.TimeoutError:
                    pass
        except BaseException:
            self._release(owner)
            raise
        finally:
            if waited:
                self.waited_s += time.monotonic() - t0
        try:
            yield
        finally:
            self._release(owner)

    def _release(self, owner: object) -> None:
        if self._probe is owner:
            self._probe = None
            self._notify()


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

    Attributes:
        inflight: routing key (episode id) -> the ``rid`` of the attempt now out (or last out),
            so that a cancelled episode's request can be aborted.
        admin: a :class:`RouterAdmin` on the same router and session, with the same key and a
            short timeout (:data:`ABORT_TIMEOUT_S`), used for aborts.
        retries: failures that spent a retry, over all calls.
        aborted_attempts: earlier attempts aborted on the workers before a retry.

    Raises:
        ValueError: ``cfg.router_url`` is not set, or ``cfg.api_key_env`` names a variable that is
            not set or empty.
    """

    def __init__(self, cfg: PolicyConfig, session: aiohttp.ClientSession, gate: GenerationGate | None = None,
                 breaker: BackendBreaker | None = None):
        if not cfg.router_url:
            raise ValueError("policy.router_url is not set")
        self.cfg = cfg
        self.session = session
        self.gate = gate
        self.breaker = breaker if breaker is not None else BackendBreaker(cfg.backend_outage_timeout_s)
        self.url = cfg.router_url.rstrip("/") + "/generate"
        self.inflight: dict[str, str] = {}
        self._api_key = api_key_from_env(cfg.api_key_env)
        self._auth = _auth_headers(self._api_key)
        self.admin = RouterAdmin(cfg.router_url, session, timeout_s=ABORT_TIMEOUT_S, api_key=self._api_key)
        self.retries = 0
        self.aborted_attempts = 0
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
            routing_key: sent as ``X-SMG-Routing-Key`` (the episode id).
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
        headers = {ROUTING_HEADER: routing_key, "Content-Type": "application/json", **self._auth}
        timeout = aiohttp.ClientTimeout(total=self.cfg.request_timeout_s)
        breaker = self.breaker
        counted = 0  # failures that spent a retry
        sent = 0  # attempts sent
        live: list[str] = []  # rids of earlier attempts that may still be generating on a worker
        self.inflight[routing_key] = rid
        try:
            while True:
                epoch = 0
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
                    outcome, error, gen = await self._send(body, headers, timeout, cur, live)
                if gen is not None:
                    breaker.record_success()
                    if gen.finish_type == "abort" and self.gate is not None:
                        gen.interrupted = self.gate.closed or self.gate.epoch != epoch
                    return gen
                slept = False
                if outcome == "outage" and breaker.enabled:
                    if breaker.is_open:
                        excused = True
                    else:  # judge it after the ordinary back-off: did any call succeed meanwhile?
                        mark, failed_at = breaker.successes, time.monotonic()
                        await asyncio.sleep(self._retry_delay(counted + 1))
                        slept = True
                        excused = breaker.record_failure(mark, failed_at, error)
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
                logger.warning("rid=%s: /generate attempt %d failed (%s); retrying", cur, sent, error)
                if not slept:
                    await asyncio.sleep(self._retry_delay(counted))
        finally:
            self.inflight.pop(routing_key, None)
            if live:  # the call ends (error or cancellation) with attempts perhaps still generating
                task = asyncio.ensure_future(self._abort_in_background(list(live)))
                self._background.add(task)
                task.add_done_callback(self._background.discard)

    async def _send(self, body: dict, headers: dict, timeout: aiohttp.ClientTimeout, rid: str,
                    live: list[str]) -> tuple[str, str, Generation | None]:
        """One attempt: ``("ok", "", gen)``, or ``(kind, error, None)`` with kind ``outage`` (a
        transport-level failure: the backend may be down for every call) or ``retry`` (a failure
        of this request). Appends ``rid`` to ``live`` when the attempt may still be generating.

        Raises:
            PolicyServerError: a 4xx answer, or a 200 answer that is JSON but malformed (not retried).
        """
        try:
            # orjson: the body holds the whole prompt's ids, which json.dumps encodes ~10x slower
            async with self.session.post(self.url, data=fastjson.dumps(body), timeout=timeout, headers=headers) as resp:
                if resp.status != 200:
                    text = _redact((await resp.text(errors="replace"))[:300], self._api_key)
                    msg = f"/generate answered {resp.status}: {text}"
                    if resp.status in OUTAGE_STATUSES:
                        return "outage", msg, None
                    if resp.status >= 500:
                        return "retry", msg, None
                    raise PolicyServerError(msg)
                raw = await resp.read()
        except aiohttp.ClientConnectorError as e:  # nothing was sent
            return "outage", _describe(e, self._api_key), None
        except asyncio.TimeoutError:
            live.append(rid)
            return "retry", f"timed out after {self.cfg.request_timeout_s:g} s (policy.request_timeout_s)", None
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as e:  # dropped or reset
            live.append(rid)
            return "outage", _describe(e, self._api_key), None
        except aiohttp.ClientError as e:
            return "retry", _describe(e, self._api_key), None
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
            logger.debug("abort of earlier attempts %s not done yet: %s", live, _describe(e, self._api_key))
            return
        live.clear()

    async def _abort_in_background(self, rids: list[str]) -> None:
        try:
            await asyncio.wait_for(self._abort_rids(rids), ABORT_TIMEOUT_S)
        except Exception as e:  # best effort: the session may be closed, the router down
            logger.debug("abort of attempts %s failed: %s", rids, _describe(e, self._api_key))


class WeightSyncError(RuntimeError):
    """A worker failed a pause, continue or weight update.

    Attributes:
        action: what was attempted (e.g. ``continue_generation``).
        failures: worker URL -> what went wrong (``HTTP <status>: <body>`` or the connection error).
    """

    def __init__(self, action: str, failures: dict[str, str]):
        self.action = action
        self.failures = dict(failures)
        detail = "; ".join(f"{url}: {msg}" for url, msg in failures.items())
        super().__init__(f"{action} failed on {len(failures)} worker(s): {detail}")


class RouterAdmin:
    """SGLang's RL endpoints on every worker behind a router (docs/design.md "SGLang native protocol").

    These are worker endpoints: the router proxies ``/generate`` but not ``/pause_generation``,
    ``/continue_generation``, ``/update_weights_from_disk`` or ``/abort_request`` (sglang-router
    0.3.2 answers 404), so each call goes to every worker URL that ``GET /workers`` lists, all at
    once. Every method raises :class:`PolicyServerError` when the router cannot list its workers
    (except :meth:`abort`, which is best effort).

    Args:
        router_url: ``http://host:port`` of the router.
        session: an aiohttp session of the caller's event loop.
        timeout_s: bound on each HTTP call to a worker (seconds); a weight update may take this
            long. Listing the workers is bounded by 10 s.
        api_key: sent as ``Authorization: Bearer <key>`` on every call (router and workers);
            ``None``: no header. Never logged nor put in a message (see :func:`api_key_from_env`).
    """

    def __init__(self, router_url: str, session: aiohttp.ClientSession, timeout_s: float = 300.0, api_key: str | None = None):
        self.router_url = router_url.rstrip("/")
        self.session = session
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._api_key = api_key or None
        self._headers = _auth_headers(self._api_key)

    def __repr__(self) -> str:
        return f"RouterAdmin(router_url={self.router_url!r}, api_key={'<set>' if self._api_key else None})"

    async def worker_urls(self) -> list[str]:
        """Worker URLs the router lists (``GET /workers``), in its order, without trailing ``/``.

        Raises:
            PolicyServerError: the router is unreachable or did not answer 200 with JSON.
        """
        try:
            async with self.session.get(self.router_url + "/workers", headers=self._headers, timeout=aiohttp.ClientTimeout(total=10)) as r:
                if r.status != 200:
                    raise PolicyServerError(f"GET {self.router_url}/workers answered {r.status}")
                data = await r.json(content_type=None)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
            raise PolicyServerError(f"cannot list the router's workers at {self.router_url}/workers: {_describe(e, self._api_key)}") from None
        workers = data.get("workers", []) if isinstance(data, dict) else []
        return [str(w.get("url") if isinstance(w, dict) else w).rstrip("/") for w in workers]

    async def _call(self, method: str, url: str, body: dict | None) -> tuple[int, Any]:
        try:
            async with self.session.request(method, url, json=body, headers=self._headers, timeout=self.timeout) as r:
                text = _redact(await r.text(errors="replace"), self._api_key)
                try:
                    return r.status, json.loads(text) if text else {}
                except ValueError:
                    return r.status, text
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            return 0, _describe(e, self._api_key)

    async def _all(self, method: str, path: str, body: dict | None, urls: list[str] | None) -> dict[str, tuple[int, Any]]:
        urls = await self.worker_urls() if urls is None else urls
        answers = await asyncio.gather(*[self._call(method, u + path, body) for u in urls])
        return dict(zip(urls, answers))

    @staticmethod
    def _failures(answers: dict[str, tuple[int, Any]], ok) -> dict[str, str]:
        return {u: (f"HTTP {st}: {str(body)[:300]}" if st else str(body)) for u, (st, body) in answers.items() if not ok(st, body)}

    async def pause(self, mode: str = "abort", urls: list[str] | None = None) -> list[str]:
        """``POST /pause_generation {"mode": mode}`` on every worker (or on ``urls``); returns the
        worker URLs.

        Raises:
            WeightSyncError: a worker did not answer 200.
            PolicyServerError: the router cannot list its workers.
        """
        answers = await self._all("POST", "/pause_generation", {"mode": mode}, urls)
        bad = self._failures(answers, lambda st, _: st == 200)
        if bad:
            raise WeightSyncError(f"pause_generation(mode={mode})", bad)
        return list(answers)

    async def resume(self, urls: list[str] | None = None) -> list[str]:
        """``POST /continue_generation {}`` on every worker (or on ``urls``); returns the worker URLs.

        Raises:
            WeightSyncError: a worker did not answer 200.
            PolicyServerError: the router cannot list its workers.
        """
        answers = await self._all("POST", "/continue_generation", {}, urls)
        bad = self._failures(answers, lambda st, _: st == 200)
        if bad:
            raise WeightSyncError("continue_generation", bad)
        return list(answers)

    async def update_weights_from_disk(self, model_path: str, weight_version: str | None, urls: list[str] | None = None) -> dict[str, dict]:
        """``POST /update_weights_from_disk`` on every worker and check each answer's ``success``.

        Returns:
            Worker URL -> its answer (``success``, ``message``, ``num_paused_requests``).

        Raises:
            WeightSyncError: naming every worker that failed the update (others may have the new
                weights: the caller must not go on with mixed weights).
            PolicyServerError: the router cannot list its workers.
        """
        body = {"model_path": model_path, "weight_version": weight_version, "abort_all_requests": False}
        answers = await self._all("POST", "/update_weights_from_disk", body, urls)
        bad = self._failures(answers, lambda st, b: st == 200 and isinstance(b, dict) and b.get("success") is True)
        if bad:
            raise WeightSyncError(f"update_weights_from_disk({model_path!r}, weight_version={weight_version!r})", bad)
        return {u: b for u, (_, b) in answers.items()}

    async def weight_versions(self, urls: list[str] | None = None) -> dict[str, str | None]:
        """Each worker's ``weight_version`` from ``GET /model_info`` (``None`` if it has none).

        Raises:
            WeightSyncError: a worker did not answer 200.
            PolicyServerError: the router cannot list its workers.
        """
        answers = await self._all("GET", "/model_info", None, urls)
        bad = self._failures(answers, lambda st, _: st == 200)
        if bad:
            raise WeightSyncError("model_info", bad)
        return {u: (None if not isinstance(b, dict) or b.get("weight_version") is None else str(b["weight_version"])) for u, (_, b) in answers.items()}

    async def abort(self, rid: str | None = None, urls: list[str] | None = None, quiet: bool = False) -> int:
        """``POST /abort_request`` with ``{"rid": rid}`` (or ``{"abort_all": true}``) on every
        worker (or on ``urls``); returns how many accepted. Failures are logged (at WARNING, or at
        DEBUG when ``quiet``), not raised: an abort is best effort."""
        level = logging.DEBUG if quiet else logging.WARNING
        try:
            answers = await self._all("POST", "/abort_request", {"rid": rid} if rid else {"abort_all": True}, urls)
        except PolicyServerError as e:
            logger.log(level, "abort: %s", e)
            return 0
        for u, (st, body) in answers.items():
            if st != 200:
                logger.log(level, "abort on %s: %s", u, body if not st else f"HTTP {st}")
        return sum(1 for st, _ in answers.values() if st == 200)
