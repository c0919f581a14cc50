"""The local stack's deterministic stand-in for tau2's NL-assertion judge.

tau2-bench >= 1.0 grades most retail tasks (and banking_knowledge's task_102) on NL assertions,
judged by an LLM (:mod:`rollout.benchmarks.tau2.judge`). Gold replay deserves every assertion met,
so the stand-in answers tau2's judge prompt with every expected outcome met, in the JSON shape the
prompt asks for (``{"results": [{"expectedOutcome", "reasoning", "metExpectation"}]}``). The real
code path runs around it: tau2 builds the prompt, our judge client sends it over HTTP to an
OpenAI-compatible endpoint with its retries, tau2 parses the answer and combines the reward.

It is served two ways:

* by the local stack's gold-replay backend (:meth:`rollout.devtools.local.gold.GoldReplayBackend.chat`),
  behind the local router's ``/v1/chat/completions``, which ``env.judge`` points at by default
  when the local stack runs;
* by :class:`StandInJudgeServer`, a stdlib HTTP server on 127.0.0.1 for tools and tests that run no
  local stack (``python -m rollout.bench env``).

A prompt that is not tau2's judge prompt is not answered here (:func:`is_judge_prompt`).
"""

from __future__ import annotations

import ast
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["StandInJudgeServer", "is_judge_prompt", "stand_in_verdict"]

# tau2's judge system prompt asks for these keys (tau2/evaluator/evaluator_nl_assertions.py)
_MARKERS = ("metExpectation", "expectedOutcome")
_OUTCOMES = "expectedOutcomes:"
STAND_IN_REASONING = "stand-in judge of the local stack: every expected outcome is taken as met (gold replay)"


def _text(content: Any) -> str:
    if isinstance(content, list):  # OpenAI content parts
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


def is_judge_prompt(messages: list[dict]) -> bool:
    """Whether ``messages`` (OpenAI chat messages) are tau2's NL-assertion judge prompt: a system
    message that asks for ``metExpectation`` / ``expectedOutcome`` and a user message listing the
    ``expectedOutcomes:``."""
    system = " ".join(_text(m.get("content")) for m in messages if m.get("role") == "system")
    user = " ".join(_text(m.get("content")) for m in messages if m.get("role") == "user")
    return all(k in system for k in _MARKERS) and _OUTCOMES in user


def expected_outcomes(messages: list[dict]) -> list[str]:
    """The assertions tau2's judge prompt lists: the Python list after the last ``expectedOutcomes:``
    of the last user message (tau2 writes ``{nl_assertions}``, a list's repr).

    Raises:
        ValueError: the prompt lists no readable list of strings.
    """
    user = [_text(m.get("content")) for m in messages if m.get("role") == "user"]
    text = user[-1] if user else ""
    at = text.rfind(_OUTCOMES)
    if at < 0:
        raise ValueError("no expectedOutcomes in the judge prompt")
    value = ast.literal_eval(text[at + len(_OUTCOMES):].strip())
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise ValueError("the judge prompt's expectedOutcomes is not a list of strings")
    return value


def stand_in_verdict(messages: list[dict]) -> str:
    """The stand-in judge's answer to tau2's judge prompt: bare JSON (tau2 parses it with
    ``json.loads``) with every expected outcome met.

    Raises:
        ValueError: ``messages`` are not tau2's judge prompt (:func:`expected_outcomes`).
    """
    outcomes = expected_outcomes(messages)
    return json.dumps({"results": [{"expectedOutcome": o, "reasoning": STAND_IN_REASONING, "metExpectation": True} for o in outcomes]})


class _Handler(BaseHTTPRequestHandler):
    server: "StandInJudgeServer._Server"

    def log_message(self, *args: Any) -> None:  # quiet
        return

    def _send(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802
        if self.path.rstrip("/").endswith("/models"):
            self._send(200, {"object": "list", "data": [{"id": self.server.model, "object": "model"}]})
        else:
            self._send(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self) -> None:  # noqa: N802
        if not self.path.rstrip("/").endswith("/chat/completions"):
            self._send(404, {"error": {"message": f"no route {self.path}"}})
            return
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            messages = body.get("messages") or []
            content = stand_in_verdict(messages)
        except (ValueError, SyntaxError, AttributeError) as e:
            self._send(400, {"error": {"message": f"not tau2's judge prompt: {e}"}})
            return
        with self.server.lock:
            self.server.calls += 1
        self._send(200, {"id": f"judge-{self.server.calls}", "object": "chat.completion", "created": int(time.time()),
                         "model": body.get("model") or self.server.model,
                         "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
                         "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}})


class StandInJudgeServer:
    """:func:`stand_in_verdict` behind an OpenAI-compatible endpoint on 127.0.0.1 (``GET /v1/models``,
    ``POST /v1/chat/completions``), served by a thread; a context manager that stops it.

    Args:
        port: the port (0: any free one).
        model: the model name it lists.

    Attributes:
        base_url: ``http://127.0.0.1:PORT/v1``.
        calls: chat completions answered.
    """

    class _Server(ThreadingHTTPServer):
        daemon_threads = True
        model = "stand-in-judge"
        calls = 0
        lock: threading.Lock

    def __init__(self, port: int = 0, model: str = "stand-in-judge") -> None:
        self._server = self._Server(("127.0.0.1", port), _Handler)
        self._server.model = model
        self._server.lock = threading.Lock()
        self.model = model
        self.base_url = f"http://127.0.0.1:{self._server.server_address[1]}/v1"
        self._thread = threading.Thread(target=self._server.serve_forever, name="stand-in-judge", daemon=True)
        self._thread.start()

    @property
    def calls(self) -> int:
        return self._server.calls

    def close(self) -> None:
        """Stop serving and close the socket (idempotent)."""
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> "StandInJudgeServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
