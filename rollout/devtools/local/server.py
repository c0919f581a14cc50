"""A small test server that speaks SGLang's native HTTP protocol over a pluggable backend.

It is a test and demo server for laptops and CI, not a replacement for SGLang. It runs behind the
real ``sglang-router`` (see :mod:`rollout.devtools.local.stack`) and serves:

* ``POST /generate``: ``{"input_ids": [int]}`` (or ``"text"``), ``sampling_params``,
  ``return_logprob``, ``rid``; answers ``{"text", "output_ids", "meta_info": {"id",
  "finish_reason", "prompt_tokens", "completion_tokens", "cached_tokens", "weight_version",
  "output_token_logprobs"?}}``. Streaming is not supported (400).
* ``POST /abort_request``: ``{"rid": str}`` or ``{"abort_all": true}``; the aborted requests
  return at once with ``finish_reason.type == "abort"`` and the tokens generated so far.
  Requests held by a pause (below) are not running yet and are not aborted (as in SGLang); a
  client that gives up on one closes its connection.
* ``POST /pause_generation``, ``POST /continue_generation``, ``POST /update_weights_from_disk``,
  ``GET /get_weight_version``: SGLang's weight-update endpoints, below.
* ``GET /health``, ``GET /health_generate``, ``GET /get_model_info`` (= ``/model_info``: SGLang's
  keys ``model_path``, ``tokenizer_path``, ``is_generation``, ``preferred_sampling_params``,
  ``weight_version``, ``has_image_understanding``, ``has_audio_understanding``, ``model_type``,
  ``architectures``, plus ``tokenizer_vocab_size``, ``eos_token_id`` and ``special_tokens``, which
  SGLang does not report, for :func:`rollout.app.preflight.check_tokenizer`), ``GET /get_server_info`` (= ``/server_info``: also
  ``weight_version``, ``pause_mode`` (null when not paused), ``num_backend_steps`` (tokens
  sampled for /generate since start, a monotonically increasing counter), held / paused /
  in-flight request counts), ``GET /v1/models``, ``POST /v1/chat/completions`` (non-streaming,
  answered by ``backend.chat``), ``POST /flush_cache``.

Weight updates (SGLang's semantics; the correct order is pause -> update -> continue):

* The server has a weight version, a string: ``--weight-version`` at start (default
  ``"default"``), changed by a successful update that names one. Every /generate answer carries
  ``meta_info["weight_version"]``: the version current at the request's last backend step (for
  a request that made no step, the version when it was admitted).
* Backend steps (one ``next()`` of a backend generator = one sampled token, the first one
  including the prefill) run one at a time under a server-level step lock, as SGLang's single
  scheduler runs one batch at a time; a request checks, holding that lock, that it is neither
  aborted nor paused before it steps.
* ``POST /pause_generation {"mode": "abort" | "retract" | "in_place"}`` (default ``"abort"``)
  answers ``{"message", "status": "ok"}`` once no backend step is running; from then on no step
  runs until ``/continue_generation``, so a pause returns within about one backend step however
  many requests are in flight. While paused, new /generate and /v1/chat/completions requests
  are held (they wait, then run after continue; a chat completion already running may finish).
  ``abort``: every admitted /generate request returns at once with
  ``finish_reason == {"type": "abort", "message": ...}`` and what it generated so far (ids and
  log-probs), and requests still queued for a thread never step; the answer comes once they have
  all answered. ``in_place``: running requests stop between two steps and wait, keeping their
  state (KV cache), then go on after continue. ``retract``: in SGLang the requests go back to
  the waiting queue and are prefilled again after continue; here it behaves as ``in_place``
  (the tiny backend keeps its KV caches), which a client cannot tell apart except by speed.
* ``POST /continue_generation {}`` answers ``{"message", "status": "ok"}``; held and paused
  requests go on.
* ``POST /update_weights_from_disk {"model_path": str, "weight_version": str | null,
  "abort_all_requests": bool = false, ...}`` (other SGLang keys such as ``flush_cache`` and
  ``load_format`` are accepted and ignored). With ``abort_all_requests`` every running request
  (paused in place included, held ones not) is aborted first. If generation is paused the weights are loaded at once; otherwise the update
  takes the model-update lock: new requests wait, and it loads once every in-flight request has
  answered. The backend's ``load_weights(model_path)`` runs between two backend steps (tiny:
  loads a ``save_pretrained`` folder; gold replay: nothing, only the version changes). Answers
  ``{"success", "message", "num_paused_requests"}`` (requests paused in place or held when the
  update happened), HTTP 200 on success, 400 on failure (weights and version unchanged; the
  message names the path and the error) or for a malformed body.
* ``GET /get_weight_version`` answers ``{"weight_version": str}``.

Stop semantics (checked after every sampled token, in this order, as SGLang does):

1. ``len(output) == max_new_tokens`` -> ``{"type": "length", "length": max_new_tokens}``;
2. the token is in ``stop_token_ids``, or is the tokenizer's EOS and ``ignore_eos`` is false ->
   ``{"type": "stop", "matched": token_id}``; the token is part of the output;
3. the decoded output (special tokens kept) now contains a stop string ->
   ``{"type": "stop", "matched": stop_string}``; the output ids end with the token that completed
   it, and ``text`` is cut before the stop string unless ``no_stop_trim``.

A backend generator that ends by itself gives ``{"type": "stop", "matched": null}``.

Injected latency (``--generate-latency-s L``, ``local.generate_latency_s``; default 0): every
admitted /generate request first waits ``L`` seconds, as if a GPU server were generating, then
steps. The wait is an ``asyncio`` sleep on the server's event loop: it holds neither the
one-step-at-a-time lock nor a generation thread, so any number of requests wait at once (1024
concurrent requests with ``L = 1`` all answer after about 1 s, plus their steps). An abort (or a
pause in ``abort`` mode) during the wait answers at once with ``finish_reason.type == "abort"``
and no tokens; a pause in place lets the wait end and holds the first step. Used by
``python -m rollout.bench pool``.

API keys (as SGLang's ``--api-key`` / ``--admin-api-key``, ``sglang.srt.utils.auth``):

* The keys are read from environment variables named by ``--api-key-env`` and
  ``--admin-api-key-env``, never from argv (argv is visible in ``ps`` and in the stack's logs).
* With an API key, every request must carry ``Authorization: Bearer <key>`` (or ``x-api-key:
  <key>``), except ``OPTIONS`` and paths starting with ``/health``, ``/ready`` or ``/metrics``;
  otherwise the answer is HTTP 401 ``{"error": "Unauthorized"}``.
* Admin endpoints (:data:`ADMIN_PATHS`: abort, pause / continue, weight updates, flush cache)
  need the admin key when one is set, else the API key when one is set, else nothing.

Fate sharing: with ``--parent-pid PID`` the server exits (SIGTERM to itself, then a hard exit 10 s
later) once its parent process is gone (polled twice a second); with ``--pdeathsig`` it also asks
Linux for SIGTERM when the parent *thread* that started it exits (see :mod:`rollout.devtools.local.stack`).

Run it with ``python -m rollout.devtools.local.server --port P --backend gold_replay --domain retail``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import json
import logging
import os
import secrets
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aiohttp import web

from rollout.core import fastjson
from rollout.core.eventloop import EVENT_LOOPS, check_event_loop, loop_kind, new_event_loop
from rollout.devtools.local.backend_api import GenerationBackend, SamplingParams

logger = logging.getLogger(__name__)

BACKENDS = ("gold_replay", "gold_replay_skip_write", "tiny")

# sampling_params keys the server honours, and SGLang keys it accepts but ignores.
_SAMPLING_USED = {
    "temperature", "top_p", "top_k", "max_new_tokens", "stop", "stop_token_ids", "ignore_eos",
    "skip_special_tokens", "no_stop_trim", "sampling_seed",
}
_SAMPLING_IGNORED = {
    "min_new_tokens", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty", "n",
    "json_schema", "regex", "ebnf", "structural_tag", "spaces_between_special_tokens",
    "custom_params", "stream_interval", "logit_bias", "stop_regex",
}
_DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's default
PAUSE_MODES = ("abort", "retract", "in_place")
DEFAULT_WEIGHT_VERSION = "default"  # SGLang's --weight-version default
# Endpoints SGLang marks ADMIN_OPTIONAL: the admin key when set, else the API key when set.
ADMIN_PATHS = frozenset({
    "/abort_request", "/pause_generation", "/continue_generation", "/update_weights_from_disk", "/flush_cache",
})
_AUTH_EXEMPT_PREFIXES = ("/health", "/ready", "/metrics")  # k8s probes and Prometheus, as in SGLang


def auth_status(method: str, path: str, authorization: str | None, x_api_key: str | None,
                api_key: str | None, admin_api_key: str | None) -> int | None:
    """SGLang's decision for one request: None (allowed) or the HTTP status to refuse it with (401).

    Args:
        method, path: of the request.
        authorization: its ``Authorization`` header (``Bearer <key>``, scheme case-insensitive).
        x_api_key: its ``x-api-key`` header (accepted as well, as recent SGLang does).
        api_key, admin_api_key: the server's keys (None: not set).
    """
    if method == "OPTIONS" or path.startswith(_AUTH_EXEMPT_PREFIXES):
        return None

    def carries(expected: str) -> bool:
        if authorization:
            scheme, _, token = authorization.partition(" ")
            if scheme.lower() == "bearer" and secrets.compare_digest(token.strip().encode(), expected.encode()):
                return True
        return bool(x_api_key) and secrets.compare_digest(x_api_key.encode(), expected.encode())

    expected = (admin_api_key or api_key) if path in ADMIN_PATHS else api_key
    if expected is None or carries(expected):
        return None
    return 401


class BadRequest(ValueError):
    """A request body the server refuses (answered with HTTP 400 and ``{"error": message}``)."""


def make_backend(name: str, domain: str, tokenizer, tiny_cfg: dict | None = None) -> GenerationBackend:
    """Build a generation backend by name.

    Args:
        name: ``gold_replay``, ``gold_replay_skip_write`` or ``tiny``.
        domain: tau2 domain for the gold-replay backends (ignored by ``tiny``).
        tokenizer: the loaded ``transformers`` tokenizer shared by server and backend.
        tiny_cfg: ``dataclasses.asdict(TinyModelConfig)``-style dict for ``tiny`` (None: defaults).

    Raises:
        ValueError: unknown backend name (or a backend's own construction error).
        ImportError: ``tiny`` without torch / ``rollout.devtools.local.tiny``.
    """
    if name in ("gold_replay", "gold_replay_skip_write"):
        from rollout.devtools.local.gold import GoldReplayBackend

        return GoldReplayBackend(domain, tokenizer, skip_write=(name == "gold_replay_skip_write"))
    if name == "tiny":
        from rollout.devtools.local.tiny import TinyLMBackend  # needs torch; imported only here

        if tiny_cfg is None:
            from rollout.core.config import TinyModelConfig

            tiny_cfg = dataclasses.asdict(TinyModelConfig())
        # One torch thread per server process: a one-token decode step is too small for OpenMP,
        # and two threads on a busy 2-core machine made 64 tokens take 13-18 s instead of ~1 s.
        return TinyLMBackend(tokenizer, dict(tiny_cfg), num_threads=1)
    raise ValueError(f"unknown backend {name!r}; choose one of {BACKENDS}")


# --------------------------------------------------------------------------- request parsing
def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _token_ids_ok(ids: list, vocab_size: int) -> bool:
    """Whether every item of ``ids`` is an ``int`` (not a ``bool``) in ``[0, vocab_size)``.

    Checked with C-level passes (``map(type, ...)``, ``min``, ``max``) rather than a Python loop
    per id: a prompt is thousands of ids and the check runs on the event loop for every request.
    """
    if not set(map(type, ids)) <= {int}:  # parsed JSON integers are exactly int
        return all(_is_int(t) for t in ids) and 0 <= min(ids) and max(ids) < vocab_size
    return 0 <= min(ids) and max(ids) < vocab_size


def _is_num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def parse_sampling_params(sp: Any) -> SamplingParams:
    """Validate SGLang ``sampling_params`` (a dict; null values mean "default").

    Raises:
        BadRequest: not a dict, an unknown key, or a value of the wrong type / out of range.
    """
    if sp is None:
        sp = {}
    if not isinstance(sp, dict):
        raise BadRequest("sampling_params must be an object")
    unknown = set(sp) - _SAMPLING_USED - _SAMPLING_IGNORED
    if unknown:
        raise BadRequest(f"unknown sampling_params: {sorted(unknown)}")
    v = {k: x for k, x in sp.items() if x is not None}
    kw: dict[str, Any] = {}
    if "temperature" in v:
        if not _is_num(v["temperature"]) or v["temperature"] < 0:
            raise BadRequest("sampling_params.temperature must be a number >= 0")
        kw["temperature"] = float(v["temperature"])
    if "top_p" in v:
        if not _is_num(v["top_p"]) or not 0 < v["top_p"] <= 1:
            raise BadRequest("sampling_params.top_p must be in (0, 1]")
        kw["top_p"] = float(v["top_p"])
    if "top_k" in v:
        if not _is_int(v["top_k"]) or v["top_k"] < -1:
            raise BadRequest("sampling_params.top_k must be an integer, -1 (or 0) for no truncation")
        kw["top_k"] = -1 if v["top_k"] == 0 else v["top_k"]
    kw["max_new_tokens"] = _DEFAULT_MAX_NEW_TOKENS
    if "max_new_tokens" in v:
        if not _is_int(v["max_new_tokens"]) or v["max_new_tokens"] < 0:
            raise BadRequest("sampling_params.max_new_tokens must be an integer >= 0")
        kw["max_new_tokens"] = v["max_new_tokens"]
    if "stop" in v:
        stop = v["stop"]
        if isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise BadRequest("sampling_params.stop must be a string or a list of strings")
        kw["stop"] = tuple(s for s in stop if s)
    if "stop_token_ids" in v:
        ids = v["stop_token_ids"]
        if not isinstance(ids, list) or not all(_is_int(i) for i in ids):
            raise BadRequest("sampling_params.stop_token_ids must be a list of integers")
        kw["stop_token_ids"] = tuple(ids)
    for key in ("ignore_eos", "skip_special_tokens", "no_stop_trim"):
        if key in v:
            if not isinstance(v[key], bool):
                raise BadRequest(f"sampling_params.{key} must be a boolean")
            kw[key] = v[key]
    if "sampling_seed" in v:
        if not _is_int(v["sampling_seed"]):
            raise BadRequest("sampling_params.sampling_seed must be an integer")
        kw["seed"] = v["sampling_seed"]
    if "n" in v and v["n"] != 1:
        raise BadRequest("sampling_params.n > 1 is not supported; send n requests")
    kw["extra"] = {k: x for k, x in v.items() if k in _SAMPLING_IGNORED}
    return SamplingParams(**kw)


# --------------------------------------------------------------------------- in-flight state
class _InFlight:
    """One /generate request: tokens so far (written by the worker thread), its abort flag, and
    the weight version of its last backend step."""

    def __init__(self, rid: str, loop: asyncio.AbstractEventLoop, weight_version: str) -> None:
        self.rid = rid
        self.lock = threading.Lock()
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.aborted = False  # read by the worker thread under ``lock``
        self.abort_message = ""
        self.abort_future: asyncio.Future = loop.create_future()
        # The server's weight version when the request was admitted, then at each of its steps.
        self.weight_version = weight_version
        # Past the pause gate and holding a read share of the model-update lock (event loop only).
        self.admitted = False

    def abort(self, message: str) -> None:
        """Stop the request (event-loop thread only); the worker appends nothing after this."""
        with self.lock:
            if self.aborted:
                return
            self.aborted = True
            self.abort_message = message
        if not self.abort_future.done():
            self.abort_future.set_result(None)

    def snapshot(self) -> tuple[list[int], list[float], str]:
        """``(output ids, their log-probs, weight version of the last step)``, consistently."""
        with self.lock:
            return list(self.ids), list(self.logprobs), self.weight_version


class _Waiters:
    """Coroutines waiting for a condition on the server's control state.

    That state (pause mode, model-update lock counts, in-flight set) is changed on the event loop
    only, so a predicate needs no lock; whoever changes it calls :meth:`notify`, and each waiter
    re-checks its predicate.
    """

    def __init__(self) -> None:
        self._futures: set[asyncio.Future] = set()

    def notify(self) -> None:
        """Wake every waiter (event-loop thread only)."""
        for fut in self._futures:
            if not fut.done():
                fut.set_result(None)
        self._futures.clear()

    async def wait_for(self, predicate: Callable[[], bool]) -> None:
        """Return once ``predicate()`` is true (checked now and after every :meth:`notify`)."""
        while not predicate():
            fut = asyncio.get_running_loop().create_future()
            self._futures.add(fut)
            try:
                await fut
            finally:
                self._futures.discard(fut)


class _FairLock:
    """A mutex granted in arrival order (FIFO), used as the server's one-step-at-a-time lock.

    ``threading.Lock`` is not fair: a worker thread that releases it and asks again at once
    usually wins, so one request could run all its steps while another waits, which is not how a
    batching server behaves (every running request advances each step). Here ``release`` hands
    the lock straight to the longest waiter, so requests take steps in turn.
    """

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._queue: deque[threading.Lock] = deque()
        self._held = False

    def acquire(self) -> None:
        with self._mutex:
            if not self._held:
                self._held = True
                return
            turn = threading.Lock()
            turn.acquire()
            self._queue.append(turn)
        turn.acquire()  # released by the holder's release(): the lock is ours

    def release(self) -> None:
        with self._mutex:
            if self._queue:
                self._queue.popleft().release()  # handed over; stays held
            else:
                self._held = False

    def __enter__(self) -> _FairLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class LocalSGLangServer:
    """Owns a backend, the tokenizer, the worker threads, the in-flight requests and the
    pause / weight-update state (see the module docstring for the semantics).

    Args:
        backend: the :class:`GenerationBackend` that samples tokens.
        tokenizer: ``transformers`` tokenizer (decoding, stop strings, ``text`` inputs).
        model_path: reported by ``/get_model_info``; default: ``tokenizer_path`` (the router
            loads a tokenizer from each worker's model path, and must not reach a model hub).
        tokenizer_path: reported by ``/get_model_info``; default: ``tokenizer.name_or_path``.
        served_model_name: reported by ``/get_server_info`` and ``/v1/models``; default
            ``local/<backend name>``.
        max_workers: generation threads (concurrent requests beyond it queue).
        weight_version: the initial weight version (SGLang's ``--weight-version``, default
            ``"default"``), reported in every ``/generate`` answer.
        api_key: required on every endpoint but health checks (SGLang's ``--api-key``); None: open.
        admin_api_key: required on :data:`ADMIN_PATHS` (SGLang's ``--admin-api-key``).
        generate_latency_s: seconds every admitted /generate request waits on the event loop
            before its first step (see the module docstring); 0.0: none.

    Raises:
        ValueError: ``generate_latency_s`` is negative.
    """

    def __init__(
        self,
        backend: GenerationBackend,
        tokenizer,
        *,
        model_path: str | None = None,
        tokenizer_path: str | None = None,
        served_model_name: str | None = None,
        max_workers: int = 64,
        weight_version: str = DEFAULT_WEIGHT_VERSION,
        api_key: str | None = None,
        admin_api_key: str | None = None,
        generate_latency_s: float = 0.0,
    ) -> None:
        if generate_latency_s < 0:
            raise ValueError(f"generate_latency_s must be >= 0 seconds, got {generate_latency_s}")
        self.generate_latency_s = float(generate_latency_s)
        self.backend = backend
        self._api_key = api_key or None
        self._admin_api_key = admin_api_key or None
        self.tokenizer = tokenizer
        self.tokenizer_path = tokenizer_path or getattr(tokenizer, "name_or_path", "")
        # The router loads a tokenizer for each worker's model_path (from a model hub unless it
        # is a local folder), so the default model_path is the local tokenizer folder.
        self.model_path = model_path or self.tokenizer_path or f"local/{backend.name}"
        self.served_model_name = served_model_name or f"local/{backend.name}"
        self.vocab_size = len(tokenizer)
        from rollout.app.preflight import tokenizer_facts

        self._tokenizer_facts = tokenizer_facts(tokenizer)
        eos = tokenizer.eos_token_id
        self.eos_ids: frozenset[int] = frozenset([eos] if isinstance(eos, int) else (eos or []))
        self.executor = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="local-gen")
        # Pause waits and weight loads: never queued behind generation threads.
        self._control = ThreadPoolExecutor(max_workers=2, thread_name_prefix="local-ctl")
        self.inflight: dict[str, set[_InFlight]] = {}
        self.started = time.time()

        self.weight_version = str(weight_version)  # written under _step_lock
        self.weights_path: str | None = None  # last model_path loaded by /update_weights_from_disk
        # One backend step (one next() of a generator, or a weight load) at a time, in turn.
        self._step_lock = _FairLock()
        self.num_backend_steps = 0  # tokens sampled for /generate since start (under _step_lock)
        # None, or the mode of the running pause; written on the event loop under _pause_cv,
        # whose notify_all wakes the worker threads paused in place.
        self.pause_mode: str | None = None
        self._pause_cv = threading.Condition()
        # Model-update lock (writer-preferring readers-writer lock on the event loop): every
        # admitted /generate and chat request holds a read share until it answers.
        self._readers = 0
        self._writers_waiting = 0
        self._writer_active = False
        self._closing = False
        self._waiters = _Waiters()

    # ---------------------------------------------------------------- control state
    def _states(self) -> list[_InFlight]:
        return [s for group in self.inflight.values() for s in group]

    def _abort(self, targets: list[_InFlight], message: str) -> int:
        """Abort ``targets`` (event loop): they answer at once; their workers stop stepping."""
        n = 0
        for s in targets:
            if not s.aborted:
                s.abort(message)
                n += 1
        if n:
            with self._pause_cv:  # wake the ones paused in place, so their threads end
                self._pause_cv.notify_all()
            self._waiters.notify()  # and the ones held at the pause gate
        return n

    def _set_pause_mode(self, mode: str | None) -> None:
        with self._pause_cv:
            self.pause_mode = mode
            self._pause_cv.notify_all()
        self._waiters.notify()

    async def _admit(self, state: _InFlight | None) -> bool:
        """Hold a request until generation is not paused and no weight update waits or runs,
        then take a read share of the model-update lock (give it back with :meth:`_release`).

        Returns False, holding nothing, if ``state`` was aborted while held or the server is
        shutting down.
        """
        def may_enter() -> bool:
            if self._closing or (state is not None and state.aborted):
                return True
            return self.pause_mode is None and not self._writer_active and not self._writers_waiting

        if not may_enter():
            logger.debug("request %s held (pause_mode=%s, weight update=%s)", state and state.rid,
                         self.pause_mode, self._writer_active or bool(self._writers_waiting))
        await self._waiters.wait_for(may_enter)
        if self._closing or (state is not None and state.aborted):
            return False
        self._readers += 1
        if state is not None:
            state.admitted = True
            state.weight_version = self.weight_version
        return True

    def _release(self) -> None:
        self._readers -= 1
        self._waiters.notify()

    async def _acquire_write(self) -> None:
        """Take the model-update lock: new requests wait from now on; returns once every
        admitted request has answered."""
        self._writers_waiting += 1
        try:
            await self._waiters.wait_for(lambda: not self._writer_active and self._readers == 0)
        finally:
            self._writers_waiting -= 1
            self._waiters.notify()
        self._writer_active = True

    def _release_write(self) -> None:
        self._writer_active = False
        self._waiters.notify()

    def _wait_step_boundary(self) -> None:
        """Block (control thread) until the backend step running now, if any, has ended."""
        with self._step_lock:
            pass

    def _num_paused_requests(self) -> int:
        """Requests that cannot step now because of the pause: paused in place, or held."""
        if self.pause_mode is None:
            return 0
        return sum(1 for s in self._states() if not s.aborted)

    # ---------------------------------------------------------------- worker thread
    def _wait_while_paused(self, state: _InFlight) -> bool:
        """Block the worker thread while generation is paused; False once ``state`` is aborted."""
        if self.pause_mode is not None and not state.aborted:
            with self._pause_cv:
                while self.pause_mode is not None and not state.aborted:
                    self._pause_cv.wait()
        return not state.aborted

    def _run(self, state: _InFlight, input_ids: list[int], params: SamplingParams) -> dict | None:
        """Generate in a worker thread; returns the finish reason, or None when aborted.

        Each backend step runs under the server's step lock and only after checking, with the
        lock held, that the request is neither aborted nor paused: once a pause (or abort) has
        taken the lock, no step of any request starts until generation continues.
        """
        if params.max_new_tokens == 0:
            return {"type": "length", "length": 0}
        stops = params.stop
        window = 4 * max((len(s) for s in stops), default=0) + 8
        stop_ids = set(params.stop_token_ids)
        eos_ids = set() if params.ignore_eos else self.eos_ids
        per_step = max(1, int(getattr(self.backend, "tokens_per_step", 1)))
        gen = None
        try:
            while True:
                if not self._wait_while_paused(state):
                    return None
                with self._step_lock:
                    if state.aborted:
                        return None
                    if self.pause_mode is not None:
                        continue  # paused since the check above: wait again, without stepping
                    if gen is None:
                        gen = self.backend.generate(list(input_ids), params)
                    items = list(itertools.islice(gen, per_step))
                    self.num_backend_steps += len(items)
                    version = self.weight_version
                for item in items:  # each token is checked as if it had come alone
                    tok, lp = int(item[0]), float(item[1])
                    with state.lock:
                        if state.aborted:
                            return None
                        state.ids.append(tok)
                        state.logprobs.append(lp)
                        state.weight_version = version
                        n = len(state.ids)
                        tail = state.ids[-window:] if stops else None
                    if n >= params.max_new_tokens:
                        return {"type": "length", "length": params.max_new_tokens}
                    if tok in stop_ids or tok in eos_ids:
                        return {"type": "stop", "matched": tok}
                    if stops:
                        text = self.tokenizer.decode(tail, skip_special_tokens=False)
                        for s in stops:
                            if s in text:
                                return {"type": "stop", "matched": s}
                if len(items) < per_step:  # the backend ended by itself
                    with state.lock:
                        return None if state.aborted else {"type": "stop", "matched": None}
        finally:
            if gen is not None:
                gen.close()

    def _load_weights(self, model_path: str, weight_version: str | None) -> tuple[bool, str]:
        """Load weights in a control thread, between two backend steps; ``(success, message)``."""
        with self._step_lock:
            old = self.weight_version
            try:
                load = getattr(self.backend, "load_weights", None)
                if load is None:
                    raise NotImplementedError(f"backend {self.backend.name} cannot load weights")
                load(model_path)
            except Exception as e:  # noqa: BLE001  (any failure is reported, weights unchanged)
                logger.warning("update_weights_from_disk %r failed: %s: %s", model_path, type(e).__name__, e)
                return False, (f"Failed to update weights from {model_path!r}: {type(e).__name__}: {e}. "
                               f"The weights and weight_version {old!r} are unchanged.")
            if weight_version is not None:
                self.weight_version = weight_version
            self.weights_path = model_path
            new = self.weight_version
        logger.info("updated weights from %s (weight_version %r -> %r)", model_path, old, new)
        return True, f"Updated weights from {model_path!r}; weight_version is {new!r}."

    def _response(self, state: _InFlight, prompt_len: int, finish: dict, params: SamplingParams,
                  return_logprob: bool) -> dict:
        ids, lps, version = state.snapshot()
        text = self.tokenizer.decode(ids, skip_special_tokens=params.skip_special_tokens)
        matched = finish.get("matched")
        if finish["type"] == "stop" and isinstance(matched, str) and not params.no_stop_trim:
            cut = text.find(matched)
            if cut >= 0:
                text = text[:cut]
        meta: dict[str, Any] = {
            "id": state.rid,
            "finish_reason": finish,
            "prompt_tokens": prompt_len,
            "completion_tokens": len(ids),
            "cached_tokens": 0,
            "weight_version": version,
        }
        if return_logprob:
            meta["output_token_logprobs"] = [[lp, t, None] for t, lp in zip(ids, lps)]
        return {"text": text, "output_ids": ids, "meta_info": meta}

    # ---------------------------------------------------------------- handlers
    async def generate(self, request: web.Request) -> web.Response:
        try:
            body = await _json_body(request, streaming_allowed=False)
            params = parse_sampling_params(body.get("sampling_params"))
            rid = body.get("rid")
            if rid is None:
                rid = uuid.uuid4().hex
            elif not isinstance(rid, str):
                raise BadRequest("rid must be a string")
            return_logprob = body.get("return_logprob") or False
            if not isinstance(return_logprob, bool):
                raise BadRequest("return_logprob must be a boolean")
            input_ids = body.get("input_ids")
            text = body.get("text")
            if input_ids is None and text is None:
                raise BadRequest("input_ids (or text) is required")
            if input_ids is not None:
                if not isinstance(input_ids, list) or not input_ids:
                    raise BadRequest("input_ids must be a non-empty list of token ids")
                if isinstance(input_ids[0], list):
                    raise BadRequest("batched requests are not supported; send one prompt per request")
                if not _token_ids_ok(input_ids, self.vocab_size):
                    raise BadRequest(f"input_ids must be integers in [0, {self.vocab_size})")
            elif not isinstance(text, str) or not text:
                raise BadRequest("text must be a non-empty string")
        except BadRequest as e:
            return _error(400, str(e))

        loop = asyncio.get_running_loop()
        if input_ids is None:
            input_ids = await loop.run_in_executor(self.executor, self.tokenizer.encode, text)
        state = _InFlight(rid, loop, self.weight_version)
        self.inflight.setdefault(rid, set()).add(state)
        try:
            try:
                admitted = await self._admit(state)
            except asyncio.CancelledError:
                state.abort("client disconnected")
                raise
            if not admitted:  # aborted while held (or shutting down): nothing was generated
                finish = {"type": "abort", "message": state.abort_message or "server shutting down"}
                return _json_answer(self._response(state, len(input_ids), finish, params, return_logprob))
            try:
                return await self._generate_admitted(state, input_ids, params, return_logprob)
            finally:
                self._release()
        finally:
            group = self.inflight.get(rid)
            if group is not None:
                group.discard(state)
                if not group:
                    del self.inflight[rid]
            self._waiters.notify()

    async def _generate_admitted(self, state: _InFlight, input_ids: list[int], params: SamplingParams,
                                 return_logprob: bool) -> web.Response:
        if self.generate_latency_s > 0:
            # The injected latency: a sleep on the event loop (no thread, no step lock), cut
            # short by an abort.
            try:
                await asyncio.wait_for(asyncio.shield(state.abort_future), self.generate_latency_s)
            except asyncio.TimeoutError:
                pass
            except asyncio.CancelledError:  # client went away
                self._abort([state], "client disconnected")
                raise
            if state.aborted:
                finish = {"type": "abort", "message": state.abort_message or "aborted"}
                return _json_answer(self._response(state, len(input_ids), finish, params, return_logprob))
        loop = asyncio.get_running_loop()
        fut = loop.run_in_executor(self.executor, self._run, state, input_ids, params)
        # An aborted request returns before its worker ends; retrieve the worker's exception
        # (if any) so that it is logged rather than reported as never retrieved.
        fut.add_done_callback(_log_worker_error)
        try:
            await asyncio.wait({fut, state.abort_future}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # client went away: stop the worker too
            self._abort([state], "client disconnected")
            raise
        if not state.aborted or fut.done():
            try:
                finish = fut.result() if fut.done() else None
            except Exception as e:  # backend failure: an infrastructure error, not a 400
                logger.exception("backend %s failed on request %s", self.backend.name, state.rid)
                return _error(500, f"backend {self.backend.name} failed: {type(e).__name__}: {e}")
            if finish is not None:
                return _json_answer(self._response(state, len(input_ids), finish, params, return_logprob))
        finish = {"type": "abort", "message": state.abort_message or "aborted"}
        return _json_answer(self._response(state, len(input_ids), finish, params, return_logprob))

    async def abort_request(self, request: web.Request) -> web.Response:
        try:
            body = await _json_body(request)
        except BadRequest as e:
            return _error(400, str(e))
        if body.get("abort_all"):
            targets = self._states()
        else:
            rid = body.get("rid")
            if not isinstance(rid, str):
                return _error(400, "rid (string) or abort_all=true is required")
            targets = list(self.inflight.get(rid, ()))
        # As in SGLang, a request held by a pause is not running yet and is not aborted.
        n = self._abort([s for s in targets if s.admitted], "aborted by /abort_request")
        logger.info("aborted %d request(s)", n)
        return web.json_response({"success": True, "aborted": n})

    async def pause_generation(self, request: web.Request) -> web.Response:
        try:
            body = await _json_body(request, empty_ok=True)
            mode = body.get("mode")
            mode = "abort" if mode is None else mode
            if mode not in PAUSE_MODES:
                raise BadRequest(f"mode must be one of {list(PAUSE_MODES)}, not {mode!r}")
        except BadRequest as e:
            return _error(400, str(e))
        t0 = time.monotonic()
        self._set_pause_mode(mode)
        n_aborted = 0
        if mode == "abort":
            n_aborted = self._abort([s for s in self._states() if s.admitted], "aborted by /pause_generation")
        # Once the pause holds the step lock, no step starts until /continue_generation.
        await asyncio.get_running_loop().run_in_executor(self._control, self._wait_step_boundary)
        if mode == "abort":  # as SGLang: answer once the aborted requests have all answered
            await self._waiters.wait_for(lambda: not any(s.admitted for s in self._states()))
        logger.info("generation paused (mode %s) in %.3f s: %d request(s) aborted, %d paused", mode,
                    time.monotonic() - t0, n_aborted, self._num_paused_requests())
        return web.json_response({"message": f"Generation paused (mode {mode}).", "status": "ok"})

    async def continue_generation(self, request: web.Request) -> web.Response:
        try:
            await _json_body(request, empty_ok=True)
        except BadRequest as e:
            return _error(400, str(e))
        was = self.pause_mode
        self._set_pause_mode(None)
        logger.info("generation continued (was paused: %s)", was)
        return web.json_response({"message": "Generation continued.", "status": "ok"})

    async def update_weights_from_disk(self, request: web.Request) -> web.Response:
        try:
            body = await _json_body(request)
            model_path = body.get("model_path")
            if not isinstance(model_path, str) or not model_path:
                raise BadRequest("model_path must be a non-empty string")
            version = body.get("weight_version")
            if version is not None and not isinstance(version, str):
                raise BadRequest("weight_version must be a string or null")
            abort_all = body.get("abort_all_requests")
            if abort_all is not None and not isinstance(abort_all, bool):
                raise BadRequest("abort_all_requests must be a boolean")
        except BadRequest as e:
            return web.json_response({"success": False, "message": str(e), "num_paused_requests": 0}, status=400)
        if abort_all:
            self._abort([s for s in self._states() if s.admitted],
                        "aborted by /update_weights_from_disk (abort_all_requests)")
        paused = self.pause_mode is not None
        if not paused:  # wait for the requests in flight; new ones wait meanwhile
            await self._acquire_write()
        try:
            num_paused = self._num_paused_requests()
            ok, message = await asyncio.get_running_loop().run_in_executor(
                self._control, self._load_weights, model_path, version
            )
        finally:
            if not paused:
                self._release_write()
        return web.json_response({"success": ok, "message": message, "num_paused_requests": num_paused},
                                 status=200 if ok else 400)

    async def get_weight_version(self, request: web.Request) -> web.Response:
        return web.json_response({"weight_version": self.weight_version})

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def health_generate(self, request: web.Request) -> web.Response:
        loop = asyncio.get_running_loop()

        def one_token() -> None:
            with self._step_lock:
                gen = self.backend.generate([0], SamplingParams(max_new_tokens=1, temperature=0.0))
                try:
                    next(gen, None)
                finally:
                    gen.close()

        try:
            await asyncio.wait_for(loop.run_in_executor(self._control, one_token), timeout=30)
        except Exception as e:  # noqa: BLE001  (any failure means unhealthy)
            logger.warning("health_generate failed: %r", e)
            return _error(503, f"generation failed: {type(e).__name__}: {e}")
        return web.Response(status=200)

    async def model_info(self, request: web.Request) -> web.Response:
        return web.json_response({
            # SGLang's keys
            "model_path": self.model_path,
            "tokenizer_path": self.tokenizer_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": self.weight_version,
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": getattr(self.backend, "model_type", None),
            "architectures": getattr(self.backend, "architectures", None),
            # not reported by SGLang: tokenizer_vocab_size, eos_token_id, special_tokens
            **self._tokenizer_facts,
        })

    async def server_info(self, request: web.Request) -> web.Response:
        states = self._states()
        return web.json_response({
            "model_path": self.model_path,
            "tokenizer_path": self.tokenizer_path,
            "served_model_name": self.served_model_name,
            "backend": self.backend.name,
            "is_generation": True,
            "version": "rollout-local-0.1",
            "uptime_s": round(time.time() - self.started, 3),
            "weight_version": self.weight_version,
            "weights_path": self.weights_path,
            "pause_mode": self.pause_mode,
            "event_loop": loop_kind(asyncio.get_running_loop()),
            "num_backend_steps": self.num_backend_steps,
            "num_inflight_requests": len(states),
            "num_held_requests": sum(1 for s in states if not s.admitted and not s.aborted),
            "num_paused_requests": self._num_paused_requests(),
            "internal_states": [{}],
        })

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({
            "object": "list",
            "data": [{"id": self.served_model_name, "object": "model", "created": int(self.started), "owned_by": "rollout-local"}],
        })

    async def flush_cache(self, request: web.Request) -> web.Response:
        return web.Response(status=200, text="Cache flushed.")

    async def chat_completions(self, request: web.Request) -> web.Response:
        try:
            body = await _json_body(request, streaming_allowed=False)
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages
            ):
                raise BadRequest("messages must be a non-empty list of {role, content} objects")
            temperature = body.get("temperature")
            if temperature is not None and (not _is_num(temperature) or temperature < 0):
                raise BadRequest("temperature must be a number >= 0")
            max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
            if max_tokens is not None and (not _is_int(max_tokens) or max_tokens < 1):
                raise BadRequest("max_tokens must be an integer >= 1")
            params = SamplingParams(
                temperature=1.0 if temperature is None else float(temperature),
                max_new_tokens=max_tokens or 1024,
            )
        except BadRequest as e:
            return _error(400, str(e))

        def answer() -> tuple[str, str, int, int]:
            content = self.backend.chat(messages, params)
            out_ids = self.tokenizer.encode(content, add_special_tokens=False)
            finish = "stop"
            if max_tokens is not None and len(out_ids) > max_tokens:
                out_ids = out_ids[:max_tokens]
                content = self.tokenizer.decode(out_ids)
                finish = "length"
            prompt_text = "\n".join(str(m.get("content") or "") for m in messages)
            n_prompt = len(self.tokenizer.encode(prompt_text, add_special_tokens=False))
            return content, finish, n_prompt, len(out_ids)

        # Held while generation is paused or a weight update waits, like /generate.
        if not await self._admit(None):
            return _error(503, "server shutting down")
        loop = asyncio.get_running_loop()
        try:
            content, finish, n_prompt, n_out = await loop.run_in_executor(self.executor, answer)
        except Exception as e:
            logger.exception("backend %s chat failed", self.backend.name)
            return _error(500, f"backend {self.backend.name} failed: {type(e).__name__}: {e}")
        finally:
            self._release()
        return web.json_response({
            "id": "chatcmpl-" + uuid.uuid4().hex,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model") or self.served_model_name,
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": finish,
            }],
            "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out},
        })

    # ---------------------------------------------------------------- lifecycle
    async def _on_shutdown(self, app: web.Application) -> None:
        self._closing = True
        self._abort(self._states(), "server shutting down")
        self._waiters.notify()

    async def _on_cleanup(self, app: web.Application) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)
        self._control.shutdown(wait=False, cancel_futures=True)

    def make_app(self) -> web.Application:
        """The aiohttp application (routes above; in-flight requests are aborted on shutdown)."""
        middlewares = []
        if self._api_key or self._admin_api_key:
            api_key, admin_api_key = self._api_key, self._admin_api_key

            @web.middleware
            async def require_key(request: web.Request, handler):
                status = auth_status(request.method, request.path, request.headers.get("Authorization"),
                                     request.headers.get("x-api-key"), api_key, admin_api_key)
                if status is not None:
                    return web.json_response({"error": "Unauthorized"}, status=status)
                return await handler(request)

            middlewares.append(require_key)
        app = web.Application(client_max_size=512 * 1024 * 1024, middlewares=middlewares)
        app.add_routes([
            web.post("/generate", self.generate),
            web.post("/abort_request", self.abort_request),
            web.post("/pause_generation", self.pause_generation),
            web.post("/continue_generation", self.continue_generation),
            web.post("/update_weights_from_disk", self.update_weights_from_disk),
            web.get("/get_weight_version", self.get_weight_version),
            web.get("/health", self.health),
            web.get("/health_generate", self.health_generate),
            web.get("/get_model_info", self.model_info),
            web.get("/model_info", self.model_info),
            web.get("/get_server_info", self.server_info),
            web.get("/server_info", self.server_info),
            web.get("/v1/models", self.models),
            web.post("/v1/chat/completions", self.chat_completions),
            web.post("/flush_cache", self.flush_cache),
            web.get("/flush_cache", self.flush_cache),
        ])
        app.on_shutdown.append(self._on_shutdown)
        app.on_cleanup.append(self._on_cleanup)
        return app


def create_app(backend: GenerationBackend, tokenizer, **kwargs: Any) -> web.Application:
    """Build the aiohttp app for ``backend`` (keyword args as for :class:`LocalSGLangServer`)."""
    return LocalSGLangServer(backend, tokenizer, **kwargs).make_app()


def _log_worker_error(fut: asyncio.Future) -> None:
    if not fut.cancelled() and fut.exception() is not None:
        logger.debug("generation worker ended with %r", fut.exception())


async def _json_body(request: web.Request, streaming_allowed: bool = True, empty_ok: bool = False) -> dict:
    """The request's JSON object body (``{}`` for an empty body when ``empty_ok``).

    Raises:
        BadRequest: not JSON, not an object, or ``"stream": true`` where streaming is not served.
    """
    if empty_ok and not (await request.read()).strip():
        return {}
    try:
        body = fastjson.loads(await request.read())
    except ValueError:  # JSONDecodeError (both libraries') and UnicodeDecodeError
        raise BadRequest("request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    if not streaming_allowed and body.get("stream"):
        raise BadRequest("streaming is not supported by the local server; send stream=false")
    return body


def _json_answer(data: dict) -> web.Response:
    """A 200 JSON answer encoded with orjson (a ``/generate`` answer lists every output id and
    its log-prob; SGLang's HTTP server answers with orjson too)."""
    return web.Response(body=fastjson.dumps(data), content_type="application/json")


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


# --------------------------------------------------------------------------- CLI
class _DropHttp2Probe(logging.Filter):
    """Drop aiohttp's parse-error tracebacks caused by the router's HTTP/2 (gRPC) probe."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not (exc is not None and type(exc).__name__ == "BadHttpMessage" and "PRI" in str(exc))


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m rollout.devtools.local.server", description=__doc__.split("\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--backend", choices=BACKENDS, default="gold_replay")
    p.add_argument("--domain", default="retail", help="tau2 domain (gold_replay backends)")
    p.add_argument("--tokenizer", default="builtin:qwen3", help="builtin:qwen3, a local folder or a hub id")
    p.add_argument("--tiny-config", default=None, help="JSON of TinyModelConfig fields (tiny backend)")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    p.add_argument("--max-workers", type=int, default=64, help="generation threads")
    p.add_argument("--weight-version", default=DEFAULT_WEIGHT_VERSION,
                   help="initial weight version reported in meta_info (SGLang's --weight-version)")
    p.add_argument("--api-key-env", default=None, metavar="NAME",
                   help="require the API key held by this environment variable (SGLang's --api-key; never in argv)")
    p.add_argument("--admin-api-key-env", default=None, metavar="NAME",
                   help="require the admin key held by this environment variable on admin endpoints (SGLang's --admin-api-key)")
    p.add_argument("--generate-latency-s", type=float, default=0.0, metavar="S",
                   help="seconds every /generate waits (asyncio sleep, no thread or step lock held) before generating")
    p.add_argument("--event-loop", choices=EVENT_LOOPS, default="uvloop",
                   help="uvloop (C, the default) or asyncio (the standard library's selector loop); see rollout.core.eventloop")
    p.add_argument("--parent-pid", type=int, default=None, help="exit once this process (the parent) is gone")
    p.add_argument("--pdeathsig", action="store_true",
                   help="Linux: SIGTERM when the parent thread exits (prctl PR_SET_PDEATHSIG)")
    return p.parse_args(argv)


def _key_from_env(p_name: str, var: str | None) -> str | None:
    """The key held by the environment variable ``var`` (None when ``var`` is None).

    Raises:
        SystemExit: ``var`` is given but unset or empty (a server asked for a key never runs open).
    """
    if var is None:
        return None
    key = os.environ.get(var)
    if not key:
        raise SystemExit(f"rollout.devtools.local.server: {p_name} {var}: the environment variable is not set (or empty)")
    return key


def main(argv: list[str] | None = None) -> None:
    """CLI entry point: load the tokenizer and backend, then serve until SIGINT/SIGTERM (or the
    parent named by ``--parent-pid`` is gone)."""
    args = _parse_args(argv)
    if args.generate_latency_s < 0:
        raise SystemExit(f"rollout.devtools.local.server: --generate-latency-s must be >= 0, got {args.generate_latency_s}")
    why = check_event_loop(args.event_loop, "--event-loop")
    if why:
        raise SystemExit(f"rollout.devtools.local.server: {why}")
    if args.pdeathsig or args.parent_pid is not None:
        from rollout.devtools.local.stack import share_fate

        share_fate(args.parent_pid, pdeathsig=args.pdeathsig)
    api_key = _key_from_env("--api-key-env", args.api_key_env)
    admin_api_key = _key_from_env("--admin-api-key-env", args.admin_api_key_env)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.log_level != "DEBUG":
        logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    logging.getLogger("aiohttp.server").addFilter(_DropHttp2Probe())
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    try:  # tau2 logs through loguru at DEBUG; follow our level
        from loguru import logger as _loguru

        _loguru.remove()
        _loguru.add(sys.stderr, level=args.log_level)
    except ImportError:
        pass
    from rollout.core.tokenizer import load_tokenizer, resolve_tokenizer_path

    tiny_cfg = json.loads(args.tiny_config) if args.tiny_config else None
    tokenizer = load_tokenizer(args.tokenizer)
    backend = make_backend(args.backend, args.domain, tokenizer, tiny_cfg)
    server = LocalSGLangServer(
        backend, tokenizer, tokenizer_path=resolve_tokenizer_path(args.tokenizer), max_workers=args.max_workers,
        weight_version=args.weight_version, api_key=api_key, admin_api_key=admin_api_key,
        generate_latency_s=args.generate_latency_s,
    )
    app = server.make_app()
    if api_key or admin_api_key:
        logger.info("API key required (from $%s)%s", args.api_key_env or args.admin_api_key_env,
                    f"; admin key from ${args.admin_api_key_env}" if admin_api_key else "")

    def announce(msg: str) -> None:
        kind = loop_kind(asyncio.get_running_loop())
        print(f"rollout.devtools.local.server backend={backend.name} loop={kind} listening on http://{args.host}:{args.port}", flush=True)

    # handler_cancellation: a client that disconnects cancels its handler, which aborts the
    # generation thread. In-flight requests are aborted on SIGTERM (on_shutdown), so a short
    # shutdown_timeout suffices.
    web.run_app(app, host=args.host, port=args.port, print=announce, handler_cancellation=True,
                shutdown_timeout=5.0, access_log=logging.getLogger("aiohttp.access"), loop=new_event_loop(args.event_loop))


if __name__ == "__main__":
    main()
