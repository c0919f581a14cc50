"""A real ``sglang-router`` over given worker URLs (servers, or proxies standing for them), on
127.0.0.1, for the tests of a half-done weight update and a straggler worker (tests/ray/)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

from rollout.core.tokenizer import resolve_tokenizer_path
from rollout.devtools.local.stack import _http, free_port, router_policy_args


@contextlib.contextmanager
def proxied_router(worker_urls: list[str], log_path: Path, timeout_s: float = 60.0) -> Iterator[str]:
    """Start the router (``manual``, ``min_group``: each routing key stays on one worker) over
    ``worker_urls`` in a session of its own; yield its URL once it lists every worker as healthy;
    on exit SIGTERM its process group (SIGKILL after 10 s).

    Raises:
        AssertionError: it did not come up within ``timeout_s`` seconds (its log in the message).
    """
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port),
                                 "--worker-urls", *worker_urls, *router_policy_args("auto"), "--tokenizer-path",
                                 resolve_tokenizer_path("builtin:qwen3"), "--prometheus-host", "127.0.0.1", "--prometheus-port",
                                 str(free_port()), "--log-level", "warn", "--disable-retries", "--disable-circuit-breaker"],
                                start_new_session=True, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                status, body = _http("GET", url + "/workers", timeout=1.0)
                if status == 200 and sum(bool(w.get("is_healthy")) for w in json.loads(body)["workers"]) == len(worker_urls):
                    break
            except (OSError, ValueError):
                pass
            assert proc.poll() is None, f"the router exited: {log_path.read_text()}"
            assert time.monotonic() < deadline, f"the router did not list the workers as healthy: {log_path.read_text()[-2000:]}"
            time.sleep(0.2)
        yield url
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=10)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
