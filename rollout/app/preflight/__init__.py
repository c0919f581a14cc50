"""Checks run before any episode: each fails fast with ONE clear line.

A run that starts against a router nobody listens on, a model served with another tokenizer, or
an output folder it cannot write, otherwise fails late (minutes of retries and a flood of logs)
or, worse, trains on token ids that mean something else.

:func:`check_before_start` runs what needs nothing started, before the local stack, Ray or any
actor starts: first :func:`check_config` (what the config names on this machine, through the
benchmark's and the engine's hooks: a tau2 domain, uvloop for the local stack; a
:class:`~rollout.core.config.ConfigError`), then the key variables, the benchmark's, the engine's
and the choices' packages, the tasks (``env.task_split`` / ``env.task_ids``
against the domain), ``pool.ray_address``, the tokenizer, the chat format with that tokenizer
(config errors naming both keys) and the output folder. :func:`run_preflight` runs, once the endpoints are up, in order:

1. :func:`check_router` (only when ``policy.router_url`` is set): the router answers, lists at
   least one healthy worker, and serves a model; returns the model info; then
   :func:`check_engine_servers`, the engine's own check (``policy.engine``: for vLLM, every
   worker serves the RL routes and reports the log-probs of what it samples).
2. :func:`check_tokenizer`: ``policy.tokenizer`` loads, and matches the served model's tokenizer
   as far as the server reports it (vocabulary size, the chat template's special tokens, EOS).
3. :func:`check_output_dir`: ``rollout.output_dir`` can be created and written.
4. An optional user-simulator check (a callable taking ``cfg.env.user``, sync or async).
5. An optional check of the rest of the ``env`` section (a callable taking ``cfg.env``, sync or
   async: the benchmark's ``check_env`` hook; tau2's checks the NL-assertion judge).

Each raises :class:`PreflightError` (a ``RuntimeError``) whose message is one line.

By job: :mod:`.machine` (the config, keys, packages, Ray address, output folder), :mod:`.router`
(the router and the served model), :mod:`.tokenizer` (the tokenizer's facts and their
comparison with the served model's), :mod:`.errors`; every name is importable from here.

What servers report (``GET /model_info``; ``/get_model_info`` is the older, deprecated name):

* SGLang reports ``model_path``, ``tokenizer_path``, ``is_generation``,
  ``preferred_sampling_params``, ``weight_version`` and, in recent versions,
  ``has_image_understanding``, ``has_audio_understanding``, ``model_type``, ``architectures``.
  It reports no vocabulary size and no special tokens; then only what is there is compared and
  the rest is logged at INFO as not checked.
* The project's local server (:mod:`rollout.devtools.local.server`) reports the same keys plus
  ``tokenizer_vocab_size`` (``len(tokenizer)``, added tokens included), ``eos_token_id`` and
  ``special_tokens`` (``{token: id}`` for the added tokens its chat template uses), which
  :func:`check_tokenizer` compares.
* sglang-router 0.3.2 proxies ``GET /get_model_info`` to one worker (forwarding the client's
  ``Authorization`` header) but answers 404 to ``GET /model_info``; the check tries the router's
  ``/get_model_info`` and ``/model_info``, then a healthy worker's ``/model_info`` and
  ``/get_model_info`` directly.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rollout.app.preflight.errors import PreflightError, one_line
from rollout.app.preflight.machine import (
    RAY_ADDRESS_WAIT_S,
    check_benchmark,
    check_config,
    check_key_variables,
    check_modules,
    check_output_dir,
    check_ray_address,
    check_task_selection,
)
from rollout.app.preflight.router import check_engine_servers, check_router
from rollout.app.preflight.tokenizer import (
    cached_tokenizer_facts,
    chat_template_special_tokens,
    check_chat_format,
    check_tokenizer,
    check_tokenizer_loads,
    tokenizer_facts,
)
from rollout.core.policy_engines import get_policy_engine

if TYPE_CHECKING:
    from rollout.core.config import Config
    from rollout.core.tasks import TaskSelection

__all__ = [
    "RAY_ADDRESS_WAIT_S",
    "PreflightError",
    "cached_tokenizer_facts",
    "chat_template_special_tokens",
    "check_before_start",
    "check_benchmark",
    "check_chat_format",
    "check_config",
    "check_engine_servers",
    "check_key_variables",
    "check_modules",
    "check_output_dir",
    "check_ray_address",
    "check_router",
    "check_task_selection",
    "check_tokenizer",
    "check_tokenizer_loads",
    "run_preflight",
    "tokenizer_facts",
]

logger = logging.getLogger(__name__)


def _run_check(fn: Callable[[Any], Any], arg: Any, timeout_s: float) -> Any:
    """Call ``fn(arg)``; await the result when it is awaitable (in a fresh event loop, in a helper
    thread when this thread already runs one), at most ``timeout_s`` seconds."""
    result = fn(arg)
    if not inspect.isawaitable(result):
        return result

    async def bounded() -> Any:
        return await asyncio.wait_for(result, timeout_s)

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(bounded())
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = asyncio.run(bounded())
        except BaseException as e:  # noqa: BLE001  (re-raised in the caller's thread)
            box["error"] = e

    t = threading.Thread(target=run, name="preflight-user-check", daemon=True)
    t.start()
    t.join(timeout_s + 5.0)
    if t.is_alive():
        raise TimeoutError(f"no answer within {timeout_s:g} s")
    if "error" in box:
        raise box["error"]
    return box.get("value")


def check_before_start(cfg: Config) -> TaskSelection:
    """Every check that needs nothing started, in order, so that a bad value fails in seconds
    with one line before the local stack, Ray or any actor starts: what the config names on this
    machine (:func:`check_config`), the key variables, the benchmark's package, optional packages
    (:func:`check_modules`), the tasks (:func:`check_task_selection`), ``pool.ray_address``, the
    tokenizer (:func:`check_tokenizer_loads`), the chat format with it (:func:`check_chat_format`)
    and ``rollout.output_dir`` (:func:`check_output_dir`). What needs the router (its workers,
    the served tokenizer) and the user simulator's endpoint is checked by :func:`run_preflight`,
    once they are up. :func:`rollout.app.wiring.open_pool` (and so the CLI's ``run`` and ``eval``)
    calls it.

    Returns:
        The tasks ``env.task_split`` / ``env.task_ids`` / ``env.open_issues`` select
        (:func:`check_task_selection`): ``.task_ids`` run, ``.skipped`` are left out for an open issue.

    Raises:
        rollout.core.config.ConfigError: a value the config names is not here (a tau2 domain,
            uvloop for the local stack, an unregistered benchmark), a split or a task the domain
            lacks (``TaskSelectionError``), a chat format that does not fit the tokenizer; one
            line naming the key.
        PreflightError: the first other check that fails, one line.
    """
    check_config(cfg)
    check_key_variables(cfg)
    check_benchmark(cfg)
    check_modules(cfg)
    selection = check_task_selection(cfg)
    check_ray_address(cfg.pool.ray_address)
    check_tokenizer_loads(cfg.policy.tokenizer)
    check_chat_format(cfg.policy.tokenizer, cfg.policy.chat_format, cfg.policy.enable_thinking)
    check_output_dir(cfg.rollout.output_dir)
    return selection


def run_preflight(cfg: Config, check_user: Callable[[Any], Any] | None = None, *,
                  router_timeout_s: float = 5.0, user_timeout_s: float = 30.0, check_env: Callable[[Any], Any] | None = None) -> dict:
    """Run the checks in order: the key variables and the benchmark's package
    (:func:`check_benchmark`), router and tokenizer (when ``policy.router_url`` is set; else
    only that the tokenizer loads), output folder, then ``check_user(cfg.env.user)``.

    Args:
        cfg: the whole config; the key is read from the environment variable named by
            ``policy.api_key_env``.
        check_user: optional user-simulator check, the benchmark's ``check_user`` hook
            (:func:`rollout.core.environment.benchmark_hook`; tau2's and tau-bench's:
            :func:`rollout.benchmarks.user_api.check_user_simulator`); called with
            ``cfg.env.user``, sync or async; it raises to fail.
        router_timeout_s: seconds for :func:`check_router`.
        user_timeout_s: seconds for ``check_user`` (and for ``check_env``).
        check_env: optional check of ``cfg.env`` (the benchmark's ``check_env`` hook), sync or
            async, run after ``check_user``; it raises to fail.

    Returns:
        ``{"model_info": dict | None, "output_dir": str, "user": what check_user returned or
        None, "seconds": float}``.

    Raises:
        PreflightError: the first check that fails, one line.
    """
    t0 = time.monotonic()
    out: dict[str, Any] = {"model_info": None, "output_dir": cfg.rollout.output_dir, "user": None}
    check_key_variables(cfg)
    check_benchmark(cfg)
    api_key = os.environ.get(cfg.policy.api_key_env) if cfg.policy.api_key_env else None
    if cfg.policy.router_url:
        wire = get_policy_engine(cfg.policy.engine)
        out["model_info"] = check_router(cfg.policy.router_url, api_key, timeout_s=router_timeout_s,
                                         served_model=wire.reports_model_info)
        # the engine's check reads every worker's whole configuration (vLLM's /server_info): 5 s was
        # too short on the loaded 2-core machine with two vLLM servers behind the router
        engine_timeout_s = max(router_timeout_s, 30.0)
        out["model_info"].update(_run_check(lambda c: check_engine_servers(c, api_key, engine_timeout_s), cfg, engine_timeout_s + 5.0))
        check_tokenizer(out["model_info"], cfg.policy.tokenizer)
    else:
        check_tokenizer_loads(cfg.policy.tokenizer)
        logger.info("preflight: policy.router_url is not set; router and tokenizer match not checked")
    check_output_dir(cfg.rollout.output_dir)
    if check_user is not None:
        try:
            out["user"] = _run_check(check_user, cfg.env.user, user_timeout_s)
        except PreflightError:
            raise
        except Exception as e:  # noqa: BLE001  (any failure is one line)
            where = cfg.env.user.base_url or cfg.env.user.kind
            raise PreflightError(f"user simulator ({where}): {one_line(f'{type(e).__name__}: {e}', 300)}") from None
    if check_env is not None:
        try:
            out["env"] = _run_check(check_env, cfg.env, user_timeout_s)
        except PreflightError:
            raise
        except Exception as e:  # noqa: BLE001  (any failure is one line)
            raise PreflightError(one_line(f"{type(e).__name__}: {e}", 300)) from None
    out["seconds"] = round(time.monotonic() - t0, 3)
    logger.info("preflight passed in %.2f s", out["seconds"])
    return out
