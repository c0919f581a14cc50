"""The local stack: N SGLang-protocol test servers behind the real ``sglang-router``.

:class:`LocalStack` starts ``local.num_servers`` subprocesses of :mod:`rollout.local.server`
on free loopback ports, then ``python -m sglang_router.launch_router`` in front of them, and
waits until the whole chain answers. Every subprocess runs in its own session (process group);
:meth:`LocalStack.stop` sends SIGTERM to each group, then SIGKILL after a grace period.

Router facts this relies on (sglang-router 0.3.2):

* ``--tokenizer-path`` must point at local tokenizer files, and each worker reports a local
  folder as its ``model_path`` (the router loads a tokenizer per worker model from it); otherwise
  the router tries to download from a model hub.
* ``--prometheus-host/--prometheus-port`` are given explicitly: the defaults (``0.0.0.0:29000``)
  would bind every interface and collide between two stacks.
* ``POST /generate`` through the router needs ``Content-Type: application/json`` (else 415).
  The router re-serialises the body: unknown keys are dropped and defaults such as
  ``"stream": false`` and ``"model": null`` are added.
* ``GET /workers`` answers ``{"workers": [{"url", "is_healthy", "load", "model_id", ...}],
  "total": n, "stats": {...}}``; workers are registered in the background after the router
  starts. ``POST /abort_request`` is not proxied (404): abort on each worker URL.
* At registration the router probes each worker with an HTTP/2 (gRPC) preface before falling
  back to HTTP/1.1; the local server drops the resulting parse errors from its log.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO

import rollout
from rollout.config import LocalConfig
from rollout.tokenizer import resolve_tokenizer_path

logger = logging.getLogger(__name__)

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_TERM_GRACE_S = 5.0
_POLL_S = 0.2


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now (the OS picks it; a race is possible)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _http(method: str, url: str, body: dict | None = None, timeout: float = 5.0) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _tail(path: Path, n_lines: int = 30) -> str:
    try:
        lines = _ANSI.sub("", path.read_text(errors="replace")).splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(lines[-n_lines:])


class LocalStack:
    """Test servers plus the real sglang-router on loopback, as a context manager.

    Args:
        local: the ``local`` config section (backend, ``num_servers``, host, ``router_port``,
            ``startup_timeout_s`` in seconds, ``weight_version`` given to every server as
            ``--weight-version``, ``tiny`` model config).
        domain: tau2 domain the gold-replay servers index (``retail``, ``airline``).
        tokenizer: ``builtin:qwen3``, a local tokenizer folder, or a hub id (the router gets the
            resolved path; a hub id makes it download).
        log_dir: where ``server-<i>.log`` and ``router.log`` go; None: a temporary folder,
            removed by :meth:`stop`.

    Usage::

        with LocalStack(cfg.local, "retail", "builtin:qwen3") as stack:
            post(stack.router_url + "/generate", ...)
    """

    def __init__(self, local: LocalConfig, domain: str, tokenizer: str, log_dir: Path | None = None) -> None:
        self.local = local
        self.domain = domain
        self.tokenizer = tokenizer
        self._own_log_dir = log_dir is None
        self._log_dir: Path | None = Path(log_dir) if log_dir is not None else None
        self._procs: list[tuple[str, subprocess.Popen, IO, Path]] = []
        self._worker_urls: list[str] = []
        self._router_url: str | None = None
        self._started = False
        self._stopped = False

    # ------------------------------------------------------------------ properties
    @property
    def router_url(self) -> str:
        """``http://host:port`` of the router (RuntimeError before :meth:`start`)."""
        if self._router_url is None:
            raise RuntimeError("LocalStack is not started")
        return self._router_url

    @property
    def worker_urls(self) -> list[str]:
        """``http://host:port`` of every test server, in start order."""
        return list(self._worker_urls)

    @property
    def log_dir(self) -> Path | None:
        """Folder holding the subprocess logs (None before :meth:`start`)."""
        return self._log_dir

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> LocalStack:  # noqa: PYI034
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> LocalStack:
        """Start the servers and the router and wait until a /generate through the router works.

        Waits at most ``local.startup_timeout_s`` seconds in all.

        Raises:
            RuntimeError: a subprocess exited, or the deadline passed; the message carries the
                tail of the relevant logs. Everything started is stopped first.
        """
        if self._started:
            raise RuntimeError("LocalStack.start() called twice")
        self._started = True
        if self._log_dir is None:
            self._log_dir = Path(tempfile.mkdtemp(prefix="rollout-local-"))
        self._log_dir.mkdir(parents=True, exist_ok=True)
        atexit.register(self.stop)
        try:
            self._start()
        except BaseException:
            self.stop(remove_logs=False)
            raise
        return self

    def _spawn(self, name: str, cmd: list[str], env: dict[str, str]) -> subprocess.Popen:
        assert self._log_dir is not None
        path = self._log_dir / f"{name}.log"
        fh = open(path, "ab")  # noqa: SIM115  (stays open for the subprocess; closed by stop())
        fh.write(("$ " + " ".join(cmd) + "\n").encode())
        fh.flush()
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        self._procs.append((name, proc, fh, path))
        logger.debug("started %s (pid %d): %s", name, proc.pid, " ".join(cmd))
        return proc

    def _check_alive(self, names: list[str] | None = None) -> None:
        for name, proc, _, path in self._procs:
            if (names is None or name in names) and proc.poll() is not None:
                raise RuntimeError(
                    f"local stack: {name} exited with code {proc.returncode} during startup; "
                    f"log {path}:\n{_tail(path)}"
                )

    def _fail(self, what: str) -> RuntimeError:
        tails = "\n".join(f"--- {name} ({path}):\n{_tail(path)}" for name, _, _, path in self._procs)
        return RuntimeError(
            f"local stack: {what} within {self.local.startup_timeout_s:.0f} s (startup_timeout_s)\n{tails}"
        )

    def _start(self) -> None:
        local = self.local
        host = local.host
        deadline = time.monotonic() + local.startup_timeout_s
        env = dict(os.environ)
        pkg_root = str(Path(rollout.__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_root, env.get("PYTHONPATH", "")) if p)
        env.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        tiny_json = json.dumps(dataclasses.asdict(local.tiny))

        # 1. the test servers
        for i in range(local.num_servers):
            port = free_port(host)
            url = f"http://{host}:{port}"
            cmd = [
                sys.executable, "-m", "rollout.local.server",
                "--host", host, "--port", str(port),
                "--backend", local.backend, "--domain", self.domain,
                "--tokenizer", self.tokenizer, "--tiny-config", tiny_json,
                "--weight-version", str(local.weight_version),
            ]
            self._spawn(f"server-{i}", cmd, env)
            self._worker_urls.append(url)
        pending = set(self._worker_urls)
        while pending:
            self._check_alive()
            for url in list(pending):
                try:
                    status, _ = _http("GET", url + "/health", timeout=2.0)
                except OSError:
                    continue
                if status == 200:
                    pending.discard(url)
            if pending:
                if time.monotonic() > deadline:
                    raise self._fail(f"servers {sorted(pending)} did not answer /health")
                time.sleep(_POLL_S)

        # 2. the router
        router_port = local.router_port or free_port(host)
        self._router_url = f"http://{host}:{router_port}"
        remaining = max(1, int(deadline - time.monotonic()))
        cmd = [
            sys.executable, "-m", "sglang_router.launch_router",
            "--host", host, "--port", str(router_port),
            "--worker-urls", *self._worker_urls,
            "--policy", "cache_aware",
            "--tokenizer-path", resolve_tokenizer_path(self.tokenizer),
            "--prometheus-host", host, "--prometheus-port", str(free_port(host)),
            "--log-level", "warn",
            "--worker-startup-timeout-secs", str(remaining),
            "--worker-startup-check-interval", "1",
            "--shutdown-grace-period-secs", "2",
        ]
        self._spawn("router", cmd, env)

        # 3. all workers registered and healthy
        while True:
            self._check_alive()
            healthy = self._healthy_workers()
            if healthy is not None and set(self._worker_urls) <= healthy:
                break
            if time.monotonic() > deadline:
                raise self._fail(f"router did not list {self._worker_urls} as healthy (it lists {sorted(healthy or [])})")
            time.sleep(_POLL_S)

        # 4. one generation through the router
        last = ""
        while True:
            self._check_alive()
            try:
                status, body = _http(
                    "POST", self._router_url + "/generate",
                    {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}},
                    timeout=30.0,
                )
                if status == 200 and isinstance(json.loads(body).get("output_ids"), list):
                    break
                last = f"HTTP {status}: {body[:300]!r}"
            except (OSError, ValueError) as e:
                last = repr(e)
            if time.monotonic() > deadline:
                raise self._fail(f"POST /generate through the router did not succeed (last: {last})")
            time.sleep(_POLL_S)
        logger.info("local stack up: router %s, workers %s, logs in %s", self._router_url, self._worker_urls, self._log_dir)

    def _healthy_workers(self) -> set[str] | None:
        try:
            status, body = _http("GET", self.router_url + "/workers", timeout=2.0)
            if status != 200:
                return None
            data = json.loads(body)
        except (OSError, ValueError):
            return None
        workers = data.get("workers", []) if isinstance(data, dict) else []
        return {str(w.get("url", "")).rstrip("/") for w in workers if isinstance(w, dict) and w.get("is_healthy")}

    def stop(self, remove_logs: bool = True) -> None:
        """Terminate the router and the servers (SIGTERM to each process group, SIGKILL after
        a few seconds). Idempotent; also registered with :mod:`atexit` by :meth:`start`.

        Args:
            remove_logs: remove the temporary log folder if the stack created it.
        """
        if self._stopped:
            return
        self._stopped = True
        atexit.unregister(self.stop)
        procs = list(reversed(self._procs))  # router first
        for name, proc, _, _ in procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + _TERM_GRACE_S
        for name, proc, _, _ in procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                logger.warning("%s (pid %d) ignored SIGTERM; killing it", name, proc.pid)
        for name, proc, fh, _ in procs:
            if proc.poll() is None:  # still running after the grace period
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    logger.error("%s (pid %d) did not die after SIGKILL", name, proc.pid)
            fh.close()
        if remove_logs and self._own_log_dir and self._log_dir is not None:
            shutil.rmtree(self._log_dir, ignore_errors=True)
