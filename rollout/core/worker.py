"""The rollout worker: a plain class around :func:`rollout.core.episode.run_episode`.

It owns what one actor owns (docs/design.md invariant 5): the tokenizer and chat template (loaded and
probed once), the benchmark's domain (``env.benchmark``, loaded through the benchmark registry,
:func:`rollout.core.environment.load_benchmark`) and its sandbox, a thread pool for the
environment's blocking calls and one aiohttp session. :mod:`rollout.core.pool` turns it into a Ray
actor in one place; tests use it directly.
"""

from __future__ import annotations

import asyncio
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import aiohttp

from rollout.core.config import AdaptiveConcurrencyConfig, EnvConfig, LoggingConfig, PolicyConfig, RewardShapingConfig
from rollout.core.environment import Benchmark, Environment, UserSimulatorError, load_benchmark
from rollout.core.eventloop import loop_kind
from rollout.core.formats import build_chat_format, choose_chat_format
from rollout.core.logs import setup_logging
from rollout.core.loop_health import LoopLagProbe, tune_actor_process
from rollout.core.policy import BackendBreaker, GenerationGate, HTTPPolicyClient, api_key_from_env
from rollout.core.policy.kvgate import KVGate
from rollout.core.policy_engines import get_policy_engine
from rollout.core.records import EpisodeSpec, EpisodeStatus, InteractionResult, TaskIssue, WorkerFields
from rollout.core.runner import run_guarded_episode
from rollout.core.settings import EpisodeSettings
from rollout.core.tasks import issues_by_task, open_task_issues
from rollout.core.telemetry import NULL_RECORDER, Recorder
from rollout.core.telemetry import registry as metrics_registry
from rollout.core.telemetry.probes import EnvironmentMetrics, MeteredEnvironment
from rollout.core.tokenizer import load_tokenizer

logger = logging.getLogger(__name__)


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
            running, the generate calls (:class:`~rollout.core.policy.HTTPPolicyClient`), the
            user simulator's turns and the tool calls
            (:class:`~rollout.core.telemetry.probes.MeteredEnvironment`), and the event loop's lag
            (a second :class:`LoopLagProbe`, 50 ms sleeps, started with the first episode). The
            pool gives each actor a ``RayRecorder`` (docs/observability.md).
        adaptive_concurrency: ``pool.adaptive_concurrency``; when enabled, one
            :class:`~rollout.core.policy.kvgate.KVGate` per worker (one poller of the workers'
            ``/metrics``) holds new episodes and new turns while the workers' KV usage is high;
            an episode that waited gets ``kv_held_s`` (:class:`~rollout.core.records.WorkerFields`,
            ``metadata["kv_held_s"]`` in the JSON). ``None`` or disabled: no gate.
        kv_actor: ``(this actor's index, pool.num_actors)`` (the pool sets it): the KV gate's
            part of the servers' KV (``1 / num_actors`` of it, or under ``placement=gate`` its own
            workers: :func:`~rollout.core.policy.kvslots.my_workers`).
        reward_shaping: ``rollout.reward_shaping`` (``None``: none), applied to every result;
            each also carries its task's open issues (:func:`rollout.core.tasks.open_task_issues`).

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
                 kv_actor: tuple[int, int] = (0, 1), reward_shaping: RewardShapingConfig | None = None):
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
        probed = build_chat_format(self.tokenizer, self.domain.tool_schemas, kwargs, policy_cfg.chat_format, source=policy_cfg.tokenizer)
        self.chat_format, self.chat, self.template_report = probed.name, probed.chat, probed.report
        self.settings = EpisodeSettings.from_policy(policy_cfg, max_steps=env_cfg.max_steps, system_prompt=self.domain.system_prompt,
                                                    tool_names=self.domain.tool_names, partial_rollout=partial_rollout, reward_shaping=reward_shaping)
        self.max_concurrent_episodes = max_concurrent_episodes
        self.executor = ThreadPoolExecutor(max_workers=max(4, max_concurrent_episodes), thread_name_prefix="tau2")  # the environment's blocking calls
        self.sandbox = self.domain.new_actor_sandbox(env_cfg, log_level=logging_cfg.tau2_level)  # None: the benchmark needs none
        self._semaphore: asyncio.Semaphore | None = None
        self._session: aiohttp.ClientSession | None = None
        self._client: HTTPPolicyClient | None = None
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

    def _ensure_session(self) -> HTTPPolicyClient:
        if self._session is None or self._session.closed:
            conn = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
            self._session = aiohttp.ClientSession(connector=conn)
            if self.kv_gate is not None:
                self.kv_gate.close()
            self.kv_gate = None
            ac = self.adaptive_concurrency
            wire = get_policy_engine(self.policy_cfg.engine)  # policy.engine: SGLang's or vLLM's wire protocol
            if ac is not None and ac.enabled:
                key = api_key_from_env(self.policy_cfg.api_key_env)
                lister = wire.admin(str(self.policy_cfg.router_url), self._session, timeout_s=ac.timeout_s, api_key=key)
                self.kv_gate = KVGate(ac, self._session, list_workers=lister.worker_health, api_key=key, actor=self.kv_actor[0],
                                      actors=self.kv_actor[1], metrics=wire.kv_metrics)
            self._client = HTTPPolicyClient(self.policy_cfg, self._session, gate=self.gate, breaker=self.breaker, recorder=self.recorder,
                                            kv_gate=self.kv_gate, wire=wire)
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
        self.episodes_run += 1
        result.add_worker_fields(WorkerFields(os.getpid(), round(held, 3) if held else None))
        result.add_graded_by(getattr(self.domain, "graded_by", None))  # the benchmark's optional GradedBy
        return result

    async def _run(self, spec: EpisodeSpec, client: HTTPPolicyClient, timeout_s: float | None) -> InteractionResult:
        """:func:`rollout.core.runner.run_guarded_episode` on a fresh environment of the domain (an
        unknown task id raises ``KeyError`` there: ``env_error``), metered when the actor records
        metrics."""

        def open_env() -> Environment:
            return self.domain.new_episode(self.env_cfg, spec.task_id, seed=spec.seed, executor=self.executor, sandbox=self.sandbox)

        return await run_guarded_episode(spec, open_env, client, self.chat, self.settings, timeout_s=timeout_s,
                                         prepare=self._metered if self.recorder.enabled else None, on_user_error=self._user_error,
                                         task_issues=open_task_issues(self.domain, spec.task_id))

    async def _metered(self, env: Environment, settings: EpisodeSettings) -> tuple[Environment, EpisodeSettings]:
        return MeteredEnvironment(env, self._env_metrics), settings

    def _user_error(self, error: UserSimulatorError) -> None:
        self._env_metrics.user_errors.record(1)

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

    def domain_task_ids(self) -> list[str]:
        """Every task id of the loaded domain, in the benchmark's order (``RolloutPool.submit`` checks specs against them)."""
        return [str(t) for t in self.domain.tasks]

    def domain_open_issues(self) -> dict[str, list[TaskIssue]]:
        """``{task id: its open issues}`` for the domain's tasks that have any (for the pool's own records)."""
        return dict(issues_by_task(self.domain, self.domain.tasks))

    def info(self) -> dict[str, Any]:
        """Identity and state of this worker (for logs and the pool)."""
        return {
            "pid": os.getpid(),
            "domain": self.domain.name,
            "tokenizer": self.policy_cfg.tokenizer,
            "episodes_run": self.episodes_run,
            "template_probe": self.template_report.summary(),
            "template_probe_line": self.template_report.headline(),
            "sandbox_kills": self.sandbox.kills if self.sandbox is not None else 0,
            "running": len(self._running),
            "gate_closed": self.gate.closed,
            "gate_waiting": self.gate.waiting,  # of the running episodes, those whose call waits at the closed gate
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
    return InteractionResult.failed(spec, EpisodeStatus.CANCELLED, "cancelled")
