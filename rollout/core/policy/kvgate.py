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

Open, the gate still caps the actor's calls in flight (additive increase, multiplicative decrease,
as TCP's congestion window): when the gate opens, held calls go out at most ``limit`` at a time
instead of all at once (a first version released every held call together and refilled the
servers' KV at once: ``python -m rollout.bench routing`` measured 8-33% of prefill still lost with
the gate on). The limit starts at ``start_calls_per_worker`` x workers at the first reading, grows
by one call per worker per poll while the figure is below ``low_water`` and the cap binds, and is
cut by ``decrease_factor`` (at most every other poll) when the gate closes or when the workers'
``sglang:num_retracted_requests_total`` grew since the last poll (a retraction is the waste the
gate exists to prevent, and the servers report it before the usage figure shows why); it never
goes below one call per worker. Unknown readings lift the cap, as they open the gate.

The call cap alone learns only from retractions, after the waste. Where the workers report their KV
pool's size (SGLang's ``sglang:max_total_num_tokens``), the gate also reserves KV tokens before it
admits a call: a call reserves its prompt plus the tokens it is expected to generate (twice the
mean of this actor's last answers, ``max_new_tokens`` until 8 answers are known; capped by
``max_new_tokens``), and the actor's reservations stay within its share (``share``, one actor's
part of the pool: 1 / ``pool.num_actors``) of ``high_water`` x the workers' KV tokens, the way
SGLang's scheduler reserves room for a request's decode before admitting it. A call is always
admitted when the actor has none out (a prompt larger than the share is not starved).

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
import collections
import functools
import logging
import math
import operator
import time
from typing import Callable

import aiohttp

from rollout.core.adaptive import AdaptiveConcurrencyConfig
from rollout.core.choices import KVSignal
from rollout.core.policy.auth import auth_headers, describe_error
from rollout.core.policy.protocol import PolicyServerError
from rollout.core.telemetry import promtext

logger = logging.getLogger(__name__)

TOKEN_USAGE = "sglang:token_usage"  # SGLang's gauge: KV tokens in use / KV pool size (0..1)
RETRACTIONS = "sglang:num_retracted_requests_total"  # SGLang's counter of retracted requests
KV_TOKENS = "sglang:max_total_num_tokens"  # SGLang's gauge: the KV pool's size in tokens
EXPECTED_AFTER = 8  # answers seen before the expected answer length replaces max_new_tokens
WORKERS_REFRESH_POLLS = 30  # polls between two reads of the router's worker list


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
        share: this actor's part of the workers' KV (1 / ``pool.num_actors``), in (0, 1].

    Raises:
        ValueError: ``share`` outside (0, 1].

    Attributes:
        closed: whether calls are held now (the figure passed ``high_water`` and has not yet
            fallen below ``low_water``).
        limit: the cap on this actor's calls in flight while open (``None``: no cap, before the
            first reading or while the figure is unknown); in_flight: calls holding a slot.
        retractions: the workers' ``sglang:num_retracted_requests_total`` summed at the last
            poll (``None`` where no worker reports it); cuts: times the limit was cut.
        token_cap: KV tokens this actor may reserve (``share`` x ``high_water`` x the workers'
            ``sglang:max_total_num_tokens``; ``None``: not reported, no reservation);
            reserved: KV tokens reserved by the calls out.
        usage: the last figure (share of the KV budget), ``None`` if unknown.
        readings: worker URL -> its last reading (``None``: unknown).
        holds: times the gate closed; held_s: seconds calls waited in all (summed over calls).
        polls: polls done.
    """

    def __init__(self, cfg: AdaptiveConcurrencyConfig, session: aiohttp.ClientSession,
                 list_workers: Callable[[], "asyncio.Future[list[str]] | object"] | None = None,
                 api_key: str | None = None, share: float = 1.0) -> None:
        if not 0 < share <= 1:
            raise ValueError(f"share must be in (0, 1], got {share}")
        self.cfg = cfg
        self.share = share
        self.token_cap: float | None = None
        self.reserved = 0
        self._answers = 0
        self._answer_tokens = 0
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
        self.limit: int | None = None
        self.in_flight = 0
        self.retractions: float | None = None
        self.cuts = 0
        self._workers_known = 1
        self._last_cut = -2  # poll number of the last cut
        self._waiters: collections.deque[tuple[asyncio.Future, int]] = collections.deque()

    @property
    def closed(self) -> bool:
        """Whether calls are held now."""
        return not self._open.is_set()

    def start(self) -> None:
        """Start the poller on the running loop (idempotent; :meth:`wait` calls it)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._poll_loop(), name="kv-gate-poller")

    def cost(self, prompt_tokens: int, max_new_tokens: int) -> int:
        """KV tokens a call reserves: its prompt plus the answer expected (twice the mean of this
        actor's answers once :data:`EXPECTED_AFTER` are known, else ``max_new_tokens``; at most
        ``max_new_tokens``)."""
        if self._answers >= EXPECTED_AFTER:
            expected = min(max_new_tokens, math.ceil(2 * self._answer_tokens / self._answers))
        else:
            expected = max_new_tokens
        return max(0, int(prompt_tokens)) + max(0, int(expected))

    def _admits(self, cost: int = 0) -> bool:
        if not self._open.is_set():
            return False
        if self.limit is not None and self.in_flight >= self.limit:
            return False
        return self.token_cap is None or self.in_flight == 0 or self.reserved + cost <= self.token_cap

    def _wake(self) -> None:
        """Hand free slots to the oldest waiters (FIFO), as many as the gate admits."""
        while self._waiters:
            fut, cost = self._waiters[0]
            if fut.done():
                self._waiters.popleft()
                continue
            if not self._admits(cost):
                break
            self._waiters.popleft()
            self.in_flight += 1
            self.reserved += cost
            fut.set_result(None)

    async def acquire(self, cost: int = 0) -> float:
        """Take a slot for one ``/generate`` attempt, waiting while the gate is closed or the
        actor's calls in flight are at :attr:`limit` or its reserved KV tokens would pass
        :attr:`token_cap` (FIFO); ``cost``: the call's KV tokens (:meth:`cost`). Returns the
        seconds waited (0.0 when admitted at once). The first calls also wait for the first poll (bounded by
        ``timeout_s`` per read), so that a pool starting against full workers does not send its
        first turns blind. Every successful ``acquire`` must be paired with
        :meth:`release` of the same cost.

        Raises:
            asyncio.CancelledError: the caller was cancelled while waiting (no slot is kept).
        """
        self.start()
        if not self._first.is_set():  # (not counted as held: the gate has not judged yet)
            await self._first.wait()
        if not self._waiters and self._admits(cost):
            self.in_flight += 1
            self.reserved += cost
            return 0.0
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append((fut, cost))
        t0 = time.monotonic()
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():  # granted just as it was cancelled: give it back
                self.release(cost)
            else:
                fut.cancel()
            raise
        waited = time.monotonic() - t0
        self.held_s += waited
        return waited

    def release(self, cost: int = 0, generated: int | None = None) -> None:
        """Give back a slot taken by :meth:`acquire` with ``cost`` (the attempt ended, however);
        ``generated``: the tokens it generated, when it answered (they teach :meth:`cost`)."""
        self.in_flight = max(0, self.in_flight - 1)
        self.reserved = max(0, self.reserved - cost)
        if generated is not None:
            self._answers += 1
            self._answer_tokens += generated
        self._wake()

    async def wait(self) -> float:
        """Wait until the gate would admit a call, without keeping a slot (:meth:`acquire` then
        :meth:`release`); returns the seconds waited."""
        held = await self.acquire()
        self.release()
        return held

    def _cut(self) -> None:
        if self.limit is None or self.polls - self._last_cut < 2:
            return
        floor = self._workers_known
        self.limit = max(floor, int(min(self.limit, max(self.in_flight, floor)) * self.cfg.decrease_factor))
        self._last_cut = self.polls
        self.cuts += 1

    def update(self, usage: float | None, retractions: float | None = None, kv_tokens: float | None = None) -> None:
        """Apply one figure: close at ``>= high_water``, open below ``low_water`` or when unknown;
        and adjust :attr:`limit` (see the module docstring). ``retractions``: the workers'
        retraction counter now (``None``: not reported); ``kv_tokens``: their KV pools' size in
        tokens (``None``: not reported; no token reservation)."""
        self.usage = usage
        self.token_cap = None if kv_tokens is None or usage is None else self.share * self.cfg.high_water * kv_tokens
        retracted = (retractions is not None and self.retractions is not None and retractions > self.retractions)
        self.retractions = retractions
        if usage is None:
            if self.closed:
                logger.info("KV gate: no worker's KV usage can be read; held calls go on (unknown is never held)")
            self._open.set()
            self.limit = None
            self._wake()
            return
        if self.limit is None:
            self.limit = self.cfg.start_calls_per_worker * self._workers_known
        if not self.closed and usage >= self.cfg.high_water:
            self.holds += 1
            self._open.clear()
            self._cut()
            logger.debug("KV gate closed: KV usage %.3f >= high water %.3f (limit %s)", usage, self.cfg.high_water, self.limit)
        elif self.closed and usage < self.cfg.low_water:
            self._open.set()
            logger.debug("KV gate opened: KV usage %.3f < low water %.3f (limit %s)", usage, self.cfg.low_water, self.limit)
        if retracted:
            self._cut()
        elif not self.closed and usage < self.cfg.low_water and self.in_flight + len(self._waiters) >= self.limit:
            self.limit += self._workers_known  # additive increase, only while the cap binds
        self._wake()

    async def poll_once(self) -> float | None:
        """Read every worker once, apply the figure (:meth:`update`) and return it."""
        urls = await self._workers()
        triples = await asyncio.gather(*[self._read(u) for u in urls]) if urls else []
        values = [v for v, _, _ in triples]
        self.readings = dict(zip(urls, values))
        self._workers_known = max(1, len(urls))
        readable = sum(v is not None for v in values)
        counts = [c for v, c, _ in triples if v is not None and c is not None]
        retractions = sum(counts) if counts and len(counts) == readable else None
        sizes = [k for v, _, k in triples if v is not None and k is not None]
        kv_tokens = sum(sizes) if sizes and len(sizes) == readable else None
        known = [v for v in values if v is not None]
        if not known:
            figure = None
        elif self.cfg.signal == KVSignal.MEAN:
            figure = sum(known) / len(known)
        else:
            figure = max(known)
        self.polls += 1
        self.update(figure, retractions, kv_tokens)
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

    async def _read(self, url: str) -> tuple[float | None, float | None, float | None]:
        """``(token usage, retraction counter, KV pool tokens)`` of one worker (each ``None`` when
        not reported); ``(None, None, None)`` when unreadable."""
        error = ""
        try:
            timeout = aiohttp.ClientTimeout(total=self.cfg.timeout_s)
            async with self.session.get(url + "/metrics", headers=self._headers, timeout=timeout) as r:
                if r.status == 200:
                    samples = promtext.parse(await r.text(errors="replace"), "sglang:", strict=False)  # once per read
                    value = metric(samples, TOKEN_USAGE, max)
                    if value is not None:
                        if url in self._failing:
                            self._failing.discard(url)
                            logger.info("KV gate: %s/metrics reads again (%s %.3f)", url, TOKEN_USAGE, value)
                        return value, metric(samples, RETRACTIONS, operator.add), metric(samples, KV_TOKENS, operator.add)
                    error = f"no {TOKEN_USAGE} sample"
                else:
                    error = f"HTTP {r.status}"
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            error = describe_error(e, self._api_key) if not isinstance(e, asyncio.TimeoutError) else f"timed out after {self.cfg.timeout_s:g} s"
        if url not in self._failing:
            self._failing.add(url)
            logger.warning("KV gate: cannot read %s/metrics (%s); its KV usage counts as unknown and nothing is held for it "
                           "(logged once until it reads again)", url, error)
        return None, None, None

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
        """``{"closed", "usage", "holds", "held_s", "polls", "workers", "limit", "in_flight", "waiting",
        "cuts", "token_cap", "reserved"}`` for logs and :meth:`RolloutWorker.info`."""
        return {"closed": self.closed, "usage": self.usage, "holds": self.holds, "held_s": round(self.held_s, 3),
                "polls": self.polls, "workers": len(self.readings), "limit": self.limit, "in_flight": self.in_flight,
                "waiting": len(self._waiters), "cuts": self.cuts, "token_cap": self.token_cap, "reserved": self.reserved}

    def close(self) -> None:
        """Stop the poller and open the gate (idempotent)."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
        self._open.set()
        self._first.set()
        self.limit = None
        self._wake()
