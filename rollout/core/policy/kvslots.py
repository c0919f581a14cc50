"""The parts of the KV gate (:mod:`rollout.core.policy.kvgate`) that hold no I/O: the split of
the workers among the actors under ``placement=gate`` (:func:`my_workers`), one worker's admission
state (:class:`Slot`), the ticket a call holds (:class:`Ticket`), and the answer lengths a call's
KV reservation expects (:class:`AnswerLengths`)."""

from __future__ import annotations

import asyncio
import collections
import logging
import math
from dataclasses import dataclass, field

from rollout.core.config import AdaptiveConcurrencyConfig

__all__ = ["ANSWERS_KEPT", "ANSWER_QUANTILE", "EXPECTED_AFTER", "AnswerLengths", "Slot", "Ticket", "my_workers"]

logger = logging.getLogger(__name__)

EXPECTED_AFTER = 8  # answers seen before the expected answer length replaces max_new_tokens
ANSWERS_KEPT = 256  # the last answers whose lengths give the expected one
ANSWER_QUANTILE = 0.9  # the expected answer length: this quantile of the last answers


def my_workers(urls: list[str], actor: int, actors: int) -> dict[str, float]:
    """The workers actor ``actor`` of ``actors`` places its keys on under ``placement=gate``, each
    with the part of its KV the actor may reserve: the URLs sorted (every actor sees the same
    order), worker ``w`` to actor ``w % actors`` alone when there are at least as many workers as
    actors (share 1.0); with fewer, actor ``a`` to worker ``a % workers``, shared equally with the
    other actors that map to it. Empty ``urls``: ``{}``."""
    ordered = sorted(set(urls))
    n = len(ordered)
    if n == 0:
        return {}
    if n >= actors:
        return {u: 1.0 for w, u in enumerate(ordered) if w % actors == actor}
    w = actor % n
    return {ordered[w]: 1.0 / sum(1 for a in range(actors) if a % n == w)}


@dataclass(eq=False)
class Ticket:
    """A slot taken by :meth:`KVGate.acquire`; give it back with :meth:`KVGate.release`.

    Attributes:
        worker: the worker URL the call must be sent to (``placement=gate``), or ``None``: send
            it to the router.
        cost: the KV tokens it reserved.
        waited: seconds it waited at the gate (0.0: admitted at once).
    """

    worker: str | None
    cost: int
    waited: float
    _slot: "Slot" = field(repr=False)


class Slot:
    """The admission state of one worker (``placement=gate``), or of all workers as one KV pool
    (``placement=router``, ``url`` None): the hysteresis, the AIMD cap, the KV-token reservation
    and the FIFO of calls waiting for it."""

    __slots__ = ("closed", "cuts", "down", "holds", "in_flight", "keys", "last_cut", "limit", "reserved", "retractions",
                 "share", "token_cap", "url", "usage", "waiters", "workers")

    def __init__(self, url: str | None, share: float) -> None:
        self.url = url
        self.share = share  # this actor's part of its KV tokens
        self.workers = 1  # workers it stands for (the cap's unit)
        self.usage: float | None = None
        self.closed = False
        self.limit: int | None = None
        self.in_flight = 0
        self.reserved = 0
        self.token_cap: float | None = None
        self.retractions: float | None = None
        self.last_cut = -2  # poll number of the last cut
        self.cuts = 0
        self.holds = 0
        self.keys = 0  # routing keys placed on it
        self.down = False  # a call to it failed in transport: no key is placed on it until it reads again
        self.waiters: collections.deque[tuple[asyncio.Future, int]] = collections.deque()

    def admits(self, cost: int) -> bool:
        """Whether a call of ``cost`` KV tokens may go now: open, under the cap, and within the
        KV-token cap (always when no call is out)."""
        if self.closed:
            return False
        if self.limit is not None and self.in_flight >= self.limit:
            return False
        return self.token_cap is None or self.in_flight == 0 or self.reserved + cost <= self.token_cap

    def room(self) -> float:
        """KV tokens it may still reserve (infinite where unknown)."""
        return math.inf if self.token_cap is None else self.token_cap - self.reserved

    def take(self, cost: int) -> None:
        """Count one call of ``cost`` KV tokens out on this slot."""
        self.in_flight += 1
        self.reserved += cost

    def grant(self, fut: asyncio.Future, cost: int) -> None:
        """Admit the waiter ``fut`` with ``cost`` (its result is this slot)."""
        self.take(cost)
        fut.set_result(self)

    def cut(self, polls: int, factor: float) -> None:
        """Multiplicative decrease of the cap (at most every other poll; never below one call per
        worker): ``factor`` x the smaller of the cap and the calls out."""
        if self.limit is None or polls - self.last_cut < 2:
            return
        floor = self.workers
        self.limit = max(floor, int(min(self.limit, max(self.in_flight, floor)) * factor))
        self.last_cut = polls
        self.cuts += 1

    def apply(self, cfg: AdaptiveConcurrencyConfig, polls: int, usage: float | None, retractions: float | None,
              kv_tokens: float | None, unplaced: int = 0) -> None:
        """One poll's figure for this slot: close at ``>= cfg.high_water``, open below
        ``cfg.low_water`` or when unknown; adjust the cap and the KV-token cap
        (:mod:`rollout.core.policy.kvgate`). ``unplaced``: new keys waiting for any worker (they
        count as wanting this slot when its cap binds)."""
        self.usage = usage
        self.token_cap = None if not kv_tokens or usage is None else self.share * cfg.high_water * kv_tokens  # 0: unbounded
        retracted = retractions is not None and self.retractions is not None and retractions > self.retractions
        self.retractions = retractions
        name = self.url or "the workers"
        if usage is None:
            if self.closed:
                logger.info("KV gate: the KV usage of %s cannot be read; held calls go on (unknown is never held)", name)
            self.closed = False
            self.limit = None
            return
        if self.limit is None:
            self.limit = cfg.start_calls_per_worker * self.workers
        if not self.closed and usage >= cfg.high_water:
            self.holds += 1
            self.closed = True
            self.cut(polls, cfg.decrease_factor)
            logger.debug("KV gate closed for %s: KV usage %.3f >= high water %.3f (limit %s)", name, usage, cfg.high_water, self.limit)
        elif self.closed and usage < cfg.low_water:
            self.closed = False
            logger.debug("KV gate opened for %s: KV usage %.3f < low water %.3f (limit %s)", name, usage, cfg.low_water, self.limit)
        # additive increase, only while the cap binds: below low_water, or, where the KV-token
        # reservation meters what goes out (the workers report their KV size), below high_water
        wanted = self.in_flight + len(self.waiters) + unplaced
        room = usage < cfg.low_water or (self.token_cap is not None and usage < cfg.high_water)
        if retracted:
            self.cut(polls, cfg.decrease_factor)
        elif not self.closed and room and wanted > self.in_flight >= self.limit:
            self.limit += self.workers

    def stats(self) -> dict:
        """This worker's figures (:meth:`KVGate.stats`'s ``per_worker``)."""
        return {"closed": self.closed, "usage": self.usage, "limit": self.limit, "in_flight": self.in_flight,
                "reserved": self.reserved, "token_cap": self.token_cap, "waiting": len(self.waiters), "keys": self.keys,
                "cuts": self.cuts, "holds": self.holds, "down": self.down}


class AnswerLengths:
    """The answer lengths a call's KV reservation expects: the :data:`ANSWER_QUANTILE` quantile of
    the last :data:`ANSWERS_KEPT` answers (tokens), once :data:`EXPECTED_AFTER` are known."""

    def __init__(self) -> None:
        self._answers: collections.deque[int] = collections.deque(maxlen=ANSWERS_KEPT)
        self._expected: int | None = None  # the quantile, recomputed after a new answer

    def add(self, generated: int) -> None:
        """One answer of ``generated`` tokens."""
        self._answers.append(int(generated))
        self._expected = None

    def cost(self, prompt_tokens: int, max_new_tokens: int) -> int:
        """KV tokens a call reserves: its prompt plus the answer expected (the
        :data:`ANSWER_QUANTILE` quantile of this actor's last :data:`ANSWERS_KEPT` answer lengths
        once :data:`EXPECTED_AFTER` are known, else ``max_new_tokens``; at most ``max_new_tokens``)."""
        if len(self._answers) >= EXPECTED_AFTER:
            if self._expected is None:
                ordered = sorted(self._answers)
                self._expected = ordered[max(0, math.ceil(ANSWER_QUANTILE * len(ordered)) - 1)]
            expected = min(max_new_tokens, self._expected)
        else:
            expected = max_new_tokens
        return max(0, int(prompt_tokens)) + max(0, int(expected))
