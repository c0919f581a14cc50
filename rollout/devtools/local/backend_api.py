"""The seam between the local SGLang-protocol server and its generation backends.

A backend turns a prompt (token ids) into a stream of sampled tokens with their log-probs. The
server (``rollout.devtools.local.server``) owns everything protocol-level: ``max_new_tokens``, stop token
ids, stop strings, aborts, and the SGLang response format. A backend only samples, and
swaps its weights when the server's ``/update_weights_from_disk`` asks it to.

Backends: ``gold_replay`` / ``gold_replay_skip_write`` (``rollout.devtools.local.gold``) and ``tiny``
(``rollout.devtools.local.tiny``, needs torch).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Protocol


@dataclass(frozen=True)
class SamplingParams:
    """The subset of SGLang's ``sampling_params`` the local server honours.

    ``top_k == -1`` and ``top_p == 1.0`` mean no truncation; ``temperature == 0`` is greedy.
    ``seed`` is SGLang's ``sampling_seed`` (None: nondeterministic).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 128
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    seed: int | None = None
    extra: dict = field(default_factory=dict, compare=False)


class GenerationBackend(Protocol):
    """Samples tokens for one request.

    ``generate`` is a plain (synchronous) generator: the server runs it in a worker thread and
    stops iterating (closing the generator) as soon as a stop condition, ``max_new_tokens`` or an
    abort is reached. It must be safe to call from several threads at once (serialise internally
    if needed). The server runs at most one ``next()`` of any generator at a time (one backend
    step at a time, like SGLang's single scheduler) and calls :meth:`load_weights` only while no
    such step runs, but a ``chat`` call may overlap it, so the swap itself must be thread-safe. A
    generator paused between two steps may be resumed after a weight update and must then use
    the new weights.

    A backend may set ``tokens_per_step`` (an int, default 1 when absent): how many tokens the
    server takes from its generator per step. A model backend samples one token per forward pass
    and keeps 1; gold replay, whose tokens cost nothing, sets more, so that the server's per-step
    work (the step lock, the pause check) is not paid per token. Stop conditions are still checked
    token by token; a pause or an abort lands between two steps.
    """

    name: str

    def generate(self, input_ids: list[int], params: SamplingParams) -> Iterator[tuple[int, float]]:
        """Yield ``(token_id, log_prob)`` pairs, one per sampled token, in order.

        ``log_prob`` is the natural-log probability of the token under the distribution the
        policy sampled from (``log_softmax(logits / temperature)`` over the full vocabulary for a
        model; 0.0 for a deterministic policy). The generator may end by itself (e.g. after
        yielding EOS).
        """
        ...

    def chat(self, messages: list[dict], params: SamplingParams) -> str:
        """Answer an OpenAI-style chat (for ``/v1/chat/completions``) with plain text."""
        ...

    def load_weights(self, model_path: str) -> None:
        """Replace the policy's weights with those saved in the folder ``model_path``.

        Called for ``POST /update_weights_from_disk``. On success every later step (of new
        requests and of requests paused in place) uses the new weights; on failure it raises
        (any exception; the message should say what was wrong) and leaves the old weights in
        use. A backend without weights (gold replay) does nothing: only the server's weight
        version label changes.
        """
        ...
