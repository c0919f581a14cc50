"""The policy-client seam: what the episode loop needs from a policy, and what a policy returns.

:class:`PolicyClient` is the one method the episode loop (:func:`rollout.core.episode.run_episode`)
calls; :class:`Generation` is its answer; :class:`PolicyServerError` the one failure the loop
expects from it. :class:`~rollout.core.policy.sglang.SGLangClient` implements it over SGLang's
native HTTP API; a trainer that owns its inference engine implements it over its own calls
(docs/design.md, "Seams"). :func:`parse_generate_response` reads SGLang's native ``/generate``
answer into a :class:`Generation`, for any client that receives one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import numpy as np

__all__ = ["Generation", "PolicyClient", "PolicyServerError", "parse_generate_response", "read_weight_spans"]


class PolicyServerError(RuntimeError):
    """The router or a policy server failed (connection, 5xx, timeout, outage past
    ``policy.backend_outage_timeout_s``, malformed response, 4xx answer)."""


@dataclass
class Generation:
    """One ``/generate`` answer.

    Attributes:
        ids: generated token ids (length ``n``), as sampled by the server.
        log_probs: their rollout log-probs (length ``n``, natural log), as the server computed them.
        finish_type: ``stop`` | ``length`` | ``abort``.
        matched: the stop token id or stop string that ended generation, if any.
        text: the server's decoded text (informational only; never re-tokenized).
        meta: the server's ``meta_info`` minus the log-prob lists (ids, token counts, timings).
        weight_version: the server's ``meta_info["weight_version"]`` (a string; ``None`` if the
            server sent none).
        interrupted: the call ended with ``finish_type == "abort"`` because the pool paused
            generation for a weight update (see :class:`~rollout.core.policy.resilience.GenerationGate`),
            not for another reason.
        weight_spans: ``None`` when every id was sampled by ``weight_version``; else the call
            crossed a weight update (a pause that kept the request: vLLM's ``/pause?mode=keep``,
            SGLang's ``retract`` / ``in_place``) and this lists ``(start, end, version)`` over
            ``ids``, in order, covering them (``weight_version`` is then the last span's).
    """

    ids: list[int]
    log_probs: list[float]
    finish_type: str
    matched: int | str | None = None
    text: str = ""
    meta: dict = field(default_factory=dict)
    weight_version: str | None = None
    interrupted: bool = False
    weight_spans: list[tuple[int, int, str | None]] | None = None

    def pieces(self) -> list[tuple[list[int], list[float], str | None]]:
        """``(ids, log_probs, weight_version)`` per weight version, in order: one piece, or one
        per span of :attr:`weight_spans` (what the trajectory records as separate spans, so that
        every token keeps the version that sampled it)."""
        if not self.weight_spans:
            return [(self.ids, self.log_probs, self.weight_version)]
        return [(self.ids[a:b], self.log_probs[a:b], v) for a, b, v in self.weight_spans]


@runtime_checkable
class PolicyClient(Protocol):
    """The policy seam: what the episode loop needs from a policy, one method.

    ``await generate(input_ids, max_new_tokens, rid, routing_key, seed)`` samples one assistant
    turn after ``input_ids`` and returns a :class:`Generation`.
    :class:`~rollout.core.policy.sglang.SGLangClient` does it over SGLang's native HTTP API. A
    trainer that owns its inference engine (verl's async server manager, AReaL's engine) writes
    a class with this method over its own calls and passes an instance to
    :func:`rollout.core.episode.run_episode`; the trajectories are exact (docs/design.md
    invariant 1) if it keeps this contract:

    * **Token ids in.** ``input_ids`` is the whole trajectory so far (the prompt, every earlier
      turn, the deltas between them), a list of ints or a 1-D integer numpy array. Sample after
      exactly these ids: never decode them and re-tokenize, nor apply a chat template (each call
      extends the previous call's ids, so an engine's prefix cache hits).
    * **Ids and log-probs out.** ``ids`` are the sampled token ids, at most ``max_new_tokens``,
      exactly as sampled: an end-of-turn or EOS token the model sampled stays in (the loop tells
      a closed turn by it), and tokens of a matched stop string stay in (SGLang:
      ``no_stop_trim``). ``log_probs`` has one entry per id: the sampling engine's natural-log
      probability of that id (the rollout log-probs a trainer uses for importance ratios). A
      missing log-prob is a failure (raise :class:`PolicyServerError`), never 0.0.
    * **Finish type.** ``finish_type`` is ``"stop"`` (an EOS or stop token, or a stop string),
      ``"length"`` (``max_new_tokens`` reached: the loop applies ``policy.on_length``) or
      ``"abort"`` (the engine aborted the request). A turn that does not end with the format's
      end-of-turn ids is closed by the loop (mask 0), whatever the finish type.
    * **Weight version.** ``weight_version``: the version of the weights that sampled the ids (a
      string, e.g. the trainer's step), or ``None`` if unknown; recorded per call in the
      sample's ``weight_versions`` and used for ``rollout.max_staleness``. A call whose ids were
      sampled by two versions (the engine kept it through a weight update) says which ids each
      sampled in ``weight_spans``; the loop records each span with its own version.
    * **Interruptions by a weight update.** When the trainer pauses generation to load new
      weights and the engine aborts a request that was out, return what it had sampled so far
      (possibly nothing) with ``finish_type="abort"`` and ``interrupted=True``, rather than
      raising. The loop then applies ``rollout.partial_rollout``: ``continue`` keeps those
      tokens (mask 1, their log-probs and version) and calls ``generate`` again for the rest of
      the turn, with a new ``rid`` and the kept ids appended to ``input_ids``; ``restart_turn``
      discards them and samples the turn again; ``drop`` ends the episode ``aborted``. So a call
      must not be sent while the update is in progress: :class:`~rollout.core.policy.sglang.SGLangClient` waits at its
      :class:`~rollout.core.policy.resilience.GenerationGate` before every attempt (the pool
      closes the gate before it pauses the servers and opens it after they continue) and marks
      an ``abort`` answer ``interrupted`` when the gate closed while the attempt was out. A
      trainer's client does the same with its own pause signal. An ``abort`` with
      ``interrupted=False`` ends the episode ``aborted``.
    * **Failures.** Raise :class:`PolicyServerError` when the backend failed and the client has
      given up (after its own retries): the episode ends ``policy_error``, an infrastructure
      failure that is never trained on. Anything else raised leaves :func:`run_episode` (the
      worker records the episode as crashed).
    * **Arguments.** ``rid`` is unique per call (``{episode_id}@{attempt}#{n}``; a client that
      retries needs a fresh id per attempt, e.g. ``<rid>.r1``) and names the request to abort;
      ``routing_key`` is the episode id (for session affinity: a client keeps an episode's calls
      on one worker; :class:`~rollout.core.policy.sglang.SGLangClient` sends the key
      ``policy.routing`` names, the episode's group id by default); ``seed``, when not ``None``, is the call's sampling seed.
    * **Concurrency.** The loop calls ``generate`` from one asyncio event loop, for many
      episodes at once; it must not block that loop (tokenizer or network work belongs in an
      awaitable or a thread).
    """

    async def generate(self, input_ids: list[int] | np.ndarray, max_new_tokens: int, rid: str, routing_key: str, seed: int | None = None) -> Generation:
        """Sample one assistant turn after ``input_ids`` (at most ``max_new_tokens`` new tokens).

        Raises:
            PolicyServerError: the policy backend failed (see the class).
        """
        ...


def read_weight_spans(spans: Any, n: int, where: str) -> list[tuple[int, int, str | None]]:
    """An answer's weight-version spans (``[{"version", "start", "end"}, ...]``, what vLLM's
    ``choices[0].weight_versions`` and SGLang's ``meta_info.weight_versions`` hold) as
    ``(start, end, version)``, checked to cover the ``n`` generated ids ``[0, n)`` in order.

    Args:
        spans: the decoded spans; ``None`` (or ``[]`` for a call that sampled nothing): none reported.
        n: how many ids the answer holds.
        where: the answer's route, for the message (``/generate``).

    Returns:
        The spans, or ``[]`` when none were reported.

    Raises:
        PolicyServerError: not a list of spans, a span without ``start``, ``end`` or ``version``,
            or spans that do not cover the ids in order.
    """
    if spans is None or (spans == [] and n == 0):
        return []
    if not isinstance(spans, list) or not spans:
        raise PolicyServerError(f"malformed {where} response: weight_versions must be a list of spans over the {n} ids, got {spans!r}")
    out, at = [], 0
    for sp in spans:
        try:
            a, b, v = int(sp["start"]), int(sp["end"]), sp["version"]
        except (KeyError, TypeError, ValueError):
            raise PolicyServerError(f"malformed {where} response: weight_versions span {sp!r} lacks start, end or version") from None
        if a != at or b < a:
            raise PolicyServerError(f"malformed {where} response: weight_versions spans {spans!r} do not cover the {n} ids in order")
        out.append((a, b, None if v is None else str(v)))
        at = b
    if at != n:
        raise PolicyServerError(f"malformed {where} response: weight_versions spans {spans!r} end at {at}, not at the {n} ids")
    return out


def parse_generate_response(body: dict) -> Generation:
    """Read ids and log-probs from a ``/generate`` response body.

    Args:
        body: the decoded JSON answer (``{"text", "output_ids"?, "meta_info": {...}}``).

    Returns:
        A :class:`Generation` whose ``ids`` and ``log_probs`` (length ``n`` each) come from
        ``meta_info.output_token_logprobs`` (``[[logprob, token_id, text], ...]``); input log-probs
        are not read. ``weight_version`` is ``meta_info.weight_version``; where the server reports
        ``meta_info.weight_versions`` (SGLang since its weight-version spans, e.g. 0.5.23), the
        last span's, and ``weight_spans`` lists them when a weight update split the call.

    Raises:
        PolicyServerError: the body lacks ``meta_info.output_token_logprobs``, a generated token's
            log-prob is ``null`` or not a number, the ids disagree with ``output_ids``, or the
            spans do not cover the ids (:func:`read_weight_spans`).
    """
    try:
        meta = body["meta_info"]
        fr = meta.get("finish_reason") or {}
        finish_type = fr.get("type", "stop") if isinstance(fr, dict) else str(fr)
        pairs = meta["output_token_logprobs"]
        ids = [int(p[1]) for p in pairs]
        lps: list[float] = []
        for i, p in enumerate(pairs):
            if p[0] is None:
                raise PolicyServerError(f"malformed /generate response: null log-prob for generated token {i} (id {ids[i]})")
            lps.append(float(p[0]))
    except (KeyError, TypeError, IndexError, ValueError, AttributeError) as e:
        raise PolicyServerError(f"malformed /generate response (need meta_info.output_token_logprobs): {e!r}") from None
    out_ids = body.get("output_ids")
    if out_ids is not None and list(out_ids) != ids:
        raise PolicyServerError("output_ids disagree with output_token_logprobs")
    meta = {k: v for k, v in meta.items() if k not in ("output_token_logprobs", "input_token_logprobs")}
    spans = read_weight_spans(meta.get("weight_versions"), len(ids), "/generate")
    version = spans[-1][2] if spans else meta.get("weight_version")
    return Generation(
        ids=ids, log_probs=lps, finish_type=finish_type, matched=fr.get("matched") if isinstance(fr, dict) else None,
        text=body.get("text", ""), meta=meta, weight_version=None if version is None else str(version),
        weight_spans=spans if len(spans) > 1 else None,
    )
