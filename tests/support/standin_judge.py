"""A stand-in for tau2-bench >= 1.0's NL-assertion judge: an OpenAI-compatible endpoint
(``POST /v1/chat/completions``) that answers every expected outcome it is asked about as met.

tau2's ``NLAssertionsEvaluator`` asks its judge model about ``expectedOutcomes: [...]`` (the Python
list's repr, the last part of its user prompt) and parses the reply's content as bare JSON
``{"results": [{"expectedOutcome", "reasoning", "metExpectation"}]}``. This server reads the list
back and says every outcome was met, deterministically and offline, so that a re-grade under
tau2-bench v1.0.1's retail tasks (NL_ASSERTION in 112 of 114 reward bases) shows what the task
fixes change in the rest of the reward (the database check). Point litellm at it with
``OPENAI_API_BASE=http://127.0.0.1:PORT/v1`` and any ``OPENAI_API_KEY`` in the environment of the
process that grades (tau2's default judge model is an OpenAI one). Binds 127.0.0.1; the test that
starts it stops it (:meth:`StandinJudge.close`, or ``with``).
"""

from __future__ import annotations

import ast
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def outcomes(prompt: str) -> list[str]:
    """The expected outcomes a tau2 judge prompt asks about (``[]`` when it names none)."""
    _, sep, tail = prompt.rpartition("expectedOutcomes:")
    if not sep:
        return []
    try:
        found = ast.literal_eval(tail.strip())
    except (ValueError, SyntaxError):
        return []
    return [str(x) for x in found] if isinstance(found, (list, tuple)) else []


class StandinJudge:
    """The server (:func:`outcomes`, every one met). Attributes: ``url`` (``http://127.0.0.1:PORT/v1``),
    ``calls`` (requests answered)."""

    def __init__(self) -> None:
        judge = self
        self.calls = 0

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                user = next((m.get("content") or "" for m in reversed(body.get("messages") or []) if m.get("role") == "user"), "")
                content = json.dumps({"results": [{"expectedOutcome": o, "reasoning": "stand-in judge: met", "metExpectation": True}
                                                  for o in outcomes(str(user))]})
                judge.calls += 1
                reply = json.dumps({"id": f"standin-{judge.calls}", "object": "chat.completion", "created": int(time.time()),
                                    "model": body.get("model", "standin"),
                                    "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}],
                                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args):  # quiet
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/v1"
        self._thread = threading.Thread(target=self._server.serve_forever, name="standin-judge", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the server (idempotent)."""
        if self._thread.is_alive():
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(5.0)

    def __enter__(self) -> "StandinJudge":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
