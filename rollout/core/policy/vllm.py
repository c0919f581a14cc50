"""vLLM's wire protocol (``policy.engine: vllm``): ``POST /inference/v1/generate``, token in,
token out, behind vllm-router, and :class:`VLLMClient`, the shared client
(:class:`~rollout.core.policy.client.HTTPPolicyClient`) fixed to it.

What vLLM 0.32.0 answers was measured against the real server (docs/engines.md; the
recorded answers the unit tests read are in ``tests/support/data/vllm/``):

* **Request** (:meth:`VLLMWire.generate_body`): ``{"request_id", "token_ids", "sampling_params":
  {temperature, top_p, top_k, max_tokens, stop, logprobs: 0, skip_special_tokens: false, seed?}}``.
  vLLM ignores a ``sampling_params`` key it does not know (``max_new_tokens`` would be dropped
  and the call run to the context length), so only its own names are sent. The server names the
  request ``generate-tokens-<request_id>`` (:data:`REQUEST_ID_PREFIX`); that is the id an abort
  must name. An ``X-Request-Id`` header would replace it (and become vllm-router's routing key),
  so none is sent.
* **Answer** (:func:`parse_vllm_response`): ``choices[0].token_ids`` and
  ``choices[0].logprobs.content[i].{token_id, logprob}`` (one per id; ``logprobs: 0`` gives the
  sampled id's), ``finish_reason`` (``stop`` | ``length`` | ``abort``; ``error`` is retried),
  ``stop_reason`` (the stop string, the stop id, or ``null`` for EOS) and ``weight_versions``
  (``[{"version", "start", "end"}]`` spans over the ids: more than one when a pause kept the
  request through a weight update). The ids are never trimmed: a matched stop string's tokens,
  a stop id and EOS stay in, as SGLang's with ``no_stop_trim`` (the episode loop's end-of-turn
  repair reads the ids alike).
* **Log-probs**: vLLM reports the model's raw log-probs unless the server runs with
  ``--logprobs-mode processed_logprobs``; then they are the sampling distribution's
  (temperature, top-k and top-p applied and renormalised), which is what a trainer's importance
  ratio needs. :meth:`VLLMWire.check_servers` (the preflight) refuses a worker in another mode
  unless the sampling makes them equal (:func:`raw_log_probs_exact`).
* **Routing**: the header ``X-Session-ID`` (vllm-router ``--policy consistent_hash`` hashes it
  first; a body field is not read on this route).
* **Control** (:class:`VLLMAdmin`, needs ``VLLM_SERVER_DEV_MODE=1``): ``/pause?mode=...``,
  ``/resume``, ``/abort_requests``, ``/collective_rpc`` (``reload_weights``),
  ``/update_weight_version``, ``/reset_prefix_cache``, ``/weight_info``, each on every worker:
  vllm-router forwards a control call to ONE worker.
* **KV metrics** (:data:`VLLM_KV_METRICS`): ``vllm:kv_cache_usage_perc``,
  ``vllm:num_preemptions_total`` and the label ``kv_cache_size_tokens`` of ``vllm:cache_config_info``.
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp

from rollout.core.config import PolicyConfig, SamplingConfig
from rollout.core.policy.admin import EngineAdmin, WeightSyncError, WorkerAdmin
from rollout.core.policy.client import HTTPPolicyClient
from rollout.core.policy.kvreadings import KVMetrics
from rollout.core.policy.protocol import Generation, PolicyServerError, read_weight_spans
from rollout.core.policy.wire import RetryableAnswer

if TYPE_CHECKING:
    import numpy as np

__all__ = ["PAUSE_QUERIES", "PROCESSED_LOGPROBS", "REQUEST_ID_PREFIX", "ROUTING_HEADER", "VLLM_KV_METRICS", "VLLM_WIRE",
           "VLLMAdmin", "VLLMClient", "VLLMWire", "check_weights_folder", "parse_vllm_response", "raw_log_probs_exact"]

logger = logging.getLogger(__name__)

GENERATE_PATH = "/inference/v1/generate"
ROUTING_HEADER = "X-Session-ID"
REQUEST_ID_PREFIX = "generate-tokens-"  # vLLM's name for the request a body's request_id names
PROCESSED_LOGPROBS = "processed_logprobs"
FINISH_TYPES = frozenset({"stop", "length", "abort"})
# the pool's pause modes (SGLang's names) -> vLLM's /pause query. keep + clear_cache=true preempts the
# kept requests (their KV is recomputed on resume: SGLang's retract); clear_cache=false keeps their KV
# (computed by the old weights: SGLang's in_place). Measured on vLLM 0.32.0, docs/engines.md.
PAUSE_QUERIES = {"abort": "mode=abort", "retract": "mode=keep&clear_cache=true", "in_place": "mode=keep&clear_cache=false"}

VLLM_KV_METRICS = KVMetrics("vllm:", "vllm:kv_cache_usage_perc", "vllm:num_preemptions_total", "vllm:cache_config_info",
                            kv_tokens_label="kv_cache_size_tokens")


def _malformed(why: str) -> PolicyServerError:
    return PolicyServerError(f"malformed {GENERATE_PATH} response: {why}")


def parse_vllm_response(body: dict) -> Generation:
    """Read a ``/inference/v1/generate`` answer (``output_mode: tokens``) into a :class:`Generation`.

    Args:
        body: the decoded JSON answer (``{"request_id", "choices": [{"token_ids", "logprobs":
            {"content": [{"token_id", "logprob", ...}]}, "finish_reason", "stop_reason",
            "weight_versions"}], "usage", ...}``).

    Returns:
        ``ids`` (``n``), ``log_probs`` (``n``, one per id), ``finish_type`` (``stop`` | ``length``
        | ``abort``), ``matched`` (``stop_reason``: the stop string, the stop id, ``None`` for
        EOS), ``weight_version`` (the last span's; ``None`` when unreported), ``weight_spans``
        (``(start, end, version)`` when more than one version sampled the ids) and ``meta``
        (``request_id``, ``usage``, ``finish_reason``, ``stop_reason``, ``weight_versions``).

    Raises:
        RetryableAnswer: ``finish_reason`` is ``error`` (the request failed in the engine).
        PolicyServerError: no ``choices[0].token_ids`` or no log-prob list; a log-prob that is
            ``null`` or not a finite number; a log-prob entry whose ``token_id`` is not its id; an
            unknown ``finish_reason``; spans that do not cover the ids.
    """
    try:
        choice = body["choices"][0]
        ids = [int(t) for t in choice["token_ids"]]
        content = choice["logprobs"]["content"]
        finish = choice.get("finish_reason")
    except (KeyError, TypeError, IndexError, ValueError) as e:
        raise _malformed(f"need choices[0].token_ids and choices[0].logprobs.content (was logprobs: 0 sent?): {e!r}") from None
    if finish == "error":
        raise RetryableAnswer(f"{GENERATE_PATH}: the engine failed request {body.get('request_id')!r} (finish_reason error)")
    if finish not in FINISH_TYPES:
        raise _malformed(f"finish_reason {finish!r} is none of {sorted(FINISH_TYPES)}")
    if not isinstance(content, list) or len(content) != len(ids):
        raise _malformed(f"{len(ids)} token_ids but {len(content) if isinstance(content, list) else content!r} log-prob entries")
    log_probs: list[float] = []
    for i, (tid, entry) in enumerate(zip(ids, content)):
        lp = entry.get("logprob") if isinstance(entry, dict) else None
        if isinstance(lp, bool) or not isinstance(lp, (int, float)) or not math.isfinite(lp):
            raise _malformed(f"log-prob {lp!r} for generated token {i} (id {tid})")
        if entry.get("token_id", tid) != tid:
            raise _malformed(f"log-prob entry {i} is for id {entry.get('token_id')}, the token is {tid}")
        log_probs.append(float(lp))
    spans = read_weight_spans(choice.get("weight_versions"), len(ids), GENERATE_PATH)
    meta = {"request_id": body.get("request_id"), "usage": body.get("usage"), "finish_reason": finish,
            "stop_reason": choice.get("stop_reason"), "weight_versions": choice.get("weight_versions")}
    return Generation(ids=ids, log_probs=log_probs, finish_type=finish, matched=choice.get("stop_reason"), meta=meta,
                      weight_version=spans[-1][2] if spans else None, weight_spans=spans if len(spans) > 1 else None)


def raw_log_probs_exact(sampling: SamplingConfig) -> bool:
    """Whether vLLM's raw log-probs (its default ``--logprobs-mode raw_logprobs``) equal the
    sampling distribution's for ``sampling``: at temperature 1 or 0 (greedy: both are the plain
    ``log_softmax``, measured) with no top-p (``1``) and no top-k (``-1``). Otherwise only
    ``processed_logprobs`` reports what was sampled from."""
    return sampling.temperature in (0.0, 1.0) and sampling.top_p == 1.0 and sampling.top_k == -1


def check_weights_folder(model_path: str | os.PathLike) -> None:
    """Refuse a folder vLLM's ``reload_weights`` cannot load, before any worker is asked: a failed
    reload leaves vLLM's model on meta tensors and the server dies at its next call (measured on
    0.32.0: a missing folder is taken for a hub id, ``collective_rpc`` answers 500, the next
    generate raises ``EngineDeadError``).

    Raises:
        WeightSyncError: ``model_path`` is not a folder here, or holds no ``config.json`` or no
            ``*.safetensors``. The folder must be readable at the same path by the pool's driver
            and by every worker (the trainer's shared output folder).
    """
    folder = Path(model_path)
    why = None
    if not folder.is_dir():
        why = "is not a folder here (the driver must see the folder the workers load, at the same path)"
    elif not (folder / "config.json").is_file():
        why = "holds no config.json"
    elif not any(folder.glob("*.safetensors")):
        why = "holds no *.safetensors"
    if why is not None:
        raise WeightSyncError(f"reload_weights({model_path!r})", {"(no worker asked)": f"{model_path} {why}; "
                              "a failed reload kills a vLLM server, so nothing was sent"})


class VLLMAdmin(WorkerAdmin):
    """vLLM's RL endpoints on every worker behind vllm-router (``VLLM_SERVER_DEV_MODE=1``); an
    :class:`~rollout.core.policy.admin.EngineAdmin`. vllm-router forwards a control call to one
    worker only, so each goes to every worker ``GET /workers`` lists, all at once. Arguments:
    :class:`~rollout.core.policy.admin.WorkerAdmin`'s."""

    def check_model_path(self, model_path: str | os.PathLike) -> None:
        """:func:`check_weights_folder` (raises :class:`WeightSyncError`)."""
        check_weights_folder(model_path)

    async def _each(self, action: str, method: str, path: str, body: dict | None, urls: list[str] | None, ok=None) -> dict[str, Any]:
        answers = await self._all(method, path, body, urls)
        bad = self._failures(answers, ok or (lambda st, _: st == 200))
        if bad:
            raise WeightSyncError(action, bad)
        return {u: b for u, (_, b) in answers.items()}

    async def pause(self, mode: str = "abort", urls: list[str] | None = None) -> list[str]:
        """``POST /pause?<query>`` on every worker (or on ``urls``), the pool's mode mapped by
        :data:`PAUSE_QUERIES` (``abort``: running calls end at once with their partial ids;
        ``retract``: they wait, their KV dropped and recomputed on resume; ``in_place``: they
        wait with their KV). Returns the worker URLs once each has paused.

        Raises:
            ValueError: unknown ``mode``.
            WeightSyncError: a worker did not answer 200.
            PolicyServerError: the router cannot list its workers.
        """
        if mode not in PAUSE_QUERIES:
            raise ValueError(f"pause mode must be one of {sorted(PAUSE_QUERIES)}, got {mode!r}")
        return list(await self._each(f"pause({mode})", "POST", f"/pause?{PAUSE_QUERIES[mode]}", None, urls))

    async def resume(self, urls: list[str] | None = None) -> list[str]:
        """``POST /resume`` on every worker (or on ``urls``); returns the worker URLs.

        Raises:
            WeightSyncError: a worker did not answer 200.
            PolicyServerError: the router cannot list its workers.
        """
        return list(await self._each("resume", "POST", "/resume", None, urls))

    async def set_weight_version(self, weight_version: str, urls: list[str] | None = None) -> list[str]:
        """``POST /update_weight_version {"new_version"}`` on every worker (vLLM starts at
        ``"default"``; set an integer version before ``rollout.max_staleness`` counts).

        Raises:
            WeightSyncError: a worker did not answer ``success: true``.
            PolicyServerError: the router cannot list its workers.
        """
        answers = await self._each(f"update_weight_version({weight_version!r})", "POST", "/update_weight_version",
                                   {"new_version": str(weight_version)}, urls,
                                   lambda st, b: st == 200 and isinstance(b, dict) and b.get("success") is True)
        return list(answers)

    async def model_infos(self, urls: list[str] | None = None) -> dict[str, dict]:
        """``{}`` for every worker: vLLM reports no weights folder (``/weight_info`` gives only the
        version), so before the pool's first update a half-done update is rolled forward but not
        back (after it, the pool knows the folder it loaded).

        Raises:
            PolicyServerError: the router cannot list its workers.
        """
        return {u: {} for u in (await self.worker_urls() if urls is None else urls)}

    async def update_weights_from_disk(self, model_path: str | os.PathLike, weight_version: str | None,
                                       urls: list[str] | None = None) -> dict[str, dict]:
        """Load ``model_path`` (a folder path, ``str`` or ``Path``) on every worker: ``/collective_rpc reload_weights`` (after
        :func:`check_weights_folder`), then ``/update_weight_version`` (when ``weight_version``
        is not ``None``; a reload does not change it), then ``/reset_prefix_cache`` (a reload does
        not clear it: a prompt cached under the old weights would be reused, measured off by up to
        2.32 in log-prob). Run it while paused (the pool pauses with ``abort``).

        Returns:
            Worker URL -> ``{"success": true, "message", "weight_version"}``.

        Raises:
            WeightSyncError: the folder is refused, or a worker failed a step (a 500 from
                ``reload_weights`` means that worker's model is gone: restart it), naming every
                worker that failed; the others may have the new weights.
            PolicyServerError: the router cannot list its workers.
        """
        model_path = os.fspath(model_path)
        check_weights_folder(model_path)
        urls = await self.worker_urls() if urls is None else urls
        await self._each(f"reload_weights({model_path!r})", "POST", "/collective_rpc",
                         {"method": "reload_weights", "kwargs": {"weights_path": model_path}}, urls)
        if weight_version is not None:
            await self.set_weight_version(weight_version, urls)
        await self._each("reset_prefix_cache", "POST", "/reset_prefix_cache", None, urls,
                         lambda st, b: st == 200 and isinstance(b, dict) and b.get("success") is True)
        return {u: {"success": True, "message": f"reloaded {model_path}", "weight_version": weight_version} for u in urls}

    async def weight_versions(self, urls: list[str] | None = None) -> dict[str, str | None]:
        """Each worker's ``weight_version`` from ``GET /weight_info`` (``"default"`` until set).

        Raises:
            WeightSyncError: a worker did not answer 200.
            PolicyServerError: the router cannot list its workers.
        """
        answers = await self._each("weight_info", "GET", "/weight_info", None, urls)
        return {u: (None if not isinstance(b, dict) or b.get("weight_version") is None else str(b["weight_version"]))
                for u, b in answers.items()}

    async def abort(self, rid: str | None = None, urls: list[str] | None = None, quiet: bool = False) -> int:
        """``POST /abort_requests {"request_ids": ["generate-tokens-<rid>"]}`` (``{}``: every
        call) on every worker (or on ``urls``); returns how many answered 200 (vLLM answers 200
        for an id it does not hold, too). Failures are logged (WARNING, or DEBUG when ``quiet``),
        not raised: an abort is best effort. The aborted call answers ``finish_reason: abort``
        with its partial ids."""
        return await self._best_effort("/abort_requests", {"request_ids": [REQUEST_ID_PREFIX + rid]} if rid else {}, urls, quiet)

    async def server_info(self, urls: list[str] | None = None) -> dict[str, dict]:
        """Each worker's ``model_config`` from ``GET /server_info?config_format=json`` (``{}``
        where the answer has none).

        Raises:
            WeightSyncError: a worker did not answer 200 (404: not started with ``VLLM_SERVER_DEV_MODE=1``).
            PolicyServerError: the router cannot list its workers.
        """
        answers = await self._each("server_info", "GET", "/server_info?config_format=json", None, urls)
        out = {}
        for u, b in answers.items():
            cfg = b.get("vllm_config") if isinstance(b, dict) else None
            model = cfg.get("model_config") if isinstance(cfg, dict) else None
            out[u] = model if isinstance(model, dict) else {}
        return out


class VLLMWire:
    """vLLM's protocol (see the module docstring); a :class:`~rollout.core.policy.wire.WireProtocol`."""

    name = "vllm"
    generate_path = GENERATE_PATH
    routing_header = ROUTING_HEADER
    kv_metrics = VLLM_KV_METRICS
    reports_model_info = False

    def generate_body(self, input_ids: list[int] | np.ndarray, max_new_tokens: int, rid: str, seed: int | None,
                      sampling: SamplingConfig) -> dict:
        """``{"request_id": rid, "token_ids", "sampling_params": {temperature, top_p, top_k,
        max_tokens, stop, logprobs: 0, skip_special_tokens: false, seed?}}``."""
        sp: dict[str, Any] = {
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k,
            "max_tokens": max_new_tokens,
            "stop": list(sampling.stop),
            "logprobs": 0,  # the sampled id's log-prob only
            "skip_special_tokens": False,
        }
        if seed is not None:
            sp["seed"] = seed
        return {"request_id": rid, "token_ids": input_ids, "sampling_params": sp}

    def set_request_id(self, body: dict, rid: str) -> None:
        """``body["request_id"] = rid`` (vLLM names it ``generate-tokens-<rid>``)."""
        body["request_id"] = rid

    def read_request(self, body: dict) -> tuple[str, list[int]]:
        """``(body["request_id"], body["token_ids"])``."""
        return str(body["request_id"]), list(body["token_ids"])

    def parse_generate(self, data: dict) -> Generation:
        """:func:`parse_vllm_response`."""
        return parse_vllm_response(data)

    def admin(self, router_url: str, session: aiohttp.ClientSession, timeout_s: float = 300.0,
              api_key: str | None = None) -> EngineAdmin:
        """A :class:`VLLMAdmin` on ``router_url``."""
        return VLLMAdmin(router_url, session, timeout_s=timeout_s, api_key=api_key)

    async def check_servers(self, admin: EngineAdmin, policy: PolicyConfig) -> dict:
        """Every worker serves the RL routes (``VLLM_SERVER_DEV_MODE=1``: ``GET /server_info``
        answers) and reports the log-probs of what it samples: ``--logprobs-mode
        processed_logprobs``, or raw ones where :func:`raw_log_probs_exact` says they are the
        same. Returns ``{"model_path", "served_model_name", "max_model_len", "logprobs_mode",
        "weight_version", "workers"}`` (of the first worker).

        Raises:
            PolicyServerError: one line naming the worker and the flag to set.
        """
        assert isinstance(admin, VLLMAdmin)
        urls = await admin.worker_urls()
        if not urls:
            raise PolicyServerError(f"vllm-router {admin.router_url} lists no workers")
        try:
            models = await admin.server_info(urls)
            versions = await admin.weight_versions(urls)
        except WeightSyncError as e:
            raise PolicyServerError(f"{e} (start vLLM with VLLM_SERVER_DEV_MODE=1 for the RL routes: /server_info, /pause, "
                                    "/abort_requests, /collective_rpc)") from None
        s = policy.sampling
        for url, model in models.items():
            mode = model.get("logprobs_mode")
            if mode != PROCESSED_LOGPROBS and not raw_log_probs_exact(s):
                raise PolicyServerError(
                    f"vLLM worker {url} runs --logprobs-mode {mode}: its log-probs are not those of the distribution it "
                    f"samples at policy.sampling temperature={s.temperature:g} top_p={s.top_p:g} top_k={s.top_k}; "
                    f"start it with --logprobs-mode {PROCESSED_LOGPROBS}")
            if mode != PROCESSED_LOGPROBS:
                logger.info("vLLM worker %s runs --logprobs-mode %s: exact only because policy.sampling is plain "
                            "(temperature 0 or 1, no top-p, no top-k)", url, mode)
        first = models[urls[0]]
        return {"model_path": first.get("model"), "tokenizer_path": first.get("tokenizer"), "served_model_name": first.get("served_model_name"),
                "max_model_len": first.get("max_model_len"), "logprobs_mode": first.get("logprobs_mode"),
                "weight_version": versions.get(urls[0]), "workers": len(urls)}

    def __repr__(self) -> str:
        return "VLLM_WIRE"


VLLM_WIRE = VLLMWire()


class VLLMClient(HTTPPolicyClient):
    """The shared client (:class:`~rollout.core.policy.client.HTTPPolicyClient`, its arguments)
    speaking vLLM's ``/inference/v1/generate`` whatever ``policy.engine`` says (:data:`VLLM_WIRE`)."""

    WIRE = VLLM_WIRE
