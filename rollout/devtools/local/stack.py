"""The local stack: N SGLang-protocol test servers behind the real ``sglang-router``.

:class:`LocalStack` starts ``local.num_servers`` subprocesses of :mod:`rollout.devtools.local.server`
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
* ``GET /get_model_info`` is proxied to one worker; ``GET /model_info`` and ``GET /server_info``
  answer 404; ``GET /get_server_info`` is the router's own summary (``{"router_manager",
  "routers_count", "workers_count"}``); ``GET /v1/models`` lists the workers' models.

Routing (``local.router_policy``; sglang-router 0.3.2, found in its ``--help`` and by experiment
with four workers that report who served each call and the header they got,
``tests/support/tagged_worker.py``, ``tests/component/test_routing_affinity.py``):

* 0.3.2's policies are ``random``, ``round_robin``, ``cache_aware``, ``power_of_two`` and
  ``manual`` (no ``consistent_hashing``: that came in later versions of the gateway). Only
  ``manual`` reads ``X-SMG-Routing-Key``: a new key is assigned to a worker and stays there
  (sticky assignment kept in the router, not a hash of the key), with ``--assignment-mode``
  ``random`` (the default), ``min_load`` (fewest requests in flight) or ``min_group`` (fewest
  keys in flight). A key whose worker turns unhealthy is given a new one; the other keys stay
  where they are. Keys are forgotten after ``--max-idle-secs`` (default 14400) without a call.
  A call without the header goes to a worker of the policy's choosing. ``auto`` is
  ``--policy manual --assignment-mode min_group`` (:func:`router_policy_args`).
* Spread, 64 keys over 4 workers, 3 calls per key, every call answered by the worker the key was
  first given (``python -m support.routing_spread`` from ``tests/``): keys started all at once
  (each call taking 0.2 s): ``min_group`` 16/16/16/16 (two runs), ``min_load`` 16/16/16/16,
  ``random`` 12/17/16/19 and 20/10/25/9; keys started one after another (nothing in flight, so
  every worker ties and the pick is random): ``min_group`` 13/14/14/23 and 16/15/13/20.
* ``cache_aware`` ignores the header and sent all 64 keys (prompts sharing a 199-token prefix,
  as every episode shares the system prompt) to one worker; ``round_robin``, ``random`` and
  ``power_of_two`` ignore it too (63 keys, 3 calls each one after another: a key's calls landed on
  different workers). After SIGKILL of one worker, ``manual`` kept answering (2 of 64
  calls failed while the router still listed the dead worker as healthy; the client retries
  those), and only the dead worker's keys moved.
* With ``policy.router_url`` set (a router you run), run it with ``--policy manual`` (0.3.2;
  ``--assignment-mode min_group`` spreads keys started together evenly) or, in a gateway that
  has it, ``--policy consistent_hashing``; under any other policy ``policy.routing`` has no effect.

API keys (found by experiment with sglang-router 0.3.2, a header-logging worker behind it):

* Without ``--api-key`` the router checks no client and forwards the client's ``Authorization``
  header verbatim to the worker (``/generate``, ``/v1/chat/completions``, ``/get_model_info``);
  no header in, no header out.
* With ``--api-key K`` the router itself requires ``Authorization: Bearer K`` from clients on
  ``/generate``, ``/v1/chat/completions``, ``/workers``, ``/get_loads`` and ``/flush_cache``
  (HTTP 401 with an empty body otherwise), but not on ``/health``, ``/health_generate``,
  ``/liveness``, ``/readiness``, ``/get_model_info``, ``/get_server_info`` or ``/v1/models``.
  Requests it proxies carry the client's header; its own calls to workers at registration
  (``/server_info``, ``/model_info``) and ``/get_load`` carry ``Bearer K``; its health checks
  (``/health``) carry none, which SGLang (and the local server) exempts from auth.
* ``--api-key`` exists only as a command-line flag (also at debug log level the router does not
  print it). So the stack never puts the key in argv: the router runs under a small wrapper
  (``python -m rollout.devtools.local.stack router ...``, :func:`_router_main`) that reads the key from the
  environment variable and passes it to ``sglang_router``'s argument parser in-process. The
  servers read it from the environment too (``--api-key-env NAME``). Logged command lines are
  redacted anyway (a key value, or the word after ``--api-key``, becomes ``***``). The key does
  sit in the subprocesses' environment (``/proc/PID/environ``, readable by the same user only),
  as it does in the process that started the stack.

Fate sharing: the servers and the router exit when the process that started the stack dies, also
by SIGKILL. Each child gets ``--parent-pid`` and polls it (:func:`share_fate`; exits within about
a second). ``Router.start()`` holds the GIL for ever, so no Python thread can poll in the router's
process: the wrapper forks, runs the router in the child (which has ``PR_SET_PDEATHSIG`` SIGTERM
towards the single-threaded wrapper) and polls the parent itself. When the stack is started from
the main thread, the children also set ``PR_SET_PDEATHSIG`` (SIGTERM) themselves for an immediate
signal; Linux sends it when the parent *thread* exits, so it is not used when the stack is started
from another (possibly short-lived) thread. No ``preexec_fn`` is used (unsafe with threads).
"""

from __future__ import annotations

import argparse
import atexit
import dataclasses
import http.client
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO

import rollout
from rollout.core.choices import EventLoop, LocalBackend, RouterPolicy
from rollout.core.config import Config, ConfigError, LocalConfig
from rollout.core.engines import EngineJob
from rollout.core.eventloop import check_event_loop
from rollout.core.startup import PreflightError, importable
from rollout.core.tokenizer import resolve_tokenizer_path
from rollout.devtools.local.ports import free_port
from rollout.devtools.local.vllm.processes import log_tail

logger = logging.getLogger(__name__)

_TERM_GRACE_S = 5.0
_POLL_S = 0.2
_SECRET_FLAGS = ("--api-key", "--admin-api-key", "--router-api-key")


# Fate sharing lives in rollout.core.fate (the tool sandbox uses it too).
from rollout.core.fate import set_parent_death_signal, share_fate  # noqa: E402,F401


def _router_main(argv: list[str]) -> int:
    """``python -m rollout.devtools.local.stack router [--api-key-env NAME] [--parent-pid PID]
    [--pdeathsig] -- ROUTER_ARGS``: run ``sglang_router.launch_router`` with ``ROUTER_ARGS`` plus
    ``--api-key <value of $NAME>`` (added in memory, never in any argv), in a forked child
    supervised by this process (see the module docstring). Exits with the router's exit code."""
    p = argparse.ArgumentParser(prog="python -m rollout.devtools.local.stack router")
    p.add_argument("--api-key-env", default=None)
    p.add_argument("--parent-pid", type=int, default=None)
    p.add_argument("--pdeathsig", action="store_true")
    p.add_argument("router_args", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    router_args = list(args.router_args)
    if router_args[:1] == ["--"]:
        router_args = router_args[1:]
    if args.pdeathsig:
        set_parent_death_signal(signal.SIGTERM)
    if args.parent_pid is not None and os.getppid() != args.parent_pid:
        return 1
    if args.api_key_env:
        key = os.environ.get(args.api_key_env)
        if not key:
            print(f"router wrapper: ${args.api_key_env} is not set (or empty)", file=sys.stderr, flush=True)
            return 2
        router_args += ["--api-key", key]
    sys.stdout.flush()
    sys.stderr.flush()
    wrapper_pid = os.getpid()
    child = os.fork()
    if child == 0:  # the router; dies with the (single-threaded) wrapper
        code = 1
        try:
            set_parent_death_signal(signal.SIGTERM)
            if os.getppid() == wrapper_pid:
                from sglang_router.launch_router import launch_router, parse_router_args

                launch_router(parse_router_args(router_args))
                code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        except BaseException as e:  # noqa: BLE001  (report, then exit the forked child)
            print(f"router failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    del router_args  # holds the key

    term_at: list[float] = []

    def forward(signum, frame) -> None:
        if not term_at:
            term_at.append(time.monotonic())
        try:
            os.kill(child, signum)
        except ProcessLookupError:
            pass

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    while True:
        pid, status = os.waitpid(child, os.WNOHANG)
        if pid == child:
            code = os.waitstatus_to_exitcode(status)
            return code if code >= 0 else 128 - code
        if args.parent_pid is not None and not term_at and os.getppid() != args.parent_pid:
            print(f"router wrapper: parent {args.parent_pid} is gone; stopping the router", file=sys.stderr, flush=True)
            forward(signal.SIGTERM, None)
        if term_at and time.monotonic() - term_at[0] > 2 * _TERM_GRACE_S:
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(_POLL_S)


def router_policy_args(policy: str) -> list[str]:
    """The ``sglang_router.launch_router`` arguments for ``local.router_policy``: ``auto`` is
    ``--policy manual --assignment-mode min_group`` (the 0.3.2 policy that honours
    ``X-SMG-Routing-Key``; see the module docstring), any other value ``--policy <value>``."""
    if policy == RouterPolicy.AUTO:
        return ["--policy", "manual", "--assignment-mode", "min_group"]
    return ["--policy", str(RouterPolicy(policy).value)]


def _redact(cmd: list[str], secrets_: list[str]) -> str:
    """The command line for logs: secret values and the word after ``--api-key`` become ``***``."""
    out: list[str] = []
    hide_next = False
    for word in cmd:
        if hide_next:
            out.append("***")
            hide_next = False
            continue
        for sec in secrets_:
            if sec:
                word = word.replace(sec, "***")
        flag, eq, _ = word.partition("=")
        if flag in _SECRET_FLAGS:
            if eq:
                word = flag + "=***"
            else:
                hide_next = True
        out.append(word)
    return " ".join(out)


def _descendants(pids: list[int]) -> list[int]:
    """Live descendants of ``pids`` (Linux ``/proc``; empty elsewhere)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                stat = fh.read().decode(errors="replace")
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(name))
    out: list[int] = []
    todo = list(pids)
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in out:
                out.append(c)
                todo.append(c)
    return out


def _kv_args(local: LocalConfig) -> list[str]:
    """The servers' ``--kv-*`` (and ``--gold-think-tokens``) flags for ``local.kv`` (only the keys that are not 0)."""
    from rollout.devtools.local.kvmodel import KVParams

    params = dataclasses.asdict(local.kv)
    think = params.pop("think_tokens", 0)
    return KVParams(**params).cli_args() + (["--gold-think-tokens", str(think)] if think else [])


def _http(method: str, url: str, body: dict | None = None, timeout: float = 5.0,
          api_key: str | None = None) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


class LocalStack:
    """Test servers plus the real sglang-router on loopback, as a context manager.

    Args:
        local: the ``local`` config section (backend, ``num_servers``, host, ``router_port``,
            ``router_policy`` (the router's ``--policy``: :func:`router_policy_args`),
            ``startup_timeout_s`` in seconds, ``weight_version`` given to every server as
            ``--weight-version``, ``generate_latency_s`` as ``--generate-latency-s``, ``event_loop``
            as ``--event-loop``, ``kv`` as the ``--kv-*`` flags, ``tiny``
            model config).
        domain: the domain the gold-replay servers index: a tau2 domain (a registry name: ``retail``, ``airline``,
            ``telecom``, ...), or ``"<benchmark>:<domain>"`` for another benchmark (``tau_bench:retail``;
            :func:`rollout.core.environment.domain_key`), indexed through the benchmark registry.
        tokenizer: ``builtin:<vocabulary>``, a local tokenizer folder, or a hub id (the router gets
            the resolved path, a folder written once for a built-in vocabulary; a hub id makes it download).
        log_dir: where ``server-<i>.log`` and ``router.log`` go; None: a temporary folder,
            removed by :meth:`stop`.
        api_key_env: name of the environment variable holding the API key (``policy.api_key_env``).
            When it is set (non-empty) at :meth:`start`, the servers and the router require
            ``Authorization: Bearer <key>`` (see the module docstring); the stack's own checks
            send it. The key is passed to the subprocesses through their environment only.
        chat_format: ``policy.chat_format``: the format the gold-replay servers read and write
            (``auto``: detected from the tokenizer by each server).

    Usage::

        with LocalStack(cfg.local, "retail", "builtin:qwen3") as stack:
            post(stack.router_url + "/generate", ...)

    Start it from a thread that lives as long as the stack (normally the main thread); from
    another thread it works too, with the slower fate sharing described in the module docstring.
    """

    def __init__(self, local: LocalConfig, domain: str, tokenizer: str, log_dir: Path | None = None,
                 api_key_env: str | None = None, chat_format: str = "auto") -> None:
        self.local = local
        self.domain = domain
        self.tokenizer = tokenizer
        self.chat_format = chat_format
        self.api_key_env = api_key_env
        self._api_key: str | None = None
        self._own_log_dir = log_dir is None
        self._log_dir: Path | None = Path(log_dir) if log_dir is not None else None
        self._procs: list[tuple[str, subprocess.Popen, IO, Path]] = []
        self._servers: list[subprocess.Popen] = []
        self._router: subprocess.Popen | None = None
        self._router_cmd: list[str] | None = None
        self._env: dict[str, str] = {}
        self._worker_urls: list[str] = []
        self._router_url: str | None = None
        self._started = False
        self._stopped = False
        self._lock = threading.Lock()

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

    @property
    def requires_api_key(self) -> bool:
        """Whether the servers and the router were started requiring the key."""
        return self._api_key is not None

    def server_infos(self, timeout_s: float = 10.0) -> list[dict]:
        """Each test server's ``GET /get_server_info`` answer (its backend, weight version,
        ``event_loop``...), in start order, with the stack's API key if it has one.

        Raises:
            RuntimeError: a server answered with a status other than 200.
            OSError: a server did not answer within ``timeout_s`` seconds.
        """
        out = []
        for url in self._worker_urls:
            status, body = _http("GET", url + "/get_server_info", timeout=timeout_s, api_key=self._api_key)
            if status != 200:
                raise RuntimeError(f"{url}/get_server_info answered {status}")
            out.append(json.loads(body))
        return out

    def pids(self) -> list[int]:
        """Pids of every process the stack started (servers, router wrappers, including ones
        that have exited since) and of their live descendants (the router process under each
        wrapper), in start order."""
        own = [proc.pid for _, proc, _, _ in self._procs]
        return own + [p for p in _descendants(own) if p not in own]

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
        if self.api_key_env:
            self._api_key = os.environ.get(self.api_key_env) or None
            if self._api_key is None:
                logger.warning("local stack: $%s (policy.api_key_env) is not set; the servers and the router "
                               "will not require a key", self.api_key_env)
        atexit.register(self.stop)
        try:
            self._start()
        except BaseException:
            self.stop(remove_logs=False)
            raise
        return self

    def _fate_args(self) -> list[str]:
        args = ["--parent-pid", str(os.getpid())]
        if threading.current_thread() is threading.main_thread():
            args.append("--pdeathsig")  # PDEATHSIG follows the parent *thread*: main thread only
        return args

    def _spawn(self, name: str, cmd: list[str]) -> subprocess.Popen:
        assert self._log_dir is not None
        path = self._log_dir / f"{name}.log"
        shown = _redact(cmd, [self._api_key] if self._api_key else [])
        fh = open(path, "ab")  # noqa: SIM115  (stays open for the subprocess; closed by stop())
        fh.write(("$ " + shown + "\n").encode())
        fh.flush()
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT, env=self._env, start_new_session=True
        )
        self._procs.append((name, proc, fh, path))
        logger.debug("started %s (pid %d): %s", name, proc.pid, shown)
        return proc

    def _entry(self, proc: subprocess.Popen) -> tuple[str, subprocess.Popen, IO, Path]:
        return next(e for e in self._procs if e[1] is proc)

    def _check_alive(self, procs: list[subprocess.Popen] | None = None, what: str = "startup") -> None:
        for name, proc, _, path in self._procs:
            if (procs is None or proc in procs) and proc.poll() is not None:
                raise RuntimeError(
                    f"local stack: {name} exited with code {proc.returncode} during {what}; "
                    f"log {path}:\n{log_tail(path, 30)}"
                )

    def _fail(self, what: str, timeout_s: float) -> RuntimeError:
        seen: dict[Path, str] = {}
        for name, _, _, path in self._procs:
            seen.setdefault(path, name)
        tails = "\n".join(f"--- {name} ({path}):\n{log_tail(path, 30)}" for path, name in seen.items())
        return RuntimeError(f"local stack: {what} within {timeout_s:.0f} s\n{tails}")

    def _start(self) -> None:
        local = self.local
        host = local.host
        deadline = time.monotonic() + local.startup_timeout_s
        env = dict(os.environ)
        pkg_root = str(Path(rollout.__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_root, env.get("PYTHONPATH", "")) if p)
        env.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        self._env = env
        tiny_json = json.dumps(dataclasses.asdict(local.tiny))
        key_args = ["--api-key-env", str(self.api_key_env)] if self._api_key else []

        # 1. the test servers
        for i in range(local.num_servers):
            port = free_port(host)
            url = f"http://{host}:{port}"
            cmd = [
                sys.executable, "-m", "rollout.devtools.local.server",
                "--host", host, "--port", str(port),
                "--backend", local.backend, "--domain", self.domain,
                "--tokenizer", self.tokenizer, "--chat-format", self.chat_format, "--tiny-config", tiny_json,
                "--weight-version", str(local.weight_version),
                "--generate-latency-s", repr(float(local.generate_latency_s)),
                *_kv_args(local),
                "--event-loop", local.event_loop,
                *key_args, *self._fate_args(),
            ]
            self._servers.append(self._spawn(f"server-{i}", cmd))
            self._worker_urls.append(url)
        pending = set(self._worker_urls)
        while pending:
            self._check_alive()
            for url in list(pending):
                try:
                    status, _ = _http("GET", url + "/health", timeout=2.0, api_key=self._api_key)
                except OSError:
                    continue
                if status == 200:
                    pending.discard(url)
            if pending:
                if time.monotonic() > deadline:
                    raise self._fail(f"servers {sorted(pending)} did not answer /health", local.startup_timeout_s)
                time.sleep(_POLL_S)

        # 2. the router, under the wrapper that adds the key in memory and shares our fate
        router_port = local.router_port or free_port(host)
        self._router_url = f"http://{host}:{router_port}"
        remaining = max(1, int(deadline - time.monotonic()))
        self._router_cmd = [
            "--host", host, "--port", str(router_port),
            "--worker-urls", *self._worker_urls,
            *router_policy_args(local.router_policy),
            "--tokenizer-path", resolve_tokenizer_path(self.tokenizer),
            "--prometheus-host", host, "--prometheus-port", str(free_port(host)),
            "--log-level", "warn",
            "--worker-startup-timeout-secs", str(remaining),
            "--worker-startup-check-interval", "1",
            "--shutdown-grace-period-secs", "2",
        ]
        self._spawn_router()
        self._wait_router(deadline, local.startup_timeout_s, list(self._worker_urls), "startup")
        logger.info("local stack up: router %s, workers %s, logs in %s%s", self._router_url, self._worker_urls,
                    self._log_dir, f" (API key from ${self.api_key_env} required)" if self._api_key else "")

    def _spawn_router(self) -> subprocess.Popen:
        assert self._router_cmd is not None
        cmd = [sys.executable, "-m", "rollout.devtools.local.stack", "router", *self._fate_args()]
        if self._api_key:
            cmd += ["--api-key-env", str(self.api_key_env)]
        self._router = self._spawn("router", [*cmd, "--", *self._router_cmd])
        return self._router

    def _wait_router(self, deadline: float, timeout_s: float, expect: list[str], what: str) -> None:
        """Wait until the router lists ``expect`` as healthy and a /generate through it works."""
        assert self._router is not None
        watched = [self._router, *[p for p in self._servers if p.poll() is None]]
        while True:
            self._check_alive(watched, what)
            healthy = self._healthy_workers()
            if healthy is not None and set(expect) <= healthy:
                break
            if time.monotonic() > deadline:
                raise self._fail(f"router did not list {expect} as healthy (it lists {sorted(healthy or [])})", timeout_s)
            time.sleep(_POLL_S)
        last = ""
        while True:
            self._check_alive(watched, what)
            try:
                status, body = _http(
                    "POST", self.router_url + "/generate",
                    {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}},
                    timeout=30.0, api_key=self._api_key,
                )
                if status == 200 and isinstance(json.loads(body).get("output_ids"), list):
                    return
                last = f"HTTP {status}: {body[:300]!r}"
            except (OSError, ValueError, http.client.HTTPException) as e:  # HTTPException: not an HTTP/1 answer
                last = repr(e)
            if time.monotonic() > deadline:
                raise self._fail(f"POST /generate through the router did not succeed (last: {last})", timeout_s)
            time.sleep(_POLL_S)

    def _healthy_workers(self) -> set[str] | None:
        try:
            status, body = _http("GET", self.router_url + "/workers", timeout=2.0, api_key=self._api_key)
            if status != 200:
                return None
            data = json.loads(body)
        except (OSError, ValueError, http.client.HTTPException):  # e.g. BadStatusLine: another server on the port
            return None
        workers = data.get("workers", []) if isinstance(data, dict) else []
        return {str(w.get("url", "")).rstrip("/") for w in workers if isinstance(w, dict) and w.get("is_healthy")}

    # ------------------------------------------------------------------ chaos
    def _terminate(self, procs: list[subprocess.Popen], grace_s: float = _TERM_GRACE_S) -> None:
        """SIGTERM each process group, SIGKILL what is left after ``grace_s``; reap them all."""
        for proc in procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except (ProcessLookupError, PermissionError):
                    pass
        deadline = time.monotonic() + grace_s
        for proc in procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                logger.warning("%s (pid %d) ignored SIGTERM; killing it", self._entry(proc)[0], proc.pid)
        for proc in procs:
            if proc.poll() is None:  # still running after the grace period
                self._kill(proc, self._entry(proc)[0])

    @staticmethod
    def _kill(proc: subprocess.Popen, name: str) -> None:
        """SIGKILL ``proc``'s process group and reap it."""
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            logger.error("%s (pid %d) did not die after SIGKILL", name, proc.pid)

    def restart_router(self, down_s: float = 0.0, timeout_s: float | None = None) -> None:
        """Stop the router (only it: its process group), wait ``down_s`` seconds, start it again on
        the same port with the same workers, and return once a /generate through it works.

        Args:
            down_s: seconds the router stays down.
            timeout_s: seconds to wait for the new router (default ``local.startup_timeout_s``);
                it must list every server whose process is still running as healthy.

        Raises:
            RuntimeError: not started / already stopped, or the new router did not come up in
                time (the message carries the log tails).
        """
        with self._lock:
            if not self._started or self._stopped or self._router is None:
                raise RuntimeError("LocalStack.restart_router(): the stack is not running")
            t0 = time.monotonic()
            self._terminate([self._router])
            self._entry(self._router)[2].close()
            if down_s > 0:
                time.sleep(down_s)
            timeout = self.local.startup_timeout_s if timeout_s is None else timeout_s
            deadline = time.monotonic() + timeout
            self._spawn_router()
            alive = [u for u, p in zip(self._worker_urls, self._servers) if p.poll() is None]
            self._wait_router(deadline, timeout, alive, "router restart")
            logger.info("local stack: router %s restarted (down %.2f s in all)", self._router_url, time.monotonic() - t0)

    def kill_server(self, i: int) -> int:
        """SIGKILL server ``i`` (its process group), for chaos tests; returns its pid. The router
        keeps it listed until its health checks fail; the stack does not restart it.

        Raises:
            IndexError: no server ``i``.
        """
        proc = self._servers[i]
        if proc.poll() is None:
            self._kill(proc, f"server-{i}")
        logger.info("local stack: killed server-%d (pid %d, %s)", i, proc.pid, self._worker_urls[i])
        return proc.pid

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
        procs = [proc for _, proc, _, _ in reversed(self._procs)]  # router first
        self._terminate(procs)
        for _, _, fh, _ in self._procs:
            fh.close()
        if remove_logs and self._own_log_dir and self._log_dir is not None:
            shutil.rmtree(self._log_dir, ignore_errors=True)



class LocalStackEngine:
    """The local stack as the wiring's engine (:class:`rollout.core.engines.EngineKind`, registered
    as ``local``, :data:`rollout.core.engines.LOCAL_STACK`): a :class:`LocalStack` for the ``local``
    section and the job's facts, its router on ``local.router_port`` or, when that is null, a free
    port chosen here, so that :attr:`router_url` is known before :meth:`start`.

    Args:
        local: the ``local`` section.
        job: the job's facts (:class:`rollout.core.engines.EngineJob`): the domain key, the
            tokenizer, the chat format, the API key's variable, the log folder.
    """

    section = "local"

    def __init__(self, local: LocalConfig, job: EngineJob):
        if not local.router_port:
            local = dataclasses.replace(local, router_port=free_port(local.host))
        self.stack = LocalStack(local, job.domain, job.tokenizer, log_dir=job.log_dir, api_key_env=job.api_key_env,
                                chat_format=job.chat_format)
        self.router_url = f"http://{local.host}:{local.router_port}"

    @staticmethod
    def check_config(cfg: Config) -> None:
        """``local.event_loop=uvloop``: uvloop is installed here, where the servers run.

        Raises:
            rollout.core.config.ConfigError: one line naming ``local.event_loop``.
        """
        if cfg.local.event_loop == EventLoop.UVLOOP:
            why = check_event_loop(cfg.local.event_loop, "local.event_loop")
            if why:
                raise ConfigError(why)

    @staticmethod
    def check_modules(cfg: Config) -> None:
        """``local.backend=tiny`` needs torch (the ``tiny`` extra), looked up, not imported.

        Raises:
            rollout.core.startup.PreflightError: one line with the install command.
        """
        if cfg.local.backend == LocalBackend.TINY and not importable("torch"):
            raise PreflightError("local.backend=tiny needs torch, which is not installed here: pip install 'tau-rollout[tiny]' "
                                 "(torch==2.13.0 is the CPU build), or choose local.backend=gold_replay")

    def start(self) -> LocalStack:
        """Start the stack (:meth:`LocalStack.start`).

        Raises:
            RuntimeError: as :meth:`LocalStack.start`, or the router is not where :attr:`router_url` says.
        """
        self.stack.start()
        if self.stack.router_url != self.router_url:  # the stack keeps the port it was given
            raise RuntimeError(f"local stack: router at {self.stack.router_url}, expected {self.router_url}")
        return self.stack

    def stop(self) -> None:
        """Stop the stack (:meth:`LocalStack.stop`; idempotent)."""
        self.stack.stop()

if __name__ == "__main__":
    if sys.argv[1:2] == ["router"]:
        sys.exit(_router_main(sys.argv[2:]))
    sys.exit("usage: python -m rollout.devtools.local.stack router [--api-key-env NAME] [--parent-pid PID] [--pdeathsig] -- ROUTER_ARGS")
