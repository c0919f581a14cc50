"""N vLLM servers behind ``vllm-router`` on 127.0.0.1: :class:`VllmStack`."""

from __future__ import annotations

import atexit
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Sequence

from rollout.devtools.local.vllm.checkpoint import checkpoint_problem
from rollout.devtools.local.vllm.processes import VllmRouter, VllmServer, find_vllm_python, http_json, vllm_missing

__all__ = ["VllmStack"]

logger = logging.getLogger(__name__)


class VllmStack:
    """``num_servers`` :class:`VllmServer` s serving one checkpoint, behind one :class:`VllmRouter`.

    Args:
        model: the checkpoint folder (:func:`rollout.devtools.local.vllm.write_checkpoint`).
        python: the vLLM venv's python (None: :func:`find_vllm_python`'s default).
        num_servers: servers behind the router; server ``i`` binds its engine to core ``i mod cores``.
        log_dir: where ``vllm-<i>.log`` and ``router.log`` go (None: a temporary folder).
        host: where everything listens (127.0.0.1).
        router_port: the router's port (None: a free one).
        router_policy: the router's ``--policy``.
        startup_timeout_s: bound on the servers' start (they start together), seconds.
        weight_version: the weight version each server is given once up (``/update_weight_version``;
            vLLM starts at ``default``); None: left as it is.
        server_kw: more :class:`VllmServer` arguments (``served_model_name``, ``max_model_len``,
            ``kv_cache_gib``, ``num_gpu_blocks``, ``seed``, ``extra_args``).

    Usage::

        with VllmStack(ckpt, num_servers=2) as stack:
            ... stack.router_url, stack.worker_urls ...
    """

    def __init__(self, model: str | os.PathLike, *, python: str | os.PathLike | None = None, num_servers: int = 1,
                 log_dir: str | os.PathLike | None = None, host: str = "127.0.0.1", router_port: int | None = None,
                 router_policy: str = "consistent_hash", startup_timeout_s: float = 600.0,
                 weight_version: str | None = None, **server_kw):
        self.python = find_vllm_python(python)
        self.model = Path(model)
        self.log_dir = Path(log_dir) if log_dir is not None else Path(tempfile.mkdtemp(prefix="rollout-vllm-"))
        self.startup_timeout_s = float(startup_timeout_s)
        self.weight_version = None if weight_version is None else str(weight_version)
        cores = os.cpu_count() or 1
        self.servers = [
            VllmServer(self.python, self.model, log_path=self.log_dir / f"vllm-{i}.log", host=host,
                       cpu_bind=str(i % cores) if num_servers > 1 else "auto", **server_kw)
            for i in range(int(num_servers))
        ]
        self.router = VllmRouter(self.python, [s.url for s in self.servers], log_path=self.log_dir / "router.log",
                                 host=host, port=router_port, policy=router_policy)
        self._started = False

    @property
    def router_url(self) -> str:
        """``http://host:port`` of the router."""
        return self.router.url

    @property
    def worker_urls(self) -> list[str]:
        """Every server's ``http://host:port``, in start order."""
        return [s.url for s in self.servers]

    @property
    def served_model_name(self) -> str:
        """The model name the servers answer to (``/v1/chat/completions``' ``model``)."""
        return self.servers[0].served_model_name

    def __enter__(self) -> VllmStack:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> VllmStack:
        """Start the servers (together), wait for each one's ``/health``, then the router, and wait
        until it lists them all as healthy. Everything is stopped again on failure.

        Raises:
            RuntimeError: vLLM is not installed, the checkpoint is not one, a process exited, or
                the start-up timed out (the message has the log's tail).
        """
        why = vllm_missing(self.python) or checkpoint_problem(self.model)
        if why:
            raise RuntimeError(f"vLLM stack: {why}")
        if self._started:
            raise RuntimeError("VllmStack.start() called twice")
        self._started = True
        atexit.register(self.stop)
        t0 = time.monotonic()
        logger.info("starting %d vLLM CPU server(s) and vllm-router (vLLM takes about a minute to start on the CPU; "
                    "logs in %s)", len(self.servers), self.log_dir)
        try:
            for s in self.servers:
                s.spawn()
            for s in self.servers:
                s.wait_ready(t0 + self.startup_timeout_s, self.startup_timeout_s, started=t0)
                self._set_version(s, self.weight_version)
            self.router.start()
        except BaseException:
            self.stop()
            raise
        logger.info("vLLM stack up in %.1f s: router %s, servers %s, logs in %s", time.monotonic() - t0,
                    self.router_url, self.worker_urls, self.log_dir)
        return self

    def stop(self) -> None:
        """Stop the router, then the servers (each by process group). Idempotent."""
        atexit.unregister(self.stop)
        self.router.stop()
        for s in self.servers:
            s.stop()

    def kill_server(self, i: int) -> None:
        """SIGKILL server ``i``'s process group (a crash). The router marks it unhealthy after its
        health checks fail (about 3 intervals)."""
        self.servers[i].kill()

    def restart_server(self, i: int, timeout_s: float | None = None, model: str | os.PathLike | None = None,
                       weight_version: str | None = None) -> None:
        """Start server ``i`` again on the same port and wait until the router lists it as healthy.

        Args:
            i: the server's index.
            timeout_s: bound on its start (default: the stack's start-up bound).
            model: the weights it starts from (default: those it started from last time; a
                trainer that has moved on passes its latest checkpoint).
            weight_version: the version it is given once up (default: the stack's ``weight_version``).

        Raises:
            RuntimeError: it did not come back in time, or the folder is not a checkpoint.
        """
        timeout = self.startup_timeout_s if timeout_s is None else float(timeout_s)
        server = self.servers[i]
        if model is not None:
            why = checkpoint_problem(model)
            if why:
                raise RuntimeError(f"vLLM stack: {why}")
            server.model = Path(model)
        server.restart(timeout)
        self._set_version(server, self.weight_version if weight_version is None else str(weight_version))
        self.router.wait_healthy([server.url], timeout)

    @staticmethod
    def _set_version(server: VllmServer, version: str | None) -> None:
        if version is None:
            return
        status, body = http_json("POST", server.url + "/update_weight_version", {"new_version": version}, timeout=60.0)
        if status != 200:
            raise RuntimeError(f"{server.url}/update_weight_version answered {status}: {body}")

    def pids(self) -> list[int]:
        """The process group ids of the servers and the router (started at least once)."""
        return [p.pid for p in (*self.servers, self.router) if p.pid is not None]

    def logs(self) -> Sequence[Path]:
        """The log files."""
        return [s.log_path for s in self.servers] + [self.router.log_path]
