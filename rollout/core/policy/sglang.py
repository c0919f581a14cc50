"""SGLang's wire protocol (``policy.engine: sglang``): its native ``/generate`` API, token in,
token out, and :class:`SGLangClient`, the shared client
(:class:`~rollout.core.policy.client.HTTPPolicyClient`) fixed to it.

* **Request** (:meth:`SGLangWire.generate_body`): ``{"input_ids", "sampling_params":
  {temperature, top_p, top_k, max_new_tokens, stop, skip_special_tokens: false, no_stop_trim:
  true, sampling_seed?}, "return_logprob": true, "rid"}``; the request id is ``rid``.
* **Answer** (:func:`~rollout.core.policy.protocol.parse_generate_response`): the ids and their
  log-probs from ``meta_info.output_token_logprobs`` (``[[logprob, token_id, text], ...]``),
  ``meta_info.finish_reason.{type, matched}``, ``meta_info.weight_version`` and, where the server
  reports them, ``meta_info.weight_versions`` spans (one per version that sampled the ids).
* **Routing**: the header ``X-SMG-Routing-Key`` (sglang-router ``--policy manual``).
* **Control** (:class:`~rollout.core.policy.admin.RouterAdmin`): ``/pause_generation``,
  ``/continue_generation``, ``/update_weights_from_disk``, ``/model_info``, ``/abort_request`` on
  every worker.
* **KV metrics** (:data:`~rollout.core.policy.kvreadings.SGLANG_KV_METRICS`):
  ``sglang:token_usage``, ``sglang:num_retracted_requests_total``, ``sglang:max_total_num_tokens``.

The retries, the breaker, the gates, in-flight tracking and the API key are the shared client's
(its module docstring); this module names only what SGLang spells its own way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import aiohttp

from rollout.core.config import PolicyConfig, SamplingConfig
from rollout.core.policy.admin import EngineAdmin, RouterAdmin, WeightSyncError
from rollout.core.policy.auth import api_key_from_env
from rollout.core.policy.client import ABORT_TIMEOUT_S, OUTAGE_STATUSES, HTTPPolicyClient
from rollout.core.policy.kvreadings import SGLANG_KV_METRICS
from rollout.core.policy.protocol import Generation, PolicyClient, PolicyServerError, parse_generate_response
from rollout.core.policy.resilience import BackendBreaker, GenerationGate

if TYPE_CHECKING:
    import numpy as np

# The client's names, and (re-exported) those that lived here before the policy package was split.
__all__ = ["ABORT_TIMEOUT_S", "OUTAGE_STATUSES", "ROUTING_HEADER", "SGLANG_WIRE", "BackendBreaker", "Generation", "GenerationGate",
           "PolicyClient", "PolicyServerError", "RouterAdmin", "SGLangClient", "SGLangWire", "WeightSyncError", "api_key_from_env",
           "parse_generate_response"]

ROUTING_HEADER = "X-SMG-Routing-Key"


class SGLangWire:
    """SGLang's native protocol (see the module docstring); a
    :class:`~rollout.core.policy.wire.WireProtocol`."""

    name = "sglang"
    generate_path = "/generate"
    routing_header = ROUTING_HEADER
    kv_metrics = SGLANG_KV_METRICS
    reports_model_info = True

    def generate_body(self, input_ids: list[int] | np.ndarray, max_new_tokens: int, rid: str, seed: int | None,
                      sampling: SamplingConfig) -> dict:
        """``{"input_ids", "sampling_params", "return_logprob": true, "rid"}``; ``sampling_params``
        from ``sampling`` with ``max_new_tokens``, ``no_stop_trim`` (a matched stop string's
        tokens stay in the ids), ``skip_special_tokens: false`` and, if not ``None``, ``sampling_seed``."""
        sp = {
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k,
            "max_new_tokens": max_new_tokens,
            "stop": list(sampling.stop),
            "skip_special_tokens": False,
            "no_stop_trim": True,
        }
        if seed is not None:
            sp["sampling_seed"] = seed
        return {"input_ids": input_ids, "sampling_params": sp, "return_logprob": True, "rid": rid}

    def set_request_id(self, body: dict, rid: str) -> None:
        """``body["rid"] = rid``."""
        body["rid"] = rid

    def read_request(self, body: dict) -> tuple[str, list[int]]:
        """``(body["rid"], body["input_ids"])``."""
        return str(body["rid"]), list(body["input_ids"])

    def parse_generate(self, data: dict) -> Generation:
        """:func:`~rollout.core.policy.protocol.parse_generate_response` (raises
        :class:`PolicyServerError` on a malformed answer)."""
        return parse_generate_response(data)

    def admin(self, router_url: str, session: aiohttp.ClientSession, timeout_s: float = 300.0,
              api_key: str | None = None) -> EngineAdmin:
        """A :class:`~rollout.core.policy.admin.RouterAdmin` on ``router_url``."""
        return RouterAdmin(router_url, session, timeout_s=timeout_s, api_key=api_key)

    async def check_servers(self, admin: EngineAdmin, policy: PolicyConfig) -> dict:
        """``{}``: the preflight's router check reads SGLang's model info itself
        (``GET /get_model_info``, :attr:`reports_model_info`)."""
        return {}

    def __repr__(self) -> str:
        return "SGLANG_WIRE"


SGLANG_WIRE = SGLangWire()


class SGLangClient(HTTPPolicyClient):
    """The shared client (:class:`~rollout.core.policy.client.HTTPPolicyClient`, its arguments)
    speaking SGLang's native ``/generate`` whatever ``policy.engine`` says (:data:`SGLANG_WIRE`)."""

    WIRE = SGLANG_WIRE
