"""The policy client: token-in / token-out ``/generate`` calls, and the workers' RL endpoints
(pause, continue, weight updates).

:class:`PolicyClient` (:mod:`~rollout.core.policy.protocol`, with :class:`Generation` and
:class:`PolicyServerError`) is the seam the episode loop uses; a trainer's own client implements
it. :class:`SGLangClient` (:mod:`~rollout.core.policy.sglang`) is the HTTP client for SGLang's native
protocol; :class:`GenerationGate` and :class:`BackendBreaker` (:mod:`~rollout.core.policy.resilience`)
hold its calls during a weight update and a backend outage; :class:`RouterAdmin` and
:class:`WeightSyncError` (:mod:`~rollout.core.policy.admin`) are the RL endpoints behind the router;
:func:`api_key_from_env` (:mod:`~rollout.core.policy.auth`) reads the API key."""

from rollout.core.policy.admin import RouterAdmin, WeightSyncError
from rollout.core.policy.auth import api_key_from_env
from rollout.core.policy.protocol import Generation, PolicyClient, PolicyServerError, parse_generate_response
from rollout.core.policy.resilience import BackendBreaker, GenerationGate
from rollout.core.policy.sglang import ABORT_TIMEOUT_S, OUTAGE_STATUSES, ROUTING_HEADER, SGLangClient

__all__ = ["ABORT_TIMEOUT_S", "OUTAGE_STATUSES", "ROUTING_HEADER", "BackendBreaker", "Generation", "GenerationGate", "PolicyClient",
           "PolicyServerError", "RouterAdmin", "SGLangClient", "WeightSyncError", "api_key_from_env", "parse_generate_response"]
