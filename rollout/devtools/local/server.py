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
  in-flight request counts, ``weight_update``: ``"waiting"`` (for the requests in flight),
  ``"loading"`` or null), ``GET /v1/models``, ``POST /v1/chat/completions`` (non-streaming,
  answered by ``backend.chat``), ``POST /flush_cache`` (empties the prefix cache).
* ``GET /metrics``: Prometheus text, SGLang's metric names where SGLang has them
  (``sglang:num_running_reqs``, ``sglang:num_queue_reqs``, ``sglang:token_usage``,
  ``sglang:cache_hit_rate``, ...) and counters of our own (:mod:`rollout.devtools.local.kvmodel`).

The KV model (``--kv-*`` flags, ``local.kv.*``; all off by default): a per-server prefix cache
(``meta_info.cached_tokens``), a KV budget beyond which running requests are retracted and
prefilled again, and a cost model in seconds, around every backend's generation; see
:mod:`rollout.devtools.local.kvmodel`.

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

Requests from web pages of other sites (:func:`rollout.app.webguard.local_guard`, before the keys):
a request whose ``Origin`` is not the server's own ``http://host:port``, or that a browser marks
``Sec-Fetch-Site: cross-site``, is answered HTTP 403, so a page the user visits cannot pause
generation or load weights with a ``text/plain`` POST, which needs no CORS pre-flight. Clients
that send no ``Origin`` (the router, the pool, curl) are not affected.

Fate sharing: with ``--parent-pid PID`` the server exits (SIGTERM to itself, then a hard exit 10 s
later) once its parent process is gone (polled twice a second); with ``--pdeathsig`` it also asks
Linux for SIGTERM when the parent *thread* that started it exits (see :mod:`rollout.devtools.local.stack`).

Run it with ``python -m rollout.devtools.local.server --port P --backend gold_replay --domain retail``.

Where it lives: :mod:`~rollout.devtools.local.protocol` (request parsing, answers),
:mod:`~rollout.devtools.local.auth` (API keys), :mod:`~rollout.devtools.local.control` (in-flight
requests, pause / continue / abort, the model-update lock), :mod:`~rollout.devtools.local.scheduler`
(backend steps one at a time, weight loads), the endpoints in :mod:`~rollout.devtools.local.generate`,
:mod:`~rollout.devtools.local.admin`, :mod:`~rollout.devtools.local.info` and
:mod:`~rollout.devtools.local.chat`; this module assembles the HTTP app and runs it.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import sys
import time
from typing import Any

from aiohttp import web

from rollout.app.webguard import local_guard
from rollout.core.eventloop import EVENT_LOOPS, check_event_loop, loop_kind, new_event_loop
from rollout.devtools.local.admin import AdminEndpoints
from rollout.devtools.local.auth import ADMIN_PATHS, auth_middlewares, auth_status
from rollout.devtools.local.backend_api import GenerationBackend
from rollout.devtools.local.chat import ChatEndpoint
from rollout.devtools.local.control import PAUSE_MODES, GenerationControl
from rollout.devtools.local.generate import GenerateEndpoint
from rollout.devtools.local.info import InfoEndpoints, ServedModel
from rollout.devtools.local.kvmodel import KVModel, KVParams
from rollout.devtools.local.protocol import BadRequest, parse_sampling_params
from rollout.devtools.local.scheduler import DEFAULT_WEIGHT_VERSION, StepScheduler
from rollout.devtools.local.scheduler import FairLock as _FairLock  # noqa: F401  (re-export: the old name, used by tests)

__all__ = [
    "ADMIN_PATHS", "BACKENDS", "DEFAULT_WEIGHT_VERSION", "PAUSE_MODES", "BadRequest", "LocalSGLangServer",
    "auth_status", "create_app", "main", "make_backend", "parse_sampling_params",
]

logger = logging.getLogger(__name__)

BACKENDS = ("gold_replay", "gold_replay_skip_write", "tiny")


def make_backend(name: str, domain: str, tokenizer, tiny_cfg: dict | None = None, chat_format: str = "auto",
                 think_tokens: int = 0) -> GenerationBackend:
    """Build a generation backend by name.

    Args:
        name: ``gold_replay``, ``gold_replay_skip_write`` or ``tiny``.
        domain: tau2 domain for the gold-replay backends (ignored by ``tiny``).
        tokenizer: the loaded ``transformers`` tokenizer shared by server and backend.
        tiny_cfg: ``dataclasses.asdict(TinyModelConfig)``-style dict for ``tiny`` (None: defaults).
        chat_format: the chat format the gold-replay backends read and write, and ``tiny``
            renders its user-simulator chats with when the tokenizer has no chat template
            (``auto``: detected from the tokenizer).
        think_tokens: gold replay: a reasoning block of this many tokens before every answer
            (hermes / Qwen3 only; 0: none).

    Raises:
        ValueError: unknown backend name (or a backend's own construction error).
        ImportError: ``tiny`` without torch / ``rollout.devtools.local.tiny``.
    """
    if name in ("gold_replay", "gold_replay_skip_write"):
        from rollout.devtools.local.gold import GoldReplayBackend

        return GoldReplayBackend(domain, tokenizer, skip_write=(name == "gold_replay_skip_write"), chat_format=chat_format,
                                 think_tokens=think_tokens)
    if name == "tiny":
        from rollout.devtools.local.tiny import TinyLMBackend  # needs torch; imported only here

        if tiny_cfg is None:
            from rollout.core.config import TinyModelConfig

            tiny_cfg = dataclasses.asdict(TinyModelConfig())
        # One torch thread per server process: a one-token decode step is too small for OpenMP,
        # and two threads on a busy 2-core machine made 64 tokens take 13-18 s instead of ~1 s.
        return TinyLMBackend(tokenizer, dict(tiny_cfg), num_threads=1, chat_format=chat_format)
    raise ValueError(f"unknown backend {name!r}; choose one of {BACKENDS}")


class LocalSGLangServer:
    """The local SGLang-protocol server: a backend, its tokenizer, the worker threads, the
    in-flight requests and the pause / weight-update state, served as one aiohttp app (see the
    module docstring for the semantics).

    It assembles the parts: :attr:`control` (:class:`GenerationControl`: in-flight requests,
    pause / abort, the model-update lock), :attr:`scheduler` (:class:`StepScheduler`: backend
    steps one at a time, weight loads) and the endpoints over them (/generate, the RL / admin
    endpoints, health and information, the OpenAI chat completion); :meth:`make_app` routes them.

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
        kv: the prefix cache / KV budget / cost model's parameters
            (:class:`~rollout.devtools.local.kvmodel.KVParams`; None: all off).

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
        kv: KVParams | None = None,
    ) -> None:
        if generate_latency_s < 0:
            raise ValueError(f"generate_latency_s must be >= 0 seconds, got {generate_latency_s}")
        self.backend = backend
        self.tokenizer = tokenizer
        self._api_key = api_key or None
        self._admin_api_key = admin_api_key or None
        from rollout.app.preflight import tokenizer_facts

        tokenizer_path = tokenizer_path or getattr(tokenizer, "name_or_path", "")
        self.model = ServedModel(
            # The router loads a tokenizer for each worker's model_path (from a model hub unless
            # it is a local folder), so the default model_path is the local tokenizer folder.
            model_path=model_path or tokenizer_path or f"local/{backend.name}",
            tokenizer_path=tokenizer_path,
            served_model_name=served_model_name or f"local/{backend.name}",
            vocab_size=len(tokenizer),
            tokenizer_facts=tokenizer_facts(tokenizer),
            started=time.time(),
        )
        self.control = GenerationControl()
        self.scheduler = StepScheduler(backend, tokenizer, self.control, max_workers=max_workers,
                                       weight_version=weight_version)
        self.kv = KVModel(kv)
        self.generation = GenerateEndpoint(self.scheduler, self.control, vocab_size=self.model.vocab_size,
                                           generate_latency_s=float(generate_latency_s), kv=self.kv)
        self.admin = AdminEndpoints(self.scheduler, self.control)
        self.info = InfoEndpoints(self.model, self.scheduler, self.control)
        self.chat = ChatEndpoint(self.scheduler, self.control, self.model.served_model_name)

    async def metrics(self, request: web.Request) -> web.Response:
        """``GET /metrics``: the KV model's gauges and counters in Prometheus' text format."""
        return web.Response(text=self.kv.prometheus(self.model.served_model_name),
                            content_type="text/plain", charset="utf-8")

    async def flush_cache(self, request: web.Request) -> web.Response:
        """``/flush_cache``: empty the prefix cache; 200 ``Cache flushed.``."""
        self.kv.flush()
        return web.Response(status=200, text="Cache flushed.")

    async def _on_shutdown(self, app: web.Application) -> None:
        self.control.close()

    async def _on_cleanup(self, app: web.Application) -> None:
        self.scheduler.shutdown()

    def make_app(self) -> web.Application:
        """The aiohttp application (routes below; in-flight requests are aborted on shutdown). A
        request sent by a web page of another site is refused (403) before the API keys are
        looked at (:func:`rollout.app.webguard.local_guard`): with no key set, the admin
        endpoints would otherwise obey any site the user's browser visits."""
        app = web.Application(client_max_size=512 * 1024 * 1024,
                              middlewares=[local_guard(), *auth_middlewares(self._api_key, self._admin_api_key)])
        admin, info = self.admin, self.info
        # (route makers, paths, handler): SGLang serves some endpoints under two paths or two methods
        # (web.get also answers HEAD, as aiohttp's default)
        routes = [
            ((web.post,), ("/generate",), self.generation.generate),
            ((web.post,), ("/abort_request",), admin.abort_request),
            ((web.post,), ("/pause_generation",), admin.pause_generation),
            ((web.post,), ("/continue_generation",), admin.continue_generation),
            ((web.post,), ("/update_weights_from_disk",), admin.update_weights_from_disk),
            ((web.get,), ("/get_weight_version",), admin.get_weight_version),
            ((web.get,), ("/health",), info.health),
            ((web.get,), ("/health_generate",), info.health_generate),
            ((web.get,), ("/get_model_info", "/model_info"), info.model_info),
            ((web.get,), ("/get_server_info", "/server_info"), info.server_info),
            ((web.get,), ("/v1/models",), info.models),
            ((web.post,), ("/v1/chat/completions",), self.chat.chat_completions),
            ((web.post, web.get), ("/flush_cache",), self.flush_cache),
            ((web.get,), ("/metrics",), self.metrics),
        ]
        app.add_routes([make(path, handler) for makers, paths, handler in routes for path in paths for make in makers])
        app.on_shutdown.append(self._on_shutdown)
        app.on_cleanup.append(self._on_cleanup)
        return app


def create_app(backend: GenerationBackend, tokenizer, **kwargs: Any) -> web.Application:
    """Build the aiohttp app for ``backend`` (keyword args as for :class:`LocalSGLangServer`)."""
    return LocalSGLangServer(backend, tokenizer, **kwargs).make_app()


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
    p.add_argument("--tokenizer", default="builtin:qwen3", help="builtin:<vocabulary>, a local folder or a hub id")
    p.add_argument("--chat-format", default="auto", help="the chat format gold replay speaks (auto: detected from the tokenizer)")
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
    kv = p.add_argument_group("KV model", "prefix cache, KV budget and cost model (rollout.devtools.local.kvmodel); 0: off")
    KVParams.add_arguments(kv)
    kv.add_argument("--gold-think-tokens", type=int, default=0,
                    help="gold replay: a <think> block of this many tokens before every answer (what makes running requests grow)")
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
    try:
        kv_params = KVParams.from_args(args)
    except ValueError as e:
        raise SystemExit(f"rollout.devtools.local.server: --kv-*: {e}") from None
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
    backend = make_backend(args.backend, args.domain, tokenizer, tiny_cfg, chat_format=args.chat_format,
                           think_tokens=args.gold_think_tokens)
    server = LocalSGLangServer(
        backend, tokenizer, tokenizer_path=resolve_tokenizer_path(args.tokenizer), max_workers=args.max_workers,
        weight_version=args.weight_version, api_key=api_key, admin_api_key=admin_api_key,
        generate_latency_s=args.generate_latency_s, kv=kv_params,
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
