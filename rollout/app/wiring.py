"""Wiring: what a job needs started before its first episode, as one context manager.

:func:`open_pool` is the library's way to a running pool: it checks what can be checked before
anything starts, starts the job's engine (the local stack when ``local.enabled``, reached through
the engine registry, :mod:`rollout.core.engines`) and points ``policy.router_url`` at its router,
runs the preflight checks (with the benchmark's own hooks, :func:`rollout.core.environment.benchmark_hook`),
starts the Ray pool, and stops all of it on exit. The CLI (:mod:`rollout.app.cli`), evaluation,
the benches and trainers use it alike::

    from rollout import load_config, open_pool

    cfg = load_config("configs/local.yaml", ["env.task_ids=[0,1]"])
    with open_pool(cfg) as (cfg, pool, task_ids):
        pool.submit_tasks(task_ids)
        for result in pool.results():
            ...
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from rollout.core import uptime
from rollout.core.config import Config
from rollout.core.engines import Engine, EngineJob, engine_for, get_engine

if TYPE_CHECKING:
    from rollout.core.pool import RolloutPool
    from rollout.core.tasks import TaskSelection

__all__ = ["STARTUP_MODES", "StartupTimeline", "open_pool", "process_age_s", "resolve_endpoints"]

logger = logging.getLogger(__name__)


def resolve_endpoints(cfg: Config, router_url: str | None) -> Config:
    """Fill ``policy.router_url`` (and the llm user's and the NL-assertion judge's ``base_url``) from
    the engine's router (the local stack's)."""
    policy = cfg.policy
    user = cfg.env.user
    judge = cfg.env.judge
    if router_url is not None:
        policy = dataclasses.replace(policy, router_url=router_url)
        if user.kind == "llm" and user.base_url is None:
            # the local router serves the user simulator too, behind the same key
            user = dataclasses.replace(user, base_url=router_url.rstrip("/") + "/v1", model=user.model or "local",
                                       api_key_env=user.api_key_env or policy.api_key_env)
        if judge.kind == "llm" and judge.base_url is None:
            # and the judge (the gold-replay backend answers as a deterministic stand-in judge)
            judge = dataclasses.replace(judge, base_url=router_url.rstrip("/") + "/v1", model=judge.model or "local",
                                        api_key_env=judge.api_key_env or policy.api_key_env)
    env = dataclasses.replace(cfg.env, user=user, judge=judge)
    return dataclasses.replace(cfg, policy=policy, env=env)


# How open_pool orders the start-up: "overlapped" (the default) or "serial" (the order before
# issue 23, kept for `python -m rollout.bench startup`, which runs both side by side).
STARTUP_MODES = ("overlapped", "serial")


def process_age_s() -> float:
    """Seconds since this process's interpreter started (:func:`rollout.core.uptime.process_age_s`:
    from its import of :mod:`rollout`, not from the process id's creation, which ``exec`` keeps)."""
    return uptime.process_age_s()


@dataclass
class StartupTimeline:
    """One :func:`open_pool` start-up's timeline: start and end of each phase, in seconds since
    ``open_pool`` was called, and how old the process was then (:func:`process_age_s`; for the CLI:
    the imports and the config before it). Pass one to ``open_pool(cfg, timeline=...)`` to read it
    (``python -m rollout.bench startup`` does); ``open_pool`` fills it as it goes.

    Attributes:
        mode: the start-up order (:data:`STARTUP_MODES`).
        process_age_at_open_pool_s: :func:`process_age_s` when ``open_pool`` was called.
        phases: phase name -> ``[start_s, end_s]`` (``checks``, ``local_stack``, ``preflight``,
            ``ray_and_actors`` or ``ray_and_actor_launch`` and ``actors_ready``); overlapped ones overlap.
        actors_ready_s: seconds from ``open_pool`` to every actor ready (None until then).
        process_start_to_ready_s: the same from the interpreter's start (None until then).
    """

    mode: str = STARTUP_MODES[0]
    process_age_at_open_pool_s: float = 0.0
    phases: dict[str, list[float]] = field(default_factory=dict)
    actors_ready_s: float | None = None
    process_start_to_ready_s: float | None = None
    t0: float = field(default_factory=time.monotonic, repr=False)  # time.monotonic() at open_pool

    def begin(self, mode: str) -> None:
        """Start the clock now, for a start-up in ``mode`` (what was recorded before is dropped)."""
        self.mode, self.phases, self.actors_ready_s, self.process_start_to_ready_s = mode, {}, None, None
        self.process_age_at_open_pool_s = round(process_age_s(), 3)
        self.t0 = time.monotonic()

    def now(self, at: float | None = None) -> float:
        """Seconds since :meth:`begin`, of now or of the ``time.monotonic()`` reading ``at``."""
        return round((time.monotonic() if at is None else at) - self.t0, 3)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Record the block's span as phase ``name`` (also when it raises)."""
        start = self.now()
        try:
            yield
        finally:
            self.phases[name] = [start, self.now()]

    def ready(self) -> None:
        """Every actor is ready now."""
        self.actors_ready_s = self.now()
        self.process_start_to_ready_s = round(self.process_age_at_open_pool_s + self.actors_ready_s, 3)

    def as_dict(self) -> dict[str, Any]:
        """The timeline as plain values (``mode``, ``process_age_at_open_pool_s``, ``phases``,
        ``actors_ready_s``, ``process_start_to_ready_s``), as the startup bench writes it."""
        out = dataclasses.asdict(self)
        del out["t0"]
        return out


def _timed(fn):
    """``fn`` wrapped to return the monotonic time it ended at."""
    def run() -> float:
        fn()
        return time.monotonic()
    return run


@contextlib.contextmanager
def open_pool(cfg: Config, log_dir_name: str = "local_stack_logs", startup: str = "overlapped",
              timeline: StartupTimeline | None = None) -> Iterator[tuple[Config, "RolloutPool", list[str]]]:
    """Start what a job needs and stop it afterwards: the job's engine (the local stack, when
    ``local.enabled``: :func:`rollout.core.engines.engine_for`) and the Ray pool, with the preflight
    checks (:func:`rollout.app.preflight.run_preflight`, the user simulator checked by the
    benchmark's ``check_user`` hook).

    Start-up order (``startup``):

    * ``overlapped`` (the default): the checks that need nothing started
      (:func:`~rollout.app.preflight.check_before_start`, the task ids among them), then the engine
      starts in a thread (its router on a port chosen when it is made, so that the actors know
      their endpoint before it answers) while this thread starts Ray and creates the actors
      (:meth:`RolloutPool.start` with ``wait=False``); once the engine is up the preflight checks
      run, then the actors are waited for and told that the router answered
      (:meth:`RolloutPool.arm_breakers`). A failed check stops what started. Without an engine
      (``local.enabled=false``) the endpoints are up already: the preflight runs first, before
      anything starts (a dead router is one line in seconds).
    * ``serial``: one after the other, as before issue 23: checks (the task ids among them),
      engine, preflight, Ray and the actors.

    The phases' times, from the interpreter's start (:func:`process_age_s`), are logged at INFO
    and kept in ``timeline`` (``python -m rollout.bench startup`` prints both orders side by side).

    Args:
        cfg: the whole config; ``policy.router_url`` may be null when ``local.enabled``.
        log_dir_name: the engine's log folder, under ``rollout.output_dir``.
        startup: ``overlapped`` or ``serial``.
        timeline: a :class:`StartupTimeline` to fill (None: one of its own, only logged).

    Yields:
        ``(cfg, pool, task_ids)``: the config with its endpoints resolved, the started pool, and
        the task ids of ``env.task_split`` / ``env.task_ids`` that run (``env.open_issues=skip``
        leaves out the tasks with an open issue: ``pool.task_selection`` says which,
        :class:`rollout.core.tasks.TaskSelection`).

    Raises:
        rollout.app.preflight.PreflightError: a check before anything starts
            (:func:`rollout.app.preflight.check_before_start`) or once the engine is up
            (:func:`rollout.app.preflight.run_preflight`) failed; one line naming the key.
        rollout.core.config.ConfigError: before anything starts, one line naming the key:
            ``env.task_ids`` names tasks the domain lacks or ``env.task_split`` a split it lacks
            (a ``TaskSelectionError``), ``policy.chat_format`` does not fit ``policy.tokenizer``,
            or a value :func:`rollout.app.preflight.check_config` refuses.
        RuntimeError: the engine or an actor failed to start.
        ValueError: an unknown ``startup``.
    """
    if startup not in STARTUP_MODES:
        raise ValueError(f"startup={startup!r}: one of {', '.join(STARTUP_MODES)}")
    timeline = StartupTimeline() if timeline is None else timeline
    timeline.begin(startup)
    run = _Startup(cfg, Path(cfg.rollout.output_dir) / log_dir_name, timeline)
    try:
        selection = run.serial() if startup == "serial" else run.overlapped()
        run.pool.task_selection = selection
        task_ids = list(selection.task_ids)
        timeline.ready()
        logger.info("start-up (%s): actors ready %.2f s after open_pool (%.2f s after the interpreter started): %s", startup,
                    timeline.actors_ready_s, timeline.process_start_to_ready_s,
                    ", ".join(f"{k} {a:.2f}-{b:.2f} s" for k, (a, b) in timeline.phases.items()))
        log_template_probe(run.cfg.policy.tokenizer, run.pool.worker_infos()[0])
        yield run.cfg, run.pool, task_ids
    finally:
        run.close()


def log_template_probe(tokenizer: str, info: dict) -> None:
    """Log what the actors' start-up probe of the chat format found (``info``: an actor's
    ``RolloutWorker.info()``): one INFO line (:meth:`~rollout.core.formats.TemplateReport.headline`),
    each case (yes / NO) at DEBUG. A ``NO`` there is often expected (Qwen3's template re-renders
    earlier turns differently, which is why the history is appended); docs/exactness.md says what
    each check means."""
    line = info.get("template_probe_line")
    if line:
        logger.info("chat template probe (%s): %s (each case with logging.level=DEBUG; docs/exactness.md#the-start-up-probe)",
                    tokenizer, line)
    logger.debug("chat template probe (%s), each case (yes / NO; docs/exactness.md#the-start-up-probe):\n%s",
                 tokenizer, info.get("template_probe", ""))


class _Startup:
    """One :func:`open_pool` start-up: what it started (the engine, the pool), each start-up order
    as a method, and how to stop it all. ``cfg`` gets the engine's router once it is made."""

    def __init__(self, cfg: Config, log_dir: Path, timeline: StartupTimeline):
        self.cfg = cfg
        self.log_dir = log_dir
        self.timeline = timeline
        self.engine: Engine | None = None
        self.pool: RolloutPool | None = None
        self._starter = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="engine-start")

    def _checks(self) -> TaskSelection:
        from rollout.app.preflight import check_before_start

        with self.timeline.phase("checks"):  # keys, packages, tasks, Ray address, tokenizer, chat format, output dir: one line each
            return check_before_start(self.cfg)

    def _make_engine(self) -> Engine | None:
        """The job's engine, made (its router's port chosen) but not started; None without one."""
        name = engine_for(self.cfg)
        if name is not None:
            kind = get_engine(name)
            self.engine = kind(getattr(self.cfg, kind.section), EngineJob.of(self.cfg, self.log_dir))
            self.cfg = resolve_endpoints(self.cfg, self.engine.router_url)
        return self.engine

    def _preflight(self) -> None:
        from rollout.app.preflight import run_preflight
        from rollout.core.environment import benchmark_hook

        with self.timeline.phase("preflight"):
            run_preflight(self.cfg, check_user=benchmark_hook(self.cfg.env.benchmark, "check_user"),
                          check_env=benchmark_hook(self.cfg.env.benchmark, "check_env"))

    def serial(self) -> TaskSelection:
        """Checks, engine, preflight, Ray and the actors, one after the other; the tasks selected."""
        from rollout.core.pool import RolloutPool

        selection = self._checks()
        if self._make_engine() is not None:
            with self.timeline.phase("local_stack"):
                self.engine.start()
        self._preflight()
        with self.timeline.phase("ray_and_actors"):
            self.pool = RolloutPool(self.cfg).start()
        return selection

    def overlapped(self) -> TaskSelection:
        """Checks; the engine starting in a thread while Ray and the actors start; preflight; the
        actors waited for; the tasks selected."""
        from rollout.core.pool import RolloutPool

        selection = self._checks()
        engine_start = None  # the engine starting in a thread
        if self._make_engine() is None:  # endpoints already up: checked at once, before anything starts (seconds at most)
            self._preflight()
        else:
            began = self.timeline.now()
            engine_start = self._starter.submit(_timed(self.engine.start))
        with self.timeline.phase("ray_and_actor_launch"):
            self.pool = RolloutPool(self.cfg).start(wait=False)
        if engine_start is not None:
            self.timeline.phases["local_stack"] = [began, self.timeline.now(engine_start.result())]  # re-raises what the start raised
            self._preflight()
        with self.timeline.phase("actors_ready"):
            self.pool.start()
        self.pool.arm_breakers()  # the router answered the preflight: the actors may have started before it did
        return selection

    def close(self) -> None:
        """Stop the pool, wait for an engine still starting (so that nothing is left half-started), stop the engine."""
        if self.pool is not None:
            self.pool.shutdown()
        self._starter.shutdown(wait=True)
        if self.engine is not None:
            self.engine.stop()
