"""SGLang's RL and admin endpoints for the local server: abort, pause / continue, weight updates.

``POST /abort_request``, ``POST /pause_generation``, ``POST /continue_generation``,
``POST /update_weights_from_disk``, ``GET /get_weight_version`` and ``/flush_cache``, over the
control state (:class:`rollout.devtools.local.control.GenerationControl`) and the scheduler
(:class:`rollout.devtools.local.scheduler.StepScheduler`). Semantics in
:mod:`rollout.devtools.local.server`'s docstring.
"""

from __future__ import annotations

import asyncio
import logging
import time

from aiohttp import web

from rollout.devtools.local.control import PAUSE_MODES, GenerationControl, InFlight
from rollout.devtools.local.protocol import BadRequest, error_answer, json_body
from rollout.devtools.local.scheduler import StepScheduler

logger = logging.getLogger(__name__)


class AdminEndpoints:
    """The handlers of SGLang's abort, pause / continue and weight-update endpoints.

    Args:
        scheduler: loads weights between two backend steps; holds the weight version.
        control: the in-flight requests and the pause state.
    """

    def __init__(self, scheduler: StepScheduler, control: GenerationControl) -> None:
        self.scheduler = scheduler
        self.control = control

    def _admitted(self) -> list[InFlight]:
        return [s for s in self.control.states() if s.admitted]

    async def abort_request(self, request: web.Request) -> web.Response:
        """``{"rid": str}`` or ``{"abort_all": true}`` -> ``{"success": true, "aborted": n}``."""
        try:
            body = await json_body(request)
        except BadRequest as e:
            return error_answer(400, str(e))
        if body.get("abort_all"):
            targets = self.control.states()
        else:
            rid = body.get("rid")
            if not isinstance(rid, str):
                return error_answer(400, "rid (string) or abort_all=true is required")
            targets = self.control.with_rid(rid)
        # As in SGLang, a request held by a pause is not running yet and is not aborted.
        n = self.control.abort([s for s in targets if s.admitted], "aborted by /abort_request")
        logger.info("aborted %d request(s)", n)
        return web.json_response({"success": True, "aborted": n})

    async def pause_generation(self, request: web.Request) -> web.Response:
        """``{"mode": "abort" | "retract" | "in_place"}`` (default abort); answers once no step runs."""
        try:
            body = await json_body(request, empty_ok=True)
            mode = body.get("mode")
            mode = "abort" if mode is None else mode
            if mode not in PAUSE_MODES:
                raise BadRequest(f"mode must be one of {list(PAUSE_MODES)}, not {mode!r}")
        except BadRequest as e:
            return error_answer(400, str(e))
        control = self.control
        t0 = time.monotonic()
        control.set_pause_mode(mode)
        n_aborted = 0
        if mode == "abort":
            n_aborted = control.abort(self._admitted(), "aborted by /pause_generation")
        # Once the pause holds the step lock, no step starts until /continue_generation.
        await asyncio.get_running_loop().run_in_executor(self.scheduler.control_executor, self.scheduler.wait_step_boundary)
        if mode == "abort":  # as SGLang: answer once the aborted requests have all answered
            await control.wait_for(lambda: not any(s.admitted for s in control.states()))
        logger.info("generation paused (mode %s) in %.3f s: %d request(s) aborted, %d paused", mode,
                    time.monotonic() - t0, n_aborted, control.num_paused_requests())
        return web.json_response({"message": f"Generation paused (mode {mode}).", "status": "ok"})

    async def continue_generation(self, request: web.Request) -> web.Response:
        """``{}`` -> ``{"message", "status": "ok"}``; held and paused requests go on."""
        try:
            await json_body(request, empty_ok=True)
        except BadRequest as e:
            return error_answer(400, str(e))
        was = self.control.pause_mode
        self.control.set_pause_mode(None)
        logger.info("generation continued (was paused: %s)", was)
        return web.json_response({"message": "Generation continued.", "status": "ok"})

    async def update_weights_from_disk(self, request: web.Request) -> web.Response:
        """``{"model_path", "weight_version"?, "abort_all_requests"?}`` -> ``{"success", "message",
        "num_paused_requests"}`` (HTTP 200 on success, 400 on failure or a malformed body)."""
        try:
            body = await json_body(request)
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
        control = self.control
        if abort_all:
            control.abort(self._admitted(), "aborted by /update_weights_from_disk (abort_all_requests)")
        paused = control.pause_mode is not None
        if not paused:  # wait for the requests in flight; new ones wait meanwhile
            await control.acquire_write()
        try:
            num_paused = control.num_paused_requests()
            ok, message = await asyncio.get_running_loop().run_in_executor(
                self.scheduler.control_executor, self.scheduler.load_weights, model_path, version
            )
        finally:
            if not paused:
                control.release_write()
        return web.json_response({"success": ok, "message": message, "num_paused_requests": num_paused},
                                 status=200 if ok else 400)

    async def get_weight_version(self, request: web.Request) -> web.Response:
        """``{"weight_version": str}``."""
        return web.json_response({"weight_version": self.scheduler.weight_version})

    async def flush_cache(self, request: web.Request) -> web.Response:
        """Nothing to flush: 200 ``Cache flushed.``."""
        return web.Response(status=200, text="Cache flushed.")
