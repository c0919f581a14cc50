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

import contextlib
import dataclasses
import logging
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


@contextlib.contextmanager
def open_pool(cfg: Config, log_dir_name: str = "local_stack_logs") -> Iterator[tuple[Config, "RolloutPool", list[str]]]:
    """Start what a job needs and stop it afterwards: the local stack (when ``local.enabled``) and
    the Ray pool, with the preflight checks in between (:func:`rollout.app.preflight.run_preflight`).

    Args:
        cfg: the whole config; ``policy.router_url`` may be null when ``local.enabled``.
        log_dir_name: the local stack's log folder, under ``rollout.output_dir``.

    Yields:
        ``(cfg, pool, task_ids)``: the config with its endpoints resolved, the started pool, and
        the task ids of ``env.task_split`` / ``env.task_ids``.

    Raises:
        rollout.app.preflight.PreflightError: a check before anything starts
            (:func:`rollout.app.preflight.check_before_start`) or once the stack is up
            (:func:`rollout.app.preflight.run_preflight`) failed; one line naming the key.
        rollout.core.config.TaskSelectionError: ``env.task_ids`` names tasks the domain lacks, or the split does not exist.
        RuntimeError: the local stack or an actor failed to start.
    """
    from rollout.app.preflight import check_before_start, run_preflight
    from rollout.benchmarks.tau2.user import check_user_simulator
    from rollout.core.environment import domain_key, load_benchmark
    from rollout.core.pool import RolloutPool

    stack = None
    pool = None
    try:
        check_before_start(cfg)  # keys, packages, Ray address, tokenizer, output dir: one line each, before anything starts
        domain = load_benchmark(cfg.env, log_level=cfg.logging.tau2_level)  # env.benchmark's, through the registry
        try:
            task_ids = domain.task_ids(cfg.env.task_split, cfg.env.task_ids)
        finally:
            domain.close()
        if cfg.local.enabled:
            from rollout.devtools.local.stack import LocalStack

            stack = LocalStack(cfg.local, domain_key(cfg.env.benchmark, cfg.env.domain), cfg.policy.tokenizer,
                               log_dir=Path(cfg.rollout.output_dir) / log_dir_name, api_key_env=cfg.policy.api_key_env,
                               chat_format=cfg.policy.chat_format)
            stack.start()
            cfg = resolve_endpoints(cfg, stack.router_url)
        run_preflight(cfg, check_user=check_user_simulator)
        pool = RolloutPool(cfg).start()
        logger.info("chat template probe (%s):\n%s", cfg.policy.tokenizer, pool.worker_infos()[0]["template_probe"])
        yield cfg, pool, task_ids
    finally:
        if pool is not None:
            pool.shutdown()
        if stack is not None:
            stack.stop()
