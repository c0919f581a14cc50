"""KV-aware concurrency: hold ``/generate`` calls while the workers' KV cache is nearly full.

SGLang admits requests until its KV pool is full and then *retracts* running requests (they go back
to the queue and their prefill is redone later: the work spent on it is thrown away). A rollout
pool that keeps ``pool.max_concurrent_episodes`` episodes in flight per actor whatever the servers'
state pushes them there whenever contexts grow long. prime-rl's orchestrator grows and trims its
in-flight rollouts from the inference servers' KV pressure, and verl's RFC #6383 asks for the same
(issue 23's anchors); this module is our version of the idea, kept to one signal and two marks.

:class:`KVGate` is one per actor, shared by all its episodes. A poller task reads each worker's
``/metrics`` every ``poll_interval_s`` seconds and takes SGLang's gauge ``sglang:token_usage`` (the
share of the KV pool in use, 0..1; several samples of it, e.g. one per data-parallel rank, count as
their maximum). The workers' readings become one figure by ``signal`` (``max``: the fullest worker;
``mean``). The gate closes when that figure reaches ``high_water`` and opens again once it is below
``low_water`` (hysteresis: between the marks it stays as it was).
:class:`~rollout.core.policy.sglang.SGLangClient` takes a :class:`Ticket` from
:meth:`KVGate.acquire` before each ``/generate`` attempt and gives it back after, so a closed gate
holds both an episode's first call (a new episode) and every later turn; calls already out go on.
``pool.max_concurrent_episodes`` stays the upper bound: the gate only ever holds calls back.

Open, the gate still caps the actor's calls in flight (additive increase, multiplicative decrease,
as TCP's congestion window): when the gate opens, held calls go out at most ``limit`` at a time
instead of all at once (a first version released every held call together and refilled the servers'
KV at once: ``python -m rollout.bench routing`` measured 8-33% of prefill still lost with the gate
on). The limit starts at ``start_calls_per_worker`` x workers at the first reading, grows by one
call per worker per poll while the figure is below ``low_water`` and the cap binds, and is cut by
``decrease_factor`` (at most every other poll) when the gate closes or when the workers'
``sglang:num_retracted_requests_total`` grew since the last poll (a retraction is the waste the
gate exists to prevent, and the servers report it before the usage figure shows why); it never goes
below one call per worker. Unknown readings lift the cap, as they open the gate.

The call cap alone learns only from retractions, after the waste. Where the workers report their KV
pool's size (SGLang's ``sglang:max_total_num_tokens``), the gate also reserves KV tokens before it
admits a call: a call reserves its prompt plus the tokens it is expected to generate (the 90th
percentile of this actor's last 256 answer lengths, ``max_new_tokens`` until 8 answers are known; a
first version reserved twice their mean and let the call cap grow only below ``low_water``: with
``placement=gate`` the routing bench's group row then lost no prefill but ran at 0.99x the
episodes/s of the row without the gate, and at 1.07-1.11x with both changed; capped by
``max_new_tokens``), and the actor's reservations stay within its part of ``high_water`` x the
workers' KV tokens (``placement=router``: 1 / ``pool.num_actors`` of all of it; ``gate``: see
below), the way SGLang's scheduler reserves room for a request's decode before admitting it. A call
is always admitted when the actor has none out (a prompt larger than the share is not starved).

**Placement.** Under ``placement=router`` the router picks each call's worker, so the gate can only
treat the workers as one KV pool: a reservation made against the pool may land on a worker that is
already full, and under ``policy.routing=group`` (a whole group on one worker) it often does;
``python -m rollout.bench routing`` measured 11.0% of prefill still lost with the gate on under
``group`` routing and 3.9% under ``episode``, at 0.70x and 0.73x the episodes/s without the gate.
Under ``placement=gate`` (the default) the gate picks the worker itself, so every part of it works
per worker: each actor has its own part of the workers
(:func:`~rollout.core.policy.kvslots.my_workers`: with at least as many workers as actors, each
worker belongs to one actor, which may reserve all its KV), one
:class:`~rollout.core.policy.kvslots.Slot` per worker holds the hysteresis, the cap and the
reservation of that worker alone, a routing key (``policy.routing``: the group or episode id) is
placed at its first call on a worker of this actor's part that has room for it in its KV share and
cap now, the one with the fewest keys (:meth:`KVGate._choose`), and stays there (the
:data:`KEYS_KEPT` keys used last are remembered); the client posts the call to that worker's
``/generate`` directly. One full worker then holds only its own keys' calls, and a new key goes to
a worker with room rather than queueing behind a full one. The router still lists the workers
(``GET /workers``) and serves aborts and weight updates; a call refused in transport by its worker
(:meth:`KVGate.lost`) takes that worker out of placement until its ``/metrics`` reads again and
moves its keys, so the retry goes to another worker; so does a worker the router counts unhealthy
(``"is_healthy": false`` in ``GET /workers``: its health checks failed, and the router itself sends
it nothing), until the router counts it healthy again and it reads. Without that, keys placed on a
worker whose ``/health`` fails but whose ``/metrics`` still answers would keep going to it, around
the router. This is the client-side sticky routing verl's
``AsyncLLMServerManager`` and SkyRL's inference client do, with KV room deciding which workers may
take a new key. With no worker known the call goes to the router, not held.

Failures never stall the pool: a worker whose ``/metrics`` cannot be read (refused, timed out, not
200, no ``sglang:token_usage`` sample) has an unknown reading and is left out of the figure; with
no reading at all the figure is unknown and the gate opens (nothing is held on a guess). Each
worker's failure is logged once (WARNING) until it reads again (INFO).

Which workers: ``worker_urls`` from the config, else the workers the router lists (``GET
/workers``, sglang-router 0.3.2's answer ``{"workers": [{"url", "is_healthy", ...}]}``), re-read
every :data:`~rollout.core.policy.kvreadings.WORKERS_REFRESH_POLLS` polls, at every poll while the
list could not be read or the router counts a worker unhealthy.

**vLLM.** The same gate reads vLLM's own figures when the client speaks vLLM (``policy.engine:
vllm``; :data:`~rollout.core.policy.vllm.VLLM_KV_METRICS`): ``vllm:kv_cache_usage_perc`` (a 0..1
share despite its name; used blocks over the pool's blocks less one), ``vllm:num_preemptions_total``
(vLLM's preemption is SGLang's retraction: the request's KV is dropped and recomputed) and the KV
pool's size in tokens, which vLLM reports only as the label ``kv_cache_size_tokens`` of its info
gauge ``vllm:cache_config_info``. vllm-router lists its workers in the same ``GET /workers`` shape.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from typing import Awaitable, Callable, Mapping

import aiohttp

from rollout.core.choices import KVSignal, Placement
from rollout.core.config import AdaptiveConcurrencyConfig
from rollout.core.policy.kvreadings import SGLANG_KV_METRICS, KVMetrics, WorkerReader
from rollout.core.policy.kvslots import AnswerLengths, Slot, Ticket, my_workers

__all__ = ["KEYS_KEPT", "KVGate", "Ticket"]

logger = logging.getLogger(__name__)

KEYS_KEPT = 65536  # placement=gate: routing keys remembered (least recently used forgotten first)


class KVGate:
    """One actor's KV-aware gate (see the module docstring).

    Args:
        cfg: ``pool.adaptive_concurrency`` (``high_water``, ``low_water``, ``poll_interval_s``,
            ``timeout_s``, ``signal``, ``placement``, ``worker_urls``, ...).
        session: the actor's aiohttp session (used for ``/metrics`` and ``/workers``).
        list_workers: coroutine function giving worker URL -> whether the router counts it
            healthy, in the router's order (its ``GET /workers``:
            :meth:`~rollout.core.policy.admin.RouterAdmin.worker_health`); unused when
            ``cfg.worker_urls`` is set.
        api_key: sent as ``Authorization: Bearer`` on ``/metrics`` reads (SGLang exempts
            ``/metrics`` from its key; a proxy may not).
        actor: this actor's index in the pool, in ``[0, actors)``; actors: ``pool.num_actors``.
            ``placement=router``: the actor reserves ``1 / actors`` of the workers' KV.
            ``placement=gate``: the workers, sorted by URL, are split among the actors
            (:func:`~rollout.core.policy.kvslots.my_workers`): with at least as many workers as
            actors, worker ``w`` is used by actor ``w % actors`` alone (all its KV); with fewer,
            actor ``a`` uses worker ``a % workers``, sharing its KV with the other actors that do.
        metrics: where the engine's ``/metrics`` holds the usage, the retractions and the KV size
            (:class:`~rollout.core.policy.kvreadings.KVMetrics`; default SGLang's names).

    Raises:
        ValueError: ``actor`` outside ``[0, actors)``.

    Attributes (under ``placement=gate`` each is the sum, or for ``usage`` the maximum, over the
    workers; ``closed`` is True when every worker is closed):
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
        polls: polls done. placed: routing key -> worker URL (``placement=gate``, the
            :data:`KEYS_KEPT` keys used last).
    """

    def __init__(self, cfg: AdaptiveConcurrencyConfig, session: aiohttp.ClientSession,
                 list_workers: Callable[[], Awaitable[Mapping[str, bool]]] | None = None,
                 api_key: str | None = None, actor: int = 0, actors: int = 1, metrics: KVMetrics = SGLANG_KV_METRICS) -> None:
        if not 0 <= actor < actors:
            raise ValueError(f"actor must be in [0, {actors}), got {actor}")
        self.cfg = cfg
        self.actor, self.actors = actor, actors
        self.share = 1.0 / actors  # placement=router: this actor's part of the workers' KV
        self.per_worker = cfg.placement == Placement.GATE
        self.answers = AnswerLengths()
        self.session = session
        self._reader = WorkerReader(session, cfg.timeout_s, cfg.worker_urls, list_workers, api_key, metrics)
        self._first = asyncio.Event()  # set once the first poll is done: calls wait for it
        self._task: asyncio.Task | None = None
        self.readings: dict[str, float | None] = {}
        self.held_s = 0.0
        self.polls = 0
        self._pool = Slot(None, self.share)  # placement=router: all workers as one
        self._slots: dict[str, Slot] = {}  # placement=gate: one per worker
        self.placed: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._unplaced: collections.deque[tuple[asyncio.Future, int, str | None]] = collections.deque()

    # ------------------------------------------------------------------ the figures, summed
    def _all(self) -> list[Slot]:
        return list(self._slots.values()) if self.per_worker else [self._pool]

    @property
    def closed(self) -> bool:
        """Whether calls are held now (``placement=gate``: by every worker)."""
        slots = self._all()
        return bool(slots) and all(s.closed for s in slots)

    @property
    def usage(self) -> float | None:
        known = [s.usage for s in self._all() if s.usage is not None]
        return max(known) if known else None

    @property
    def limit(self) -> int | None:
        limits = [s.limit for s in self._all()]
        return None if not limits or any(x is None for x in limits) else sum(limits)  # type: ignore[misc]

    @property
    def token_cap(self) -> float | None:
        caps = [s.token_cap for s in self._all()]
        return None if not caps or any(x is None for x in caps) else sum(caps)  # type: ignore[misc]

    @property
    def retractions(self) -> float | None:
        counts = [s.retractions for s in self._all() if s.retractions is not None]
        return sum(counts) if counts else None

    in_flight = property(lambda self: sum(s.in_flight for s in self._all()), doc="Calls holding a slot.")
    reserved = property(lambda self: sum(s.reserved for s in self._all()), doc="KV tokens reserved by the calls out.")
    cuts = property(lambda self: sum(s.cuts for s in self._all()), doc="Times a cap was cut.")
    holds = property(lambda self: sum(s.holds for s in self._all()), doc="Times a worker (or the pool) closed.")

    def start(self) -> None:
        """Start the poller on the running loop (idempotent; :meth:`acquire` calls it)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._poll_loop(), name="kv-gate-poller")

    def cost(self, prompt_tokens: int, max_new_tokens: int) -> int:
        """KV tokens a call reserves (:meth:`AnswerLengths.cost` of this actor's answers)."""
        return self.answers.cost(prompt_tokens, max_new_tokens)

    # ------------------------------------------------------------------ placement
    def _slot_of(self, key: str | None) -> Slot | None:
        """The slot a call of ``key`` waits for: the pool's, its worker's, or None (not placed)."""
        if not self.per_worker:
            return self._pool
        if key is not None and key in self.placed:
            self.placed.move_to_end(key)
            return self._slots.get(self.placed[key])
        return None

    def _choose(self, cost: int) -> Slot | None:
        """The worker for a new key: among those that admit ``cost`` now (room in their KV share
        and cap), have nobody waiting and are not down, the one with the fewest keys placed (the
        keys of a workload are alike, so their count is the load a worker has been given, and each
        worker's prefix cache holds the same number of keys; ties: the most KV room left, then
        the fewest calls out), read workers first; None when none admits. Workers that are down
        count only when every worker is (then nothing is known, and nothing is held for it)."""
        best = None
        all_down = all(s.down for s in self._slots.values())
        for s in self._slots.values():
            if (s.down and not all_down) or s.waiters or not s.admits(cost):
                continue
            rank = (s.usage is not None, -s.keys, s.room() - cost, -s.in_flight)
            if best is None or rank > best[0]:
                best = (rank, s)
        return best[1] if best is not None else None

    def _place(self, key: str | None, slot: Slot) -> None:
        if key is None:
            return
        old = self.placed.pop(key, None)
        if old is not None and old in self._slots:
            self._slots[old].keys -= 1
        self.placed[key] = slot.url  # type: ignore[assignment]
        slot.keys += 1
        while len(self.placed) > KEYS_KEPT:  # the least recently used key is forgotten (placed afresh if it comes back)
            _, url = self.placed.popitem(last=False)
            if url in self._slots:
                self._slots[url].keys -= 1

    def _unplace(self, url: str) -> None:
        for key in [k for k, u in self.placed.items() if u == url]:
            del self.placed[key]
        if url in self._slots:
            self._slots[url].keys = 0

    def lost(self, ticket: Ticket) -> None:
        """The call sent with ``ticket`` failed in transport (refused, reset): its worker is
        taken out of placement until its ``/metrics`` reads again, and the keys placed on it are
        placed afresh at their next call (``placement=gate``; no-op otherwise)."""
        slot = ticket._slot
        if not self.per_worker or slot.url is None or slot.url not in self._slots:
            return
        self._take_down(slot, "a call to it failed in transport", "it reads again")

    def _take_down(self, slot: Slot, why: str, until: str) -> None:
        """Take ``slot``'s worker out of placement and place its keys afresh (logged once, at
        WARNING, until the worker is back)."""
        if slot.down and not slot.keys:
            return  # already out, and nothing placed on it since
        if not slot.down:
            logger.warning("KV gate: worker %s is out of placement (%s); its keys move to other workers until %s",
                           slot.url, why, until)
        slot.down = True
        self._unplace(slot.url)  # type: ignore[arg-type]

    def _wake(self) -> None:
        """Hand free slots to the oldest waiters (FIFO per worker; then new keys, each to the
        worker :meth:`_choose` names), as many as the gate admits."""
        for slot in self._all():
            while slot.waiters:
                fut, cost = slot.waiters[0]
                if fut.done():
                    slot.waiters.popleft()
                    continue
                if not slot.admits(cost):
                    break
                slot.waiters.popleft()
                slot.grant(fut, cost)
        while self._unplaced:
            fut, cost, key = self._unplaced[0]
            if fut.done():
                self._unplaced.popleft()
                continue
            slot = self._slot_of(key)  # not None: another call of its key was placed meanwhile, and it follows
            now = self._admitting(key, cost, slot)
            if now is None and slot is None:  # a new key no worker admits yet: it and the keys behind it wait
                break
            self._unplaced.popleft()
            if now is not None:
                now.grant(fut, cost)
            else:
                slot.waiters.append((fut, cost))  # type: ignore[union-attr]

    def _admitting(self, key: str | None, cost: int, slot: Slot | None, new_keys: bool = True) -> Slot | None:
        """The slot that takes a call of ``key`` with ``cost`` KV tokens at once, or None (it
        waits). ``slot``: the key's (:meth:`_slot_of`); it takes the call when nobody waits for it
        and it admits ``cost``. A key not placed: with no worker known, the router's (unheld);
        else, when ``new_keys`` (no new key waits before it), the worker :meth:`_choose` names,
        where the key is placed."""
        if slot is not None:
            return slot if not slot.waiters and slot.admits(cost) else None
        if not self._slots:
            return self._pool
        if not new_keys:
            return None
        chosen = self._choose(cost)
        if chosen is not None:
            self._place(key, chosen)
        return chosen

    # ------------------------------------------------------------------ acquire / release
    async def acquire(self, cost: int = 0, key: str | None = None) -> Ticket:
        """Take a slot for one ``/generate`` attempt of routing key ``key`` with ``cost`` KV
        tokens (:meth:`cost`), waiting (FIFO) while its worker (``placement=router``: the pool)
        is closed, its calls in flight are at the cap, or its reserved KV tokens would pass the
        cap. Under ``placement=gate`` a key not placed yet goes to the first worker that has room
        for it (:meth:`_choose`) and stays there; with no worker known it goes to the router, not held.
        The first calls also wait for the first poll (bounded by ``timeout_s`` per read), so
        that a pool starting against full workers does not send its first turns blind. Every
        ticket must be given back with :meth:`release`.

        Returns:
            the :class:`Ticket`: where to send the call, and the seconds waited.

        Raises:
            asyncio.CancelledError: the caller was cancelled while waiting (no slot is kept).
        """
        self.start()
        if not self._first.is_set():  # (not counted as held: the gate has not judged yet)
            await self._first.wait()
        slot = self._slot_of(key)
        now = self._admitting(key, cost, slot, new_keys=not self._unplaced)
        if now is not None:
            now.take(cost)
            return Ticket(now.url, cost, 0.0, now)
        fut = asyncio.get_running_loop().create_future()
        if slot is not None:
            slot.waiters.append((fut, cost))
        else:
            self._unplaced.append((fut, cost, key))
        t0 = time.monotonic()
        try:
            granted = await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():  # granted just as it was cancelled: give it back
                self.release(Ticket(None, cost, 0.0, fut.result()))
            else:
                fut.cancel()
            raise
        waited = time.monotonic() - t0
        self.held_s += waited
        return Ticket(granted.url, cost, waited, granted)

    def release(self, ticket: Ticket, generated: int | None = None) -> None:
        """Give back ``ticket`` (its attempt ended, however); ``generated``: the tokens it
        generated, when it answered (they teach :meth:`cost`)."""
        slot = ticket._slot
        slot.in_flight = max(0, slot.in_flight - 1)
        slot.reserved = max(0, slot.reserved - ticket.cost)
        if generated is not None:
            self.answers.add(generated)
        self._wake()

    async def wait(self) -> float:
        """Wait until the gate would admit a call, without keeping a slot (:meth:`acquire` then
        :meth:`release`); returns the seconds waited."""
        ticket = await self.acquire()
        self.release(ticket)
        return ticket.waited

    # ------------------------------------------------------------------ readings
    def update(self, usage: float | None, retractions: float | None = None, kv_tokens: float | None = None) -> None:
        """Apply one figure for all workers as one (``placement=router``; :meth:`Slot.apply`) and
        wake who it admits. ``retractions``: the workers' retraction counter now (``None``: not
        reported); ``kv_tokens``: their KV pools' size in tokens (``None``: not reported; no
        token reservation)."""
        self._pool.apply(self.cfg, self.polls, usage, retractions, kv_tokens)
        self._wake()

    def _sync_workers(self, urls: list[str]) -> None:
        """``placement=gate``: one slot per worker of this actor's part (:func:`my_workers`); a
        worker no longer in it loses its keys, and its waiters are placed afresh (ahead of the
        new keys)."""
        mine = my_workers(urls, self.actor, self.actors)
        for url in [u for u in self._slots if u not in mine or self._slots[u].share != mine[u]]:
            gone = self._slots.pop(url)
            self._unplace(url)
            for fut, cost in reversed(gone.waiters):
                self._unplaced.appendleft((fut, cost, None))
            if gone.in_flight:
                logger.info("KV gate: worker %s left the router's list with %d calls out", url, gone.in_flight)
        for url, share in mine.items():
            self._slots.setdefault(url, Slot(url, share))

    async def poll_once(self) -> float | None:
        """Read every worker once, apply the readings and return the figure (``placement=gate``:
        the fullest worker's usage)."""
        urls = await self._reader.workers(self.polls)
        triples = await asyncio.gather(*[self._reader.read(u) for u in urls]) if urls else []
        values = [v for v, _, _ in triples]
        self.readings = dict(zip(urls, values))
        self.polls += 1
        if self.per_worker:
            self._sync_workers(urls)
            for url, reading in zip(urls, triples):
                slot = self._slots.get(url)
                if slot is None:  # another actor's worker
                    continue
                if url in self._reader.unhealthy:
                    self._take_down(slot, "the router counts it unhealthy", "the router counts it healthy again")
                elif reading.usage is not None:
                    if slot.down:
                        logger.info("KV gate: worker %s is back in placement", url)
                    slot.down = False  # it reads again (and the router counts it healthy): keys may be placed on it
                slot.apply(self.cfg, self.polls, *reading, unplaced=len(self._unplaced))
            self._wake()
            figure = self.usage
        else:
            self._pool.workers = max(1, len(urls))
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
            self.update(figure, retractions, kv_tokens)
        self._first.set()
        return figure

    async def _poll_loop(self) -> None:
        while True:
            try:
                await self.poll_once()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a bug here must not hold the pool: open and go on polling
                logger.exception("KV gate: poll failed (%r); the gate opens", e)
                for slot in self._all():
                    slot.apply(self.cfg, self.polls, None, None, None)
                self._wake()
                self._first.set()
            await asyncio.sleep(self.cfg.poll_interval_s)

    def stats(self) -> dict:
        """``{"closed", "usage", "holds", "held_s", "polls", "workers", "limit", "in_flight", "waiting",
        "cuts", "token_cap", "reserved", "placement"}`` for logs and :meth:`RolloutWorker.info`;
        under ``placement=gate`` also ``"keys"`` (keys placed) and ``"per_worker"`` (URL -> the same
        figures for that worker, with ``"keys"`` and ``"down"``)."""
        out = {"closed": self.closed, "usage": self.usage, "holds": self.holds, "held_s": round(self.held_s, 3),
               "polls": self.polls, "workers": len(self.readings), "limit": self.limit, "in_flight": self.in_flight,
               "waiting": sum(len(s.waiters) for s in self._all()) + len(self._unplaced), "cuts": self.cuts,
               "token_cap": self.token_cap, "reserved": self.reserved, "placement": str(self.cfg.placement)}
        if self.per_worker:
            out["keys"] = len(self.placed)
            out["per_worker"] = {url: s.stats() for url, s in self._slots.items()}
        return out

    def close(self) -> None:
        """Stop the poller and open the gate (idempotent)."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
        self._first.set()
        for slot in [*self._all(), self._pool]:
            slot.closed = False
            slot.limit = None
            slot.token_cap = None
        self._wake()
