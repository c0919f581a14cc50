"""The wire seam: what differs between two engines' token-in / token-out HTTP protocols, and
nothing else.

:class:`~rollout.core.policy.client.HTTPPolicyClient` does everything an engine's client must do
whatever the engine (retries with fresh request ids, the backend breaker, the generation gate, the
KV gate, in-flight tracking, aborts of earlier attempts, the API key); a :class:`WireProtocol`
says how this engine spells it: the generate route and its request body, how its answer reads
into a :class:`~rollout.core.policy.protocol.Generation`, where the request id goes, which header
keeps a routing key on one worker, the ``/metrics`` names the KV gate reads, and the control
endpoints (:meth:`WireProtocol.admin`, an :class:`~rollout.core.policy.admin.EngineAdmin`).

Two are built in, registered by name in :data:`rollout.core.policy_engines.POLICY_ENGINES` and
selected by ``policy.engine``: ``sglang`` (:data:`rollout.core.policy.sglang.SGLANG_WIRE`) and
``vllm`` (:data:`rollout.core.policy.vllm.VLLM_WIRE`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from rollout.core.policy.protocol import PolicyServerError

if TYPE_CHECKING:
    import aiohttp
    import numpy as np

    from rollout.core.config import PolicyConfig, SamplingConfig
    from rollout.core.policy.admin import EngineAdmin
    from rollout.core.policy.kvreadings import KVMetrics
    from rollout.core.policy.protocol import Generation

__all__ = ["RetryableAnswer", "WireProtocol"]


class RetryableAnswer(PolicyServerError):
    """A 200 answer that says this request failed on the server but another attempt may not
    (vLLM's ``finish_reason: "error"``): the client spends a retry on it, as on a 5xx."""


@runtime_checkable
class WireProtocol(Protocol):
    """One engine's HTTP protocol, as the shared client and control plane need it.

    Attributes:
        name: the ``policy.engine`` name (``sglang``, ``vllm``).
        generate_path: the token-in / token-out route on the router and on each worker
            (``/generate``, ``/inference/v1/generate``).
        routing_header: the header whose value the router keeps on one worker (``policy.routing``:
            the group or episode id): ``X-SMG-Routing-Key`` (sglang-router ``--policy manual``),
            ``X-Session-ID`` (vllm-router ``--policy consistent_hash``).
        kv_metrics: where the workers' ``/metrics`` hold the KV gate's figures.
        reports_model_info: the router serves SGLang's ``GET /get_model_info`` (the preflight's
            router check reads the served model there; otherwise :meth:`check_servers` tells it).
    """

    name: str
    generate_path: str
    routing_header: str
    kv_metrics: KVMetrics
    reports_model_info: bool

    def generate_body(self, input_ids: list[int] | np.ndarray, max_new_tokens: int, rid: str, seed: int | None,
                      sampling: SamplingConfig) -> dict:
        """The request body of one call: token ids in, ``max_new_tokens`` at most, the sampling
        parameters of ``policy.sampling`` (stop strings kept in the ids, special tokens not
        skipped), the sampled ids' log-probs asked for, ``seed`` when not ``None``, request id ``rid``."""
        ...

    def set_request_id(self, body: dict, rid: str) -> None:
        """Put an attempt's request id ``rid`` into ``body`` (retries send ``<rid>.r1``, ...)."""
        ...

    def read_request(self, body: dict) -> tuple[str, list[int]]:
        """``(request id, prompt ids)`` of a generate body this wire wrote (for a proxy that
        records the calls, e.g. the exactness check's).

        Raises:
            KeyError, TypeError: ``body`` is not such a body.
        """
        ...

    def parse_generate(self, data: dict) -> Generation:
        """The :class:`Generation` of a 200 answer's decoded JSON object.

        Raises:
            RetryableAnswer: the answer says the request failed on the server (retried).
            PolicyServerError: the answer is malformed (a missing or ``null`` log-prob, ids that
                disagree, a finish reason the loop cannot read); not retried.
        """
        ...

    def admin(self, router_url: str, session: aiohttp.ClientSession, timeout_s: float = 300.0,
              api_key: str | None = None) -> EngineAdmin:
        """The control plane of the workers behind ``router_url`` (pause, resume, weight updates,
        weight versions, aborts), on ``session``."""
        ...

    async def check_servers(self, admin: EngineAdmin, policy: PolicyConfig) -> dict:
        """Check, once the servers are up, that they can serve ``policy`` exactly; return what
        they report of the served model (``model_path``, ``weight_version``, ...; ``{}``: nothing
        beyond the router check's).

        Raises:
            PolicyServerError: one line naming the worker and the flag or key to change.
        """
        ...
