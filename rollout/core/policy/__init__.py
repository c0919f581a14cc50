"""The policy client: token-in / token-out ``/generate`` calls to an SGLang router, and the
workers' RL endpoints (pause, continue, weight updates). :class:`PolicyClient` is the seam the
episode loop uses; :class:`SGLangClient` is the HTTP client for SGLang's native protocol."""

from rollout.core.policy.sglang import (
    ABORT_TIMEOUT_S,
    OUTAGE_STATUSES,
    ROUTING_HEADER,
    BackendBreaker,
    Generation,
    GenerationGate,
    PolicyClient,
    PolicyServerError,
    RouterAdmin,
    SGLangClient,
    WeightSyncError,
    api_key_from_env,
    parse_generate_response,
)

__all__ = ["ABORT_TIMEOUT_S", "OUTAGE_STATUSES", "ROUTING_HEADER", "BackendBreaker", "Generation", "GenerationGate", "PolicyClient",
           "PolicyServerError", "RouterAdmin", "SGLangClient", "WeightSyncError", "api_key_from_env", "parse_generate_response"]
