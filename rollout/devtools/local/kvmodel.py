"""The local server's model of what decides a real server's speed: a prefix cache, a KV budget
with retraction, and a cost model in seconds; and its Prometheus ``/metrics``.

One :class:`KVModel` per server (per worker), used by every backend: the /generate endpoint
(:mod:`rollout.devtools.local.generate`) wraps each request's backend generation in it. It is a
*model* with a handful of parameters (:class:`KVParams`, ``local.kv.*``), not SGLang's scheduler:

* **Prefix cache** (``cache_tokens`` > 0): a :class:`~rollout.devtools.local.radix.RadixCache` of
  that many tokens (LRU eviction of leaves). At prefill a prompt is matched against it; the
  matched length is ``meta_info.cached_tokens``, as SGLang reports it (prompt tokens found in the
  cache). The prompt is inserted after its prefill and prompt + output when the request ends
  (SGLang's ``cache_unfinished_req`` / ``cache_finished_req``), so a multi-turn episode's next
  turn finds its whole context, and a group member sent after the first finds the shared prompt.
* **KV budget** (``kv_budget_tokens`` > 0): running requests hold KV for their prompt plus the
  tokens generated so far. A request waits in a FIFO queue until its tokens fit (one request is
  always admitted when none runs). While decoding, running requests grow; when the tokens held
  pass the budget, running requests are *retracted* (the one with the fewest generated tokens,
  ties by the longest prompt, as SGLang's ``retract_decode`` chooses), their KV freed and the
  request put back at the head of the queue; on readmission its prompt and the tokens it had
  generated are prefilled again (what was cached is matched again). The KV tokens it had computed
  (prompt + generated - cached) are counted as retracted (lost) prefill.
* **Cost model** (seconds, all 0 by default): prefill costs ``prefill_s_per_token`` per uncached
  token, one prefill at a time per server (a GPU prefills one batch at a time, so misses cost
  throughput, not only latency); each generated token costs ``decode_s_per_token +
  s_per_running_request x running requests`` (a decode step slows as the batch grows), decoding
  runs for all running requests at once, in chunks of :data:`DECODE_CHUNK` tokens. The waits are
  asyncio sleeps; an abort cuts them short.

The backend produces its tokens first (at its own speed: gold replay at once, the tiny model by
really generating); the modelled decode then takes the time the cost model gives for them. What
it does not model: prefix sharing inside the KV budget (each running request holds its whole
prompt; in SGLang running requests share cached prefixes and the cache lives inside the same
pool), chunked prefill, prefill and decode competing for one GPU (here they overlap), the
scheduler's ``new_token_ratio`` reservation, paging, host / storage cache tiers, and pauses: a
pause holds backend steps (as before), not the modelled waits.

With every parameter at its default the model is off: no waits, no queue, ``cached_tokens`` 0,
exactly today's behaviour; ``/metrics`` still counts requests and tokens.

Metric names are SGLang's where SGLang has them (``python/sglang/srt/metrics/collector.py``):
gauges ``sglang:num_running_reqs``, ``sglang:num_queue_reqs``, ``sglang:token_usage``,
``sglang:cache_hit_rate``, ``sglang:num_used_tokens``, ``sglang:max_total_num_tokens`` and
counters ``sglang:prompt_tokens_total``, ``sglang:generation_tokens_total``,
``sglang:cached_tokens_total`` (``cache_source="device"``), ``sglang:num_requests_total``,
``sglang:num_retracted_requests_total``; every sample carries ``model_name``. Ours, under
``rollout_local_``: ``requests_total``, ``prompt_tokens_total``, ``cached_tokens_total``,
``prefill_tokens_total`` (tokens prefilled, redone ones included), ``retractions_total``,
``retracted_prefill_tokens_total``, ``cache_tokens`` (held by the cache),
``cache_evicted_tokens_total``. Differences from SGLang: ``token_usage`` is tokens held by
running requests / ``kv_budget_tokens`` (0 when unbounded); ``cache_hit_rate`` is cumulative
(cached / prompt tokens since start), where SGLang's is over its last logging interval.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from rollout.devtools.local.radix import RadixCache

__all__ = ["DECODE_CHUNK", "KVModel", "KVParams", "KVRequest"]

logger = logging.getLogger(__name__)

DECODE_CHUNK = 8  # tokens decoded between two budget checks (and two sleeps)


@dataclass(frozen=True)
class KVParams:
    """The model's parameters (``local.kv.*``; the server's ``--kv-*`` flags). 0 means off /
    unbounded for each.

    Attributes:
        cache_tokens: prefix-cache capacity in tokens (0: no cache, ``cached_tokens`` always 0).
        kv_budget_tokens: tokens running requests may hold (prompt + generated so far) before
            retraction (0: unbounded, nothing queues or is retracted).
        prefill_s_per_token: seconds per uncached prompt token (one prefill at a time).
        decode_s_per_token: seconds per generated token.
        s_per_running_request: seconds added to every generated token per running request.

    Raises:
        ValueError: a negative value.
    """

    # metadata "help": the server's --help line for the field's flag (see add_arguments)
    cache_tokens: int = dataclasses.field(default=0, metadata={"help": "prefix-cache capacity in tokens"})
    kv_budget_tokens: int = dataclasses.field(default=0, metadata={"help": "KV tokens running requests may hold before retraction"})
    prefill_s_per_token: float = dataclasses.field(default=0.0, metadata={"help": "seconds per uncached prompt token"})
    decode_s_per_token: float = dataclasses.field(default=0.0, metadata={"help": "seconds per generated token"})
    s_per_running_request: float = dataclasses.field(default=0.0, metadata={"help": "seconds added to each generated token per running request"})

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            if getattr(self, f.name) < 0:
                raise ValueError(f"{f.name} must be >= 0, got {getattr(self, f.name)}")

    @property
    def active(self) -> bool:
        """Whether any part of the model is on."""
        return any(getattr(self, f.name) for f in dataclasses.fields(self))

    @property
    def timed(self) -> bool:
        """Whether any cost is non-zero."""
        return bool(self.prefill_s_per_token or self.decode_s_per_token or self.s_per_running_request)

    @staticmethod
    def _dest(field: dataclasses.Field) -> str:
        """The argparse destination of a field's flag: ``kv_<field>`` (``kv_budget_tokens`` as is)."""
        return field.name if field.name.startswith("kv_") else f"kv_{field.name}"

    def cli_args(self) -> list[str]:
        """The server's command-line flags for these parameters (only the non-default ones)."""
        out = []
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v:
                out += ["--" + self._dest(f).replace("_", "-"), repr(v)]
        return out

    @classmethod
    def add_arguments(cls, group) -> None:
        """Add one flag per parameter to ``group`` (an argparse parser or argument group): ``--kv-<field>``
        (``--kv-budget-tokens`` for ``kv_budget_tokens``), typed as the field, default 0; what
        :meth:`cli_args` writes and :meth:`from_args` reads back."""
        for f in dataclasses.fields(cls):
            group.add_argument("--" + cls._dest(f).replace("_", "-"), type=type(f.default), default=f.default, help=f.metadata["help"])

    @classmethod
    def from_args(cls, args) -> "KVParams":
        """The parameters parsed by the flags of :meth:`add_arguments` (``args``: the argparse namespace).

        Raises:
            ValueError: a negative value (as the constructor).
        """
        return cls(**{f.name: getattr(args, cls._dest(f)) for f in dataclasses.fields(cls)})


class KVRequest:
    """One /generate request inside the model (event loop only).

    Attributes:
        prompt: the prompt's token ids.
        cached: tokens found in the cache at its first prefill (``meta_info.cached_tokens``).
        decoded: output tokens the modelled decode has produced.
        held: KV tokens it holds while running (0 while waiting).
        computed: KV tokens it computed itself in its current admission (lost if retracted).
    """

    __slots__ = ("_admitted", "_retracted", "cached", "computed", "decoded", "first", "held", "prompt", "running")

    def __init__(self, prompt: Sequence[int]) -> None:
        self.prompt = prompt
        self.cached = 0
        self.decoded = 0
        self.held = 0
        self.computed = 0
        self.first = True
        self.running = False
        self._admitted: asyncio.Future | None = None
        self._retracted: asyncio.Event | None = None

    @property
    def need(self) -> int:
        """KV tokens it needs to run: its prompt and what it has generated."""
        return len(self.prompt) + self.decoded


async def _wait(fut: asyncio.Future | asyncio.Event | None, abort: asyncio.Future, timeout: float | None) -> bool:
    """Wait for ``fut`` (or ``timeout`` seconds when None), cut short by ``abort``; False when aborted."""
    if abort.done():
        return False
    waits: set = {asyncio.shield(abort)}
    if isinstance(fut, asyncio.Event):
        ev = asyncio.ensure_future(fut.wait())
        waits.add(ev)
    elif fut is not None:
        ev = asyncio.shield(fut)
        waits.add(ev)
    else:
        ev = None
    try:
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            if not w.done():
                w.cancel()
    return not abort.done()


class KVModel:
    """The prefix cache, KV budget and cost model of one server (see the module docstring).
    Used on the server's event loop only.

    Args:
        params: the model's parameters.
    """

    def __init__(self, params: KVParams | None = None) -> None:
        self.params = params or KVParams()
        self.cache = RadixCache(self.params.cache_tokens) if self.params.cache_tokens > 0 else None
        self.running: list[KVRequest] = []
        self.waiting: deque[KVRequest] = deque()
        self.used = 0  # KV tokens held by running requests
        self._prefill_lock: asyncio.Lock | None = None
        # counters
        self.requests = 0
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.generation_tokens = 0
        self.prefill_tokens = 0
        self.retractions = 0
        self.retracted_tokens = 0
        self.in_flight = 0  # requests between start() and release()

    @property
    def active(self) -> bool:
        """Whether requests go through the model (any parameter set)."""
        return self.params.active

    # ------------------------------------------------------------------ lifecycle
    def start(self, prompt: Sequence[int]) -> KVRequest:
        """Register a new request (counted in the request and prompt-token counters)."""
        req = KVRequest(prompt)
        self.requests += 1
        self.prompt_tokens += len(prompt)
        self.in_flight += 1
        return req

    def release(self, req: KVRequest, output: Sequence[int] | None = None) -> None:
        """End ``req`` (finished, aborted or failed): free its KV, and, when it finished with
        ``output``, cache prompt + output. Safe to call once per request, in any state."""
        self.in_flight -= 1
        if output is not None:
            self.generation_tokens += len(output)
            if self.cache is not None:
                self.cache.insert(list(req.prompt) + list(output))
        if req.running:
            self._drop(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        if self.running or self.waiting:
            self._admit_waiting()

    async def prefill(self, req: KVRequest, abort: asyncio.Future) -> bool:
        """Queue for the KV budget, match the cache, and spend the prefill time; False when
        aborted (the request then holds nothing)."""
        if self.params.kv_budget_tokens:
            loop = asyncio.get_running_loop()
            req._admitted = loop.create_future()
            if req.first:
                self.waiting.append(req)
            else:  # retracted: back at the head of the queue
                self.waiting.appendleft(req)
            self._admit_waiting()
            if not await _wait(req._admitted, abort, None):
                return False
        else:
            self._run(req)
        if self._prefill_lock is None:
            self._prefill_lock = asyncio.Lock()
        async with self._prefill_lock:  # one prefill at a time
            if abort.done():
                return False
            if not req.running:  # retracted while it waited for its turn: nothing was computed;
                return True  # decode() queues it again (a first prefill stays first)
            # A retracted request matches its prompt again (its output was never cached).
            hit = self.cache.match(req.prompt) if self.cache is not None else 0
            if req.first:
                req.cached = hit
                self.cached_tokens += hit
            todo = len(req.prompt) + req.decoded - hit
            self.prefill_tokens += todo
            req.computed = todo
            if self.params.prefill_s_per_token and todo > 0:
                if not await _wait(None, abort, todo * self.params.prefill_s_per_token):
                    return False
            if self.cache is not None and req.first:
                self.cache.insert(req.prompt)
        req.first = False
        return True

    async def decode(self, req: KVRequest, n_tokens: int, abort: asyncio.Future) -> bool:
        """Decode ``n_tokens`` in the model (growing the KV held, paying the decode cost, and
        surviving retractions: a retracted request queues and prefills again); False when
        aborted (``req.decoded`` says how far it got)."""
        p = self.params
        while req.decoded < n_tokens:
            if not req.running:  # retracted
                if not await self.prefill(req, abort):
                    return False
                continue
            chunk = min(DECODE_CHUNK, n_tokens - req.decoded)
            dt = chunk * (p.decode_s_per_token + p.s_per_running_request * len(self.running))
            if dt > 0:
                assert req._retracted is not None
                if not await _wait(req._retracted, abort, dt):
                    return False
                if not req.running:
                    continue  # retracted during the chunk: it is redone
            req.decoded += chunk
            req.held += chunk
            req.computed += chunk
            self.used += chunk
            self._enforce_budget()
        return True

    # ------------------------------------------------------------------ internals
    def _run(self, req: KVRequest) -> None:
        req.running = True
        req.held = req.need
        req._retracted = asyncio.Event()
        self.used += req.held
        self.running.append(req)

    def _drop(self, req: KVRequest) -> None:
        req.running = False
        self.used -= req.held
        req.held = 0
        self.running.remove(req)

    def _admit_waiting(self) -> None:
        budget = self.params.kv_budget_tokens
        while self.waiting:
            head = self.waiting[0]
            if budget and self.running and self.used + head.need > budget:
                return
            self.waiting.popleft()
            self._run(head)
            if head._admitted is not None and not head._admitted.done():
                head._admitted.set_result(None)

    def _enforce_budget(self) -> None:
        budget = self.params.kv_budget_tokens
        while budget and self.used > budget and len(self.running) > 1:
            victim = min(self.running, key=lambda r: (r.decoded, -len(r.prompt)))
            self.retractions += 1
            self.retracted_tokens += victim.computed
            victim.computed = 0
            self._drop(victim)
            assert victim._retracted is not None
            victim._retracted.set()
        if self.waiting:
            self._admit_waiting()

    def flush(self) -> None:
        """Empty the prefix cache (``/flush_cache``)."""
        if self.cache is not None:
            self.cache.clear()

    # ------------------------------------------------------------------ metrics
    def gauges(self) -> dict[str, float]:
        """The gauges now, by metric name."""
        budget = self.params.kv_budget_tokens
        running = len(self.running) if self.active else self.in_flight
        return {
            "sglang:num_running_reqs": running,
            "sglang:num_queue_reqs": len(self.waiting),
            "sglang:token_usage": (self.used / budget) if budget else 0.0,
            "sglang:cache_hit_rate": (self.cached_tokens / self.prompt_tokens) if self.prompt_tokens else 0.0,
            "sglang:num_used_tokens": self.used,
            "sglang:max_total_num_tokens": budget,
            "rollout_local_cache_tokens": self.cache.size if self.cache is not None else 0,
        }

    def counters(self) -> dict[str, float]:
        """The counters now, by metric name (SGLang's, then ours)."""
        return {
            "sglang:prompt_tokens_total": self.prompt_tokens,
            "sglang:generation_tokens_total": self.generation_tokens,
            "sglang:cached_tokens_total": self.cached_tokens,
            "sglang:num_requests_total": self.requests,
            "sglang:num_retracted_requests_total": self.retractions,
            "rollout_local_requests_total": self.requests,
            "rollout_local_prompt_tokens_total": self.prompt_tokens,
            "rollout_local_cached_tokens_total": self.cached_tokens,
            "rollout_local_prefill_tokens_total": self.prefill_tokens,
            "rollout_local_retractions_total": self.retractions,
            "rollout_local_retracted_prefill_tokens_total": self.retracted_tokens,
            "rollout_local_cache_evicted_tokens_total": self.cache.evicted if self.cache is not None else 0,
        }

    def prometheus(self, model_name: str) -> str:
        """The metrics in Prometheus' text exposition format (``GET /metrics``)."""
        label = 'model_name="' + model_name.replace("\\", "\\\\").replace('"', '\\"') + '"'
        lines = []
        for name, value in self.gauges().items():
            lines += [f"# TYPE {name} gauge", f"{name}{{{label}}} {float(value)!r}"]
        for name, value in self.counters().items():
            extra = ',cache_source="device"' if name == "sglang:cached_tokens_total" else ""
            lines += [f"# TYPE {name} counter", f"{name}{{{label}{extra}}} {float(value)!r}"]
        return "\n".join(lines) + "\n"
