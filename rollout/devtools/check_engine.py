"""What ``python -m rollout.check exactness`` needs of the engine, whichever it is: a recording proxy
for its wire protocol, the engine started from the config, the policy's weights per version, and a
weight update crossed while episodes generate.

* :class:`RecordingProxy` sits between the pool's policy client and the router: every call passes
  through as it is (the control plane's too), and each 200 answer on the engine's generate route
  (``policy.engine``'s wire: SGLang's ``/generate``, vLLM's ``/inference/v1/generate``) is recorded
  as ``(prompt ids, generated ids, log-probs)`` per episode, read with the wire's own
  ``read_request`` / ``parse_generate``.
* :func:`open_engine` starts the engine ``engine_for(cfg)`` names (the local stack, or vLLM) as
  ``open_pool`` does, and fills in the endpoints.
* :func:`starting_weights` builds the policy's starting weights as a ``transformers`` model: the
  local ``tiny`` backend's (rebuilt from ``local.tiny``), the checkpoint a vLLM engine serves, or
  ``--model``. :func:`update_checkpoint` writes the checkpoint a mid-run update loads (the same
  shape, seed + 1); ``--update-to`` names one instead.
* :func:`cross_update` waits until calls are under way, then closes the worker's generation gate,
  pauses every worker (``abort``: the calls under way come back with their partial ids), loads the
  second checkpoint on every worker under the next version, checks that every worker reports it,
  resumes, and opens the gate: what the pool's ``update_weights_from_disk`` does, for one worker.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import time
from pathlib import Path
from typing import Any, Iterator

import aiohttp
from aiohttp import web

from rollout.app.webguard import local_guard
from rollout.core.config import Config, ConfigError
from rollout.core.episode import parse_request_id

logger = logging.getLogger(__name__)

__all__ = ["RecordingProxy", "UpdateReport", "cross_update", "next_version", "open_engine", "served_checkpoint", "starting_weights", "transformers_model",
           "update_checkpoint"]

_HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}


class RecordingProxy:
    """An HTTP proxy in front of a router that passes every call through and records every
    generate exchange of ``wire`` (a :class:`rollout.core.policy.wire.WireProtocol`; None: SGLang's).

    ``calls[episode_id]`` is a list of ``(input_ids, generated_ids, log_probs)`` in answer order
    (the episode id is the part of the request id before ``@``); ``answered`` counts the recorded
    calls, ``in_flight`` the generate calls sent and not answered yet. Binds 127.0.0.1 on a free
    port; use as ``async with RecordingProxy(router_url, wire) as proxy: ... proxy.url ...``.
    """

    def __init__(self, upstream: str, wire: Any = None):
        from rollout.core.policy_engines import SGLANG, get_policy_engine

        self.upstream = upstream.rstrip("/")
        self.wire = wire if wire is not None else get_policy_engine(SGLANG)
        self.calls: dict[str, list[tuple[list[int], list[int], list[float]]]] = collections.defaultdict(list)
        self.answered = 0
        self.in_flight = 0
        self.url = ""

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS}
        is_generate = request.method == "POST" and request.path == self.wire.generate_path
        self.in_flight += int(is_generate)
        try:
            async with self._session.request(request.method, self.upstream + request.path_qs, data=raw or None,
                                             headers=headers) as r:
                data, status, ctype = await r.read(), r.status, r.content_type
        finally:
            self.in_flight -= int(is_generate)
        if is_generate and status == 200:
            self._record(raw, data)
        return web.Response(body=data, status=status, content_type=ctype if ctype != "application/octet-stream" else None)

    def _record(self, raw: bytes, data: bytes) -> None:
        import json

        try:
            rid, prompt = self.wire.read_request(json.loads(raw))
            gen = self.wire.parse_generate(json.loads(data))
            eid = parse_request_id(rid)[0]
        except (KeyError, TypeError, ValueError) as e:  # not a call of the pool's (or a malformed answer: the client fails it)
            logger.warning("recording proxy: a generate call not recorded: %s", e)
            return
        self.calls[eid].append((list(prompt), list(gen.ids), list(gen.log_probs)))
        self.answered += 1

    async def __aenter__(self) -> RecordingProxy:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        app = web.Application(client_max_size=256 * 2**20, middlewares=[local_guard()])
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc) -> None:
        await self._runner.cleanup()
        await self._session.close()


@contextlib.contextmanager
def open_engine(cfg: Config, log_dir: Path) -> Iterator[tuple[Config, Any]]:
    """Start the engine the config asks for (:func:`rollout.core.engines.engine_for`; nothing when
    ``local.enabled`` is false) and yield ``(cfg with its endpoints resolved, the engine or None)``;
    the engine is stopped on exit.

    Raises:
        RuntimeError: the engine did not start (its message has the logs' tails).
    """
    from rollout.app.wiring import resolve_endpoints
    from rollout.core.engines import EngineJob, engine_for, get_engine

    name = engine_for(cfg)
    if name is None:
        yield cfg, None
        return
    kind = get_engine(name)
    engine = kind(getattr(cfg, kind.section), EngineJob.of(cfg, log_dir))
    try:
        engine.start()
        yield resolve_endpoints(cfg, engine.router_url), engine
    finally:
        engine.stop()


def transformers_model(path: str | Path):
    """A float32 ``transformers`` causal LM from a checkpoint folder, in eval mode."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype="float32").eval()


def served_checkpoint(cfg: Config) -> Path | None:
    """The checkpoint ``local.backend=vllm`` serves (written or named by ``local.vllm``), else None."""
    if cfg.local.enabled and cfg.local.backend == "vllm":
        from rollout.devtools.local.vllm.engine import checkpoint_path

        return checkpoint_path(cfg.local, cfg.policy.tokenizer)
    return None


def update_checkpoint(cfg: Config, out_dir: Path) -> Path:
    """Write the checkpoint a mid-run update loads: the served model's shape with seed + 1 (a vLLM
    checkpoint of ``local.vllm``, or the ``tiny`` backend's model in ``save_pretrained`` form).

    Raises:
        rollout.core.config.ConfigError: the engine is neither (``--model``: no second checkpoint known).
    """
    if served_checkpoint(cfg) is not None:
        from rollout.devtools.local.vllm import write_checkpoint

        if cfg.local.vllm.model:
            raise ConfigError("--update-weights with local.vllm.model: the check writes the update only for its own checkpoint")
        return write_checkpoint(Path(cfg.local.vllm.checkpoint_dir).expanduser() / f"{served_checkpoint(cfg).name}-update",
                                seed=cfg.local.vllm.seed + 1, tokenizer=cfg.policy.tokenizer)
    if cfg.local.enabled and cfg.local.backend == "tiny":
        from rollout.core.tokenizer import load_tokenizer
        from rollout.devtools.local.tiny import build_tiny_model, save_weights

        tiny = dataclasses.replace(cfg.local.tiny, seed=cfg.local.tiny.seed + 1)
        return save_weights(build_tiny_model(len(load_tokenizer(cfg.policy.tokenizer)), tiny), out_dir / "update_weights")
    raise ConfigError("--update-weights needs the weights of a second version: use local.backend=vllm or tiny")


def starting_weights(cfg: Config, model_path: str | None, vocab_size: int):
    """The policy's weights at the start, as a ``transformers`` model: ``--model``, the checkpoint
    ``local.backend=vllm`` serves (written now if it is not there yet: the engine then finds it),
    or the ``tiny`` backend's model rebuilt from ``local.tiny``.

    Raises:
        rollout.core.config.ConfigError: no way to get the policy's weights.
    """
    if model_path:
        return transformers_model(model_path)
    served = served_checkpoint(cfg)
    if served is not None:
        if not cfg.local.vllm.model:
            from rollout.devtools.local.vllm import write_checkpoint

            write_checkpoint(served, seed=cfg.local.vllm.seed, tokenizer=cfg.policy.tokenizer)
        return transformers_model(served)
    if cfg.local.enabled and cfg.local.backend == "tiny":
        from rollout.devtools.local.tiny import build_tiny_model

        return build_tiny_model(vocab_size, cfg.local.tiny)
    raise ConfigError("the exactness check needs the policy's weights: use local.backend=tiny or vllm, or pass --model PATH")


def next_version(version: str | None) -> str:
    """The version an update after ``version`` gets: ``n + 1`` for an integer, else ``"1"``."""
    return str(int(version) + 1) if version is not None and version.lstrip("-").isdigit() else "1"


@dataclasses.dataclass
class UpdateReport:
    """What the mid-run weight update met.

    Attributes:
        crossed: the update ran while calls were under way (False: every episode ended first).
        version: the version loaded.
        calls_interrupted: generate calls under way when the worker's gate closed (the pause
            aborted them: each was then continued or restarted, ``rollout.partial_rollout``).
        calls_before: calls answered before the update.
        workers: the worker URLs updated.
        seconds: pause to resume.
    """

    crossed: bool = False
    version: str = ""
    calls_interrupted: int = 0
    calls_before: int = 0
    workers: list[str] = dataclasses.field(default_factory=list)
    seconds: float = 0.0


async def cross_update(worker, proxy: RecordingProxy, cfg: Config, path: Path, version: str, after_calls: int,
                       done: asyncio.Event) -> UpdateReport:
    """Once ``after_calls`` calls were answered and one is under way, update every worker to
    ``path`` under ``version`` (see the module docstring); returns at once, uncrossed, if ``done``
    is set first.

    Raises:
        rollout.core.policy.WeightSyncError: a worker refused the folder, failed the update, or
            reports another version afterwards.
    """
    from rollout.core.policy import WeightSyncError, api_key_from_env
    from rollout.core.policy_engines import get_policy_engine

    while proxy.answered < after_calls or proxy.in_flight == 0:
        if done.is_set():
            return UpdateReport(version=version, calls_before=proxy.answered)
        await asyncio.sleep(0.02)
    t0 = time.monotonic()
    report = UpdateReport(crossed=True, version=version, calls_before=proxy.answered)
    wire = get_policy_engine(cfg.policy.engine)
    async with aiohttp.ClientSession() as session:
        admin = wire.admin(proxy.upstream, session, timeout_s=cfg.policy.request_timeout_s,
                           api_key=api_key_from_env(cfg.policy.api_key_env))
        admin.check_model_path(str(path))
        met = await worker.pause_generation()
        report.calls_interrupted = met["generate_calls_out"]
        try:
            urls = await admin.pause("abort")
            await admin.update_weights_from_disk(str(path), version, urls)
            wrong = {u: f"reports {v!r}" for u, v in (await admin.weight_versions(urls)).items() if v != version}
            if wrong:
                raise WeightSyncError(f"update to {path} as version {version}", wrong)
            await admin.resume(urls)
        finally:
            await worker.resume_generation()
    report.workers, report.seconds = list(urls), time.monotonic() - t0
    logger.info("exactness check: weights updated to version %s mid-run (%d calls under way, %d answered before)",
                version, report.calls_interrupted, report.calls_before)
    return report
