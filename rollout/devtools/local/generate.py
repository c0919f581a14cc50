"""SGLang's native ``POST /generate`` for the local server: parse, admit, step, answer.

A request is validated (:mod:`rollout.devtools.local.protocol`), registered in flight and held
at the pause gate (:class:`rollout.devtools.local.control.GenerationControl`), waits the injected
latency if any, then is generated token by token in a worker thread by
:class:`rollout.devtools.local.scheduler.StepScheduler`; an abort answers at once with what was
generated so far. Answer format and semantics in :mod:`rollout.devtools.local.server`'s docstring.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

from aiohttp import web

from rollout.devtools.local.backend_api import SamplingParams
from rollout.devtools.local.control import GenerationControl, InFlight
from rollout.devtools.local.kvmodel import KVModel, KVRequest
from rollout.devtools.local.protocol import BadRequest, error_answer, json_answer, json_body, parse_sampling_params, token_ids_ok
from rollout.devtools.local.scheduler import StepScheduler

logger = logging.getLogger(__name__)


def generate_answer(tokenizer, state: InFlight, prompt_len: int, finish: dict, params: SamplingParams,
                    return_logprob: bool, cached_tokens: int = 0) -> dict:
    """SGLang's /generate answer for ``state``: ``{"text", "output_ids", "meta_info"}``.

    Args:
        tokenizer: decodes the output ids into ``text``.
        state: the request (its output ids, log-probs and weight version so far).
        prompt_len: prompt tokens (``meta_info["prompt_tokens"]``).
        finish: the finish reason (``{"type": "length" | "stop" | "abort", ...}``); a stop
            string in ``finish["matched"]`` is cut from ``text`` unless ``params.no_stop_trim``.
        params: the request's sampling parameters.
        return_logprob: add ``meta_info["output_token_logprobs"]`` (``[[log_prob, id, None]]``).
        cached_tokens: prompt tokens found in the prefix cache (``meta_info["cached_tokens"]``).
    """
    ids, lps, version = state.snapshot()
    text = tokenizer.decode(ids, skip_special_tokens=params.skip_special_tokens)
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
        "cached_tokens": cached_tokens,
        "weight_version": version,
    }
    if return_logprob:
        meta["output_token_logprobs"] = [[lp, t, None] for t, lp in zip(ids, lps)]
    return {"text": text, "output_ids": ids, "meta_info": meta}


def _log_worker_error(fut: asyncio.Future) -> None:
    if not fut.cancelled() and fut.exception() is not None:
        logger.debug("generation worker ended with %r", fut.exception())


class GenerateEndpoint:
    """``POST /generate`` (:meth:`generate`).

    Args:
        scheduler: runs the backend steps.
        control: the in-flight registry and the pause gate.
        vocab_size: ``input_ids`` must lie in ``[0, vocab_size)``.
        generate_latency_s: seconds every admitted request waits on the event loop before its
            first step (0.0: none).
        kv: the server's prefix cache / KV budget / cost model (:mod:`rollout.devtools.local.kvmodel`),
            around every backend's generation; None: a model with every part off (counts only).
    """

    def __init__(self, scheduler: StepScheduler, control: GenerationControl, *, vocab_size: int,
                 generate_latency_s: float, kv: KVModel | None = None) -> None:
        self.scheduler = scheduler
        self.control = control
        self.vocab_size = vocab_size
        self.generate_latency_s = generate_latency_s
        self.kv = kv if kv is not None else KVModel()

    def _answer(self, state: InFlight, prompt_len: int, finish: dict, params: SamplingParams,
                return_logprob: bool, kv_req: KVRequest | None = None) -> web.Response:
        cached = kv_req.cached if kv_req is not None else 0
        return json_answer(generate_answer(self.scheduler.tokenizer, state, prompt_len, finish, params, return_logprob, cached))

    async def generate(self, request: web.Request) -> web.Response:
        """Answer one /generate request (400 for a malformed body, 500 for a backend failure)."""
        try:
            body = await json_body(request, streaming_allowed=False)
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
                if not token_ids_ok(input_ids, self.vocab_size):
                    raise BadRequest(f"input_ids must be integers in [0, {self.vocab_size})")
            elif not isinstance(text, str) or not text:
                raise BadRequest("text must be a non-empty string")
        except BadRequest as e:
            return error_answer(400, str(e))

        scheduler, control = self.scheduler, self.control
        loop = asyncio.get_running_loop()
        if input_ids is None:
            input_ids = await loop.run_in_executor(scheduler.executor, scheduler.tokenizer.encode, text)
        state = InFlight(rid, loop, scheduler.weight_version)
        control.track(state)
        try:
            try:
                admitted = await control.admit(state)
            except asyncio.CancelledError:
                state.abort("client disconnected")
                raise
            if not admitted:  # aborted while held (or shutting down): nothing was generated
                finish = {"type": "abort", "message": state.abort_message or "server shutting down"}
                return self._answer(state, len(input_ids), finish, params, return_logprob)
            state.weight_version = scheduler.weight_version  # the version when admitted
            kv_req = self.kv.start(input_ids)
            output: list[int] | None = None
            try:
                answer, output = await self._generate_admitted(state, input_ids, params, return_logprob, kv_req)
                return answer
            finally:
                self.kv.release(kv_req, output)
                control.release()
        finally:
            control.untrack(state)

    async def _generate_admitted(self, state: InFlight, input_ids: list[int], params: SamplingParams,
                                 return_logprob: bool, kv_req: KVRequest) -> tuple[web.Response, list[int] | None]:
        """The answer, and the output ids when the request finished (None: aborted or failed).

        With the KV model on, the request first queues for the KV budget and pays its prefill
        (:meth:`KVModel.prefill`), the backend then generates, and the modelled decode takes its
        time for the generated tokens (:meth:`KVModel.decode`; an abort there answers with the
        tokens decoded so far)."""
        n_in = len(input_ids)

        def aborted(kv: KVRequest | None = kv_req) -> tuple[web.Response, None]:
            finish = {"type": "abort", "message": state.abort_message or "aborted"}
            return self._answer(state, n_in, finish, params, return_logprob, kv), None

        if self.generate_latency_s > 0:
            # The injected latency: a sleep on the event loop (no thread, no step lock), cut
            # short by an abort.
            try:
                await asyncio.wait_for(asyncio.shield(state.abort_future), self.generate_latency_s)
            except asyncio.TimeoutError:
                pass
            except asyncio.CancelledError:  # client went away
                self.control.abort([state], "client disconnected")
                raise
            if state.aborted:
                return aborted()
        kv = self.kv if self.kv.active else None
        if kv is not None:
            try:
                if not await kv.prefill(kv_req, state.abort_future):
                    return aborted()
            except asyncio.CancelledError:
                self.control.abort([state], "client disconnected")
                raise
        loop = asyncio.get_running_loop()
        fut = loop.run_in_executor(self.scheduler.executor, self.scheduler.run, state, input_ids, params)
        # An aborted request returns before its worker ends; retrieve the worker's exception
        # (if any) so that it is logged rather than reported as never retrieved.
        fut.add_done_callback(_log_worker_error)
        try:
            await asyncio.wait({fut, state.abort_future}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # client went away: stop the worker too
            self.control.abort([state], "client disconnected")
            raise
        if not state.aborted or fut.done():
            try:
                finish = fut.result() if fut.done() else None
            except Exception as e:  # backend failure: an infrastructure error, not a 400
                backend = self.scheduler.backend.name
                logger.exception("backend %s failed on request %s", backend, state.rid)
                return error_answer(500, f"backend {backend} failed: {type(e).__name__}: {e}"), None
            if finish is not None:
                if kv is not None:
                    try:
                        done = await kv.decode(kv_req, len(state.ids), state.abort_future)
                    except asyncio.CancelledError:
                        self.control.abort([state], "client disconnected")
                        raise
                    if not done:  # aborted in the modelled decode: what it had decoded
                        with state.lock:
                            del state.ids[kv_req.decoded:]
                            del state.logprobs[kv_req.decoded:]
                        return aborted()
                return self._answer(state, n_in, finish, params, return_logprob, kv_req), state.snapshot()[0]
        return aborted()
