"""Wiring: what a job needs started before its first episode, as one context manager.

:func:`open_pool` is the library's way to a running pool: it checks what can be checked before
anything starts, starts the local stack when ``local.enabled`` (and points ``policy.router_url``
at its router), runs the preflight checks, starts the Ray pool, and stops all of it on exit. The
CLI (:mod:`rollout.app.cli`), evaluation, the benches and trainers use it alike::

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
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from rollout.core.config import Config

if TYPE_CHECKING:
    from rollout.core.pool import RolloutPool

logger = logging.getLogger(__name__)


def resolve_endpoints(cfg: Config, router_url: str | None) -> Config:
    """Fill ``policy.router_url`` (and the llm user's ``base_url``) from the local stack's router."""
    policy = cfg.policy
    user = cfg.env.user
    if router_url is not None:
        policy = dataclasses.replace(policy, router_url=router_url)
        if user.kind == "llm" and user.base_url is None:
            # the local router serves the user simulator too, behind the same key
            user = dataclasses.replace(user, base_url=router_url.rstrip("/") + "/v1", model=user.model or "local",
                                       api_key_env=user.api_key_env or policy.api_key_env)
    env = dataclasses.replace(cfg.env, user=user)
    return dataclasses.replace(cfg, policy=policy, env=env)


# How open_pool orders the start-up: "overlapped" (the default) or "serial" (the order before
# issue 23, kept for `python -m rollout.bench startup`, which runs both side by side).
STARTUP_MODES = ("overlapped", "serial")
STARTUP = "overlapped"
# The last start-up's timeline (open_pool fills it; python -m rollout.bench startup reads it).
LAST_STARTUP: dict = {}


def process_age_s() -> float | None:
    """Seconds since this process started (Linux: ``/proc/self/stat``'s start time against the
    boot clock, 10 ms resolution); ``None`` elsewhere."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return time.clock_gettime(time.CLOCK_BOOTTIME) - int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


class _Timeline:
    """Start and end of each start-up phase, seconds since :func:`open_pool` was called, and how
    old the process was then (for the CLI: the imports and config before it)."""

    def __init__(self, mode: str):
        age = process_age_s()
        self.t0 = time.monotonic()
        self.data: dict = {"mode": mode, "process_age_at_open_pool_s": None if age is None else round(age, 3), "phases": {}}

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 3)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = self.now()
        try:
            yield
        finally:
            self.data["phases"][name] = [start, self.now()]

    def mark(self, name: str, start: float) -> None:
        self.data["phases"][name] = [start, self.now()]


def _timed(fn):
    """``fn`` wrapped to return the monotonic time it ended at."""
    def run() -> float:
        fn()
        return time.monotonic()
    return run


@contextlib.contextmanager
def open_pool(cfg: Config, log_dir_name: str = "local_stack_logs", startup: str | None = None) -> Iterator[tuple[Config, "RolloutPool", list[str]]]:
    """Start what a job needs and stop it afterwards: the local stack (when ``local.enabled``) and
    the Ray pool, with the preflight checks (:func:`rollout.app.preflight.run_preflight`).

    Start-up order (``startup``, default :data:`STARTUP`):

    * ``overlapped``: the checks that need nothing started (:func:`~rollout.app.preflight.check_before_start`),
      then the local stack starts in a thread (its router on a port chosen here, so that the
      actors know their endpoint before it answers) while this thread starts Ray and creates the
      actors (:meth:`RolloutPool.start` with ``wait=False``) and reads the task ids; once the
      stack is up the preflight checks run, then the actors are waited for and told that the
      router answered (:meth:`RolloutPool.arm_breakers`). A failed check stops what started.
      Without a local stack (``local.enabled=false``) the endpoints are up already: the
      preflight runs first, before anything starts (a dead router is one line in seconds).
    * ``serial``: one after the other, as before: checks, task ids, local stack, preflight, Ray
      and the actors.

    The phases' times, from the command's start, are logged at INFO and kept in
    :data:`LAST_STARTUP` (``python -m rollout.bench startup`` prints both orders side by side).

    Args:
        cfg: the whole config; ``policy.router_url`` may be null when ``local.enabled``.
        log_dir_name: the local stack's log folder, under ``rollout.output_dir``.
        startup: ``overlapped`` or ``serial`` (``None``: :data:`STARTUP`).

    Yields:
        ``(cfg, pool, task_ids)``: the config with its endpoints resolved, the started pool, and
        the task ids of ``env.task_split`` / ``env.task_ids``.

    Raises:
        rollout.app.preflight.PreflightError: a check before anything starts
            (:func:`rollout.app.preflight.check_before_start`) or once the stack is up
            (:func:`rollout.app.preflight.run_preflight`) failed; one line naming the key.
        rollout.core.config.TaskSelectionError: ``env.task_ids`` names tasks the domain lacks, or the split does not exist.
        RuntimeError: the local stack or an actor failed to start.
        ValueError: an unknown ``startup``.
    """
    from rollout.app.preflight import check_before_start, run_preflight
    from rollout.benchmarks.tau2.user import check_user_simulator
    from rollout.core.pool import RolloutPool

    mode = STARTUP if startup is None else startup
    if mode not in STARTUP_MODES:
        raise ValueError(f"startup={mode!r}: one of {', '.join(STARTUP_MODES)}")
    timeline = _Timeline(mode)
    LAST_STARTUP.clear()
    stack = None
    stack_start: concurrent.futures.Future | None = None  # the local stack starting in a thread
    starter = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="local-stack-start")
    pool = None
    try:
        with timeline.phase("checks"):
            check_before_start(cfg)  # keys, packages, Ray address, tokenizer, output dir: one line each, before anything starts
        if mode == "serial":
            with timeline.phase("task_ids"):
                task_ids = _task_ids(cfg)
            if cfg.local.enabled:
                with timeline.phase("local_stack"):
                    stack = _local_stack(cfg, cfg.local, log_dir_name)
                    stack.start()
                cfg = resolve_endpoints(cfg, stack.router_url)
            with timeline.phase("preflight"):
                run_preflight(cfg, check_user=check_user_simulator)
            with timeline.phase("ray_and_actors"):
                pool = RolloutPool(cfg).start()
        else:
            if not cfg.local.enabled:  # endpoints already up: checked at once, before anything starts (seconds at most)
                with timeline.phase("preflight"):
                    run_preflight(cfg, check_user=check_user_simulator)
            else:
                from rollout.devtools.local.stack import free_port

                local = cfg.local if cfg.local.router_port else dataclasses.replace(cfg.local, router_port=free_port(cfg.local.host))
                stack = _local_stack(cfg, local, log_dir_name)
                began = timeline.now()
                stack_start = starter.submit(_timed(stack.start))
                cfg = resolve_endpoints(cfg, f"http://{local.host}:{local.router_port}")
            with timeline.phase("ray_and_actor_launch"):
                pool = RolloutPool(cfg).start(wait=False)
            with timeline.phase("task_ids"):
                task_ids = _task_ids(cfg)
            if stack_start is not None:
                ended_at = stack_start.result()  # re-raises what the start raised
                timeline.data["phases"]["local_stack"] = [began, round(ended_at - timeline.t0, 3)]
                if stack is not None and stack.router_url != cfg.policy.router_url:  # the stack kept the port it was given
                    raise RuntimeError(f"local stack: router at {stack.router_url}, expected {cfg.policy.router_url}")
            if cfg.local.enabled:
                with timeline.phase("preflight"):
                    run_preflight(cfg, check_user=check_user_simulator)
            with timeline.phase("actors_ready"):
                pool.start()
            pool.arm_breakers()  # the router answered the preflight: the actors may have started before it did
        ready = timeline.data["actors_ready_s"] = timeline.now()
        age = timeline.data["process_age_at_open_pool_s"]
        timeline.data["process_start_to_ready_s"] = None if age is None else round(age + ready, 3)
        LAST_STARTUP.update(timeline.data)
        logger.info("start-up (%s): actors ready %.2f s after open_pool (%s after the process started): %s", mode, ready,
                    "?" if age is None else f"{age + ready:.2f} s",
                    ", ".join(f"{k} {a:.2f}-{b:.2f} s" for k, (a, b) in timeline.data["phases"].items()))
        logger.info("chat template probe (%s):\n%s", cfg.policy.tokenizer, pool.worker_infos()[0]["template_probe"])
        yield cfg, pool, task_ids
    finally:
        if pool is not None:
            pool.shutdown()
        starter.shutdown(wait=True)  # a stack still starting is stopped once its start returned (nothing left half-started)
        if stack is not None:
            stack.stop()


def _task_ids(cfg: Config) -> list[str]:
    """The task ids of ``env.task_split`` / ``env.task_ids`` (the domain loaded in this process).

    Raises:
        rollout.core.config.TaskSelectionError: as :func:`open_pool`.
    """
    from rollout.core.environment import load_benchmark

    domain = load_benchmark(cfg.env, log_level=cfg.logging.tau2_level)  # env.benchmark's, through the registry
    try:
        return domain.task_ids(cfg.env.task_split, cfg.env.task_ids)
    finally:
        domain.close()


def _local_stack(cfg: Config, local, log_dir_name: str):
    from rollout.core.environment import domain_key
    from rollout.devtools.local.stack import LocalStack

    return LocalStack(local, domain_key(cfg.env.benchmark, cfg.env.domain), cfg.policy.tokenizer,
                      log_dir=Path(cfg.rollout.output_dir) / log_dir_name, api_key_env=cfg.policy.api_key_env,
                      chat_format=cfg.policy.chat_format)
