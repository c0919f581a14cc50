"""KV-aware concurrency: hold ``/generate`` calls while the workers' KV cache is nearly full.

SGLang admits requests until its KV pool is full and then *retracts* running requests (they go
back to the queue and their prefill is redone later: the work spent on it is thrown away). A
rollout pool that keeps ``pool.max_concurrent_episodes`` episodes in flight per actor whatever the
servers' state pushes them there whenever contexts grow long. prime-rl's orchestrator grows and
trims its in-flight rollouts from the inference servers' KV pressure, and verl's RFC #6383 asks for
the same (issue 23's anchors); this module is our version of the idea, kept to one signal and two
marks.

:class:`KVGate` is one per actor, shared by all its episodes. A poller task reads each worker's
``/metrics`` every ``poll_interval_s`` seconds and takes SGLang's gauge ``sglang:token_usage``
(the share of the KV pool in use, 0..1; several samples of it, e.g. one per data-parallel rank,
count as their maximum). The workers' readings become one figure by ``signal`` (``max``: the
fullest worker; ``mean``). The gate closes when that figure reaches ``high_water`` and opens
again once it is below ``low_water`` (hysteresis: between the marks it stays as it was).
:class:`~rollout.core.policy.sglang.SGLangClient` awaits :meth:`KVGate.wait` before each
``/generate`` attempt, so a closed gate holds both an episode's first call (a new episode) and
every later turn; calls already out go on. ``pool.max_concurrent_episodes`` stays the upper bound:
the gate only ever holds calls back.

Failures never stall the pool: a worker whose ``/metrics`` cannot be read (refused, timed out,
not 200, no ``sglang:token_usage`` sample) has an unknown reading and is left out of the figure;
with no reading at all the figure is unknown and the gate opens (nothing is held on a guess). Each
worker's failure is logged once (WARNING) until it reads again (INFO).

Which workers: ``worker_urls`` from the config, else the workers the router lists
(``GET /workers``, sglang-router 0.3.2's answer ``{"workers": [{"url", ...}]}``), re-read every
:data:`WORKERS_REFRESH_POLLS` polls and whenever the list could not be read.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Callable

import aiohttp

from rollout.core.adaptive import AdaptiveConcurrencyConfig
from rollout.core.choices import KVSignal
from rollout.core.policy.auth import auth_headers, describe_error
from rollout.core.policy.protocol import PolicyServerError

logger = logging.getLogger(__name__)

TOKEN_USAGE = "sglang:token_usage"  # SGLang's gauge: KV tokens in use / KV pool size (0..1)
WORKERS_REFRESH_POLLS = 30  # polls between two reads of the router's worker list


def parse_token_usage(text: str) -> float | None:
    """The ``sglang:token_usage`` of a Prometheus text exposition: the largest value among its
    samples (any labels), or ``None`` when it has none that parses as a finite number."""
    best: float | None = None
    for line in text.splitlines():
        if not line.startswith(TOKEN_USAGE):
            continue
        rest = line[len(TOKEN_USAGE):]
        if rest and rest[0] not in " {":  # another metric whose name starts the same
            continue
        if rest.startswith("{"):
            end = rest.rfind("}")
            if end < 0:
                continue
            rest = rest[end + 1:]
        parts = rest.split()
        if not parts:
            continue
        try:
            value = float(parts[0])
        except ValueError:
            continue
        if math.isfinite(value):
            best = value if best is None else max(best, value)
    return best


class KVGate:
    """One actor's KV-aware gate (see the module docstring).

    Args:
        cfg: ``pool.adaptive_concurrency`` (``high_water``, ``low_water``, ``poll_interval_s``,
            ``timeout_s``, ``signal``, ``worker_urls``).
        session: the actor's aiohttp session (used for ``/metrics`` and ``/workers``).
        list_workers: coroutine function listing the worker URLs (the router's ``GET /workers``:
            :meth:`~rollout.core.policy.admin.RouterAdmin.worker_urls`); unused when
            ``cfg.worker_urls`` is set.
        api_key: sent as ``Authorization: Bearer`` on ``/metrics`` reads (SGLang exempts
            ``/metrics`` from its key; a proxy may not).

    Attributes:
        closed: whether calls are held now.
        usage: the last figure (share of the KV budget), ``None`` if unknown.
        readings: worker URL -> its last reading (``None``: unknown).
        holds: times the gate closed; held_s: seconds calls waited in all (summed over calls).
        polls: polls done.
    """

    def __init__(self, cfg: AdaptiveConcurrencyConfig, session: aiohttp.ClientSession,
                 list_workers: Callable[[], "asyncio.Future[list[str]] | object"] | None = None,
                 api_key: str | None = None) -> None:
        self.cfg = cfg
        self.session = session
        self._list_workers = list_workers
        self._headers = auth_headers(api_key)
        self._api_key = api_key
        self._open = asyncio.Event()
        self._open.set()
        self._first = asyncio.Event()  # set once the first poll is done: calls wait for it
        self._task: asyncio.Task | None = None
        self._urls: list[str] = [u.rstrip("/") for u in cfg.worker_urls] if cfg.worker_urls else []
        self._failing: set[str] = set()
        self._list_failed = False
        self.usage: float | None = None
        self.readings: dict[str, float | None] = {}
        self.holds = 0
        self.held_s = 0.0
        self.polls = 0

    @property
    def closed(self) -> bool:
        """Whether calls are held now."""
        return not self._open.is_set()

    def start(self) -> None:
        """Start the poller on the running loop (idempotent; :meth:`wait` calls it)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._poll_loop(), name="kv-gate-poller")

    async def wait(self) -> float:
        """Wait while the gate is closed; returns the seconds waited (0.0 when it was open). The
        first calls also wait for the first poll (bounded by ``timeout_s`` per read), so that a
        pool starting against full workers does not send its first turns blind."""
        self.start()
        if not self._first.is_set():  # (not counted as held: the gate has not judged yet)
            await self._first.wait()
        if self._open.is_set():
            return 0.0
        t0 = time.monotonic()
        await self._open.wait()
        waited = time.monotonic() - t0
        self.held_s += waited
        return waited

    def update(self, usage: float | None) -> None:
        """Apply one figure: close at ``>= high_water``, open below ``low_water`` or when unknown."""
        self.usage = usage
        if usage is None:
            if self.closed:
                logger.info("KV gate: no worker's KV usage can be read; held calls go on (unknown is never held)")
            self._open.set()
        elif not self.closed and usage >= self.cfg.high_water:
            self.holds += 1
            self._open.clear()
            logger.debug("KV gate closed: KV usage %.3f >= high water %.3f", usage, self.cfg.high_water)
        elif self.closed and usage < self.cfg.low_water:
            self._open.set()
            logger.debug("KV gate opened: KV usage %.3f < low water %.3f", usage, self.cfg.low_water)

    async def poll_once(self) -> float | None:
        """Read every worker once, apply the figure (:meth:`update`) and return it."""
        urls = await self._workers()
        values = await asyncio.gather(*[self._read(u) for u in urls]) if urls else []
        self.readings = dict(zip(urls, values))
        known = [v for v in values if v is not None]
        if not known:
            figure = None
        elif self.cfg.signal == KVSignal.MEAN:
            figure = sum(known) / len(known)
        else:
            figure = max(known)
        self.polls += 1
        self.update(figure)
        self._first.set()
        return figure

    async def _workers(self) -> list[str]:
        if self.cfg.worker_urls or self._list_workers is None:
            return self._urls
        if self._urls and not self._list_failed and self.polls % WORKERS_REFRESH_POLLS:
            return self._urls
        try:
            self._urls = [str(u).rstrip("/") for u in await self._list_workers()]  # type: ignore[misc]
            if self._list_failed:
                logger.info("KV gate: the router's worker list reads again (%d workers)", len(self._urls))
            self._list_failed = False
        except (PolicyServerError, aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            if not self._list_failed:
                logger.warning("KV gate: cannot list the workers (%s); their KV usage is unknown meanwhile and "
                               "nothing is held for it", describe_error(e, self._api_key))
            self._list_failed = True
        return self._urls

    async def _read(self, url: str) -> float | None:
        error = ""
        try:
            timeout = aiohttp.ClientTimeout(total=self.cfg.timeout_s)
            async with self.session.get(url + "/metrics", headers=self._headers, timeout=timeout) as r:
                if r.status == 200:
                    value = parse_token_usage(await r.text(errors="replace"))
                    if value is not None:
                        if url in self._failing:
                            self._failing.discard(url)
                            logger.info("KV gate: %s/metrics reads again (%s %.3f)", url, TOKEN_USAGE, value)
                        return value
                    error = f"no {TOKEN_USAGE} sample"
                else:
                    error = f"HTTP {r.status}"
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            error = describe_error(e, self._api_key) if not isinstance(e, asyncio.TimeoutError) else f"timed out after {self.cfg.timeout_s:g} s"
        if url not in self._failing:
            self._failing.add(url)
            logger.warning("KV gate: cannot read %s/metrics (%s); its KV usage counts as unknown and nothing is held for it "
                           "(logged once until it reads again)", url, error)
        return None

    async def _poll_loop(self) -> None:
        while True:
            try:
                await self.poll_once()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a bug here must not hold the pool: open and go on polling
                logger.exception("KV gate: poll failed (%r); the gate opens", e)
                self.update(None)
                self._first.set()
            await asyncio.sleep(self.cfg.poll_interval_s)

    def stats(self) -> dict:
        """``{"closed", "usage", "holds", "held_s", "polls", "workers"}`` for logs and :meth:`RolloutWorker.info`."""
        return {"closed": self.closed, "usage": self.usage, "holds": self.holds, "held_s": round(self.held_s, 3),
                "polls": self.polls, "workers": len(self.readings)}

    def close(self) -> None:
        """Stop the poller and open the gate (idempotent)."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
        self._open.set()
        self._first.set()
