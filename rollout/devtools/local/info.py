"""The local server's health and information endpoints, and the facts they report.

``GET /health``, ``GET /health_generate``, ``GET /get_model_info`` (= ``/model_info``),
``GET /get_server_info`` (= ``/server_info``) and ``GET /v1/models``; the keys each reports are
listed in :mod:`rollout.devtools.local.server`'s docstring.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from aiohttp import web

from rollout.core.eventloop import loop_kind
from rollout.devtools.local.control import GenerationControl
from rollout.devtools.local.protocol import error_answer
from rollout.devtools.local.scheduler import StepScheduler

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServedModel:
    """What the server says about the model it serves.

    Attributes:
        model_path, tokenizer_path: reported by ``/get_model_info`` and ``/get_server_info``.
        served_model_name: reported by ``/get_server_info`` and ``/v1/models``, and the default
            ``model`` of a chat completion.
        vocab_size: ``len(tokenizer)``; /generate's ``input_ids`` must lie in ``[0, vocab_size)``.
        tokenizer_facts: :func:`rollout.app.preflight.tokenizer_facts` of the tokenizer (keys SGLang
            does not report: ``tokenizer_vocab_size``, ``eos_token_id``, ``special_tokens``).
        started: wall-clock start time (seconds since the epoch).
    """

    model_path: str
    tokenizer_path: str
    served_model_name: str
    vocab_size: int
    tokenizer_facts: dict
    started: float


class InfoEndpoints:
    """The handlers of the health and information endpoints.

    Args:
        model: the served model's facts.
        scheduler: the backend, weight version and step counter; runs the health step.
        control: the in-flight requests and the pause state.
    """

    def __init__(self, model: ServedModel, scheduler: StepScheduler, control: GenerationControl) -> None:
        self.model = model
        self.scheduler = scheduler
        self.control = control

    async def health(self, request: web.Request) -> web.Response:
        """200, always (the process is up)."""
        return web.Response(status=200)

    async def health_generate(self, request: web.Request) -> web.Response:
        """200 once the backend sampled one token (under the step lock, 30 s at most), else 503."""
        loop = asyncio.get_running_loop()
        try:
            await asyncio.wait_for(loop.run_in_executor(self.scheduler.control_executor, self.scheduler.step_once), timeout=30)
        except Exception as e:  # noqa: BLE001  (any failure means unhealthy)
            logger.warning("health_generate failed: %r", e)
            return error_answer(503, f"generation failed: {type(e).__name__}: {e}")
        return web.Response(status=200)

    async def model_info(self, request: web.Request) -> web.Response:
        """SGLang's ``/get_model_info`` keys plus the tokenizer facts."""
        backend = self.scheduler.backend
        return web.json_response({
            # SGLang's keys
            "model_path": self.model.model_path,
            "tokenizer_path": self.model.tokenizer_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": self.scheduler.weight_version,
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": getattr(backend, "model_type", None),
            "architectures": getattr(backend, "architectures", None),
            # not reported by SGLang: tokenizer_vocab_size, eos_token_id, special_tokens
            **self.model.tokenizer_facts,
        })

    async def server_info(self, request: web.Request) -> web.Response:
        """SGLang's ``/get_server_info`` keys plus the pause, step and request counts."""
        scheduler, control = self.scheduler, self.control
        states = control.states()
        return web.json_response({
            "model_path": self.model.model_path,
            "tokenizer_path": self.model.tokenizer_path,
            "served_model_name": self.model.served_model_name,
            "backend": scheduler.backend.name,
            "is_generation": True,
            "version": "rollout-local-0.1",
            "uptime_s": round(time.time() - self.model.started, 3),
            "weight_version": scheduler.weight_version,
            "weights_path": scheduler.weights_path,
            "pause_mode": control.pause_mode,
            "event_loop": loop_kind(asyncio.get_running_loop()),
            "num_backend_steps": scheduler.num_backend_steps,
            "num_inflight_requests": len(states),
            "num_held_requests": sum(1 for s in states if not s.admitted and not s.aborted),
            "num_paused_requests": control.num_paused_requests(),
            "weight_update": control.weight_update,
            "internal_states": [{}],
        })

    async def models(self, request: web.Request) -> web.Response:
        """OpenAI's ``/v1/models``: the one served model."""
        return web.json_response({
            "object": "list",
            "data": [{"id": self.model.served_model_name, "object": "model", "created": int(self.model.started),
                      "owned_by": "rollout-local"}],
        })
