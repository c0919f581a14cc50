"""Weight sync: the pause / resume / update-weights cycle of the policy servers behind the router.

:class:`WeightSync` closes every healthy actor's generation gate (new generate calls wait), then
pauses, updates and resumes every worker the router lists, through the engine's admin
(:class:`~rollout.core.policy.EngineAdmin` of ``policy.engine``'s wire: SGLang's
``/pause_generation``, ``/update_weights_from_disk``, ``/continue_generation``; vLLM's ``/pause``,
``/collective_rpc reload_weights`` + ``/update_weight_version`` + ``/reset_prefix_cache``,
``/resume``) that runs on a private event loop in a thread of its own (:class:`AdminLoop`): the
pool's API is synchronous, and a trainer may call it from inside an event loop of its own.
In-flight episodes are held, not ended; a turn the pause interrupted becomes what
``rollout.partial_rollout`` says.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import threading
import time
from typing import Any, Callable

import aiohttp

from rollout.core.config import Config
from rollout.core.policy import EngineAdmin, api_key_from_env
from rollout.core.policy_engines import SGLANG, get_policy_engine
from rollout.core.pool.actors import ActorSet
from rollout.core.pool.specs import as_weight_version
from rollout.core.pool.steps import StepRunner
from rollout.core.pool.weight_repair import WeightUpdateReport, settle_update
from rollout.core.telemetry import registry as R
from rollout.core.telemetry.recorder import NULL_RECORDER, Recorder

logger = logging.getLogger(__name__)

PAUSE_MODES = ("abort", "in_place", "retract")


@dataclasses.dataclass(frozen=True)
class PauseReport:
    """What one :meth:`rollout.core.pool.RolloutPool.pause` met (also each pause of
    :meth:`rollout.core.pool.RolloutPool.update_weights_from_disk`).

    Attributes:
        mode: the pause mode (``abort`` | ``in_place`` | ``retract``).
        workers: the worker URLs paused.
        seconds: how long the pause took to return.
        episodes_running: episodes running on the actors when their gates closed.
        generate_calls_out: ``/generate`` calls under way when the gates closed: with ``abort``,
            the calls the pause interrupted (each then handled by ``rollout.partial_rollout``).
    """

    mode: str
    workers: list[str]
    seconds: float
    episodes_running: int
    generate_calls_out: int


class AdminLoop:
    """A private event loop in a daemon thread (``rollout-pool-admin``) holding one engine's
    :class:`~rollout.core.policy.EngineAdmin` and its aiohttp session.

    Args:
        router_url: ``http://host:port`` of the router.
        timeout_s: bound on each HTTP call to a worker, seconds.
        api_key: the bearer key (``None``: no header).
        engine: ``policy.engine``, the wire whose admin it holds (SGLang's by default).
    """

    def __init__(self, router_url: str, timeout_s: float, api_key: str | None = None, engine: str = SGLANG):
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="rollout-pool-admin", daemon=True)
        self._thread.start()
        wire = get_policy_engine(engine)

        async def make() -> EngineAdmin:
            return wire.admin(router_url, aiohttp.ClientSession(), timeout_s=timeout_s, api_key=api_key)

        self.admin = self.run(make)

    def run(self, fn: Callable[..., Any], *args, timeout: float | None = None):
        """Run coroutine function ``fn(*args)`` on the loop and wait (up to ``timeout`` seconds)
        for its result; its exception is raised here."""
        return asyncio.run_coroutine_threadsafe(fn(*args), self._loop).result(timeout)

    def close(self) -> None:
        """Close the session, stop the loop and join its thread (10 s bounds each)."""
        try:
            self.run(self.admin.session.close, timeout=10)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop.close()


class WeightSync:
    """The weight-update cycle of one pool (see the module docstring).

    Args:
        cfg: the whole config (``policy.router_url``, ``policy.request_timeout_s``,
            ``policy.api_key_env``, ``rollout.weight_version``).
        actors: the actor set whose gates close and open.
        healthy: the indices of the actors to gate (those not down).
        recorder: where the weight version, the updates' durations and the pauses' durations
            (pause to resume) are recorded (``None``: nowhere).

    Attributes:
        last_pause: what the last :meth:`pause` met (``None`` before the first).
        counts: ``weight_updates``, ``generate_calls_paused`` and, for half-done updates,
            ``weight_updates_rolled_forward`` / ``_rolled_back`` / ``_split``.
        last_update: what the last update some worker took did (``None`` before one).
    """

    def __init__(self, cfg: Config, actors: ActorSet, healthy: Callable[[], list[int]], recorder: Recorder | None = None):
        self.cfg = cfg
        self._actors = actors
        self._healthy = healthy
        self._weight_version = as_weight_version(cfg.rollout.weight_version)
        self._paused: str | None = None
        self._admin_loop: AdminLoop | None = None
        self.last_pause: PauseReport | None = None
        self.counts: collections.Counter[str] = collections.Counter(weight_updates=0, generate_calls_paused=0, weight_updates_rolled_forward=0,
                                                                     weight_updates_rolled_back=0, weight_updates_split=0)
        self._recorder = recorder if recorder is not None else NULL_RECORDER
        self._version_gauge = self._recorder.bind(R.WEIGHT_VERSION)
        self._update_s = self._recorder.bind(R.WEIGHT_UPDATE_DURATION)
        self._paused_at: float | None = None  # time.monotonic() when the pause began
        self.last_update: WeightUpdateReport | None = None
        self._served: dict[str, str | None] = {}  # worker URL -> the folder of the weights it serves (after an update)

    def publish(self) -> None:
        """Record the current weight version (the pool calls it once Ray is up: a record made
        before that is lost)."""
        self._version_gauge.record(self._weight_version)

    @property
    def weight_version(self) -> int:
        """The trainer's current weight version."""
        return self._weight_version

    def set_weight_version(self, version: int | str) -> None:
        """Take ``version`` as the trainer's current one.

        Raises:
            ValueError: ``version`` is not an integer.
        """
        self._weight_version = as_weight_version(version)
        self.publish()

    @property
    def paused(self) -> str | None:
        """The pause mode while paused, else ``None``."""
        return self._paused

    def _admin(self) -> AdminLoop:
        if self._admin_loop is None:
            p = self.cfg.policy
            self._admin_loop = AdminLoop(p.router_url, timeout_s=p.request_timeout_s, api_key=api_key_from_env(p.api_key_env),
                                         engine=p.engine)
        return self._admin_loop

    def actor_back(self, index: int) -> None:
        """Actor ``index`` answers again after a failure: a restarted actor's gate is open, so
        close it while the pool is paused."""
        if self._paused is not None:
            self._actors.set_gates(False, [index])

    def pause(self, mode: str = "abort") -> list[str]:
        """Close every healthy actor's gate, then pause every worker (SGLang: ``POST
        /pause_generation {"mode": mode}``; vLLM: ``POST /pause``, the mode mapped by
        :data:`rollout.core.policy.vllm.PAUSE_QUERIES`); returns the worker URLs once every
        worker has answered.

        Raises:
            ValueError: unknown ``mode``.
            rollout.core.policy.WeightSyncError: a worker failed to pause.
            rollout.core.policy.PolicyServerError: the router cannot list its workers.
        """
        if mode not in PAUSE_MODES:
            raise ValueError(f"mode must be one of {PAUSE_MODES}, got {mode!r}")
        t0 = time.monotonic()
        self._paused = mode
        if self._paused_at is None:
            self._paused_at = t0
        gates = self._actors.set_gates(False, self._healthy())
        admin = self._admin()
        urls = admin.run(lambda: admin.admin.pause(mode))
        self.last_pause = PauseReport(mode=mode, workers=list(urls), seconds=time.monotonic() - t0,
                                      episodes_running=sum(g["episodes_running"] for g in gates),
                                      generate_calls_out=sum(g["generate_calls_out"] for g in gates))
        self.counts["generate_calls_paused"] += self.last_pause.generate_calls_out
        logger.info("generation paused (%s) on %d worker(s) in %.3fs: %d episode(s) running, %d /generate call(s) under way",
                    mode, len(urls), self.last_pause.seconds, self.last_pause.episodes_running, self.last_pause.generate_calls_out)
        return urls

    def resume(self) -> list[str]:
        """Resume every worker (SGLang: ``POST /continue_generation``; vLLM: ``POST /resume``),
        then open every healthy actor's gate; returns the worker URLs.

        Raises:
            rollout.core.policy.WeightSyncError: a worker failed to continue.
        """
        admin = self._admin()
        urls = admin.run(lambda: admin.admin.resume())
        self._actors.set_gates(True, self._healthy())
        if self._paused_at is not None and self._paused is not None:
            self._recorder.bind(R.PAUSE_DURATION, mode=self._paused).record(time.monotonic() - self._paused_at)
        self._paused_at = None
        self._paused = None
        logger.info("generation resumed on %d worker(s)", len(urls))
        return urls

    def update_weights_from_disk(self, model_path: str, weight_version: int | str) -> dict[str, dict]:
        """Check the folder as the engine needs (vLLM: ``config.json`` and ``*.safetensors``, since
        a failed reload kills a vLLM server), pause (``abort``), load ``model_path`` on every
        worker, check that every worker reports ``weight_version``, take it as the current
        version, resume.

        Returns:
            Worker URL -> its answer (``success``, ``message``, and SGLang's ``num_paused_requests``
            or vLLM's ``weight_version``).

        Raises:
            ValueError: ``weight_version`` is not an integer.
            rollout.core.policy.WeightSyncError: the engine refuses the folder (nothing
                paused), a worker failed the update, or reports another version afterwards;
                generation then stays paused. Some workers took it and the others failed it
                even when sent again: rolled back
                (:class:`~rollout.core.pool.weight_repair.HalfDoneUpdateError`, a ``WeightSyncError``).
        """
        version = as_weight_version(weight_version)
        t0 = time.monotonic()
        admin = self._admin()
        admin.admin.check_model_path(model_path)  # before the pause: a refused folder leaves generation running
        urls = self.pause("abort")
        retries, served = self.cfg.pool.weight_update_retries, self._served
        # a half-done update (some workers failed it) is rolled forward or back: rollout.core.pool.weight_repair
        answers = admin.run(lambda: settle_update(admin.admin, urls, model_path, version, served, self._weight_version, retries,
                                                  self._record_update)).answers
        self._weight_version = version
        self.counts["weight_updates"] += 1
        self.publish()
        self.resume()
        self._update_s.record(time.monotonic() - t0)
        logger.info("weights updated to version %d from %s on %d worker(s) in %.2fs", version, model_path, len(urls), time.monotonic() - t0)
        return answers

    def _record_update(self, report: WeightUpdateReport) -> None:
        """Keep what an update some worker took did (:attr:`last_update`, the counts, the folder
        each worker serves) and say so when it was half done."""
        self.last_update, self._served = report, dict(report.paths)
        if report.outcome != "updated":
            self.counts[f"weight_updates_{report.outcome}"] += 1
            logger.warning("%s", report)

    def close(self) -> None:
        """Stop the admin loop (a later call starts a new one)."""
        if self._admin_loop is not None:
            self._admin_loop.close()
            self._admin_loop = None


class WeightCycleAPI:
    """The weight-update calls of :class:`rollout.core.pool.RolloutPool` (mixed into it): each
    runs :class:`WeightSync`'s under the pool's lock (:mod:`rollout.core.pool.steps`)."""

    _weights: WeightSync
    _runner: StepRunner

    @property
    def last_pause(self) -> PauseReport | None:
        """What the last :meth:`pause` met (``None`` before the first)."""
        return self._weights.last_pause

    @property
    def last_weight_update(self) -> WeightUpdateReport | None:
        """What the last :meth:`update_weights_from_disk` that some worker took did: ``updated``,
        or, half done, ``rolled_forward`` / ``rolled_back`` / ``split`` with the workers each way
        (:mod:`rollout.core.pool.weight_repair`); ``None`` before one."""
        return self._weights.last_update

    @property
    def weight_version(self) -> int:
        """The trainer's current weight version (``rollout.weight_version`` at start, then the
        last successful :meth:`update_weights_from_disk`); staleness is counted against it."""
        return self._weights.weight_version

    def set_weight_version(self, version: int) -> None:
        """Tell the pool the trainer's current version when weights are updated by other means.

        Raises:
            ValueError: ``version`` is not an integer.
        """
        self._runner.call(self._weights.set_weight_version, version)

    def pause(self, mode: str = "abort") -> list[str]:
        """Stop all generation; in-flight episodes are held, not ended.

        Every actor's gate closes first (new ``/generate`` calls wait), then every worker the
        router lists gets ``POST /pause_generation {"mode": mode}``. With ``abort`` the workers
        end their running calls at once; the episodes see an interruption and handle it by
        ``rollout.partial_rollout`` once :meth:`resume` is called. With ``in_place`` the calls wait
        on the servers. Returns once every worker has answered, i.e. no generation is running.

        Returns:
            The worker URLs paused.

        Raises:
            ValueError: unknown ``mode``.
            rollout.core.policy.WeightSyncError: a worker failed to pause (generation may be paused on
                the others: call :meth:`resume` or retry).
            rollout.core.policy.PolicyServerError: the router cannot list its workers.
        """
        return self._runner.call(self._weights.pause, mode)

    def resume(self) -> list[str]:
        """``POST /continue_generation`` on every worker, then open every actor's gate: held
        episodes go on. Returns the worker URLs.

        Raises:
            rollout.core.policy.WeightSyncError: a worker failed to continue.
        """
        return self._runner.call(self._weights.resume)

    @property
    def paused(self) -> str | None:
        """The pause mode while paused, else ``None``."""
        return self._weights.paused

    def update_weights_from_disk(self, model_path: str, weight_version: int | str) -> dict[str, dict]:
        """Pause (``abort``), load ``model_path`` on every worker, check every answer, continue.

        Args:
            model_path: a folder every worker can read (e.g. written by the trainer with
                ``save_pretrained``).
            weight_version: the new version (an integer); the workers report it in every
                ``/generate`` answer from now on, and staleness is counted against it.

        Returns:
            Worker URL -> its answer (``success``, ``message``, ``num_paused_requests``).

        Raises:
            ValueError: ``weight_version`` is not an integer.
            rollout.core.policy.WeightSyncError: a worker failed the update, or reports another version
                afterwards. Generation then stays paused (the workers may hold different weights): retry the update, or :meth:`resume` knowingly.
                An update some workers took and others failed is sent again to those
                (``pool.weight_update_retries``: rolled forward, no error) or, failing that, taken
                back on the others (:class:`~rollout.core.pool.weight_repair.HalfDoneUpdateError`,
                rolled back); :attr:`last_weight_update` says which.
        """
        return self._runner.call(self._weights.update_weights_from_disk, model_path, weight_version)
