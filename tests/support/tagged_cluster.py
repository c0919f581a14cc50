"""N :mod:`support.tagged_worker` processes behind the real ``sglang-router``, on 127.0.0.1, for
the routing tests (tests/component/test_routing_affinity.py) and the routing measurement
(:mod:`support.routing_spread`)."""

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
from rollout.devtools.local.stack import _http, free_port

TESTS = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def tagged_cluster(router_args: list[str], workers: int = 4, delay_s: float = 0.1, log_dir: Path | None = None,
                   timeout_s: float = 60.0) -> Iterator[tuple[str, list[str], list[subprocess.Popen]]]:
    """Start ``workers`` tagged workers (named ``w0``, ``w1``...; each ``/generate`` waits
    ``delay_s`` seconds so that calls overlap) and ``python -m sglang_router.launch_router`` with
    ``router_args`` in front of them, each process in a session of its own; wait until the router
    lists every worker as healthy.

    Yields:
        ``(router_url, worker_urls, processes)`` (the workers' processes first, the router last).
        On exit every process group is sent SIGTERM, then SIGKILL after 10 s.

    Raises:
        AssertionError: a worker or the router did not come up within ``timeout_s`` seconds (with
            the router's log when it exited and ``log_dir`` holds it).
    """
    tok = resolve_tokenizer_path("builtin:qwen3")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), str(TESTS.parent), os.environ.get("PYTHONPATH", "")]))

    def out(name: str):
        return open(log_dir / name, "wb") if log_dir is not None else subprocess.DEVNULL

    procs: list[subprocess.Popen] = []
    urls: list[str] = []
    try:
        for i in range(workers):
            port = free_port()
            urls.append(f"http://127.0.0.1:{port}")
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "support.tagged_worker", "--port", str(port), "--name", f"w{i}", "--model-path", tok,
                 "--delay-s", str(delay_s)], env=env, start_new_session=True, stdout=out(f"w{i}.log"), stderr=subprocess.STDOUT))
        deadline = time.monotonic() + timeout_s
        for u in urls:
            while True:
                try:
                    if _http("GET", u + "/health", timeout=1.0)[0] == 200:
                        break
                except OSError:
                    pass
                assert time.monotonic() < deadline, f"worker {u} did not start"
                time.sleep(0.1)
        rport = free_port()
        router = f"http://127.0.0.1:{rport}"
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(rport), "--worker-urls", *urls,
             *router_args, "--tokenizer-path", tok, "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
             "--log-level", "warn"], env=env, start_new_session=True, stdout=out("router.log"), stderr=subprocess.STDOUT))
        while True:
            try:
                status, body = _http("GET", router + "/workers", timeout=1.0)
                if status == 200 and sum(bool(w.get("is_healthy")) for w in json.loads(body)["workers"]) == workers:
                    break
            except (OSError, ValueError):
                pass
            if procs[-1].poll() is not None:
                log = (log_dir / "router.log").read_text() if log_dir is not None else "(no log kept)"
                raise AssertionError(f"the router exited: {log}")
            assert time.monotonic() < deadline, "the router did not list the workers as healthy"
            time.sleep(0.2)
        yield router, urls, procs
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
