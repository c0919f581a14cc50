"""The workers' RL endpoints behind a router: pause and continue generation, weight updates,
weight versions and request aborts on every worker, and the failure of one of them
(:class:`WeightSyncError`). The pool drives weight updates through it; the client aborts the
earlier attempts of a retried call through it.

:class:`WorkerAdmin` is what every engine shares: the router's worker list (``GET /workers``,
the same answer from sglang-router 0.3.2 and vllm-router 0.1.17) and one call to every worker
at once, since neither router carries a control call to all of its workers (sglang-router answers
404; vllm-router forwards it to ONE worker, chosen by hashing the body: docs/engines.md).
:class:`EngineAdmin` is the seam (the five control verbs and the weight-folder check), which
:class:`RouterAdmin` implements over SGLang's endpoints and
:class:`~rollout.core.policy.vllm.VLLMAdmin` over vLLM's."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from typing import Any, Protocol, runtime_checkable

import aiohttp

from rollout.core.policy.auth import auth_headers, describe_error, redact
from rollout.core.policy.protocol import PolicyServerError

__all__ = ["EngineAdmin", "RouterAdmin", "WeightSyncError", "WorkerAdmin"]

logger = logging.getLogger(__name__)


class WeightSyncError(RuntimeError):
    """A worker failed a pause, continue or weight update.

    Attributes:
        action: what was attempted (e.g. ``continue_generation``).
        failures: worker URL -> what went wrong (``HTTP <status>: <body>`` or the connection error).
    """

    def __init__(self, action: str, failures: dict[str, str]):
        self.action = action
        self.failures = dict(failures)
        detail = "; ".join(f"{url}: {msg}" for url, msg in failures.items())
        super().__init__(f"{action} failed on {len(failures)} worker(s): {detail}")


@runtime_checkable
class EngineAdmin(Protocol):
    """The control plane of one engine's workers behind a router: what the pool's weight-update
    cycle (:class:`rollout.core.pool.weights.WeightSync`), the actors' cancellations and the
    client's retries call. Pause modes are the pool's names (``abort`` | ``retract`` |
    ``in_place``, SGLang's); an engine maps them to its own. Each verb calls every worker the
    router lists (or ``urls``) at once.
    """

    async def worker_urls(self) -> list[str]:
        """The worker URLs the router lists. Raises :class:`PolicyServerError` when it cannot."""
        ...

    async def worker_health(self) -> dict[str, bool]:
        """Worker URL -> whether the router counts it healthy. Raises :class:`PolicyServerError`."""
        ...

    def check_model_path(self, model_path: str) -> None:
        """Refuse, before anything is paused, a weights folder the engine cannot load (raises
        :class:`WeightSyncError`); engines that answer a bad folder harmlessly check nothing."""
        ...

    async def pause(self, mode: str = "abort", urls: list[str] | None = None) -> list[str]:
        """Pause generation (``abort`` | ``retract`` | ``in_place``); returns the worker URLs."""
        ...

    async def resume(self, urls: list[str] | None = None) -> list[str]:
        """Let generation go on; returns the worker URLs."""
        ...

    async def update_weights_from_disk(self, model_path: str, weight_version: str | None,
                                       urls: list[str] | None = None) -> dict[str, dict]:
        """Load ``model_path`` on every worker and take ``weight_version``; worker URL -> its answer."""
        ...

    async def weight_versions(self, urls: list[str] | None = None) -> dict[str, str | None]:
        """Each worker's weight version now."""
        ...

    async def model_infos(self, urls: list[str] | None = None) -> dict[str, dict]:
        """Each worker's model facts, ``model_path`` (the folder of the weights it serves) where the
        engine reports one; ``{}`` for a worker that reports nothing. A half-done weight update is
        rolled back to that folder before the pool's first update
        (:mod:`rollout.core.pool.weight_repair`)."""
        ...

    async def abort(self, rid: str | None = None, urls: list[str] | None = None, quiet: bool = False) -> int:
        """Abort the call ``rid`` (``None``: every call) on every worker, best effort; how many accepted."""
        ...


class WorkerAdmin:
    """What every engine's control plane shares: the router's workers (``GET /workers``) and one
    call to each of them at once. An engine's admin (:class:`RouterAdmin` for SGLang,
    :class:`~rollout.core.policy.vllm.VLLMAdmin` for vLLM) adds its endpoints on top
    (:class:`EngineAdmin`).

    Args:
        router_url: ``http://host:port`` of the router.
        session: an aiohttp session of the caller's event loop.
        timeout_s: bound on each HTTP call to a worker (seconds); a weight update may take this
            long. Listing the workers is bounded by the smaller of ``timeout_s`` and
            :attr:`LIST_TIMEOUT_S`.
        api_key: sent as ``Authorization: Bearer <key>`` on every call (router and workers);
            ``None``: no header. Never logged nor put in a message (see :func:`api_key_from_env`).
    """

    LIST_TIMEOUT_S = 30.0
    """Bound on ``GET /workers``, seconds: 10 s failed a weight update in a CI run where the machine's
    load was 40 on 2 cores and vllm-router answered late; a wedged router still fails within it."""

    def __init__(self, router_url: str, session: aiohttp.ClientSession, timeout_s: float = 300.0, api_key: str | None = None):
        self.router_url = router_url.rstrip("/")
        self.session = session
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._list_timeout = aiohttp.ClientTimeout(total=min(timeout_s, self.LIST_TIMEOUT_S))
        self._api_key = api_key or None
        self._headers = auth_headers(self._api_key)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(router_url={self.router_url!r}, api_key={'<set>' if self._api_key else None})"

    async def worker_urls(self) -> list[str]:
        """Worker URLs the router lists (``GET /workers``), in its order, without trailing ``/``,
        healthy or not.

        Raises:
            PolicyServerError: the router is unreachable or did not answer 200 with JSON.
        """
        return list(await self.worker_health())

    async def worker_health(self) -> dict[str, bool]:
        """Worker URL (the router's order, without trailing ``/``) -> whether the router counts it
        healthy (its ``is_healthy``; ``True`` where an entry does not say). sglang-router keeps a
        worker whose health checks fail in ``GET /workers`` with ``"is_healthy": false`` and sends
        it no calls until its checks pass again (0.3.2, tests/component/test_routing_affinity.py).

        Raises:
            PolicyServerError: the router is unreachable or did not answer 200 with JSON.
        """
        try:
            async with self.session.get(self.router_url + "/workers", headers=self._headers, timeout=self._list_timeout) as r:
                if r.status != 200:
                    raise PolicyServerError(f"GET {self.router_url}/workers answered {r.status}")
                data = await r.json(content_type=None)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
            raise PolicyServerError(f"cannot list the router's workers at {self.router_url}/workers: {describe_error(e, self._api_key)}") from None
        workers = data.get("workers", []) if isinstance(data, dict) else []
        return {str(w.get("url") if isinstance(w, dict) else w).rstrip("/"): not (isinstance(w, dict) and w.get("is_healthy") is False)
                for w in workers}

    async def _call(self, method: str, url: str, body: dict | None) -> tuple[int, Any]:
        try:
            async with self.session.request(method, url, json=body, headers=self._headers, timeout=self.timeout) as r:
                text = redact(await r.text(errors="replace"), self._api_key)
                try:
                    return r.status, json.loads(text) if text else {}
                except ValueError:
                    return r.status, text
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            return 0, describe_error(e, self._api_key)

    async def _all(self, method: str, path: str, body: dict | None, urls: list[str] | None) -> dict[str, tuple[int, Any]]:
        urls = await self.worker_urls() if urls is None else urls
        answers = await asyncio.gather(*[self._call(method, u + path, body) for u in urls])
        return dict(zip(urls, answers))

    async def _best_effort(self, path: str, body: dict, urls: list[str] | None, quiet: bool) -> int:
        """``POST path`` with ``body`` on every worker (or on ``urls``): how many answered 200.
        Failures are logged (at WARNING, or at DEBUG when ``quiet``), never raised: for an abort,
        which is best effort."""
        level = logging.DEBUG if quiet else logging.WARNING
        try:
            answers = await self._all("POST", path, body, urls)
        except PolicyServerError as e:
            logger.log(level, "%s: %s", path, e)
            return 0
        for u, (st, ans) in answers.items():
            if st != 200:
                logger.log(level, "%s on %s: %s", path, u, ans if not st else f"HTTP {st}")
        return sum(1 for st, _ in answers.values() if st == 200)

    @staticmethod
    def _failures(answers: dict[str, tuple[int, Any]], ok) -> dict[str, str]:
        return {u: (f"HTTP {st}: {str(body)[:300]}" if st else str(body)) for u, (st, body) in answers.items() if not ok(st, body)}

    def check_model_path(self, model_path: str) -> None:
        """Nothing to check here (an engine whose workers die on a bad folder overrides it)."""


class RouterAdmin(WorkerAdmin):
    """SGLang's RL endpoints on every worker behind a router (docs/design.md "SGLang native protocol").

    These are worker endpoints: the router proxies ``/generate`` but not ``/pause_generation``,
    ``/continue_generation``, ``/update_weights_from_disk`` or ``/abort_request`` (sglang-router
    0.3.2 answers 404), so each call goes to every worker URL that ``GET /workers`` lists, all at
    once. Every method raises :class:`PolicyServerError` when the router cannot list its workers
    (except :meth:`abort`, which is best effort). A bad weights folder is answered
    ``success: false`` by SGLang (the worker keeps its weights), so :meth:`check_model_path`
    checks nothing. Arguments: :class:`WorkerAdmin`'s.
    """

    async def pause(self, mode: str = "abort", urls: list[str] | None = None) -> list[str]:
        """``POST /pause_generation {"mode": mode}`` on every worker (or on ``urls``); returns the
        worker URLs.

        Raises:
            WeightSyncError: a worker did not answer 200.
            PolicyServerError: the router cannot list its workers.
        """
        answers = await self._all("POST", "/pause_generation", {"mode": mode}, urls)
        bad = self._failures(answers, lambda st, _: st == 200)
        if bad:
            raise WeightSyncError(f"pause_generation(mode={mode})", bad)
        return list(answers)

    async def resume(self, urls: list[str] | None = None) -> list[str]:
        """``POST /continue_generation {}`` on every worker (or on ``urls``); returns the worker URLs.

        Raises:
            WeightSyncError: a worker did not answer 200.
            PolicyServerError: the router cannot list its workers.
        """
        answers = await self._all("POST", "/continue_generation", {}, urls)
        bad = self._failures(answers, lambda st, _: st == 200)
        if bad:
            raise WeightSyncError("continue_generation", bad)
        return list(answers)

    async def update_weights_from_disk(self, model_path: str, weight_version: str | None, urls: list[str] | None = None) -> dict[str, dict]:
        """``POST /update_weights_from_disk`` on every worker and check each answer's ``success``.

        Returns:
            Worker URL -> its answer (``success``, ``message``, ``num_paused_requests``).

        Raises:
            WeightSyncError: naming every worker that failed the update (others may have the new
                weights: the caller must not go on with mixed weights).
            PolicyServerError: the router cannot list its workers.
        """
        model_path = os.fspath(model_path)  # a Path too
        body = {"model_path": model_path, "weight_version": weight_version, "abort_all_requests": False}
        answers = await self._all("POST", "/update_weights_from_disk", body, urls)
        bad = self._failures(answers, lambda st, b: st == 200 and isinstance(b, dict) and b.get("success") is True)
        if bad:
            raise WeightSyncError(f"update_weights_from_disk({model_path!r}, weight_version={weight_version!r})", bad)
        return {u: b for u, (_, b) in answers.items()}

    async def weight_versions(self, urls: list[str] | None = None) -> dict[str, str | None]:
        """Each worker's ``weight_version`` from ``GET /model_info`` (``None`` if it has none).

        Raises:
            WeightSyncError: a worker did not answer 200.
            PolicyServerError: the router cannot list its workers.
        """
        answers = await self._all("GET", "/model_info", None, urls)
        bad = self._failures(answers, lambda st, _: st == 200)
        if bad:
            raise WeightSyncError("model_info", bad)
        return {u: (None if not isinstance(b, dict) or b.get("weight_version") is None else str(b["weight_version"])) for u, (_, b) in answers.items()}

    async def model_infos(self, urls: list[str] | None = None) -> dict[str, dict]:
        """Each worker's ``GET /model_info`` answer (``model_path``, ``weight_version``, ...; ``{}``
        where it did not answer 200 with a JSON object).

        Raises:
            PolicyServerError: the router cannot list its workers.
        """
        answers = await self._all("GET", "/model_info", None, urls)
        return {u: (b if st == 200 and isinstance(b, dict) else {}) for u, (st, b) in answers.items()}

    async def abort(self, rid: str | None = None, urls: list[str] | None = None, quiet: bool = False) -> int:
        """``POST /abort_request`` with ``{"rid": rid}`` (or ``{"abort_all": true}``) on every
        worker (or on ``urls``); returns how many accepted. Failures are logged (at WARNING, or at
        DEBUG when ``quiet``), not raised: an abort is best effort."""
        return await self._best_effort("/abort_request", {"rid": rid} if rid else {"abort_all": True}, urls, quiet)
