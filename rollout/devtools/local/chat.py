"""OpenAI's ``POST /v1/chat/completions`` for the local server (the tau2 user simulator's model).

Non-streaming only; answered by the backend's ``chat`` in a generation thread. Like /generate, a
completion is held while generation is paused or a weight update waits, and holds a read share
of the model-update lock while it runs (:class:`rollout.devtools.local.control.GenerationControl`);
it takes no backend step, so a pause lets a running one finish.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

from aiohttp import web

from rollout.devtools.local.backend_api import SamplingParams
from rollout.devtools.local.control import GenerationControl
from rollout.devtools.local.protocol import BadRequest, error_answer, is_int, is_num, json_body
from rollout.devtools.local.scheduler import StepScheduler

logger = logging.getLogger(__name__)


class ChatEndpoint:
    """``POST /v1/chat/completions`` (:meth:`chat_completions`).

    Args:
        scheduler: the backend, the tokenizer (token counts, ``max_tokens`` cuts) and the
            generation threads.
        control: the pause gate and model-update lock.
        served_model_name: the answer's ``model`` when the request names none.
    """

    def __init__(self, scheduler: StepScheduler, control: GenerationControl, served_model_name: str) -> None:
        self.scheduler = scheduler
        self.control = control
        self.served_model_name = served_model_name

    async def chat_completions(self, request: web.Request) -> web.Response:
        """``{"messages", "temperature"?, "max_tokens"? | "max_completion_tokens"?, "model"?}`` ->
        an OpenAI ``chat.completion`` (400 for a malformed body, 500 for a backend failure, 503
        while shutting down)."""
        try:
            body = await json_body(request, streaming_allowed=False)
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages
            ):
                raise BadRequest("messages must be a non-empty list of {role, content} objects")
            temperature = body.get("temperature")
            if temperature is not None and (not is_num(temperature) or temperature < 0):
                raise BadRequest("temperature must be a number >= 0")
            max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
            if max_tokens is not None and (not is_int(max_tokens) or max_tokens < 1):
                raise BadRequest("max_tokens must be an integer >= 1")
            params = SamplingParams(
                temperature=1.0 if temperature is None else float(temperature),
                max_new_tokens=max_tokens or 1024,
            )
        except BadRequest as e:
            return error_answer(400, str(e))
        backend, tokenizer = self.scheduler.backend, self.scheduler.tokenizer

        def answer() -> tuple[str, str, int, int]:
            content = backend.chat(messages, params)
            out_ids = tokenizer.encode(content, add_special_tokens=False)
            finish = "stop"
            if max_tokens is not None and len(out_ids) > max_tokens:
                out_ids = out_ids[:max_tokens]
                content = tokenizer.decode(out_ids)
                finish = "length"
            prompt_text = "\n".join(str(m.get("content") or "") for m in messages)
            n_prompt = len(tokenizer.encode(prompt_text, add_special_tokens=False))
            return content, finish, n_prompt, len(out_ids)

        # Held while generation is paused or a weight update waits, like /generate.
        if not await self.control.admit(None):
            return error_answer(503, "server shutting down")
        loop = asyncio.get_running_loop()
        try:
            content, finish, n_prompt, n_out = await loop.run_in_executor(self.scheduler.executor, answer)
        except Exception as e:
            logger.exception("backend %s chat failed", backend.name)
            return error_answer(500, f"backend {backend.name} failed: {type(e).__name__}: {e}")
        finally:
            self.control.release()
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
