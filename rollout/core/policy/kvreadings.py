"""Reading the workers' KV state for the KV gate (:mod:`rollout.core.policy.kvgate`): which
workers there are (``pool.adaptive_concurrency.worker_urls`` or the router's ``GET /workers``,
sglang-router 0.3.2's answer ``{"workers": [{"url", "is_healthy", ...}]}``), which of them the
router counts unhealthy, and what each one's ``/metrics`` says, in SGLang's metric names (``python/sglang/srt/metrics/collector.py``)."""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import operator
from typing import Awaitable, Callable, Mapping, NamedTuple

import aiohttp

from rollout.core.policy.auth import auth_headers, describe_error
from rollout.core.policy.protocol import PolicyServerError
from rollout.core.telemetry import promtext

__all__ = ["KV_TOKENS", "RETRACTIONS", "TOKEN_USAGE", "WORKERS_REFRESH_POLLS", "Reading", "WorkerReader", "metric",
           "parse_token_usage"]

logger = logging.getLogger(__name__)

TOKEN_USAGE = "sglang:token_usage"  # SGLang's gauge: KV tokens in use / KV pool size (0..1)
RETRACTIONS = "sglang:num_retracted_requests_total"  # SGLang's counter of retracted requests
KV_TOKENS = "sglang:max_total_num_tokens"  # SGLang's gauge: the KV pool's size in tokens
WORKERS_REFRESH_POLLS = 30  # polls between two reads of the router's worker list


class Reading(NamedTuple):
    """One worker's ``/metrics`` at one poll (each ``None`` when not reported or unreadable).

    Attributes:
        usage: ``sglang:token_usage``, the share of its KV pool in use (0..1; the largest sample,
            e.g. over data-parallel ranks).
        retractions: ``sglang:num_retracted_requests_total`` (summed over samples).
        kv_tokens: ``sglang:max_total_num_tokens``, its KV pool's size in tokens (summed).
    """

    usage: float | None
    retractions: float | None
    kv_tokens: float | None


def parse_token_usage(text: str) -> float | None:
    """The ``sglang:token_usage`` of a Prometheus text exposition: the largest value among its
    samples (any labels), or ``None`` when it has none that parses as a finite number."""
    return metric(promtext.parse(text, TOKEN_USAGE, strict=False), TOKEN_USAGE, max)


def metric(samples: list[promtext.Sample], name: str, combine: Callable[[float, float], float]) -> float | None:
    """Metric ``name`` among parsed ``samples``: its finite values (any labels) combined by
    ``combine`` (e.g. ``max`` for a gauge per rank, ``operator.add`` for a counter per rank), or
    ``None`` when it has none."""
    values = [s.value for s in promtext.select(samples, name) if math.isfinite(s.value)]
    return functools.reduce(combine, values) if values else None



class WorkerReader:
    """Lists the workers and reads their ``/metrics`` (one per gate).

    Args:
        session: the actor's aiohttp session.
        timeout_s: bound on one read (seconds); a read past it is unknown.
        worker_urls: fixed worker URLs (``pool.adaptive_concurrency.worker_urls``), or ``None``:
            ``list_workers``'s.
        list_workers: coroutine function giving worker URL -> whether the router counts it
            healthy, in the router's order (its ``GET /workers``:
            :meth:`~rollout.core.policy.admin.RouterAdmin.worker_health`).
        api_key: sent as ``Authorization: Bearer`` (SGLang exempts ``/metrics`` from its key; a
            proxy may not).
    """

    def __init__(self, session: aiohttp.ClientSession, timeout_s: float, worker_urls: list[str] | None = None,
                 list_workers: Callable[[], Awaitable[Mapping[str, bool]]] | None = None, api_key: str | None = None) -> None:
        self.session = session
        self.timeout_s = timeout_s
        self._fixed = bool(worker_urls)
        self._urls: list[str] = [u.rstrip("/") for u in worker_urls] if worker_urls else []
        self._list_workers = list_workers
        self._headers = auth_headers(api_key)
        self._api_key = api_key
        self._failing: set[str] = set()
        self._list_failed = False
        self.unhealthy: frozenset[str] = frozenset()  # listed workers the router counts unhealthy, at the last read

    async def workers(self, polls: int) -> list[str]:
        """The worker URLs: ``worker_urls`` when set, else the router's list, re-read when
        ``polls`` is a multiple of :data:`WORKERS_REFRESH_POLLS`, after a failed read and while
        the router counts a worker unhealthy (so that its return is seen at the next poll); the
        last list is kept meanwhile, and a failure is logged once. :attr:`unhealthy` is the
        router's unhealthy workers at the last read (empty with ``worker_urls``)."""
        if self._fixed or self._list_workers is None:
            return self._urls
        if self._urls and not self._list_failed and not self.unhealthy and polls % WORKERS_REFRESH_POLLS:
            return self._urls
        try:
            health = {str(u).rstrip("/"): ok for u, ok in (await self._list_workers()).items()}
            if self._list_failed:
                logger.info("KV gate: the router's worker list reads again (%d workers)", len(health))
            self._list_failed = False
            self._urls = list(health)
            self.unhealthy = frozenset(u for u, ok in health.items() if not ok)
        except (PolicyServerError, aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            if not self._list_failed:
                logger.warning("KV gate: cannot list the workers (%s); their KV usage is unknown meanwhile and "
                               "nothing is held for it", describe_error(e, self._api_key))
            self._list_failed = True
        return self._urls

    async def read(self, url: str) -> Reading:
        """One worker's :class:`Reading` (each field ``None`` when not reported; all ``None``
        when ``/metrics`` cannot be read: refused, timed out, not 200, no ``sglang:token_usage``
        sample). A failure is logged once (WARNING) until the worker reads again (INFO)."""
        error = ""
        try:
            timeout = aiohttp.ClientTimeout(total=self.timeout_s)
            async with self.session.get(url + "/metrics", headers=self._headers, timeout=timeout) as r:
                if r.status == 200:
                    samples = promtext.parse(await r.text(errors="replace"), "sglang:", strict=False)  # once per read
                    value = metric(samples, TOKEN_USAGE, max)
                    if value is not None:
                        if url in self._failing:
                            self._failing.discard(url)
                            logger.info("KV gate: %s/metrics reads again (%s %.3f)", url, TOKEN_USAGE, value)
                        return Reading(value, metric(samples, RETRACTIONS, operator.add), metric(samples, KV_TOKENS, operator.add))
                    error = f"no {TOKEN_USAGE} sample"
                else:
                    error = f"HTTP {r.status}"
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            error = describe_error(e, self._api_key) if not isinstance(e, asyncio.TimeoutError) else f"timed out after {self.timeout_s:g} s"
        if url not in self._failing:
            self._failing.add(url)
            logger.warning("KV gate: cannot read %s/metrics (%s); its KV usage counts as unknown and nothing is held for it "
                           "(logged once until it reads again)", url, error)
        return Reading(None, None, None)
