"""The rollout worker: a plain class around :func:`rollout.core.episode.run_episode`.

It owns what one actor owns (docs/design.md invariant 5): the tokenizer and chat template (loaded and
probed once), the benchmark's domain (``env.benchmark``, loaded through the benchmark registry,
:func:`rollout.core.environment.load_benchmark`) and its sandbox, a thread pool for the
environment's blocking calls and one aiohttp session. :mod:`rollout.core.pool` turns it into a Ray
actor in one place; tests use it directly.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import logging
import math
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import aiohttp

from rollout.core.config import AdaptiveConcurrencyConfig, EnvConfig, LoggingConfig, PolicyConfig
from rollout.core.environment import Benchmark, UserSimulatorError, load_benchmark
from rollout.core.episode import run_episode
from rollout.core.eventloop import loop_kind
from rollout.core.formats import TemplateError, choose_chat_format, get_chat_format
from rollout.core.logs import setup_logging
from rollout.core.policy import BackendBreaker, GenerationGate, RouterAdmin, SGLangClient, api_key_from_env
from rollout.core.policy.kvgate import KVGate
from rollout.core.records import EpisodeSpec, EpisodeStatus, InteractionResult
from rollout.core.settings import EpisodeSettings
from rollout.core.telemetry import NULL_RECORDER, Recorder
from rollout.core.telemetry import registry as metrics_registry
from rollout.core.telemetry.probes import EnvironmentMetrics, MeteredEnvironment
from rollout.core.tokenizer import load_tokenizer

logger = logging.getLogger(__name__)


class LoopLagProbe:
    """Event-loop lag: how late the loop wakes a coroutine that asked to sleep.

    A probe coroutine sleeps ``interval_s`` in a loop and records, each time, how much later than
    asked it woke (``loop.time()`` after the sleep, minus the time before it, minus
    ``interval_s``; never below 0). Whatever keeps the loop from running callbacks (a blocking
    call on the loop, CPU-bound callbacks, a worker thread holding the GIL) shows up as lag. The
    floor is about 1 ms: the selector's timeout has millisecond resolution.

    On Linux it also reads the loop thread's scheduler statistics (``/proc/self/task/<tid>/
    schedstat``: nanoseconds on a CPU, nanoseconds runnable but waiting for one), so
    :meth:`stats` can tell the loop's own CPU time from time lost waiting for a core that other
    threads or processes hold.

    Args:
        interval_s: the probe's sleep, seconds (> 0).
        max_samples: samples kept; the oldest are dropped beyond it (about 17 minutes at 10 ms).
        on_sample: called on the loop with each sample (seconds of lag), e.g. a metric's
            :meth:`~rollout.core.telemetry.Instrument.record`; ``None``: nothing.

    Raises:
        ValueError: ``interval_s <= 0`` or ``max_samples < 1``.
    """

    def __init__(self, interval_s: float = 0.01, max_samples: int = 100_000, on_sample: Callable[[float], None] | None = None) -> None:
        if interval_s <= 0 or max_samples < 1:
            raise ValueError(f"LoopLagProbe needs interval_s > 0 and max_samples >= 1, got {interval_s}, {max_samples}")
        self.interval_s = float(interval_s)
        self._samples: collections.deque[float] = collections.deque(maxlen=max_samples)
        self._on_sample = on_sample
        self._task: asyncio.Task | None = None
        self._tid: int | None = None  # the loop thread's native id, once the probe runs
        self._sched0: tuple[float, float, float] | None = None  # (monotonic s, on-CPU s, waiting s) at start / reset

    @property
    def running(self) -> bool:
        """Whether the probe coroutine is running."""
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        """Start the probe on the running event loop (idempotent).

        Raises:
            RuntimeError: no running event loop in this thread.
        """
        if not self.running:
            self._task = asyncio.get_running_loop().create_task(self._probe(), name="loop-lag-probe")

    async def _probe(self) -> None:
        loop = asyncio.get_running_loop()
        self._tid = threading.get_native_id()
        self._sched0 = self._sched_now()
        while True:
            t0 = loop.time()
            await asyncio.sleep(self.interval_s)
            lag = max(0.0, loop.time() - t0 - self.interval_s)
            self._samples.append(lag)
            if self._on_sample is not None:
                self._on_sample(lag)

    def stats(self, reset: bool = False) -> dict[str, Any]:
        """Lag percentiles over the samples since the start or the last reset.

        Args:
            reset: forget the samples after reading them (the next call covers what follows).

        Returns:
            ``{"samples": int, "interval_ms": float, "p50_ms", "p99_ms", "max_ms", "mean_ms",
            "loop_cpu_share", "loop_wait_share"}``: milliseconds (nearest-rank percentiles; the
            four figures are None without samples), then the loop thread's seconds on a CPU and
            seconds runnable but waiting for a CPU, each per second of the same span (None where
            the kernel does not say: not Linux, or no ``schedstat``). A wait share that is large
            next to the CPU share means the lag comes from a busy machine, not from the loop's
            own work.
        """
        data = sorted(self._samples)
        now = self._sched_now()
        cpu_share = wait_share = None
        if now is not None and self._sched0 is not None and now[0] > self._sched0[0]:
            span = now[0] - self._sched0[0]
            cpu_share = round((now[1] - self._sched0[1]) / span, 4)
            wait_share = round((now[2] - self._sched0[2]) / span, 4)
        if reset:
            self._samples.clear()
            self._sched0 = now
        n = len(data)

        def pct(q: float) -> float | None:
            if not n:
                return None
            rank = math.ceil(round(q * n, 9))  # nearest rank (rounded: 0.99 * 100 is 99.00000000000001)
            return round(1e3 * data[min(n, max(1, rank)) - 1], 3)

        return {
            "samples": n,
            "interval_ms": round(1e3 * self.interval_s, 3),
            "p50_ms": pct(0.50),
            "p99_ms": pct(0.99),
            "max_ms": round(1e3 * data[-1], 3) if n else None,
            "mean_ms": round(1e3 * sum(data) / n, 3) if n else None,
            "loop_cpu_share": cpu_share,
            "loop_wait_share": wait_share,
        }

    def _sched_now(self) -> tuple[float, float, float] | None:
        """``(time.monotonic(), seconds on a CPU, seconds waiting for one)`` of the loop thread,
        or None (the probe has not run yet, or no ``schedstat``)."""
        if self._tid is None:
            return None
        try:
            with open(f"/proc/self/task/{self._tid}/schedstat") as f:
                on_cpu_ns, waiting_ns, _ = f.read().split()
        except (OSError, ValueError):
            return None
        return time.monotonic(), int(on_cpu_ns) / 1e9, int(waiting_ns) / 1e9

    def stop(self) -> None:
        """Cancel the probe coroutine (idempotent); the samples are kept."""
        if self._task is not None:
            self._task.cancel()
            self._task = None



def chat_format_for(policy_cfg: PolicyConfig, tokenizer: Any) -> str:
    """The chat format ``policy.chat_format`` names for ``tokenizer`` (``auto``: detected, and
    logged): :func:`rollout.core.formats.choose_chat_format`.

    Raises:
        TemplateError: ``auto`` recognises no family, or the name is not registered (the message
            names ``policy.chat_format`` and the registered families).
    """
    return choose_chat_format(policy_cfg.chat_format, tokenizer, policy_cfg.tokenizer)


class RolloutWorker:
    """Runs episodes of one benchmark's domain (``env.benchmark``, ``env.domain``) against one router.

    Args:
        policy_cfg: the ``policy`` section (``router_url`` resolved).
        env_cfg: the ``env`` section (``user.base_url`` resolved for the llm user).
        logging_cfg: the ``logging`` section.
        max_concurrent_episodes: episodes run at once (the rest wait).
        partial_rollout: ``rollout.partial_rollout``, what a turn interrupted by a weight update
            becomes (``continue`` | ``restart_turn`` | ``drop``).
        own_process: the worker owns its process (a Ray actor: the pool sets it): once loaded,
            it calls :func:`tune_actor_process`, which changes process-wide state (``gc.freeze``,
            the GIL switch interval), so a worker built inside someone else's process leaves it
            False.
        gil_switch_interval_ms: with ``own_process``, the process's GIL switch interval
            (``pool.gil_switch_interval_ms``).
        recorder: where the actor's metrics go (``None``: nowhere): episodes started and
            running, the ``/generate`` calls (:class:`~rollout.core.policy.SGLangClient`), the
            user simulator's turns and the tool calls
            (:class:`~rollout.core.telemetry.probes.MeteredEnvironment`), and the event loop's lag
            (a second :class:`LoopLagProbe`, 50 ms sleeps, started with the first episode). The
            pool gives each actor a ``RayRecorder`` (docs/observability.md).
        adaptive_concurrency: ``pool.adaptive_concurrency``; when enabled, one
            :class:`~rollout.core.policy.kvgate.KVGate` per worker (one poller of the workers'
            ``/metrics``) holds new episodes and new turns while the workers' KV usage is high;
            an episode that waited gets ``metadata["kv_held_s"]``. ``None`` or disabled: no gate.
        kv_actor: ``(this actor's index, pool.num_actors)`` (the pool sets it): the KV gate's
            part of the servers' KV (``1 / num_actors`` of it, or under ``placement=gate`` its own
            workers: :func:`~rollout.core.policy.kvslots.my_workers`).

    The weight-update cycle: :meth:`pause_generation` closes the worker's
    :class:`~rollout.core.policy.GenerationGate` (new ``/generate`` calls wait; a call the servers
    abort meanwhile is an interruption, see ``partial_rollout``), :meth:`resume_generation` opens
    it. :meth:`cancel` ends chosen episodes at once as ``cancelled``. :meth:`loop_lag` reads
    the actor's event-loop lag (a :class:`LoopLagProbe`, started by its first call).

    Raises:
        TemplateError: the tokenizer's chat template cannot give exact delta tokenization.
    """

    def __init__(self, policy_cfg: PolicyConfig, env_cfg: EnvConfig, logging_cfg: LoggingConfig | None = None, max_concurrent_episodes: int = 8,
                 partial_rollout: str = "continue", own_process: bool = False, gil_switch_interval_ms: float = 1.0,
                 recorder: Recorder | None = None, adaptive_concurrency: AdaptiveConcurrencyConfig | None = None,
                 kv_actor: tuple[int, int] = (0, 1)):
        logging_cfg = logging_cfg or LoggingConfig()
        setup_logging(logging_cfg)
        self.policy_cfg = policy_cfg
        self.env_cfg = env_cfg
        api_key_from_env(policy_cfg.api_key_env)  # a missing key fails the actor's start, not every episode
        # one circuit breaker per actor: an outage seen by one episode holds the others too
        self.breaker = BackendBreaker(policy_cfg.backend_outage_timeout_s)
        if _router_answers(policy_cfg):  # seen up: an outage from the first call on is waited for
            self.breaker.arm()
        self.domain: Benchmark = load_benchmark(env_cfg, log_level=logging_cfg.tau2_level)  # env.benchmark's, through the registry
        self.tokenizer = load_tokenizer(policy_cfg.tokenizer)
        kwargs = {} if policy_cfg.enable_thinking is None else {"enable_thinking": policy_cfg.enable_thinking}
        self.chat_format = chat_format_for(policy_cfg, self.tokenizer)
        self.chat = get_chat_format(self.chat_format)(self.tokenizer, tools=self.domain.tool_schemas, template_kwargs=kwargs)
        self.template_report = self.chat.probe()
        if not self.template_report.ok:
            raise TemplateError(
                f"tokenizer {policy_cfg.tokenizer!r}: exact delta tokenization is impossible with chat format {self.chat_format}:\n"
                + self.template_report.summary()
            )
        logger.debug("chat format %s probe for %s:\n%s", self.chat_format, policy_cfg.tokenizer, self.template_report.summary())
        self.settings = EpisodeSettings.from_policy(policy_cfg, max_steps=env_cfg.max_steps, system_prompt=self.domain.system_prompt,
                                                    tool_names=self.domain.tool_names, partial_rollout=partial_rollout)
        self.max_concurrent_episodes = max_concurrent_episodes
        self.executor = ThreadPoolExecutor(max_workers=max(4, max_concurrent_episodes), thread_name_prefix="tau2")  # the environment's blocking calls
        self.sandbox = self.domain.new_actor_sandbox(env_cfg, log_level=logging_cfg.tau2_level)  # None: the benchmark needs none
        self._semaphore: asyncio.Semaphore | None = None
        self._session: aiohttp.ClientSession | None = None
        self._client: SGLangClient | None = None
        self.gate = GenerationGate()
        self.adaptive_concurrency = adaptive_concurrency
        self.kv_actor = kv_actor
        self.kv_gate: KVGate | None = None
        self._running: dict[str, asyncio.Task] = {}
        self._cancelled: set[str] = set()
        self.episodes_run = 0
        self.lag_probe = LoopLagProbe()
        self.recorder = recorder if recorder is not None else NULL_RECORDER
        self._env_metrics = EnvironmentMetrics(self.recorder)
        self._started = self.recorder.bind(metrics_registry.EPISODES_STARTED)
        self._running_gauge = self.recorder.bind(metrics_registry.EPISODES_RUNNING)
        lag = self.recorder.bind(metrics_registry.LOOP_LAG)
        self._metrics_probe = LoopLagProbe(interval_s=0.05, max_samples=1, on_sample=lag.record) if self.recorder.enabled else None
        self.process_tuning = tune_actor_process(gil_switch_interval_ms / 1e3) if own_process else None

    def _ensure_session(self) -> SGLangClient:
        if self._session is None or self._session.closed:
            conn = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
            self._session = aiohttp.ClientSession(connector=conn)
            if self.kv_gate is not None:
                self.kv_gate.close()
            self.kv_gate = None
            ac = self.adaptive_concurrency
            if ac is not None and ac.enabled:
                key = api_key_from_env(self.policy_cfg.api_key_env)
                lister = RouterAdmin(str(self.policy_cfg.router_url), self._session, timeout_s=ac.timeout_s, api_key=key)
                self.kv_gate = KVGate(ac, self._session, list_workers=lister.worker_health, api_key=key, actor=self.kv_actor[0], actors=self.kv_actor[1])
            self._client = SGLangClient(self.policy_cfg, self._session, gate=self.gate, breaker=self.breaker, recorder=self.recorder,
                                        kv_gate=self.kv_gate)
            self._semaphore = asyncio.Semaphore(self.max_concurrent_episodes)
        assert self._client is not None
        return self._client

    async def pause_generation(self) -> dict[str, int]:
        """Close the gate: ``/generate`` calls wait until :meth:`resume_generation`.

        Returns:
            ``{"episodes_running": episodes running here, "generate_calls_out": /generate calls
            under way when the gate closed (sent and not answered)}``: the calls that a server
            pause which follows interrupts.
        """
        self.gate.close()
        out = len(self._client.inflight) if self._client is not None else 0
        return {"episodes_running": len(self._running), "generate_calls_out": out}

    async def resume_generation(self) -> int:
        """Open the gate: held calls go on. Returns the number of episodes running here."""
        self.gate.open()
        return len(self._running)

    async def cancel(self, episode_ids: list[str]) -> int:
        """End the given episodes now, as ``cancelled`` (their :meth:`run` returns that), and
        abort their ``/generate`` calls on the servers. Episodes not running here (not started
        yet, or already finished) are cancelled when they start, or ignored. Returns how many
        were running."""
        client = self._ensure_session()
        ids = set(episode_ids)
        self._cancelled |= ids
        hit = [eid for eid in ids if eid in self._running]
        rids = [client.inflight[eid] for eid in hit if eid in client.inflight]
        for eid in hit:
            self._running[eid].cancel()
        if rids:
            await asyncio.gather(*[client.admin.abort(rid) for rid in rids])
        return len(hit)

    async def run(self, spec: EpisodeSpec, timeout_s: float | None = None) -> InteractionResult:
        """Run one episode; never raises (every failure is a typed status).

        Args:
            spec: the episode.
            timeout_s: bound on the whole episode (``None``: no bound beyond the per-step ones).
        """
        client = self._ensure_session()
        assert self._semaphore is not None
        if self._metrics_probe is not None:
            self._metrics_probe.start()
        eid = spec.episode_id
        held = 0.0  # seconds its calls waited at the KV gate
        async with self._semaphore:
            if eid in self._cancelled:
                result = _cancelled(spec)
            else:
                client.groups[eid] = spec.group_id  # policy.routing=group: the key its calls send
                task = asyncio.ensure_future(self._run(spec, client, timeout_s))
                self._running[eid] = task
                self._started.record(1)
                self._running_gauge.record(len(self._running))
                try:
                    result = await asyncio.shield(task)
                except asyncio.CancelledError:
                    if eid not in self._cancelled:  # the caller went away (e.g. Ray cancelled run)
                        task.cancel()
                        raise
                    result = _cancelled(spec)
                finally:
                    self._running.pop(eid, None)
                    client.groups.pop(eid, None)
                    held = client.kv_held_s.pop(eid, 0.0)
                    self._running_gauge.record(len(self._running))
        self._cancelled.discard(eid)
        if held:
            result.metadata["kv_held_s"] = round(held, 3)
        self.episodes_run += 1
        result.metadata.setdefault("worker_pid", os.getpid())
        return result

    async def _run(self, spec: EpisodeSpec, client: SGLangClient, timeout_s: float | None) -> InteractionResult:
        try:
            try:  # an unknown task id raises KeyError: the crash net below
                env = self.domain.new_episode(self.env_cfg, spec.task_id, seed=spec.seed, executor=self.executor, sandbox=self.sandbox)
            except UserSimulatorError as e:  # set-up failure (e.g. its API key is missing)
                self._env_metrics.user_errors.record(1)
                return InteractionResult(spec, EpisodeStatus.USER_ERROR, 0.0, None, metadata={"termination_reason": "user_setup", "error": str(e)})
            if self.recorder.enabled:
                env = MeteredEnvironment(env, self._env_metrics)
            coro = run_episode(spec, env, client, self.chat, self.settings)
            return await (asyncio.wait_for(coro, timeout_s) if timeout_s else coro)
        except asyncio.TimeoutError:
            return InteractionResult(spec, EpisodeStatus.TIMEOUT, 0.0, None, metadata={"termination_reason": "episode_timeout", "error": f"episode ran over {timeout_s}s (pool.episode_timeout_s)"})
        except Exception as e:  # anything else is a bug, but must not take the actor down
            logger.exception("episode %s crashed", spec.episode_id)
            return InteractionResult(spec, EpisodeStatus.ENV_ERROR, 0.0, None, metadata={"termination_reason": "crash", "error": repr(e)})

    async def loop_lag(self, reset: bool = False) -> dict[str, Any]:
        """This worker's event-loop lag (see :class:`LoopLagProbe`; 10 ms probe sleeps). The
        probe starts at the first call, so that call returns no samples; call it with
        ``reset=True`` to start a measured window, and again at its end.

        Args:
            reset: forget the samples after reading them.

        Returns:
            :meth:`LoopLagProbe.stats` plus ``"pid"`` and ``"event_loop"`` (``"uvloop"`` or
            ``"asyncio"``, :func:`rollout.core.eventloop.loop_kind`).
        """
        self.lag_probe.start()
        return {**self.lag_probe.stats(reset=reset), "pid": os.getpid(), "event_loop": loop_kind(asyncio.get_running_loop())}

    async def event_loop(self) -> str:
        """The kind of event loop this worker's coroutines run on: ``"uvloop"`` or ``"asyncio"``
        (in a Ray actor, the loop Ray built; see :mod:`rollout.core.eventloop`)."""
        return loop_kind(asyncio.get_running_loop())

    def arm_breaker(self) -> dict[str, Any]:
        """Record that the backend was seen answering (a check the driver made once it was up,
        e.g. the preflight's router check, for an actor that started before the router answered):
        an outage from the very first call is then waited for, as when the actor saw the router
        itself at start (:meth:`rollout.core.policy.BackendBreaker.arm`). Returns the breaker's stats."""
        self.breaker.arm()
        return self.breaker.stats()

    def info(self) -> dict[str, Any]:
        """Identity and state of this worker (for logs and the pool)."""
        return {
            "pid": os.getpid(),
            "domain": self.domain.name,
            "tokenizer": self.policy_cfg.tokenizer,
            "episodes_run": self.episodes_run,
            "template_probe": self.template_report.summary(),
            "sandbox_kills": self.sandbox.kills if self.sandbox is not None else 0,
            "running": len(self._running),
            "gate_closed": self.gate.closed,
            "breaker": self.breaker.stats(),
            "process_tuning": self.process_tuning,
            "request_retries": self._client.retries if self._client is not None else 0,
            "kv_gate": self.kv_gate.stats() if self.kv_gate is not None else None,
            "metrics": self.recorder.enabled,  # False: its recorder drops everything (pool.metrics=false)
        }

    async def close(self) -> None:
        """Cancel the episodes still running (their requests are aborted on the servers), then
        close the HTTP session, the sandbox and the thread pool."""
        self.lag_probe.stop()
        if self._metrics_probe is not None:
            self._metrics_probe.stop()
        if self._running:
            await self.cancel(list(self._running))
            await asyncio.gather(*self._running.values(), return_exceptions=True)
        if self.kv_gate is not None:
            self.kv_gate.close()
        if self._session is not None and not self._session.closed:
            await self._session.close()
        if self.sandbox is not None:
            self.sandbox.close()
        self.domain.close()
        self.executor.shutdown(wait=False, cancel_futures=True)


def tune_actor_process(switch_interval_s: float = 0.001) -> dict[str, Any]:
    """Tune a rollout actor's process for a responsive event loop; call it once the process has
    loaded what it keeps (the domain's database and tasks, the tokenizer).

    * ``gc.freeze()`` moves every object alive now to a generation the collector never scans.
      Without it, each full collection walks the ~160k (retail) to ~200k (airline) objects of the
      parsed database and tasks: about 100 ms with the event loop stopped, measured here, a
      loop-lag spike every time one runs. (The idea is the one the ``gc.freeze`` documentation
      gives for long-lived servers.)
    * ``malloc_trim(0)`` (glibc only; skipped elsewhere) returns the free pages the loading left
      in the heap: about 20 MiB after the tokenizer's load, measured here.
    * ``sys.setswitchinterval(switch_interval_s)``: the event loop lets the GIL go at every
      system call (each socket read and write, each poll) and must then wait for a worker thread
      running Python (a tool call, a reward) to hand it back, at the latest after the switch
      interval: Python's default of 5 ms per system call adds up to the loop's lag under load
      (the GIL "convoy effect", D. Beazley, "Understanding the Python GIL", PyCon 2010).

    Args:
        switch_interval_s: the GIL switch interval, seconds (> 0).

    Returns:
        ``{"frozen": objects frozen, "trimmed": whether malloc_trim ran, "switch_interval_s"}``.
    """
    gc.collect()
    gc.freeze()
    trimmed = False
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
        trimmed = True
    except (OSError, AttributeError):  # not glibc
        pass
    sys.setswitchinterval(switch_interval_s)
    return {"frozen": gc.get_freeze_count(), "trimmed": trimmed, "switch_interval_s": sys.getswitchinterval()}


def _router_answers(cfg: PolicyConfig, timeout_s: float = 5.0) -> bool:
    """True when ``GET {router_url}/health`` answers 200 within ``timeout_s`` seconds."""
    import urllib.request

    if not cfg.router_url:
        return False
    req = urllib.request.Request(cfg.router_url.rstrip("/") + "/health")
    key = api_key_from_env(cfg.api_key_env)
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return r.status == 200
    except (OSError, ValueError):
        return False


def _cancelled(spec: EpisodeSpec) -> InteractionResult:
    return InteractionResult(spec, EpisodeStatus.CANCELLED, 0.0, None, metadata={"termination_reason": "cancelled", "error": None})
