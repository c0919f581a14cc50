"""Our :class:`~rollout.core.policy.PolicyClient` over verl's server manager (token in, token out).

verl hands each agent loop a server manager, ``verl.workers.rollout.llm_server.LLMServerClient``
(or its ``FullyAsyncLLMServerClient``), whose one call is::

    await server_manager.generate(request_id, *, prompt_ids, sampling_params, ...) -> TokenOutput

``TokenOutput`` (``verl/workers/rollout/replica.py``) has ``token_ids``, ``log_probs`` (``None``
unless ``sampling_params["logprobs"]`` is true), ``stop_reason`` and ``extra_fields`` (the
server's ``global_steps``: the weight version verl loaded; the fully async client adds
``min_global_steps`` / ``max_global_steps``). Facts read in verl 0.9.1's source:

* ``request_id`` is verl's sticky-session key: its load balancer sends every call with the same
  id to the same server (prefix cache), and the client sends each call to the server under a
  fresh id of its own (``llm_server.py``: ``_acquire_server``, ``_vllm_request_id``). verl's own
  ``ToolAgentLoop`` passes one id for a whole conversation; :class:`VerlPolicyClient` passes the
  episode id (our ``routing_key``).
* ``stop_reason``: SGLang's server (``sglang_rollout/async_sglang_server.py``) returns SGLang's
  finish type, ``"stop"``, ``"length"`` or ``"abort"``; vLLM's (``vllm_rollout/vllm_async_server.py``)
  ``"completed"`` for stop and length alike, or ``"aborted"``; the fully async client sets
  ``"length"`` when its budget is spent. ``None`` is unknown.
* ``max_new_tokens`` in ``sampling_params`` is honoured by both servers (vLLM reads it as
  ``max_tokens``); ``logprobs`` true asks for the sampled tokens' log-probs.
* verl's SGLang server runs with ``skip_tokenizer_init=True`` by default (``workers/config/rollout.py``),
  so stop *strings* cannot be matched there: stop strings that are one token in the vocabulary
  (``</tool_call>`` in Qwen3's) are sent as ``stop_token_ids`` instead (what verl's
  ``ToolAgentLoop`` does with its tool parser's stop tokens); the others are left to the model's
  end of turn, and logged once.
* Per-request seeds: SGLang's key is ``sampling_seed``, vLLM's ``seed``.

An ``abort`` from verl's server is not a weight-update interruption we can continue: verl's fully
async client already resumes those inside ``generate``, and an abort that still comes back is one
verl drops. So it is returned with ``interrupted=False`` and the episode ends ``aborted`` (an
infrastructure failure, not trained). Any exception from the server manager (a Ray error, no
server available, a prompt longer than the server's context) is a :class:`PolicyServerError`: the
episode ends ``policy_error``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from rollout.core.policy import Generation, PolicyServerError
from rollout.integrations.episodes import single_token_stop_ids, warn_unmatched_stops

logger = logging.getLogger(__name__)

__all__ = ["VerlPolicyClient", "finish_type", "single_token_stop_ids", "warn_unmatched_stops"]

_ABORT = frozenset({"abort", "aborted"})
_SEED_KEY = {"sglang": "sampling_seed", "vllm": "seed"}


def finish_type(stop_reason: str | None, n_ids: int, max_new_tokens: int, last_is_stop: bool) -> str:
    """Our ``finish_type`` (``stop`` | ``length`` | ``abort``) for verl's ``TokenOutput.stop_reason``.

    ``"completed"`` (vLLM) and ``None`` do not tell a stop from a length cut: it is ``length`` when
    the call used its whole budget without ending on a stop or end-of-turn id, else ``stop``.

    Args:
        stop_reason: ``TokenOutput.stop_reason``.
        n_ids: how many ids the call returned.
        max_new_tokens: the call's budget.
        last_is_stop: the last id is an end-of-turn, EOS or stop id.
    """
    reason = (stop_reason or "").lower()
    if reason in _ABORT:
        return "abort"
    if reason == "length":
        return "length"
    if reason == "stop":
        return "stop"
    return "length" if n_ids >= max_new_tokens and not last_is_stop else "stop"


class VerlPolicyClient:
    """A :class:`~rollout.core.policy.PolicyClient` over verl's server manager, for one episode.

    Args:
        server_manager: verl's ``LLMServerClient`` (what ``AgentLoopBase.server_manager`` holds),
            or any object with its ``generate(request_id, *, prompt_ids, sampling_params)``.
        sampling_params: the sampling parameters verl gave the agent loop (``temperature``,
            ``top_p``, ``top_k``, ``repetition_penalty``, ``logprobs``); copied for every call,
            with ``logprobs`` forced on (our samples carry rollout log-probs), ``max_new_tokens``
            set to the loop's per-call budget and ``stop_token_ids`` extended.
        stop_token_ids: ids that end a turn (:func:`single_token_stop_ids` of ``policy.sampling.stop``).
        end_ids: ids after which a call that used its whole budget still counts as stopped (the
            chat format's end-of-turn ids, EOS); used only when the server does not say.
        backend: verl's ``actor_rollout_ref.rollout.name`` (``sglang``, ``vllm``, ...): picks the
            key a per-call seed is sent under (none for other backends).
        send_seed: send the loop's per-call seed (our pool does; reproducible episodes).

    Attributes:
        versions: ``(min, max)`` of verl's ``global_steps`` over the calls so far (``None`` until
            a call reported one); verl's own loops report them as ``min_global_steps`` /
            ``max_global_steps``.
        calls: how many ``generate`` calls returned.
        preempted: the sum of the calls' ``num_preempted`` (verl's metric), or ``-1`` if no call
            reported one.

    Raises (from :meth:`generate`):
        PolicyServerError: the server manager raised, or answered without a log-prob per id.
    """

    def __init__(self, server_manager: Any, sampling_params: Mapping[str, Any], *, stop_token_ids: Iterable[int] = (),
                 end_ids: Iterable[int] = (), backend: str = "sglang", send_seed: bool = True):
        self.server_manager = server_manager
        base = {k: v for k, v in dict(sampling_params).items() if k not in ("max_tokens", "max_new_tokens")}
        base["logprobs"] = True
        stops = [int(t) for t in base.pop("stop_token_ids", None) or []]
        for t in stop_token_ids:
            if int(t) not in stops:
                stops.append(int(t))
        if stops:
            base["stop_token_ids"] = stops
        self._base = base
        self._end = set(stops) | {int(t) for t in end_ids}
        self._seed_key = _SEED_KEY.get(str(backend)) if send_seed else None
        self.versions: tuple[int, int] | None = None
        self.calls = 0
        self.preempted = -1

    def sampling_params(self, max_new_tokens: int, seed: int | None) -> dict[str, Any]:
        """The ``sampling_params`` of one call (a fresh dict: verl's servers pop keys from it)."""
        sp = dict(self._base)
        if "stop_token_ids" in sp:
            sp["stop_token_ids"] = list(sp["stop_token_ids"])
        sp["max_new_tokens"] = int(max_new_tokens)
        if seed is not None and self._seed_key is not None:
            sp[self._seed_key] = int(seed)
        return sp

    async def generate(self, input_ids, max_new_tokens: int, rid: str, routing_key: str, seed: int | None = None) -> Generation:
        """One call of verl's ``server_manager.generate`` (see the module docstring).

        Args:
            input_ids: the trajectory so far (list or 1-D integer array).
            max_new_tokens: the call's budget (> 0).
            rid: our request id (recorded in ``Generation.meta``; verl picks its own server ids).
            routing_key: the episode id, sent as verl's sticky-session ``request_id``.
            seed: the call's sampling seed (sent when ``send_seed`` and the backend has a key).

        Returns:
            A :class:`Generation`: ids and log-probs as the server returned them, ``finish_type``
            by :func:`finish_type`, ``weight_version`` = ``str(global_steps)`` (``None`` if absent),
            ``interrupted=False``.

        Raises:
            PolicyServerError: the server manager raised, or the log-probs are missing or misaligned.
        """
        prompt = [int(t) for t in input_ids]
        try:
            out = await self.server_manager.generate(request_id=routing_key, prompt_ids=prompt,
                                                     sampling_params=self.sampling_params(max_new_tokens, seed))
        except Exception as e:  # Ray errors, no server, a prompt past the server's context: the backend failed
            raise PolicyServerError(f"verl server manager generate failed: {e!r}") from e
        ids = [int(t) for t in (getattr(out, "token_ids", None) or [])]
        lps = getattr(out, "log_probs", None)
        if lps is None or len(lps) != len(ids) or any(lp is None for lp in lps):
            raise PolicyServerError(f"verl server answered {len(ids)} ids with {'no' if lps is None else len(lps)} log-probs "
                                    "(the sampling parameters ask for them: logprobs=True)")
        extra = dict(getattr(out, "extra_fields", None) or {})
        self._note_versions(extra)
        n_pre = getattr(out, "num_preempted", None)
        if n_pre is not None:
            self.preempted = max(self.preempted, 0) + int(n_pre)
        self.calls += 1
        stop_reason = getattr(out, "stop_reason", None)
        fin = finish_type(stop_reason, len(ids), max_new_tokens, bool(ids) and ids[-1] in self._end)
        steps = extra.get("global_steps")
        meta = {"rid": rid, "stop_reason": stop_reason, "completion_tokens": len(ids)}
        return Generation(ids=ids, log_probs=[float(x) for x in lps], finish_type=fin, meta=meta,
                          weight_version=None if steps is None else str(steps), interrupted=False)

    def _note_versions(self, extra: dict[str, Any]) -> None:
        lo = extra.get("min_global_steps", extra.get("global_steps"))
        hi = extra.get("max_global_steps", extra.get("global_steps"))
        if lo is None or hi is None:
            return
        lo, hi = int(lo), int(hi)
        self.versions = (lo, hi) if self.versions is None else (min(self.versions[0], lo), max(self.versions[1], hi))
