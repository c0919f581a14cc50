"""The policy client: token-in / token-out generate calls, and the workers' RL endpoints (pause,
continue, weight updates), for SGLang and vLLM.

:class:`PolicyClient` (:mod:`~rollout.core.policy.protocol`, with :class:`Generation` and
:class:`PolicyServerError`) is the seam the episode loop uses; a trainer's own client implements
it. :class:`HTTPPolicyClient` (:mod:`~rollout.core.policy.client`) is the HTTP client for the
engine ``policy.engine`` names, whose wire protocol (:class:`WireProtocol`,
:mod:`~rollout.core.policy.wire`) is the only part that differs: SGLang's native protocol
(:mod:`~rollout.core.policy.sglang`, :class:`SGLangClient`) or vLLM's
(:mod:`~rollout.core.policy.vllm`, :class:`VLLMClient`). :class:`GenerationGate` and
:class:`BackendBreaker` (:mod:`~rollout.core.policy.resilience`) hold its calls during a weight
update and a backend outage; :class:`EngineAdmin` (:mod:`~rollout.core.policy.admin`; SGLang's
:class:`RouterAdmin`, vLLM's :class:`VLLMAdmin`) and :class:`WeightSyncError` are the RL endpoints
behind the router; :func:`api_key_from_env` (:mod:`~rollout.core.policy.auth`) reads the API key."""

from rollout.core.policy.admin import EngineAdmin, RouterAdmin, WeightSyncError, WorkerAdmin
from rollout.core.policy.auth import api_key_from_env
from rollout.core.policy.client import ABORT_TIMEOUT_S, OUTAGE_STATUSES, HTTPPolicyClient
from rollout.core.policy.protocol import Generation, PolicyClient, PolicyServerError, parse_generate_response
from rollout.core.policy.resilience import BackendBreaker, GenerationGate
from rollout.core.policy.sglang import ROUTING_HEADER, SGLANG_WIRE, SGLangClient
from rollout.core.policy.vllm import VLLM_WIRE, VLLMAdmin, VLLMClient, parse_vllm_response
from rollout.core.policy.wire import RetryableAnswer, WireProtocol

__all__ = ["ABORT_TIMEOUT_S", "OUTAGE_STATUSES", "ROUTING_HEADER", "SGLANG_WIRE", "VLLM_WIRE", "BackendBreaker", "EngineAdmin",
           "Generation", "GenerationGate", "HTTPPolicyClient", "PolicyClient", "PolicyServerError", "RetryableAnswer", "RouterAdmin",
           "SGLangClient", "VLLMAdmin", "VLLMClient", "WeightSyncError", "WireProtocol", "WorkerAdmin", "api_key_from_env",
           "parse_generate_response", "parse_vllm_response"]
