"""The router check: the router answers, lists a healthy worker and serves a model; and the
engine's own check of its servers (:func:`check_engine_servers`: for vLLM, the RL routes and the
log-probs mode)."""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Any

from rollout.app.preflight.errors import PreflightError, one_line, reason
from rollout.core.policy import PolicyServerError
from rollout.core.policy_engines import get_policy_engine

if TYPE_CHECKING:
    from rollout.core.config import Config

logger = logging.getLogger(__name__)


def _get(url: str, api_key: str | None, timeout: float) -> tuple[int, Any]:
    """``(status, parsed JSON or raw text)``; raises ``OSError`` (refused, timeout, DNS)."""
    req = urllib.request.Request(url, method="GET")
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(req, timeout=max(0.05, timeout)) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    text = raw.decode("utf-8", errors="replace")
    try:
        return status, json.loads(text) if text.strip() else None
    except ValueError:
        return status, text


def check_router(router_url: str, api_key: str | None, timeout_s: float = 5.0, served_model: bool = True) -> dict:
    """The router answers, lists at least one healthy worker, and serves a model.

    Args:
        router_url: ``http(s)://host:port`` of the router (sglang-router, vllm-router; or of a
            single SGLang server).
        api_key: sent as ``Authorization: Bearer <key>``; None: no header.
        timeout_s: seconds for the whole check (every request shares this deadline).
        served_model: read the served model from SGLang's ``GET /get_model_info`` (or
            ``/model_info``); False (an engine without it, e.g. vLLM: its
            :func:`check_engine_servers` reads the model): only the workers are checked.

    Returns:
        The model info of the served model (``GET /get_model_info`` or ``/model_info``: at least
        ``model_path``; see the module docstring for the other keys); ``{}`` without ``served_model``.

    Raises:
        PreflightError: nothing answers within ``timeout_s``, the key is refused (401/403), the
            router lists no healthy worker, or no model info can be had. One line.
    """
    base = router_url.rstrip("/")
    deadline = time.monotonic() + timeout_s
    where = f"router {base}"

    def left() -> float:
        rest = deadline - time.monotonic()
        if rest <= 0:
            raise PreflightError(f"{where}: no complete answer within {timeout_s:g} s (policy.router_url)")
        return rest

    def get(url: str) -> tuple[int, Any]:
        try:
            return _get(url, api_key, left())
        except PreflightError:
            raise
        except (OSError, ValueError) as e:  # URLError, refused, timeout, bad URL
            raise PreflightError(f"{where}: GET {url[len(base):] or '/'} failed: {reason(e)} (policy.router_url)") from None

    def refused(status: int, path: str) -> PreflightError:
        hint = "no key was sent: set policy.api_key_env" if not api_key else "check the key in policy.api_key_env"
        return PreflightError(f"{where}: GET {path} refused with HTTP {status} ({hint})")

    # 1. the router answers and lists its workers
    status, body = get(base + "/workers")
    workers: list[dict] | None = None
    if status in (401, 403):
        raise refused(status, "/workers")
    if status == 200 and isinstance(body, dict) and isinstance(body.get("workers"), list):
        workers = [w for w in body["workers"] if isinstance(w, dict)]
    else:  # not an sglang-router (a single server?): it must at least be healthy
        status_h, _ = get(base + "/health")
        if status_h != 200:
            raise PreflightError(f"{where}: GET /workers answered HTTP {status} and GET /health HTTP {status_h}")
        logger.info("%s: GET /workers answered HTTP %s (not an sglang-router?); worker count not checked", where, status)
    healthy: list[str] = []
    if workers is not None:
        if not workers:
            raise PreflightError(f"{where}: lists no workers (GET /workers); start the SGLang servers or register them")
        healthy = [str(w.get("url", "")).rstrip("/") for w in workers if w.get("is_healthy", True)]
        if not healthy:
            urls = ", ".join(str(w.get("url")) for w in workers)
            raise PreflightError(f"{where}: none of its {len(workers)} workers is healthy ({one_line(urls)})")

    if not served_model:
        return {}
    # 2. the served model
    tried: list[str] = []
    candidates = [base + "/get_model_info", base + "/model_info"]
    candidates += [u + p for u in healthy[:1] if u for p in ("/model_info", "/get_model_info")]
    for url in candidates:
        status, body = get(url)
        if status in (401, 403):
            raise refused(status, url[len(base):] if url.startswith(base) else url)
        if status == 200 and isinstance(body, dict) and body.get("model_path"):
            if body.get("is_generation") is False:
                raise PreflightError(f"{where}: serves {body['model_path']!r}, which is not a generation model (is_generation false)")
            logger.info("%s: %d healthy worker(s), model %s (weight_version %s)", where, len(healthy),
                        body.get("model_path"), body.get("weight_version"))
            return body
        tried.append(f"{url} -> HTTP {status}")
    raise PreflightError(f"{where}: serves no model info ({one_line('; '.join(tried), 300)})")


async def check_engine_servers(cfg: Config, api_key: str | None, timeout_s: float = 30.0) -> dict:
    """The engine's own check of the servers behind ``policy.router_url``
    (:meth:`~rollout.core.policy.wire.WireProtocol.check_servers` of ``policy.engine``'s wire:
    nothing more for SGLang; for vLLM, every worker serves the RL routes and reports the log-probs
    of the distribution it samples at ``policy.sampling``). A coroutine: :func:`run_preflight`
    runs it in a loop of its own.

    Returns:
        What the engine reports of the served model (``{}``: nothing beyond :func:`check_router`'s).

    Raises:
        PreflightError: one line, naming the worker and the flag to set, or the time that ran out.
    """
    import asyncio

    import aiohttp

    wire = get_policy_engine(cfg.policy.engine)
    try:
        async with aiohttp.ClientSession() as session:
            admin = wire.admin(str(cfg.policy.router_url), session, timeout_s=timeout_s, api_key=api_key)
            return await asyncio.wait_for(wire.check_servers(admin, cfg.policy), timeout_s)
    except PolicyServerError as e:
        raise PreflightError(f"policy.engine={wire.name}: {one_line(str(e), 400)}") from None
    except asyncio.TimeoutError:
        raise PreflightError(f"policy.engine={wire.name}: the servers behind {cfg.policy.router_url} did not answer "
                             f"the engine's check within {timeout_s:g} s") from None
