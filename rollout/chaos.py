"""Chaos bench: the main job under faults, checked for exactly-once delivery and clean exits.

``python -m rollout.bench chaos [--config configs/local.yaml] [--tasks N] [--faults a,b,...]
[--json FILE] [key=value ...]`` runs the main job (``python -m rollout run``, the CLI, in a
subprocess in its own session; gold replay on the local stack, ``N`` tasks of the configured
domain, ``rollout.n_samples_per_task=1``, ``pool.num_actors=2``, a Ray cluster of its own) once
per fault (the first ``N`` tasks of ``env.task_split``) and reports, per fault:

* ``submitted``: episode ids in the run's ``specs.jsonl``, plus the re-runs of group members
  (``<id>~r<n>``) found in the results;
* ``delivered``: distinct episode ids in ``samples.jsonl`` / ``failed.jsonl`` /
  ``filtered.jsonl`` at the end (after the ``--resume`` when the fault needs one);
* ``lost``: submitted minus delivered; ``duplicated``: ids on more than one line of those files,
  or on more than one line of the journal ``episodes.jsonl``;
* ``statuses``: episodes per status; ``wall_s``: seconds from the start of the fault's first
  run to the end of its last one (bench-owned helpers' start-up included);
* ``left_behind``: processes the fault started (every descendant of each CLI driver, captured
  with psutil every 0.5 s while it runs, and every process the bench started for the fault)
  still alive, zombies excepted, once the bench has waited up to ``--left-wait`` seconds (90 by
  default: after a SIGKILLed driver, Ray's own agents exit on their own about 60 s later) for
  them to go; ``left_wait_s`` says how long that took. What is left is reported, then killed
  by pid.

Faults (:data:`FAULTS`):

``actor_sigkill_x3``
    SIGKILL a ``ray::RolloutWorker`` actor process (a descendant of this run's driver) three
    times: the oldest one alive, first :data:`EPISODES_GOING_S` seconds after the actors are up,
    then each time once the previous victim is back (a new actor process exists and the driver
    logged ``actor N is back``: it answered a health ping). An actor restart takes ~20 s on a
    loaded 2-core machine, so this fault runs one episode at a time per actor
    (``pool.max_concurrent_episodes=1``) to keep work for the third kill; with fewer than ~16
    tasks the run may end first (the ``three_kills`` check then fails).
``server_kill``
    ``local.num_servers=2``; SIGKILL one ``rollout.local.server`` process (a descendant of the
    driver) :data:`EPISODES_GOING_S` seconds after the actors are up, while the first episodes
    generate. Episodes on it may end ``policy_error`` (delivered; their group member is re-run).
``router_restart``
    The bench owns the local stack (:class:`rollout.local.stack.LocalStack`; the job runs with
    ``local.enabled=false policy.router_url=<its router>``), SIGKILLs the router's process group
    once :data:`ROUTER_KILL_AT` episodes are delivered (the next ones are then starting their
    first turns), and restarts it on the same port :data:`ROUTER_DOWN_S` seconds later
    (:meth:`~rollout.local.stack.LocalStack.restart_router`). The policy client's circuit breaker
    should let every episode complete (check ``all_completed``). It is armed per actor only once
    a call of that actor succeeded: a router lost in the first second of a run, before that,
    ends the episodes ``policy_error`` after their retries (seen here; by design).
``faulty_server``
    A real ``sglang-router`` (``--disable-retries --disable-circuit-breaker``, so that every
    fault reaches the client) whose only worker is :class:`FaultInjectingProxy` in front of a
    real ``rollout.local.server``; the proxy answers a fraction of the episodes' ``/generate``
    calls (chosen by a hash of their ``rid``, so a retry is a fresh draw) with 503, a connection
    reset, a hang past ``policy.request_timeout_s`` (set to :data:`FAULTY_REQUEST_TIMEOUT_S`),
    a truncated JSON body or ``finish_reason.type == "abort"`` (:data:`FAULT_RATES`).
``user_sim_429_500``
    ``env.user.kind=llm`` against :class:`FakeUserLLM`, an OpenAI-compatible server that answers
    429 (``Retry-After: 1``) or 500 to 4 in 10 of the chat calls (:data:`USER_FAULT_PATTERN`)
    and otherwise a fixed reply that says ``###STOP###`` at the user's second turn;
    ``env.user.retry_backoff_s=0.2``.
``driver_sigkill_resume``
    SIGKILL the driver once a third of the episodes are delivered, then ``--resume``.
``driver_sigterm_resume``
    SIGTERM the driver likewise (it must exit within 10 s with code 143 and the summary status
    ``interrupted``), then ``--resume``.
``node_removal``
    A ``ray.cluster_utils.Cluster`` (head without CPUs, two worker nodes with one CPU each) run
    by a helper subprocess (``python -m rollout.chaos cluster``, so that Ray is imported only
    there); the job joins it (``pool.ray_address``) and the bench removes the worker node that
    hosts an actor (found through the actor process's raylet ancestor) once 2 episodes are
    delivered.

A fault passes (``ok``) when lost, duplicated and left_behind are 0 and its own checks hold
(``checks``: e.g. three kills done, exit code 143 within 10 s); ``notes`` says what happened.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import hashlib
import json
import logging
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import psutil

logger = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[1]
FAULTS = ("actor_sigkill_x3", "server_kill", "router_restart", "faulty_server", "user_sim_429_500",
          "driver_sigkill_resume", "driver_sigterm_resume", "node_removal")
DEFAULT_TASKS = 24
LEFT_WAIT_S = 90.0  # seconds to wait for a run's processes to go
ROUTER_DOWN_S = 5.0  # seconds the router stays down in router_restart
EPISODES_GOING_S = 1.0  # server_kill / actor_sigkill_x3 strike this long after the actors are up (seconds)
ROUTER_KILL_AT = 2  # router_restart kills the router once this many episodes are delivered
FAULTY_REQUEST_TIMEOUT_S = 20.0  # policy.request_timeout_s in faulty_server (seconds)
FAULTY_HANG_S = 35.0  # a hung /generate answers 504 after this long (seconds; > the timeout)
# Fraction of the episodes' /generate calls answered with each fault in faulty_server.
FAULT_RATES = {"503": 0.05, "reset": 0.04, "hang": 0.015, "truncated": 0.02, "abort": 0.02}
# user_sim_429_500: the user simulator's chat calls, in arrival order, are answered by this
# pattern, repeated: 2 in 10 with 429 (Retry-After: 1), 2 in 10 with 500.
USER_FAULT_PATTERN = ("ok", "429", "ok", "500", "ok", "ok", "429", "ok", "ok", "500")
JOB_TIMEOUT_S = 900.0  # one CLI run (seconds); past it the run is killed and the fault fails
KILL_WAIT_S = 240.0  # seconds to wait for the moment of a kill (episodes delivered, actor back)
OK_EXIT_CODES = (0, 3)  # 3: some episodes ended with an infrastructure failure (typed, delivered)
# Applied before the user's overrides.
BASE_OVERRIDES = ["rollout.n_samples_per_task=1", "pool.num_actors=2", "logging.level=INFO"]


# -- processes ---------------------------------------------------------------------------------
def _key(p: psutil.Process) -> tuple[int, float] | None:
    try:
        return p.pid, p.create_time()
    except psutil.Error:
        return None


def _cmdline(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())
    except psutil.Error:
        return ""


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class ProcessWatcher:
    """Records every process under some root pids, polling every ``interval_s`` seconds in a
    thread (a SIGKILLed driver's children are re-parented: they stay recorded).

    Attributes:
        seen: ``(pid, create time) -> psutil.Process`` of every process recorded (roots included).
        gone_at: ``(pid, create time) -> time.monotonic()`` of the poll that first found it gone.
    """

    def __init__(self, interval_s: float = 0.5):
        self.interval_s = interval_s
        self.seen: dict[tuple[int, float], psutil.Process] = {}
        self.gone_at: dict[tuple[int, float], float] = {}
        self._roots: list[psutil.Process] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="chaos-watcher", daemon=True)
        self._thread.start()

    def add(self, pid: int) -> None:
        """Watch ``pid`` and its descendants (recorded at once and then every poll)."""
        try:
            p = psutil.Process(pid)
        except psutil.Error:
            return
        with self._lock:
            self._roots.append(p)
        self.scan()

    def scan(self) -> None:
        """Record the roots' live descendants now."""
        with self._lock:
            roots = list(self._roots)
        for root in roots:
            found = [root]
            try:
                if root.is_running():
                    found += root.children(recursive=True)
            except psutil.Error:
                pass
            for p in found:
                k = _key(p)
                if k is not None:
                    with self._lock:
                        self.seen.setdefault(k, p)
        with self._lock:
            todo = [(k, p) for k, p in self.seen.items() if k not in self.gone_at]
        now = time.monotonic()
        for k, p in todo:
            if not _alive(p):
                with self._lock:
                    self.gone_at[k] = now

    def gone_after(self, keys: list[tuple[int, float]], since: float) -> float | None:
        """Seconds from ``since`` (``time.monotonic()``) until every process of ``keys`` was
        found gone; ``None`` while one is still alive."""
        with self._lock:
            if any(k not in self.gone_at for k in keys):
                return None
            return max([self.gone_at[k] - since for k in keys] + [0.0])

    def descendants(self, pid: int) -> list[psutil.Process]:
        """Live descendants of ``pid`` now (not only recorded ones)."""
        try:
            return psutil.Process(pid).children(recursive=True)
        except psutil.Error:
            return []

    def alive(self) -> list[psutil.Process]:
        """Recorded processes still alive (zombies excepted)."""
        with self._lock:
            procs = list(self.seen.values())
        return [p for p in procs if _alive(p)]

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.scan()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


def wait_gone(watcher: ProcessWatcher, timeout_s: float) -> tuple[list[psutil.Process], float]:
    """Wait up to ``timeout_s`` seconds for every recorded process to exit; returns what is
    still alive and the seconds waited."""
    t0 = time.monotonic()
    while True:
        left = watcher.alive()
        if not left or time.monotonic() - t0 >= timeout_s:
            return left, time.monotonic() - t0
        time.sleep(0.5)


def _kill_tree(pid: int, sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` to ``pid``'s process group (it was started in a session of its own)."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


# -- the job ----------------------------------------------------------------------------------
class Job:
    """One ``python -m rollout run`` in a subprocess in its own session; output to ``log_path``.

    Args:
        args: the CLI arguments after ``python -m rollout run``.
        out_dir: the run's ``rollout.output_dir``.
        env: the environment of the subprocess.
        watcher: records the driver and its descendants.
    """

    def __init__(self, args: list[str], out_dir: Path, log_path: Path, env: dict[str, str], watcher: ProcessWatcher):
        self.args = args
        self.out_dir = out_dir
        self.log_path = log_path
        self._fh = open(log_path, "w")  # noqa: SIM115 (closed by wait())
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen([sys.executable, "-m", "rollout", "run", *args], cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                                     stdout=self._fh, stderr=subprocess.STDOUT, start_new_session=True)
        self.pid = self.proc.pid
        self.wall_s: float | None = None
        self.timed_out = False
        watcher.add(self.pid)

    def running(self) -> bool:
        return self.proc.poll() is None

    def delivered(self) -> int:
        """Episodes journaled as delivered so far (lines of ``episodes.jsonl``)."""
        path = self.out_dir / "episodes.jsonl"
        try:
            with open(path, "rb") as fh:
                return sum(1 for line in fh if line.strip())
        except OSError:
            return 0

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def wait(self, timeout_s: float = JOB_TIMEOUT_S) -> int:
        """Wait for the run to end (killing its process group past ``timeout_s`` seconds);
        returns its exit code."""
        try:
            self.proc.wait(timeout=max(0.0, timeout_s - (time.monotonic() - self.t0)))
        except subprocess.TimeoutExpired:
            self.timed_out = True
            _kill_tree(self.pid)
            self.proc.wait(30)
        if self.wall_s is None:
            self.wall_s = time.monotonic() - self.t0
        self._fh.close()
        return self.proc.returncode

    def summary(self) -> dict:
        try:
            return json.loads((self.out_dir / "summary.json").read_text())
        except (OSError, ValueError):
            return {}

    def record(self) -> dict:
        """What the report keeps of this run."""
        s = self.summary()
        return {"args": self.args, "rc": self.proc.returncode, "wall_s": round(self.wall_s or 0.0, 2), "timed_out": self.timed_out,
                "summary_status": s.get("status"), "summary_reason": s.get("reason"), "log": str(self.log_path)}


def wait_until(cond: Callable[[], bool], job: Job | None, timeout_s: float, poll_s: float = 0.2) -> bool:
    """Wait until ``cond()`` (True), ``job`` ended or ``timeout_s`` passed (False)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if cond():
            return True
        if (job is not None and not job.running()) or time.monotonic() > deadline:
            return False
        time.sleep(poll_s)


# -- counting ---------------------------------------------------------------------------------
def _jsonl(path: Path, notes: list[str]) -> list[dict]:
    if not path.is_file():
        return []
    out = []
    for n, line in enumerate(path.read_text().splitlines()):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except ValueError:
            notes.append(f"{path.name}:{n + 1} is not valid JSON (torn line)")
    return out


def _episode_id(d: dict) -> str:
    return str(d.get("episode_id") or (d.get("metadata") or {}).get("episode_id") or "")


def tally(out_dir: Path) -> dict[str, Any]:
    """Count a run's episodes (see the module docstring for the definitions).

    Returns:
        ``{"submitted", "delivered", "lost", "duplicated", "statuses", "reruns", "lost_ids",
        "duplicated_ids", "unexpected_ids", "notes"}``.
    """
    notes: list[str] = []
    specs = [_episode_id(d) for d in _jsonl(out_dir / "specs.jsonl", notes)]
    rows = [d for f in ("samples.jsonl", "failed.jsonl", "filtered.jsonl") for d in _jsonl(out_dir / f, notes)]
    written = [_episode_id(d) for d in rows]
    journal = [_episode_id(d) for d in _jsonl(out_dir / "episodes.jsonl", notes)]
    spec_set = set(specs)
    reruns = {i for i in set(written) | set(journal) if "~r" in i and i.split("~r", 1)[0] in spec_set}
    submitted = spec_set | reruns
    delivered = set(written)
    dup = {i for i, n in collections.Counter(written).items() if n > 1} | {i for i, n in collections.Counter(journal).items() if n > 1}
    if len(specs) != len(spec_set):
        notes.append(f"specs.jsonl names {len(specs) - len(spec_set)} episode(s) twice")
    statuses: collections.Counter[str] = collections.Counter()
    first: set[str] = set()
    for d, i in zip(rows, written):
        if i not in first:
            first.add(i)
            statuses[str(d.get("status"))] += 1
    return {
        "submitted": len(submitted), "delivered": len(delivered), "lost": len(submitted - delivered), "duplicated": len(dup),
        "statuses": dict(sorted(statuses.items())), "reruns": len(reruns), "lost_ids": sorted(submitted - delivered)[:20],
        "duplicated_ids": sorted(dup)[:20], "unexpected_ids": sorted(delivered - submitted)[:20], "notes": notes,
    }


# -- helper servers (each runs its own event loop in a thread) ---------------------------------
class ThreadedApp:
    """An aiohttp application on 127.0.0.1 (a free port) served from a thread of its own, for
    callers whose own code is synchronous (the bench, Ray drivers in tests). Subclasses build the
    app in ``_app()`` and may open and close resources in ``_on_start`` / ``_on_stop``;
    ``start()`` returns once :attr:`url` serves, ``stop()`` tears it down."""

    def __init__(self) -> None:
        self.url = ""
        self._loop: asyncio.AbstractEventLoop | None = None

    def _app(self):  # pragma: no cover - overridden
        raise NotImplementedError

    async def _on_start(self) -> None:
        pass

    async def _on_stop(self) -> None:
        pass

    async def _start(self) -> None:
        from aiohttp import web

        await self._on_start()
        self._runner = web.AppRunner(self._app(), access_log=None, handler_cancellation=True, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"

    async def _stop(self) -> None:
        await self._runner.cleanup()
        await self._on_stop()

    def start(self):
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=type(self).__name__, daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(30)
        return self

    def stop(self) -> None:
        if self._loop is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(30)
        except Exception as e:  # noqa: BLE001 (best effort at the end of a fault)
            logger.debug("stopping %s: %r", type(self).__name__, e)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
        self._loop = None


_HOP = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}


class FaultInjectingProxy(ThreadedApp):
    """An HTTP proxy that stands for an SGLang worker in front of ``upstream`` (a real server):
    every request is forwarded, except that a fraction of the episodes' ``/generate`` calls (a
    ``rid`` of the form ``<episode>@<attempt>#<n>[.r<k>]``) get a fault instead, picked by a hash
    of ``seed`` and the ``rid`` (deterministic; a retry has a new ``rid``, so a fresh draw):

    * ``503``: HTTP 503 with a JSON error;
    * ``reset``: the connection is reset (RST) without an answer;
    * ``hang``: no answer for ``hang_s`` seconds (then 504);
    * ``truncated``: the server's answer cut to half its bytes, HTTP 200;
    * ``abort``: the server's answer with ``meta_info.finish_reason = {"type": "abort"}``.

    Args:
        upstream: the server's base URL.
        rates: fault -> fraction of those calls (their sum at most 1).
        hang_s: seconds a hung call waits.

    Attributes:
        counts: fault -> calls it was injected into; ``forwarded``: calls passed through.
    """

    def __init__(self, upstream: str, rates: dict[str, float], hang_s: float, seed: int = 0):
        super().__init__()
        self.upstream = upstream.rstrip("/")
        self.rates = dict(rates)
        self.hang_s = hang_s
        self.seed = seed
        self.counts: collections.Counter[str] = collections.Counter()

    def pick(self, rid: str | None) -> str | None:
        """The fault for the call with this ``rid`` (``None``: forward it)."""
        if not rid or "@" not in rid or "#" not in rid:
            return None  # the stack's / preflight's own probes
        u = int.from_bytes(hashlib.sha256(f"{self.seed}:{rid}".encode()).digest()[:8], "big") / 2**64
        acc = 0.0
        for kind, rate in self.rates.items():
            acc += rate
            if u < acc:
                return kind
        return None

    def _app(self):
        from aiohttp import web

        app = web.Application(client_max_size=256 * 2**20)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        return app

    async def _on_start(self) -> None:
        import aiohttp

        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600))

    async def _on_stop(self) -> None:
        await self._session.close()

    async def _handle(self, request):
        from aiohttp import web

        body = await request.read()
        kind = None
        if request.method == "POST" and request.path == "/generate":
            try:
                rid = json.loads(body).get("rid")
            except (ValueError, AttributeError):
                rid = None
            kind = self.pick(rid if isinstance(rid, str) else None)
        self.counts[kind or ("forwarded" if request.path == "/generate" else "other")] += 1
        if kind == "503":
            return web.json_response({"error": {"message": "injected: service unavailable"}}, status=503)
        if kind == "reset":
            sock = request.transport.get_extra_info("socket") if request.transport else None
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            if request.transport is not None:
                request.transport.abort()
            return web.Response(status=500)  # never sent: the connection is gone
        if kind == "hang":
            await asyncio.sleep(self.hang_s)
            return web.json_response({"error": {"message": "injected: gateway timeout"}}, status=504)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        async with self._session.request(request.method, self.upstream + request.path_qs, data=body or None, headers=headers) as r:
            data = await r.read()
            status, ctype = r.status, r.headers.get("Content-Type", "application/json")
        if kind == "truncated" and status == 200:
            return web.Response(body=data[: len(data) // 2], status=200, content_type="application/json")
        if kind == "abort" and status == 200:
            d = json.loads(data)
            d.setdefault("meta_info", {})["finish_reason"] = {"type": "abort", "message": "injected abort"}
            return web.json_response(d)
        return web.Response(body=data, status=status, headers={"Content-Type": ctype})


class FakeUserLLM(ThreadedApp):
    """An OpenAI-compatible user simulator endpoint (``GET /v1/models``, ``POST
    /v1/chat/completions``): the chat calls, in arrival order, are answered as ``pattern`` says
    (repeated): ``429`` (with ``Retry-After: 1``), ``500``, or ``ok``: a fixed user line, which
    says ``###STOP###`` from the user's ``stop_at``-th turn on (counted by the simulator's own
    earlier turns in the request, role ``assistant``).

    Attributes:
        counts: ``429`` / ``500`` / ``ok`` / ``stop`` -> calls answered so.
    """

    def __init__(self, pattern: tuple[str, ...] = USER_FAULT_PATTERN, stop_at: int = 2):
        super().__init__()
        self.pattern = pattern
        self.stop_at = stop_at
        self._calls = 0
        self.counts: collections.Counter[str] = collections.Counter()

    def _app(self):
        from aiohttp import web

        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)
        return app

    async def _models(self, request):
        from aiohttp import web

        return web.json_response({"object": "list", "data": [{"id": "sim", "object": "model"}]})

    async def _chat(self, request):
        from aiohttp import web

        body = await request.json()
        msgs = body.get("messages") or []
        if not (len(msgs) == 1 and msgs[0].get("content") == "ping"):  # not the pre-flight probe
            action = self.pattern[self._calls % len(self.pattern)]
            self._calls += 1
            if action == "429":
                self.counts["429"] += 1
                return web.json_response({"error": {"message": "injected: rate limited"}}, status=429, headers={"Retry-After": "1"})
            if action == "500":
                self.counts["500"] += 1
                return web.json_response({"error": {"message": "injected: internal error"}}, status=500)
        turn = sum(1 for m in msgs if m.get("role") == "assistant") + 1
        if turn >= self.stop_at:
            text = "Thank you, that is everything I needed. ###STOP###"
            self.counts["stop"] += 1
        else:
            text = "Hi, I need some help with my order, please go ahead with what is needed."
            self.counts["ok"] += 1
        return web.json_response({
            "id": "chatcmpl-chaos", "object": "chat.completion", "created": int(time.time()), "model": body.get("model", "sim"),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        })


def _http_ok(url: str, body: dict | None = None, timeout_s: float = 5.0) -> tuple[int, bytes]:
    import urllib.error
    import urllib.request

    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="GET" if body is None else "POST")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError:
        return 0, b""


# -- the faults -------------------------------------------------------------------------------
@dataclasses.dataclass
class ChaosOptions:
    """What the bench runs.

    Attributes:
        config: the YAML config of the job (``--config``).
        tasks: tasks per fault: the first ``tasks`` of the configured split (``env.task_split``,
            or ``env.task_ids``), one episode each.
        overrides: ``key=value`` overrides for every run (after the bench's own defaults, before
            each fault's own keys).
        out_dir: where each fault's run folder and logs go (a new temporary folder if ``None``).
        left_wait_s: seconds to wait for a fault's processes to go.
    """

    config: str = "configs/local.yaml"
    tasks: int = DEFAULT_TASKS
    overrides: list[str] = dataclasses.field(default_factory=list)
    out_dir: Path | None = None
    left_wait_s: float = LEFT_WAIT_S


class _Fault:
    """The state of one fault's scenario: its runs, its helpers, its notes and checks."""

    def __init__(self, name: str, opts: ChaosOptions, root: Path, cfg, ray_tmp: str, task_ids: list[str]):
        self.name = name
        self.task_ids = task_ids
        self.opts = opts
        self.cfg = cfg
        self.dir = root / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.out = self.dir / "run"
        self.watcher = ProcessWatcher()
        self.jobs: list[Job] = []
        self.notes: list[str] = []
        self.checks: dict[str, bool] = {}
        self.extra: dict[str, Any] = {}
        self.cleanups: list[Callable[[], None]] = []
        self.env = dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True", TOKENIZERS_PARALLELISM="false", RAY_TMPDIR=ray_tmp)
        self.env.pop("RAY_ADDRESS", None)
        self.env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), self.env.get("PYTHONPATH", "")) if p)

    def args(self, *fault_overrides: str, resume: bool = False) -> list[str]:
        ids = ",".join(json.dumps(str(i)) for i in self.task_ids)
        a = ["--config", self.opts.config, "--no-progress", f"env.task_ids=[{ids}]", *BASE_OVERRIDES, "pool.ray_address=local",
             f"rollout.output_dir={self.out}", *self.opts.overrides, *fault_overrides]
        return [*a, "--resume"] if resume else a

    def start(self, *fault_overrides: str, resume: bool = False) -> Job:
        job = Job(self.args(*fault_overrides, resume=resume), self.out, self.dir / f"job-{len(self.jobs)}.log", self.env, self.watcher)
        self.jobs.append(job)
        logger.info("%s: started run %d (pid %d)%s", self.name, len(self.jobs), job.pid, " --resume" if resume else "")
        return job

    def finish(self, job: Job, what: str = "run") -> int:
        rc = job.wait()
        logger.info("%s: %s ended with exit code %s after %.1f s", self.name, what, rc, job.wall_s or 0.0)
        if job.timed_out:
            self.notes.append(f"{what} did not end within {JOB_TIMEOUT_S:.0f} s and was killed")
        return rc

    def check(self, name: str, ok: bool, note: str | None = None) -> None:
        self.checks[name] = bool(ok)
        if note is not None:
            self.notes.append(note)

    def check_final(self, job: Job, *, completed: bool = False) -> None:
        """The last run must end ``finished`` with exit code 0 or 3 (0 when ``completed``)."""
        s = job.summary()
        ok_codes = (0,) if completed else OK_EXIT_CODES
        self.check("final_run_finished", job.proc.returncode in ok_codes and s.get("status") == "finished",
                   None if job.proc.returncode in ok_codes and s.get("status") == "finished" else
                   f"last run: exit code {job.proc.returncode}, summary status {s.get('status')!r} ({s.get('reason')}); log {job.log_path}")


def _actor_procs(f: _Fault, job: Job, under: list[int] | None = None) -> list[psutil.Process]:
    """Live ``ray::RolloutWorker`` processes under ``job``'s driver (or under the pids ``under``)."""
    procs = [p for pid in (under if under is not None else [job.pid]) for p in f.watcher.descendants(pid)]
    return [p for p in procs if _cmdline(p).startswith("ray::RolloutWorker") and _alive(p)]


def _started_at(p: psutil.Process) -> float:
    k = _key(p)
    return k[1] if k is not None else 0.0


def fault_actor_sigkill_x3(f: _Fault) -> None:
    # One episode at a time per actor: a restart takes ~20 s on a loaded 2-core machine, and the
    # run must still have work when the third victim is back.
    job = f.start("pool.max_concurrent_episodes=1")
    kills: list[dict] = []
    ok = _episodes_started(job) and len(_actor_procs(f, job)) >= 2
    seen = {p.pid for p in _actor_procs(f, job)}
    while ok and len(kills) < 3 and job.running():
        actors = _actor_procs(f, job)
        if not actors:
            break
        victim = min(actors, key=lambda p: (_started_at(p), p.pid))
        backs = job.log().count(" is back")
        try:
            victim.send_signal(signal.SIGKILL)
        except psutil.Error:
            continue
        kills.append({"pid": victim.pid, "t": round(time.monotonic() - job.t0, 1), "delivered": job.delivered()})
        logger.info("%s: SIGKILLed actor pid %d (kill %d/3, %d delivered)", f.name, victim.pid, len(kills), job.delivered())

        def restarted() -> bool:
            now = {p.pid for p in _actor_procs(f, job)}
            return bool(now - seen) and job.log().count(" is back") > backs

        ok = wait_until(restarted, job, KILL_WAIT_S, poll_s=0.5)
        seen |= {p.pid for p in _actor_procs(f, job)}
        if ok:
            kills[-1]["back_after_s"] = round(time.monotonic() - job.t0 - kills[-1]["t"], 1)
    f.extra["kills"] = kills
    f.check("three_kills", len(kills) == 3, f"{len(kills)} actor kill(s): " + ", ".join(
        f"pid {k['pid']} at {k['t']} s ({k['delivered']} delivered, back after {k.get('back_after_s', '?')} s)" for k in kills))
    f.finish(job)
    f.check_final(job)
    retries = job.log().count("retrying (attempt")
    f.notes.append(f"{retries} episode attempt(s) re-run after their actor died (driver log)")


def _episodes_started(job: Job) -> bool:
    """Wait until the run's actors are up plus :data:`EPISODES_GOING_S` seconds (episodes are
    then in their first turns: an episode's generation takes its first second or two, its
    reward evaluation most of the rest); False if the run ended first."""
    if not wait_until(lambda: "rollout actors ready" in job.log(), job, KILL_WAIT_S, poll_s=0.5):
        return False
    time.sleep(EPISODES_GOING_S)
    return job.running()


def fault_server_kill(f: _Fault) -> None:
    job = f.start("local.num_servers=2")
    ok = _episodes_started(job)
    servers = [p for p in f.watcher.descendants(job.pid) if "rollout.local.server" in _cmdline(p) and _alive(p)]
    killed = None
    if ok and servers:
        victim = min(servers, key=lambda p: p.pid)
        try:
            victim.send_signal(signal.SIGKILL)
            killed = victim.pid
        except psutil.Error:
            pass
    f.check("server_killed", killed is not None,
            f"SIGKILLed server pid {killed} of {len(servers)} at {job.delivered()} delivered" if killed else "no server was killed (the run ended first)")
    f.finish(job)
    f.check_final(job)


def fault_router_restart(f: _Fault) -> None:
    from rollout.local.stack import LocalStack

    local = dataclasses.replace(f.cfg.local, enabled=True)
    stack = LocalStack(local, f.cfg.env.domain, f.cfg.policy.tokenizer, log_dir=f.dir / "bench_stack_logs")
    f.cleanups.append(stack.stop)
    stack.start()
    for pid in stack.pids():
        f.watcher.add(pid)
    job = f.start("local.enabled=false", f"policy.router_url={stack.router_url}")
    # Mid-run, once every actor has had /generate calls succeed: an actor's circuit breaker is
    # armed only then (a router that never answered is not waited for), see BackendBreaker.
    ok = wait_until(lambda: job.delivered() >= ROUTER_KILL_AT, job, KILL_WAIT_S)
    routers = []
    for pid in stack.pids() if ok else []:
        try:
            proc = psutil.Process(pid)
            if "rollout.local.stack router" in _cmdline(proc) and _alive(proc):
                routers.append(pid)
        except psutil.Error:
            pass
    if ok and routers:
        at = job.delivered()
        t0 = time.monotonic()
        pgid = os.getpgid(routers[0])
        if pgid != os.getpgid(0):
            os.killpg(pgid, signal.SIGKILL)  # the wrapper and the router it forked: one process group
        time.sleep(ROUTER_DOWN_S)
        stack.restart_router()
        for pid in stack.pids():
            f.watcher.add(pid)
        f.check("router_restarted", True, f"router (pid {routers[-1]}) SIGKILLed at {at} delivered, back on the same port "
                f"{time.monotonic() - t0:.1f} s later ({job.delivered()} delivered by then)")
    else:
        f.check("router_restarted", False, "the router was not restarted (the run ended first)")
    f.finish(job)
    log = job.log()
    f.notes.append(f"circuit breaker opened {log.count('policy backend unreachable')} time(s), closed "
                   f"{log.count('policy backend is back')} time(s) (actor logs)")
    f.check_final(job)
    st = tally(f.out)["statuses"]
    f.check("all_completed", set(st) == {"completed"}, None if set(st) == {"completed"} else f"not every episode completed: {st}")


def _start_server(f: _Fault, port: int) -> subprocess.Popen:
    c = f.cfg
    cmd = [sys.executable, "-m", "rollout.local.server", "--host", "127.0.0.1", "--port", str(port), "--backend", c.local.backend,
           "--domain", c.env.domain, "--tokenizer", c.policy.tokenizer, "--tiny-config", json.dumps(dataclasses.asdict(c.local.tiny)),
           "--weight-version", str(c.local.weight_version), "--log-level", "WARNING", "--parent-pid", str(os.getpid())]
    fh = open(f.dir / "server.log", "w")  # noqa: SIM115 (closed with the fault)
    proc = subprocess.Popen(cmd, cwd=ROOT, env=f.env, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    f.cleanups.append(fh.close)
    f.cleanups.append(lambda: _stop_proc(proc))
    f.watcher.add(proc.pid)
    return proc


def _start_router(f: _Fault, worker_url: str) -> tuple[subprocess.Popen, str]:
    from rollout.local.stack import free_port
    from rollout.tokenizer import resolve_tokenizer_path

    port = free_port()
    args = ["--host", "127.0.0.1", "--port", str(port), "--worker-urls", worker_url, "--policy", "cache_aware",
            "--tokenizer-path", resolve_tokenizer_path(f.cfg.policy.tokenizer), "--prometheus-host", "127.0.0.1",
            "--prometheus-port", str(free_port()), "--log-level", "warn", "--worker-startup-timeout-secs", "120",
            "--worker-startup-check-interval", "1", "--disable-retries", "--disable-circuit-breaker"]
    fh = open(f.dir / "router.log", "w")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "rollout.local.stack", "router", "--parent-pid", str(os.getpid()), "--", *args],
                            cwd=ROOT, env=f.env, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    f.cleanups.append(fh.close)
    f.cleanups.append(lambda: _stop_proc(proc))
    f.watcher.add(proc.pid)
    return proc, f"http://127.0.0.1:{port}"


def _stop_proc(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
    """SIGTERM ``proc``'s process group, SIGKILL it after ``grace_s`` seconds."""
    if proc.poll() is None:
        _kill_tree(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            _kill_tree(proc.pid)
            proc.wait(10)


def _wait_http(f: _Fault, what: str, cond: Callable[[], bool], procs: list[subprocess.Popen], timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
            raise RuntimeError(f"{f.name}: {what} did not come up (logs in {f.dir})")
        time.sleep(0.3)


def fault_faulty_server(f: _Fault) -> None:
    from rollout.local.stack import free_port

    port = free_port()
    server = _start_server(f, port)
    server_url = f"http://127.0.0.1:{port}"
    _wait_http(f, "the server", lambda: _http_ok(server_url + "/health")[0] == 200, [server])
    proxy = FaultInjectingProxy(server_url, FAULT_RATES, FAULTY_HANG_S).start()
    f.cleanups.append(proxy.stop)
    router, router_url = _start_router(f, proxy.url)

    def router_ready() -> bool:
        st, body = _http_ok(router_url + "/workers")
        if st != 200 or not any(w.get("is_healthy") for w in json.loads(body).get("workers", [])):
            return False
        st, body = _http_ok(router_url + "/generate", {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 1}}, 30)
        return st == 200

    _wait_http(f, "the router", router_ready, [server, router])
    job = f.start("local.enabled=false", f"policy.router_url={router_url}", f"policy.request_timeout_s={FAULTY_REQUEST_TIMEOUT_S:g}")
    f.finish(job)
    f.check_final(job)
    counts = {k: proxy.counts.get(k, 0) for k in (*FAULT_RATES, "forwarded")}
    f.extra["injected"] = counts
    f.notes.append("injected into /generate: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    f.check("every_fault_injected", all(counts[k] > 0 for k in FAULT_RATES),
            None if all(counts[k] > 0 for k in FAULT_RATES) else "not every kind of fault was injected (raise --tasks)")


def fault_user_sim_429_500(f: _Fault) -> None:
    user = FakeUserLLM().start()
    f.cleanups.append(user.stop)
    job = f.start("env.user.kind=llm", f"env.user.base_url={user.url}/v1", "env.user.model=sim", "env.user.retry_backoff_s=0.2")
    f.finish(job)
    f.check_final(job)
    f.extra["user_calls"] = dict(user.counts)
    f.notes.append("user simulator calls: " + ", ".join(f"{k} {v}" for k, v in sorted(user.counts.items())))
    f.check("faults_injected", user.counts.get("429", 0) > 0 and user.counts.get("500", 0) > 0)
    st = tally(f.out)["statuses"]
    bad = {k: v for k, v in st.items() if k not in ("completed", "user_error")}
    f.check("completed_or_user_error", not bad, None if not bad else f"statuses other than completed / user_error: {bad}")


def _driver_stop_resume(f: _Fault, sig: int) -> None:
    job = f.start()
    target = max(2, f.opts.tasks // 3)
    ok = wait_until(lambda: job.delivered() >= target, job, KILL_WAIT_S)
    name = signal.Signals(sig).name
    if not ok or not job.running():
        f.check("driver_stopped", False, f"the run ended before {target} episodes were delivered; no {name} sent")
        f.finish(job)
        return
    at = job.delivered()
    f.watcher.scan()
    stopped = list(f.watcher.seen)
    t0 = time.monotonic()
    os.kill(job.pid, sig)
    try:
        job.proc.wait(60)
    except subprocess.TimeoutExpired:
        pass
    took = time.monotonic() - t0
    rc = f.finish(job, f"{name}ed run")
    f.extra["stop"] = {"signal": name, "delivered_at_signal": at, "exit_s": round(took, 2), "rc": rc}
    if sig == signal.SIGTERM:
        s = job.summary()
        f.check("exit_143_within_10s", rc == 143 and took < 10.0 and s.get("status") == "interrupted",
                f"SIGTERM at {at} delivered: exit code {rc} after {took:.1f} s, summary status {s.get('status')!r} "
                f"({s.get('undelivered')} undelivered)")
    else:
        state = json.loads((f.out / "run.json").read_text()) if (f.out / "run.json").is_file() else {}
        f.check("driver_killed", rc == -signal.SIGKILL, f"SIGKILL at {at} delivered ({job.delivered()} journaled); "
                f"run.json status {state.get('status')!r}")
    again = f.start(resume=True)
    f.finish(again, "resumed run")
    f.watcher.scan()
    gone = f.watcher.gone_after(stopped, t0)
    f.notes.append(f"the {len(stopped)} processes of the {name}ed run were all gone {gone:.1f} s after the {name}" if gone is not None
                   else f"some of the {len(stopped)} processes of the {name}ed run were still alive when the resumed run ended")
    f.check_final(again)
    s = again.summary()
    f.check("resumed_once", s.get("resumed_sessions") == 1, None if s.get("resumed_sessions") == 1 else f"resumed_sessions {s.get('resumed_sessions')}")


def fault_driver_sigkill_resume(f: _Fault) -> None:
    _driver_stop_resume(f, signal.SIGKILL)


def fault_driver_sigterm_resume(f: _Fault) -> None:
    _driver_stop_resume(f, signal.SIGTERM)


class _ClusterHelper:
    """``python -m rollout.chaos cluster``: a ``ray.cluster_utils.Cluster`` in a subprocess (its
    own session), driven through stdin / stdout, one JSON object a line."""

    def __init__(self, f: _Fault, workers: int = 2, cpus: float = 1.0):
        self._fh = open(f.dir / "cluster.log", "w")  # noqa: SIM115
        env = dict(f.env, RAY_AUTH_MODE="disabled")
        self.proc = subprocess.Popen([sys.executable, "-m", "rollout.chaos", "cluster", "--workers", str(workers), "--cpus", str(cpus)],
                                     cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._fh, text=True,
                                     start_new_session=True)
        f.watcher.add(self.proc.pid)
        self.info = self._read(180.0)

    def _read(self, timeout_s: float) -> dict:
        out: list[str] = []
        t = threading.Thread(target=lambda: out.append(self.proc.stdout.readline()), daemon=True)
        t.start()
        t.join(timeout_s)
        if not out or not out[0]:
            raise RuntimeError(f"the cluster helper did not answer within {timeout_s:.0f} s (log {self._fh.name})")
        return json.loads(out[0])

    def remove(self, raylet_pid: int) -> dict:
        self.proc.stdin.write(json.dumps({"remove": raylet_pid}) + "\n")
        self.proc.stdin.flush()
        return self._read(120.0)

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"stop": True}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(60)
            except (OSError, subprocess.TimeoutExpired):
                _stop_proc(self.proc)
        self._fh.close()


def fault_node_removal(f: _Fault) -> None:
    helper = _ClusterHelper(f)
    f.cleanups.append(helper.stop)
    raylets = {n["raylet_pid"]: n for n in helper.info["workers"]}
    f.env["RAY_AUTH_MODE"] = "disabled"
    job = f.start(f"pool.ray_address={helper.info['address']}")
    # the actors run under a worker node's raylet, not under the driver: look for them there
    ok = wait_until(lambda: job.delivered() >= 2 and len(_actor_procs(f, job, list(raylets))) >= 2, job, KILL_WAIT_S)
    removed = None
    if ok:
        for p in sorted(_actor_procs(f, job, list(raylets)), key=lambda p: p.pid):
            try:
                node = next((a.pid for a in p.parents() if a.pid in raylets), None)
            except psutil.Error:
                continue
            if node is not None:
                at = job.delivered()
                r = helper.remove(node)
                removed = {"raylet_pid": node, "actor_pid": p.pid, "delivered": at, **r}
                logger.info("%s: removed node %s (raylet pid %d, actor pid %d) at %d delivered", f.name, r.get("node_id"), node, p.pid, at)
                break
    f.extra["removed"] = removed
    f.check("node_removed", removed is not None, f"removed worker node {removed['node_id'][:12]} (actor pid {removed['actor_pid']}) at "
            f"{removed['delivered']} delivered in {removed.get('s')} s" if removed else "no node was removed (the run ended first)")
    f.finish(job)
    f.check_final(job)
    helper.stop()


_SCENARIOS: dict[str, Callable[[_Fault], None]] = {
    "actor_sigkill_x3": fault_actor_sigkill_x3, "server_kill": fault_server_kill, "router_restart": fault_router_restart,
    "faulty_server": fault_faulty_server, "user_sim_429_500": fault_user_sim_429_500,
    "driver_sigkill_resume": fault_driver_sigkill_resume, "driver_sigterm_resume": fault_driver_sigterm_resume,
    "node_removal": fault_node_removal,
}


def run_fault(name: str, opts: ChaosOptions, root: Path, cfg, ray_tmp: str, task_ids: list[str]) -> dict[str, Any]:
    """Run one fault's scenario on ``task_ids`` and report it (a row of the table; see the module
    docstring)."""
    f = _Fault(name, opts, root, cfg, ray_tmp, task_ids)
    t0 = time.monotonic()
    error = None
    try:
        _SCENARIOS[name](f)
    except Exception as e:  # noqa: BLE001 (reported in the row: the bench goes on with the next fault)
        error = f"{type(e).__name__}: {e}"
        logger.exception("%s: the scenario failed", name)
    finally:
        for job in f.jobs:
            if job.running():
                _kill_tree(job.pid)
                job.wait(30)
        wall = time.monotonic() - t0
        for fn in reversed(f.cleanups):
            try:
                fn()
            except Exception as e:  # noqa: BLE001
                f.notes.append(f"clean-up failed: {e!r}")
        f.watcher.scan()
        left, waited = wait_gone(f.watcher, opts.left_wait_s)
        f.watcher.close()
    left_desc = []
    for p in left:
        left_desc.append(f"{p.pid} {_cmdline(p)[:100]}")
        try:
            p.kill()  # ours: recorded as a descendant of this fault's run
        except psutil.Error:
            pass
    counts = tally(f.out)
    notes = list(f.notes) + counts.pop("notes")
    if counts["reruns"]:
        notes.append(f"{counts['reruns']} group member(s) re-run under a new id (counted as submitted)")
    if counts["unexpected_ids"]:
        notes.append(f"delivered ids that were never submitted: {counts['unexpected_ids']}")
    if counts["lost_ids"]:
        notes.append(f"lost: {counts['lost_ids']}")
    if counts["duplicated_ids"]:
        notes.append(f"duplicated: {counts['duplicated_ids']}")
    if error:
        notes.append(f"scenario error: {error}")
    notes.append(f"processes recorded {len(f.watcher.seen)}, all gone {waited:.1f} s after the last run" if not left else
                 f"{len(left)} process(es) still alive {waited:.0f} s after the last run (killed now): {left_desc[:5]}")
    ok = (error is None and counts["lost"] == 0 and counts["duplicated"] == 0 and not left and counts["submitted"] > 0
          and not counts["unexpected_ids"] and all(f.checks.values()))
    row = {"fault": name, "ok": ok, "submitted": counts["submitted"], "delivered": counts["delivered"], "lost": counts["lost"],
           "duplicated": counts["duplicated"], "left_behind": len(left), "statuses": counts["statuses"], "wall_s": round(wall, 1),
           "left_wait_s": round(waited, 1), "checks": f.checks, "notes": notes, "left_processes": left_desc,
           "runs": [j.record() for j in f.jobs], "dir": str(f.dir), **f.extra}
    logger.info("%s: %s", name, "ok" if ok else "FAILED")
    return row


def run_chaos(opts: ChaosOptions, faults: list[str], on_row: Callable[[list[dict[str, Any]]], None] | None = None) -> list[dict[str, Any]]:
    """Run each fault in turn (see the module docstring); returns one row per fault.

    Args:
        on_row: called with the rows so far after each fault (e.g. to write them out).

    Raises:
        ValueError: an unknown fault name, ``opts.tasks`` < 1, or more tasks than the configured
            split (``env.task_split`` / ``env.task_ids``) holds.
    """
    from rollout.config import load_config
    from rollout.env.tau2_env import Tau2Domain

    bad = [x for x in faults if x not in _SCENARIOS]
    if bad:
        raise ValueError(f"unknown fault(s) {bad}; known: {', '.join(FAULTS)}")
    if opts.tasks < 1:
        raise ValueError("--tasks must be >= 1")
    cfg = load_config(opts.config, [*BASE_OVERRIDES, *opts.overrides])
    task_ids = list(Tau2Domain(cfg.env.domain, tau2_log_level=cfg.logging.tau2_level).task_ids(cfg.env.task_split, cfg.env.task_ids))
    if len(task_ids) < opts.tasks:
        raise ValueError(f"--tasks {opts.tasks}: the {cfg.env.domain} split {cfg.env.task_split!r} holds {len(task_ids)} tasks")
    task_ids = task_ids[: opts.tasks]
    root = Path(opts.out_dir) if opts.out_dir else Path(tempfile.mkdtemp(prefix="rollout-chaos-"))
    root.mkdir(parents=True, exist_ok=True)
    ray_tmp = tempfile.mkdtemp(prefix="rc", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    logger.info("chaos bench: %d fault(s), %d tasks each, folders in %s", len(faults), opts.tasks, root)
    rows = []
    try:
        for name in faults:
            rows.append(run_fault(name, opts, root, cfg, ray_tmp, task_ids))
            if on_row is not None:
                on_row(rows)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    """The bench's table: one row per fault, then each fault's notes."""
    head = ("fault", "ok", "submitted", "delivered", "lost", "dup", "left", "wall s", "statuses")
    body = []
    for r in rows:
        st = " ".join(f"{k}={v}" for k, v in r.get("statuses", {}).items()) or "-"
        body.append((r["fault"], "yes" if r.get("ok") else ("skip" if r.get("skipped") else "NO"),
                     *(str(r.get(k, "-")) for k in ("submitted", "delivered", "lost", "duplicated", "left_behind")),
                     f"{r['wall_s']:.0f}" if isinstance(r.get("wall_s"), (int, float)) else "-", st))
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(head)]
    fmt = "  ".join(f"{{:{'<' if i in (0, 8) else '>'}{w}}}" for i, w in enumerate(widths))
    lines = [fmt.format(*head), "  ".join("-" * w for w in widths), *(fmt.format(*b) for b in body), "", "notes:"]
    for r in rows:
        lines.append(f"  {r['fault']}: " + "; ".join(r.get("notes", [])))
    return "\n".join(lines)


# -- the cluster helper (the only place here that imports Ray) ---------------------------------
def _cluster_main(argv: list[str]) -> int:
    """``python -m rollout.chaos cluster [--workers 2] [--cpus 1]``: start a Ray
    ``Cluster`` (a head without CPUs, ``--workers`` worker nodes with ``--cpus`` CPUs each), print
    ``{"address", "head_raylet_pid", "workers": [{"node_id", "raylet_pid"}]}`` as one JSON line,
    then obey JSON lines on stdin: ``{"remove": raylet_pid}`` removes that worker node (answering
    ``{"node_id", "s"}``, seconds), ``{"stop": true}`` or end of input shuts the cluster down."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m rollout.chaos cluster")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--cpus", type=float, default=1.0)
    args = p.parse_args(argv)
    from ray.cluster_utils import Cluster

    from rollout.fate import set_parent_death_signal

    set_parent_death_signal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally: shut the cluster down
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    try:
        nodes = [cluster.add_node(num_cpus=args.cpus) for _ in range(args.workers)]
        cluster.wait_for_nodes()

        def raylet_pid(node) -> int:
            from ray._private import ray_constants

            return node.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process.pid

        by_pid = {raylet_pid(n): n for n in nodes}
        print(json.dumps({"address": cluster.address, "head_raylet_pid": raylet_pid(cluster.head_node),
                          "workers": [{"node_id": n.node_id, "raylet_pid": pid} for pid, n in by_pid.items()]}), flush=True)
        for line in sys.stdin:
            cmd = json.loads(line)
            if cmd.get("stop"):
                break
            node = by_pid.pop(int(cmd["remove"]))
            t0 = time.monotonic()
            cluster.remove_node(node, allow_graceful=False)
            print(json.dumps({"node_id": node.node_id, "s": round(time.monotonic() - t0, 2)}), flush=True)
    finally:
        cluster.shutdown()
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["cluster"]:
        sys.exit(_cluster_main(sys.argv[2:]))
    sys.exit("usage: python -m rollout.chaos cluster [--workers N] [--cpus C]  (the bench: python -m rollout.bench chaos)")
