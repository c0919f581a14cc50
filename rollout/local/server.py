"""A small test server that speaks SGLang's native HTTP protocol over a pluggable backend.

It is a test and demo server for laptops and CI, not a replacement for SGLang. It runs behind the
real ``sglang-router`` (see :mod:`rollout.local.stack`) and serves:

* ``POST /generate``: ``{"input_ids": [int]}`` (or ``"text"``), ``sampling_params``,
  ``return_logprob``, ``rid``; answers ``{"text", "output_ids", "meta_info": {"id",
  "finish_reason", "prompt_tokens", "completion_tokens", "cached_tokens",
  "output_token_logprobs"?}}``. Streaming is not supported (400).
* ``POST /abort_request``: ``{"rid": str}`` or ``{"abort_all": true}``; the aborted requests
  return at once with ``finish_reason.type == "abort"`` and the tokens generated so far.
* ``GET /health``, ``GET /health_generate``, ``GET /get_model_info``, ``GET /get_server_info``,
  ``GET /v1/models``, ``POST /v1/chat/completions`` (non-streaming, answered by
  ``backend.chat``), ``POST /flush_cache``.

Stop semantics (checked after every sampled token, in this order, as SGLang does):

1. ``len(output) == max_new_tokens`` -> ``{"type": "length", "length": max_new_tokens}``;
2. the token is in ``stop_token_ids``, or is the tokenizer's EOS and ``ignore_eos`` is false ->
   ``{"type": "stop", "matched": token_id}``; the token is part of the output;
3. the decoded output (special tokens kept) now contains a stop string ->
   ``{"type": "stop", "matched": stop_string}``; the output ids end with the token that completed
   it, and ``text`` is cut before the stop string unless ``no_stop_trim``.

A backend generator that ends by itself gives ``{"type": "stop", "matched": null}``.

Run it with ``python -m rollout.local.server --port P --backend gold_replay --domain retail``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aiohttp import web

from rollout.local.backend_api import GenerationBackend, SamplingParams

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
        ImportError: ``tiny`` without torch / ``rollout.local.tiny``.
    """
    if name in ("gold_replay", "gold_replay_skip_write"):
        from rollout.local.gold import GoldReplayBackend

        return GoldReplayBackend(domain, tokenizer, skip_write=(name == "gold_replay_skip_write"))
    if name == "tiny":
        from rollout.local.tiny import TinyLMBackend  # needs torch; imported only here

        if tiny_cfg is None:
            from rollout.config import TinyModelConfig

            tiny_cfg = dataclasses.asdict(TinyModelConfig())
        # One torch thread per server process: a one-token decode step is too small for OpenMP,
        # and two threads on a busy 2-core machine made 64 tokens take 13-18 s instead of ~1 s.
        return TinyLMBackend(tokenizer, dict(tiny_cfg), num_threads=1)
    raise ValueError(f"unknown backend {name!r}; choose one of {BACKENDS}")


# --------------------------------------------------------------------------- request parsing
def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


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
    """One /generate request: tokens so far (written by the worker thread) and its abort flag."""

    def __init__(self, rid: str, loop: asyncio.AbstractEventLoop) -> None:
        self.rid = rid
        self.lock = threading.Lock()
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.aborted = False  # read by the worker thread under ``lock``
        self.abort_message = ""
        self.abort_future: asyncio.Future = loop.create_future()

    def abort(self, message: str) -> None:
        """Stop the request (event-loop thread only); the worker appends nothing after this."""
        with self.lock:
            if self.aborted:
                return
            self.aborted = True
            self.abort_message = message
        if not self.abort_future.done():
            self.abort_future.set_result(None)

    def snapshot(self) -> tuple[list[int], list[float]]:
        with self.lock:
            return list(self.ids), list(self.logprobs)


class LocalSGLangServer:
    """Owns a backend, the tokenizer, the worker threads and the in-flight requests.

    Args:
        backend: the :class:`GenerationBackend` that samples tokens.
        tokenizer: ``transformers`` tokenizer (decoding, stop strings, ``text`` inputs).
        model_path: reported by ``/get_model_info``; default: ``tokenizer_path`` (the router
            loads a tokenizer from each worker's model path, and must not reach a model hub).
        tokenizer_path: reported by ``/get_model_info``; default: ``tokenizer.name_or_path``.
        served_model_name: reported by ``/get_server_info`` and ``/v1/models``; default
            ``local/<backend name>``.
        max_workers: generation threads (concurrent requests beyond it queue).
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
    ) -> None:
        self.backend = backend
        self.tokenizer = tokenizer
        self.tokenizer_path = tokenizer_path or getattr(tokenizer, "name_or_path", "")
        # The router loads a tokenizer for each worker's model_path (from a model hub unless it
        # is a local folder), so the default model_path is the local tokenizer folder.
        self.model_path = model_path or self.tokenizer_path or f"local/{backend.name}"
        self.served_model_name = served_model_name or f"local/{backend.name}"
        self.vocab_size = len(tokenizer)
        eos = tokenizer.eos_token_id
        self.eos_ids: frozenset[int] = frozenset([eos] if isinstance(eos, int) else (eos or []))
        self.executor = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="local-gen")
        self.inflight: dict[str, set[_InFlight]] = {}
        self.started = time.time()

    # ---------------------------------------------------------------- worker thread
    def _run(self, state: _InFlight, input_ids: list[int], params: SamplingParams) -> dict | None:
        """Generate in a worker thread; returns the finish reason, or None when aborted."""
        if params.max_new_tokens == 0:
            return {"type": "length", "length": 0}
        stops = params.stop
        window = 4 * max((len(s) for s in stops), default=0) + 8
        stop_ids = set(params.stop_token_ids)
        eos_ids = set() if params.ignore_eos else self.eos_ids
        gen = self.backend.generate(list(input_ids), params)
        try:
            for tok, lp in gen:
                tok = int(tok)
                with state.lock:
                    if state.aborted:
                        return None
                    state.ids.append(tok)
                    state.logprobs.append(float(lp))
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
            with state.lock:
                return None if state.aborted else {"type": "stop", "matched": None}
        finally:
            gen.close()

    def _response(self, state: _InFlight, prompt_len: int, finish: dict, params: SamplingParams,
                  return_logprob: bool) -> dict:
        ids, lps = state.snapshot()
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
                if not all(_is_int(t) and 0 <= t < self.vocab_size for t in input_ids):
                    raise BadRequest(f"input_ids must be integers in [0, {self.vocab_size})")
            elif not isinstance(text, str) or not text:
                raise BadRequest("text must be a non-empty string")
        except BadRequest as e:
            return _error(400, str(e))

        loop = asyncio.get_running_loop()
        if input_ids is None:
            input_ids = await loop.run_in_executor(self.executor, self.tokenizer.encode, text)
        state = _InFlight(rid, loop)
        self.inflight.setdefault(rid, set()).add(state)
        try:
            fut = loop.run_in_executor(self.executor, self._run, state, input_ids, params)
            # An aborted request returns before its worker ends; retrieve the worker's exception
            # (if any) so that it is logged rather than reported as never retrieved.
            fut.add_done_callback(_log_worker_error)
            try:
                await asyncio.wait({fut, state.abort_future}, return_when=asyncio.FIRST_COMPLETED)
            except asyncio.CancelledError:  # client went away: stop the worker too
                state.abort("client disconnected")
                raise
            if not state.aborted or fut.done():
                try:
                    finish = fut.result() if fut.done() else None
                except Exception as e:  # backend failure: an infrastructure error, not a 400
                    logger.exception("backend %s failed on request %s", self.backend.name, rid)
                    return _error(500, f"backend {self.backend.name} failed: {type(e).__name__}: {e}")
                if finish is not None:
                    return web.json_response(self._response(state, len(input_ids), finish, params, return_logprob))
            finish = {"type": "abort", "message": state.abort_message or "aborted"}
            return web.json_response(self._response(state, len(input_ids), finish, params, return_logprob))
        finally:
            group = self.inflight.get(rid)
            if group is not None:
                group.discard(state)
                if not group:
                    del self.inflight[rid]

    async def abort_request(self, request: web.Request) -> web.Response:
        try:
            body = await _json_body(request)
        except BadRequest as e:
            return _error(400, str(e))
        if body.get("abort_all"):
            targets = [s for group in self.inflight.values() for s in group]
        else:
            rid = body.get("rid")
            if not isinstance(rid, str):
                return _error(400, "rid (string) or abort_all=true is required")
            targets = list(self.inflight.get(rid, ()))
        for s in targets:
            s.abort("aborted by /abort_request")
        logger.info("aborted %d request(s)", len(targets))
        return web.json_response({"success": True, "aborted": len(targets)})

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def health_generate(self, request: web.Request) -> web.Response:
        loop = asyncio.get_running_loop()

        def one_token() -> None:
            gen = self.backend.generate([0], SamplingParams(max_new_tokens=1, temperature=0.0))
            try:
                next(gen, None)
            finally:
                gen.close()

        try:
            await asyncio.wait_for(loop.run_in_executor(self.executor, one_token), timeout=30)
        except Exception as e:  # noqa: BLE001  (any failure means unhealthy)
            logger.warning("health_generate failed: %r", e)
            return _error(503, f"generation failed: {type(e).__name__}: {e}")
        return web.Response(status=200)

    async def model_info(self, request: web.Request) -> web.Response:
        return web.json_response({
            "model_path": self.model_path,
            "tokenizer_path": self.tokenizer_path,
            "is_generation": True,
        })

    async def server_info(self, request: web.Request) -> web.Response:
        return web.json_response({
            "model_path": self.model_path,
            "tokenizer_path": self.tokenizer_path,
            "served_model_name": self.served_model_name,
            "backend": self.backend.name,
            "is_generation": True,
            "version": "rollout-local-0.1",
            "uptime_s": round(time.time() - self.started, 3),
            "num_inflight_requests": sum(len(g) for g in self.inflight.values()),
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

        loop = asyncio.get_running_loop()
        try:
            content, finish, n_prompt, n_out = await loop.run_in_executor(self.executor, answer)
        except Exception as e:
            logger.exception("backend %s chat failed", self.backend.name)
            return _error(500, f"backend {self.backend.name} failed: {type(e).__name__}: {e}")
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
        for group in list(self.inflight.values()):
            for s in list(group):
                s.abort("server shutting down")

    async def _on_cleanup(self, app: web.Application) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)

    def make_app(self) -> web.Application:
        """The aiohttp application (routes above; in-flight requests are aborted on shutdown)."""
        app = web.Application(client_max_size=512 * 1024 * 1024)
        app.add_routes([
            web.post("/generate", self.generate),
            web.post("/abort_request", self.abort_request),
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


async def _json_body(request: web.Request, streaming_allowed: bool = True) -> dict:
    """The request's JSON object body.

    Raises:
        BadRequest: not JSON, not an object, or ``"stream": true`` where streaming is not served.
    """
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise BadRequest("request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    if not streaming_allowed and body.get("stream"):
        raise BadRequest("streaming is not supported by the local server; send stream=false")
    return body


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


# --------------------------------------------------------------------------- CLI
class _DropHttp2Probe(logging.Filter):
    """Drop aiohttp's parse-error tracebacks caused by the router's HTTP/2 (gRPC) probe."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not (exc is not None and type(exc).__name__ == "BadHttpMessage" and "PRI" in str(exc))


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m rollout.local.server", description=__doc__.split("\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--backend", choices=BACKENDS, default="gold_replay")
    p.add_argument("--domain", default="retail", help="tau2 domain (gold_replay backends)")
    p.add_argument("--tokenizer", default="builtin:qwen3", help="builtin:qwen3, a local folder or a hub id")
    p.add_argument("--tiny-config", default=None, help="JSON of TinyModelConfig fields (tiny backend)")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    p.add_argument("--max-workers", type=int, default=64, help="generation threads")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """CLI entry point: load the tokenizer and backend, then serve until SIGINT/SIGTERM."""
    import os

    args = _parse_args(argv)
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
    from rollout.tokenizer import load_tokenizer, resolve_tokenizer_path

    tiny_cfg = json.loads(args.tiny_config) if args.tiny_config else None
    tokenizer = load_tokenizer(args.tokenizer)
    backend = make_backend(args.backend, args.domain, tokenizer, tiny_cfg)
    server = LocalSGLangServer(
        backend, tokenizer, tokenizer_path=resolve_tokenizer_path(args.tokenizer), max_workers=args.max_workers
    )
    app = server.make_app()

    def announce(msg: str) -> None:
        print(f"rollout.local.server backend={backend.name} listening on http://{args.host}:{args.port}", flush=True)

    # handler_cancellation: a client that disconnects cancels its handler, which aborts the
    # generation thread. In-flight requests are aborted on SIGTERM (on_shutdown), so a short
    # shutdown_timeout suffices.
    web.run_app(app, host=args.host, port=args.port, print=announce, handler_cancellation=True,
                shutdown_timeout=5.0, access_log=logging.getLogger("aiohttp.access"))


if __name__ == "__main__":
    main()
