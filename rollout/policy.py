"""Policy client for SGLang's native ``/generate`` API (token in, token out).

Every request sends ``input_ids``; the generated ids and their log-probs are read from
``meta_info.output_token_logprobs`` (``[[logprob, token_id, text], ...]``), never re-tokenized
from text (DESIGN.md "SGLang native protocol"). Requests carry ``rid`` (used to abort) and the
header ``X-SMG-Routing-Key: <episode id>`` so that a consistent-hashing router keeps an episode's
turns on one worker (prefix-cache reuse).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp

from rollout.config import PolicyConfig

logger = logging.getLogger(__name__)

ROUTING_HEADER = "X-SMG-Routing-Key"


class PolicyServerError(RuntimeError):
    """The router or a policy server failed (connection, 5xx, timeout, malformed response)."""


@dataclass
class Generation:
    """One ``/generate`` answer.

    Attributes:
        ids: generated token ids (length ``n``), as sampled by the server.
        log_probs: their rollout log-probs (length ``n``).
        finish_type: ``stop`` | ``length`` | ``abort``.
        matched: the stop token id or stop string that ended generation, if any.
        text: the server's decoded text (informational only; never re-tokenized).
        meta: the server's ``meta_info`` minus the log-prob list (ids, token counts, timings).
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
    """What the episode loop needs from a policy."""

    async def generate(self, input_ids: list[int], max_new_tokens: int, rid: str, routing_key: str, seed: int | None = None) -> Generation: ...


def parse_generate_response(body: dict) -> Generation:
    """Read ids and log-probs from a ``/generate`` response body.

    Raises:
        PolicyServerError: the body lacks ``meta_info.output_token_logprobs`` or disagrees with
            ``output_ids``.
    """
    try:
        meta = body["meta_info"]
        fr = meta.get("finish_reason") or {}
        finish_type = fr.get("type", "stop") if isinstance(fr, dict) else str(fr)
        pairs = meta["output_token_logprobs"]
        ids = [int(p[1]) for p in pairs]
        lps = [float(p[0]) if p[0] is not None else 0.0 for p in pairs]
    except (KeyError, TypeError, IndexError, ValueError) as e:
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
    they continue. A call waits at the gate before it is sent; an answer with
    ``finish_reason.type == "abort"`` is a pause interruption (``Generation.interrupted``) when the
    gate closed while the call was out, which tells it from an abort of any other origin. Lives
    in one event loop (the actor's); not thread-safe.
    """

    def __init__(self) -> None:
        self._open = asyncio.Event()
        self._open.set()
        self.epoch = 0  # incremented at every close

    @property
    def closed(self) -> bool:
        return not self._open.is_set()

    def close(self) -> None:
        if not self.closed:
            self.epoch += 1
            self._open.clear()

    def open(self) -> None:
        self._open.set()

    async def wait_open(self) -> None:
        await self._open.wait()


class SGLangClient:
    """``/generate`` client over one shared aiohttp session.

    Args:
        cfg: the ``policy`` section (``router_url`` must be resolved).
        session: an aiohttp session owned by the caller (one per actor).

    Retries connection errors and 5xx answers ``cfg.max_request_retries`` times with jittered
    exponential back-off; 4xx answers are not retried. With a ``gate``, every call first waits
    until the gate is open (a weight update is not in progress), and an abort answer is marked
    ``interrupted`` when the gate closed meanwhile. ``inflight`` maps each routing key (episode
    id) to the ``rid`` of its call now out, so that a cancelled episode's request can be aborted.
    """

    def __init__(self, cfg: PolicyConfig, session: aiohttp.ClientSession, gate: GenerationGate | None = None):
        if not cfg.router_url:
            raise ValueError("policy.router_url is not set")
        self.cfg = cfg
        self.session = session
        self.gate = gate
        self.url = cfg.router_url.rstrip("/") + "/generate"
        self.inflight: dict[str, str] = {}

    def payload(self, input_ids: list[int], max_new_tokens: int, rid: str, seed: int | None) -> dict:
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

    async def generate(self, input_ids: list[int], max_new_tokens: int, rid: str, routing_key: str, seed: int | None = None) -> Generation:
        """Sample one assistant turn.

        Args:
            input_ids: the full token sequence so far (prompt + response).
            max_new_tokens: at most this many new tokens (>= 1).
            rid: request id (for aborts); unique per request.
            routing_key: sent as ``X-SMG-Routing-Key`` (the episode id).
            seed: ``sampling_seed``.

        Raises:
            PolicyServerError: after the retries are spent, or on a 4xx / malformed answer.
        """
        body = self.payload(input_ids, max_new_tokens, rid, seed)
        timeout = aiohttp.ClientTimeout(total=self.cfg.request_timeout_s)
        last: Exception | None = None
        if self.gate is not None:
            await self.gate.wait_open()
            epoch = self.gate.epoch
        self.inflight[routing_key] = rid
        try:
            for attempt in range(self.cfg.max_request_retries + 1):
                if attempt:
                    await asyncio.sleep(min(8.0, 0.25 * 2**attempt) * (0.5 + random.random()))
                try:
                    async with self.session.post(self.url, json=body, timeout=timeout, headers={ROUTING_HEADER: routing_key}) as resp:
                        if resp.status >= 500:
                            last = PolicyServerError(f"/generate answered {resp.status}: {(await resp.text())[:200]}")
                            continue
                        if resp.status != 200:
                            raise PolicyServerError(f"/generate answered {resp.status}: {(await resp.text())[:300]}")
                        data = await resp.json(content_type=None)
                    gen = parse_generate_response(data)
                    if gen.finish_type == "abort" and self.gate is not None:
                        gen.interrupted = self.gate.closed or self.gate.epoch != epoch
                    return gen
                except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as e:
                    last = e
                    logger.warning("rid=%s: /generate attempt %d failed: %r", rid, attempt + 1, e)
                except asyncio.TimeoutError:
                    raise PolicyServerError(f"/generate timed out after {self.cfg.request_timeout_s}s") from None
            raise PolicyServerError(f"/generate failed after {self.cfg.max_request_retries + 1} attempts: {last!r}")
        finally:
            self.inflight.pop(routing_key, None)


class WeightSyncError(RuntimeError):
    """A worker failed a pause, continue or weight update; ``failures`` maps worker URL to what
    went wrong."""

    def __init__(self, action: str, failures: dict[str, str]):
        self.action = action
        self.failures = dict(failures)
        detail = "; ".join(f"{url}: {msg}" for url, msg in failures.items())
        super().__init__(f"{action} failed on {len(failures)} worker(s): {detail}")


class RouterAdmin:
    """SGLang's RL endpoints on every worker behind a router (DESIGN.md "SGLang native protocol").

    These are worker endpoints: the router proxies ``/generate`` but not ``/pause_generation``,
    ``/continue_generation``, ``/update_weights_from_disk`` or ``/abort_request`` (sglang-router
    0.3.2 answers 404), so each call goes to every worker URL that ``GET /workers`` lists, all at
    once. Every method raises :class:`PolicyServerError` when the router cannot list its workers.

    Args:
        router_url: ``http://host:port`` of the router.
        session: an aiohttp session of the caller's event loop.
        timeout_s: bound on each HTTP call (seconds); a weight update may take this long.
    """

    def __init__(self, router_url: str, session: aiohttp.ClientSession, timeout_s: float = 300.0):
        self.router_url = router_url.rstrip("/")
        self.session = session
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)

    async def worker_urls(self) -> list[str]:
        """Worker URLs the router lists (``GET /workers``), in its order."""
        try:
            async with self.session.get(self.router_url + "/workers", timeout=aiohttp.ClientTimeout(total=10)) as r:
                if r.status != 200:
                    raise PolicyServerError(f"GET {self.router_url}/workers answered {r.status}")
                data = await r.json(content_type=None)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
            raise PolicyServerError(f"cannot list the router's workers at {self.router_url}/workers: {e!r}") from None
        workers = data.get("workers", []) if isinstance(data, dict) else []
        return [str(w.get("url") if isinstance(w, dict) else w).rstrip("/") for w in workers]

    async def _call(self, method: str, url: str, body: dict | None) -> tuple[int, Any]:
        try:
            async with self.session.request(method, url, json=body, timeout=self.timeout) as r:
                text = await r.text()
                try:
                    return r.status, json.loads(text) if text else {}
                except ValueError:
                    return r.status, text
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            return 0, f"{e.__class__.__name__}: {e}"

    async def _all(self, method: str, path: str, body: dict | None, urls: list[str] | None) -> dict[str, tuple[int, Any]]:
        urls = await self.worker_urls() if urls is None else urls
        answers = await asyncio.gather(*[self._call(method, u + path, body) for u in urls])
        return dict(zip(urls, answers))

    @staticmethod
    def _failures(answers: dict[str, tuple[int, Any]], ok) -> dict[str, str]:
        return {u: (f"HTTP {st}: {str(body)[:300]}" if st else str(body)) for u, (st, body) in answers.items() if not ok(st, body)}

    async def pause(self, mode: str = "abort", urls: list[str] | None = None) -> list[str]:
        """``POST /pause_generation {"mode": mode}`` on every worker; returns the worker URLs.

        Raises:
            WeightSyncError: a worker did not answer 200.
        """
        answers = await self._all("POST", "/pause_generation", {"mode": mode}, urls)
        bad = self._failures(answers, lambda st, _: st == 200)
        if bad:
            raise WeightSyncError(f"pause_generation(mode={mode})", bad)
        return list(answers)

    async def resume(self, urls: list[str] | None = None) -> list[str]:
        """``POST /continue_generation {}`` on every worker; returns the worker URLs.

        Raises:
            WeightSyncError: a worker did not answer 200.
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
        """
        answers = await self._all("GET", "/model_info", None, urls)
        bad = self._failures(answers, lambda st, _: st == 200)
        if bad:
            raise WeightSyncError("model_info", bad)
        return {u: (None if not isinstance(b, dict) or b.get("weight_version") is None else str(b["weight_version"])) for u, (_, b) in answers.items()}

    async def abort(self, rid: str | None = None, urls: list[str] | None = None) -> int:
        """``POST /abort_request`` with ``{"rid": rid}`` (or ``{"abort_all": true}``) on every
        worker; returns how many accepted. Failures are logged, not raised (an abort is best effort)."""
        try:
            answers = await self._all("POST", "/abort_request", {"rid": rid} if rid else {"abort_all": True}, urls)
        except PolicyServerError as e:
            logger.warning("abort: %s", e)
            return 0
        for u, (st, body) in answers.items():
            if st != 200:
                logger.warning("abort on %s: %s", u, body if not st else f"HTTP {st}")
        return sum(1 for st, _ in answers.values() if st == 200)
