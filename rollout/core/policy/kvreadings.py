"""Reading the workers' KV state for the KV gate (:mod:`rollout.core.policy.kvgate`): which
workers there are (``pool.adaptive_concurrency.worker_urls`` or the router's ``GET /workers``,
sglang-router 0.3.2's answer ``{"workers": [{"url", "is_healthy", ...}]}``), which of them the
router counts unhealthy, and what each one's ``/metrics`` says, in the engine's metric names
(:class:`KVMetrics`: SGLang's, ``python/sglang/srt/metrics/collector.py``, are
:data:`SGLANG_KV_METRICS`; vLLM's are :data:`rollout.core.policy.vllm.VLLM_KV_METRICS`)."""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import operator
from dataclasses import dataclass
from typing import Awaitable, Callable, Mapping, NamedTuple

import aiohttp

from rollout.core.policy.auth import auth_headers, describe_error
from rollout.core.policy.protocol import PolicyServerError
from rollout.core.telemetry import promtext

__all__ = ["KV_TOKENS", "RETRACTIONS", "SGLANG_KV_METRICS", "TOKEN_USAGE", "WORKERS_REFRESH_POLLS", "KVMetrics", "Reading",
           "WorkerReader", "label_metric", "metric", "parse_token_usage"]

logger = logging.getLogger(__name__)

TOKEN_USAGE = "sglang:token_usage"  # SGLang's gauge: KV tokens in use / KV pool size (0..1)
RETRACTIONS = "sglang:num_retracted_requests_total"  # SGLang's counter of retracted requests
KV_TOKENS = "sglang:max_total_num_tokens"  # SGLang's gauge: the KV pool's size in tokens
WORKERS_REFRESH_POLLS = 30  # polls between two reads of the router's worker list


class Reading(NamedTuple):
    """One worker's ``/metrics`` at one poll (each ``None`` when not reported or unreadable).

    Attributes:
        usage: the share of its KV pool in use (0..1; the largest sample, e.g. over data-parallel
            ranks): ``sglang:token_usage``, ``vllm:kv_cache_usage_perc``.
        retractions: requests pushed out of the KV pool to be recomputed later, a counter (summed
            over samples): ``sglang:num_retracted_requests_total``, ``vllm:num_preemptions_total``.
        kv_tokens: its KV pool's size in tokens (summed): ``sglang:max_total_num_tokens``, vLLM's
            ``kv_cache_size_tokens`` label of ``vllm:cache_config_info``.
    """

    usage: float | None
    retractions: float | None
    kv_tokens: float | None


@dataclass(frozen=True)
class KVMetrics:
    """Where an engine's ``/metrics`` holds the three figures of a :class:`Reading`.

    Attributes:
        prefix: what every name read starts with (``"sglang:"``), to parse only those lines.
        usage: the gauge of the KV pool's share in use (0..1).
        retractions: the counter of requests pushed out of the KV pool.
        kv_tokens: the KV pool's size in tokens: the gauge of that name, or, when
            ``kv_tokens_label`` is set, that label's value on the info gauge of that name (vLLM
            reports its capacity only as a label).
        kv_tokens_label: see ``kv_tokens``; ``None``: a plain gauge.
    """

    prefix: str
    usage: str
    retractions: str
    kv_tokens: str
    kv_tokens_label: str | None = None

    def reading(self, samples: list[promtext.Sample]) -> Reading | None:
        """The :class:`Reading` of parsed ``samples``, or ``None`` when they hold no usage sample."""
        usage = metric(samples, self.usage, max)
        if usage is None:
            return None
        tokens = (metric(samples, self.kv_tokens, operator.add) if self.kv_tokens_label is None
                  else label_metric(samples, self.kv_tokens, self.kv_tokens_label))
        return Reading(usage, metric(samples, self.retractions, operator.add), tokens)


SGLANG_KV_METRICS = KVMetrics("sglang:", TOKEN_USAGE, RETRACTIONS, KV_TOKENS)


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


def label_metric(samples: list[promtext.Sample], name: str, label: str) -> float | None:
    """The sum over the samples of metric ``name`` of their label ``label`` read as a number (an
    info gauge that carries a figure as a label, e.g. vLLM's ``vllm:cache_config_info``'s
    ``kv_cache_size_tokens``, one sample per engine), or ``None`` when no sample has it as a finite number."""
    values = []
    for s in promtext.select(samples, name):
        try:
            v = float(s.labels.get(label, ""))
        except ValueError:
            continue
        if math.isfinite(v):
            values.append(v)
    return sum(values) if values else None



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
        metrics: the engine's metric names (default SGLang's).
    """

    def __init__(self, session: aiohttp.ClientSession, timeout_s: float, worker_urls: list[str] | None = None,
                 list_workers: Callable[[], Awaitable[Mapping[str, bool]]] | None = None, api_key: str | None = None,
                 metrics: KVMetrics = SGLANG_KV_METRICS) -> None:
        self.session = session
        self.metrics = metrics
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
        when ``/metrics`` cannot be read: refused, timed out, not 200, no usage sample, e.g.
        ``sglang:token_usage``). A failure is logged once (WARNING) until the worker reads again (INFO)."""
        error = ""
        names = self.metrics
        try:
            timeout = aiohttp.ClientTimeout(total=self.timeout_s)
            async with self.session.get(url + "/metrics", headers=self._headers, timeout=timeout) as r:
                if r.status == 200:
                    samples = promtext.parse(await r.text(errors="replace"), names.prefix, strict=False)  # once per read
                    reading = names.reading(samples)
                    if reading is not None:
                        if url in self._failing:
                            self._failing.discard(url)
                            logger.info("KV gate: %s/metrics reads again (%s %.3f)", url, names.usage, reading.usage)
                        return reading
                    error = f"no {names.usage} sample"
                else:
                    error = f"HTTP {r.status}"
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            error = describe_error(e, self._api_key) if not isinstance(e, asyncio.TimeoutError) else f"timed out after {self.timeout_s:g} s"
        if url not in self._failing:
            self._failing.add(url)
            logger.warning("KV gate: cannot read %s/metrics (%s); its KV usage counts as unknown and nothing is held for it "
                           "(logged once until it reads again)", url, error)
        return Reading(None, None, None)
