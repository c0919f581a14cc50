"""What an episode counted: :class:`EpisodeMetrics`, the typed form of a record's ``metadata``.

:func:`rollout.core.episode.run_episode` counts into an :class:`EpisodeMetrics` and writes it into
:attr:`~rollout.core.records.InteractionResult.metadata` with :meth:`EpisodeMetrics.to_metadata`
(a plain dict: the JSON of ``samples.jsonl``, the journal and the trainer API). Readers (the run
summary, the pool's counters) read it back with :meth:`EpisodeMetrics.from_metadata` instead of
string keys. ``metadata`` also holds keys that are not metrics (the spec's identifiers that
:meth:`~rollout.core.records.InteractionResult.to_sample` adds, the pool's ``excluded_reason``):
:meth:`~EpisodeMetrics.from_metadata` ignores them.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Any


class _Unset(enum.Enum):
    """The type of :data:`UNSET` (an enum member: one object under copy and pickle)."""

    UNSET = "unset"

    def __repr__(self) -> str:
        return "UNSET"

    def __bool__(self) -> bool:
        return False


UNSET = _Unset.UNSET
"""An optional metric the episode did not produce: its key is left out of ``metadata`` (not null)."""

@dataclass
class EpisodeMetrics:
    """An episode's counts, end and timings; fields in the order of their ``metadata`` keys.

    Attributes:
        turns: assistant turns sampled to the end (a turn split by weight updates counts once).
        requests: ``/generate`` calls that answered.
        parse_errors: assistant turns that did not parse (``policy.on_parse_error``).
        turn_boundary_repairs: turns closed with the template's end-of-turn tokens (mask 0),
            because the model stopped without them.
        length_finishes: turns cut at ``policy.sampling.max_new_tokens`` or by the context window.
        tool_errors: tool calls whose result is an error.
        interruptions: ``/generate`` calls interrupted by a weight update.
        interrupted_turns: turns with at least one interruption; ``continued_turns`` /
            ``restarted_turns``: those finished under ``rollout.partial_rollout`` continue /
            restart_turn.
        discarded_tokens: sampled tokens dropped (``restart_turn``, a stop string straddling an
            interruption).
        termination_reason: why the episode ended (``done``, ``context``, ``turn_length``,
            ``tokenize_timeout``, a status value, ...); None before it ends.
        error: the error text of a failed episode, else None.
        reward_info: the environment's reward breakdown; only when the environment ended the
            episode (its value may be None), else :data:`UNSET`.
        timings: seconds per phase (``generate_s``, the environment's own, ``total_s``); set when
            the episode ends.
        prompt_tokens / response_tokens / generated_tokens: the trajectory's first-prompt length,
            response length and tokens with mask 1; :data:`UNSET` without a trajectory.
        sample_splits: with ``rollout.sample_mode=merge_prefix``, the times a turn's prompt did
            not extend the sample being merged and a new sample began (samples - 1); set by the
            driver's exporter, :data:`UNSET` in the other modes.
        compactions: times ``policy.context_strategy`` compacted the conversation (each starts a
            new segment: a new sample); :data:`UNSET` with ``none``.
    """

    turns: int = 0
    requests: int = 0
    parse_errors: int = 0
    turn_boundary_repairs: int = 0
    length_finishes: int = 0
    tool_errors: int = 0
    interruptions: int = 0
    interrupted_turns: int = 0
    continued_turns: int = 0
    restarted_turns: int = 0
    discarded_tokens: int = 0
    termination_reason: str | None = None
    error: str | None = None
    reward_info: dict[str, Any] | None | _Unset = UNSET
    timings: dict[str, float] | _Unset = UNSET
    prompt_tokens: int | _Unset = UNSET
    response_tokens: int | _Unset = UNSET
    generated_tokens: int | _Unset = UNSET
    sample_splits: int | _Unset = UNSET
    compactions: int | _Unset = UNSET

    def to_metadata(self) -> dict[str, Any]:
        """The metrics as ``metadata``'s keys, in field order, leaving out the :data:`UNSET` ones
        (a new dict; ``timings`` and ``reward_info`` are the objects held, not copies)."""
        return {f.name: v for f in dataclasses.fields(self) if (v := getattr(self, f.name)) is not UNSET}

    @classmethod
    def from_metadata(cls, metadata: dict[str, Any]) -> EpisodeMetrics:
        """Read the metrics of a record's ``metadata`` (other keys are ignored). A counter that is
        missing or null reads 0; an optional metric that is missing reads :data:`UNSET`.

        Raises:
            ValueError, TypeError: a counter that is not a number.
        """
        kw: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name not in metadata:
                continue
            value = metadata[f.name]
            kw[f.name] = int(value or 0) if f.name in COUNTERS else value
        return cls(**kw)


# The counters (the int fields): every run_episode record has them, from 0; a record made elsewhere
# (the pool's actor_lost, a worker's timeout) may lack them, read as 0.
COUNTERS = tuple(f.name for f in dataclasses.fields(EpisodeMetrics) if f.type == "int")
