"""Policy client for SGLang's native ``/generate`` API (token in, token out).

Every request sends ``input_ids``; the generated ids and their log-probs are read from
``meta_info.output_token_logprobs`` (``[[logprob, token_id, text], ...]``), never re-tokenized
from text (DESIGN.md "SGLang native protocol"). Requests carry ``rid`` (used to abort) and the
header ``X-SMG-Routing-Key: <episode id>`` so that a consistent-hashing router keeps an episode's
turns on one worker (prefix-cache reuse).
"""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass, field
from typing import Protocol

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
    """

    ids: list[int]
    log_probs: list[float]
    finish_type: str
    matched: int | str | None = None
    text: str = ""
    meta: dict = field(default_factory=dict)


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
    return Generation(ids=ids, log_probs=lps, finish_type=finish_type, matched=fr.get("matched") if isinstance(fr, dict) else None, text=body.get("text", ""), meta=meta)


class SGLangClient:
    """``/generate`` client over one shared aiohttp session.

    Args:
        cfg: the ``policy`` section (``router_url`` must be resolved).
        session: an aiohttp session owned by the caller (one per actor).

    Retries connection errors and 5xx answers ``cfg.max_request_retries`` times with jittered
    exponential back-off; 4xx answers are not retried.
    """

    def __init__(self, cfg: PolicyConfig, session: aiohttp.ClientSession):
        if not cfg.router_url:
            raise ValueError("policy.router_url is not set")
        self.cfg = cfg
        self.session = session
        self.url = cfg.router_url.rstrip("/") + "/generate"

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
                return parse_generate_response(data)
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as e:
                last = e
                logger.warning("rid=%s: /generate attempt %d failed: %r", rid, attempt + 1, e)
            except asyncio.TimeoutError:
                raise PolicyServerError(f"/generate timed out after {self.cfg.request_timeout_s}s") from None
        raise PolicyServerError(f"/generate failed after {self.cfg.max_request_retries + 1} attempts: {last!r}")


async def abort_all(router_url: str, session: aiohttp.ClientSession, rid: str | None = None) -> int:
    """Abort in-flight requests on every worker the router lists (the router answers 404 to
    ``/abort_request`` itself, so the abort goes to each worker from ``GET /workers``).

    Args:
        rid: one request id, or ``None`` for every request.

    Returns:
        The number of workers that accepted the abort.
    """
    try:
        async with session.get(router_url.rstrip("/") + "/workers", timeout=aiohttp.ClientTimeout(total=10)) as r:
            workers = (await r.json(content_type=None)).get("workers", [])
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
        logger.warning("abort: cannot list workers at %s: %r", router_url, e)
        return 0
    body = {"rid": rid} if rid else {"abort_all": True}
    ok = 0
    for w in workers:
        url = (w.get("url") if isinstance(w, dict) else str(w)).rstrip("/")
        try:
            async with session.post(url + "/abort_request", json=body, timeout=aiohttp.ClientTimeout(total=10)) as r:
                ok += r.status == 200
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            logger.warning("abort: worker %s: %r", url, e)
    return ok
