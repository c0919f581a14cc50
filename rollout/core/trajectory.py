"""The token record an episode builds while it runs (docs/design.md invariant 1).

:class:`Trajectory` holds one episode's prompt and response ids with their loss mask, rollout
log-probs, per-call weight versions and generation spans, and its segments
(``policy.history=rerender``, a compaction); :func:`check_spans`, :func:`check_segments` and
:func:`turn_calls` read those spans and segments wherever a record is checked or cut into turns
(:mod:`rollout.core.records`, :mod:`rollout.core.sample_modes`).
"""

from __future__ import annotations

import array
from dataclasses import dataclass, field

import numpy as np


class TrajectoryError(ValueError):
    """Raised when an append would break token / mask / log-prob alignment."""


@dataclass
class Trajectory:
    """Token record of one episode (docs/design.md invariant 1).

    ``prompt_ids`` is the first request's prompt. Every later token is appended either as
    *generated* (sampled by the policy: mask 1, its rollout log-prob) or as *context* (template
    tokens, tool results, user turns, turn-boundary repairs: mask 0, log-prob 0.0). The three
    response lists always have the same length.

    Each ``/generate`` call is recorded once, in order (a call whose ids two weight versions
    sampled, ``Generation.weight_spans``, once per version, its spans adjacent): ``weight_versions[j]`` is the server's
    ``meta_info["weight_version"]`` for call ``j`` (``None`` if the server sent none) and
    ``generation_spans[j] == (start, end)`` are the response indices of the tokens call ``j``
    sampled (``end - start`` tokens; empty when it sampled none or its tokens were discarded).
    The spans are disjoint, in order, and cover exactly the positions whose mask is 1, so every
    sampled token's weight version is known (slime's ``Sample.weight_versions``, made per token).

    Append-only but for :meth:`discard_from` (the tail of an unfinished turn, ``restart_turn``).

    *Segments*: when a turn's prompt does not extend the tokens so far (``policy.history=rerender``
    after a re-render that changed earlier text, or a compaction by ``policy.context_strategy``),
    :meth:`start_segment` appends the new prompt as context and records where it starts
    (``segment_starts``: response indices, in order). Each segment is one append-only sequence
    the policy was given; the record is their concatenation, which is never trained on as one
    sequence: the sample modes cut it into its segments (:mod:`rollout.core.sample_modes`).
    :meth:`context_array` is the live segment, what the next ``/generate`` call is given.

    While an episode runs, the actor keeps the four token sequences in compact form
    (:meth:`compact`: ``array.array``, which the garbage collector does not walk item by item;
    full collections over hundreds of 10-30k-item lists stopped the event loop for hundreds of
    milliseconds, docs/performance.md) and turns them back into lists when it ends (:meth:`expand`).
    """

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    rollout_log_probs: list[float] = field(default_factory=list)
    weight_versions: list[str | None] = field(default_factory=list)
    generation_spans: list[tuple[int, int]] = field(default_factory=list)
    segment_starts: list[int] = field(default_factory=list)

    @property
    def tokens(self) -> list[int]:
        """Prompt + response ids: exactly the sequence the policy saw and sampled (a new list;
        with several segments, their concatenation)."""
        if self.is_compact:
            return (self.prompt_ids + self.response_ids).tolist()
        return self.prompt_ids + self.response_ids

    def token_array(self) -> np.ndarray:
        """Prompt + response ids as a new 1-D ``int64`` numpy array of ``len(self)`` ids (from the
        compact form without making a Python int per id).

        From the compact form it views a new concatenated array, never the live arrays: a view
        of a live ``array.array`` that anything got hold of made its next append raise
        ``BufferError`` (seen under ``python -m rollout.bench pool``; tests/unit/test_records.py).
        """
        if self.is_compact:
            return np.frombuffer(self.prompt_ids + self.response_ids, dtype=np.int64)
        return np.asarray(self.prompt_ids + self.response_ids, dtype=np.int64)

    @property
    def context_start(self) -> int:
        """Index in :attr:`tokens` where the live segment starts (0 with one segment)."""
        return len(self.prompt_ids) + self.segment_starts[-1] if self.segment_starts else 0

    @property
    def context_length(self) -> int:
        """Tokens in the live segment: the length of the next ``/generate`` call's ``input_ids``
        (what ``policy.max_context_tokens`` bounds)."""
        return len(self) - self.context_start

    def context_array(self) -> np.ndarray:
        """The live segment's ids as a new 1-D ``int64`` array (:meth:`token_array` with one
        segment)."""
        whole = self.token_array()
        return whole[self.context_start:] if self.segment_starts else whole

    def start_segment(self, prompt_ids: list[int] | array.array) -> None:
        """Start a new segment whose prompt is ``prompt_ids`` (appended as context, mask 0).

        Raises:
            TrajectoryError: ``prompt_ids`` is empty.
        """
        if not len(prompt_ids):
            raise TrajectoryError("a segment needs a prompt")
        self.segment_starts.append(len(self.response_ids))
        self.append_context(prompt_ids)

    is_compact = property(lambda self: isinstance(self.prompt_ids, array.array), doc="Whether in compact form (:meth:`compact`).")

    def compact(self) -> Trajectory:
        """Hold ``prompt_ids``, ``response_ids``, ``loss_mask`` and ``rollout_log_probs`` as
        ``array.array`` (int64, int64, int8 and float64: the same values, none of them
        visited by the garbage collector) until :meth:`expand`; every method works on either form. Returns self.

        Raises:
            OverflowError: an id outside int64 or a mask value outside int8.
        """
        if not self.is_compact:
            self.prompt_ids = array.array("q", self.prompt_ids)
            self.response_ids = array.array("q", self.response_ids)
            self.loss_mask = array.array("b", self.loss_mask)
            self.rollout_log_probs = array.array("d", self.rollout_log_probs)
        return self

    def expand(self) -> Trajectory:
        """Back to lists of Python ints and floats (the form every record outside the episode loop
        has); a no-op on lists. Returns self."""
        if self.is_compact:
            self.prompt_ids = self.prompt_ids.tolist()
            self.response_ids = self.response_ids.tolist()
            self.loss_mask = self.loss_mask.tolist()
            self.rollout_log_probs = self.rollout_log_probs.tolist()
        return self

    def __len__(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    response_length = property(lambda self: len(self.response_ids), doc="Response tokens (after the first prompt).")

    def append_generated(self, ids: list[int], log_probs: list[float], weight_version: str | None = None) -> None:
        """Append the ids one ``/generate`` call sampled, with their log-probs (mask 1), and
        record the call's weight version and span (also for an empty ``ids``).

        Raises:
            TrajectoryError: ``len(ids) != len(log_probs)``.
        """
        if len(ids) != len(log_probs):
            raise TrajectoryError(f"{len(ids)} generated ids but {len(log_probs)} log-probs")
        start = len(self.response_ids)
        self.response_ids.extend(ids)
        self.loss_mask.extend([1] * len(ids))
        self.rollout_log_probs.extend(float(x) for x in log_probs)
        self.weight_versions.append(None if weight_version is None else str(weight_version))
        self.generation_spans.append((start, start + len(ids)))

    def append_context(self, ids: list[int] | array.array) -> None:
        """Append ids the policy did not sample (mask 0, log-prob 0.0); ``ids``: a list or an
        int64 ``array.array``."""
        self.response_ids.extend(ids)
        self.loss_mask.extend([0] * len(ids))
        self.rollout_log_probs.extend([0.0] * len(ids))

    def discard_from(self, index: int) -> int:
        """Drop response tokens from response index ``index`` on; the calls that sampled them
        keep their entries with their spans cut at ``index``.

        Returns:
            The number of tokens dropped.

        Raises:
            TrajectoryError: ``index`` is outside ``[0, response_length]``.
        """
        n = len(self.response_ids)
        if not 0 <= index <= n:
            raise TrajectoryError(f"cannot discard from {index}: the response has {n} tokens")
        if self.segment_starts and index < self.segment_starts[-1]:
            raise TrajectoryError(f"cannot discard from {index}: the live segment starts at {self.segment_starts[-1]}")
        del self.response_ids[index:], self.loss_mask[index:], self.rollout_log_probs[index:]
        self.generation_spans = [(min(a, index), min(b, index)) for a, b in self.generation_spans]
        return n - index

    def check(self) -> None:
        """Raise :class:`TrajectoryError` if the response lists, the spans and the mask disagree."""
        n = len(self.response_ids)
        if len(self.loss_mask) != n or len(self.rollout_log_probs) != n:
            raise TrajectoryError(
                f"misaligned trajectory: {n} ids, {len(self.loss_mask)} mask, {len(self.rollout_log_probs)} log-probs"
            )
        check_spans(self.generation_spans, self.weight_versions, self.loss_mask)
        check_segments(self.segment_starts, self.loss_mask)


def check_segments(starts: list, loss_mask: list[int]) -> None:
    """Check that segment ``starts`` are increasing response indices inside the response, each at a
    context token (a segment opens with its prompt).

    Raises:
        TrajectoryError: naming the first bad start.
    """
    prev = -1
    for s in starts:
        if not prev < s < len(loss_mask) or loss_mask[s] != 0:
            raise TrajectoryError(f"segment start {s} out of order, out of range or on a sampled token")
        prev = s


def turn_calls(spans: list) -> list[list[int]]:
    """The ``/generate`` calls of each assistant turn of an append-only record, as lists of call
    indices: a call whose span starts where the previous one ended continues that turn (a weight
    update interrupted it, or ``restart_turn`` discarded it); context (mask 0) always lies between
    two turns (an end-of-turn repair, a tool result, a user turn), so a gap starts a new turn."""
    turns: list[list[int]] = []
    for j, (a, _b) in enumerate(spans):
        if turns and a == spans[j - 1][1]:
            turns[-1].append(j)
        else:
            turns.append([j])
    return turns


def check_spans(spans: list, versions: list, loss_mask: list[int]) -> None:
    """Check that per-call ``spans`` are in order, disjoint, one per entry of ``versions``, and
    cover exactly the positions where ``loss_mask`` is 1.

    Raises:
        TrajectoryError: naming the first disagreement.
    """
    if len(spans) != len(versions):
        raise TrajectoryError(f"{len(spans)} generation spans but {len(versions)} weight versions")
    pos = 0
    covered = 0
    for a, b in spans:
        if not pos <= a <= b <= len(loss_mask):
            raise TrajectoryError(f"generation span ({a}, {b}) out of order or out of range")
        if any(m != 1 for m in loss_mask[a:b]):
            raise TrajectoryError(f"generation span ({a}, {b}) covers tokens with mask 0")
        pos, covered = b, covered + (b - a)
    if covered != sum(loss_mask):
        raise TrajectoryError(f"{sum(loss_mask)} tokens have mask 1 but the generation spans cover {covered}")
