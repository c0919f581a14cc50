"""The sample-export seam: what training samples an episode becomes (``rollout.sample_mode``).

An exporter turns one finished episode into the training samples that reach the trainer and the
files, in two steps: :meth:`SampleExporter.export` of an
:class:`~rollout.core.records.InteractionResult` gives the episode's samples, and
:meth:`SampleExporter.split` of the episode's *episode sample*
(:meth:`~rollout.core.records.InteractionResult.to_sample`) gives the same samples. The pool keeps
one episode sample per episode (the ledger, the journal, the training policy and the groups work
per episode, docs/design.md invariant 2) and calls ``split`` of the configured mode where samples
are handed out (:mod:`rollout.core.pool.streams`), so a resumed run re-splits journaled episodes
the same way.

Modes (:mod:`rollout.core.sample_modes`): ``trajectory`` (one sample per episode, the whole
append-only token sequence; one per segment for an episode whose history was re-rendered or
compacted), ``per_turn`` (one per assistant turn), ``merge_prefix`` (turns merged while each
prompt extends the sample). A new mode is a class with ``export`` and ``split``, added with
:func:`register_exporter`.
"""

from __future__ import annotations

from typing import Callable, Protocol

from rollout.core.records import InteractionResult, TrainingSample
from rollout.core.sample_modes import MergePrefixMode, PerTurnMode, TrajectoryMode


class SampleExporter(Protocol):
    """Turns one finished episode into its training samples."""

    def export(self, result: InteractionResult) -> list[TrainingSample]:
        """The episode's samples, in order (at least one); every one carries the episode's id
        in ``metadata["episode_id"]``, its status and its reward.

        Raises:
            rollout.core.trajectory.TrajectoryError: the episode's record is misaligned.
        """
        ...

    def split(self, episode: TrainingSample) -> list[TrainingSample]:
        """The same samples from the episode's ``trajectory`` sample (a journaled one too).

        Raises:
            rollout.core.trajectory.TrajectoryError: the sample is misaligned.
        """
        ...


# name -> factory(keep_messages=...) (``keep_messages``: keep the conversation, ``rollout.keep_messages``)
_EXPORTERS: dict[str, Callable[..., SampleExporter]] = {
    "trajectory": TrajectoryMode, "per_turn": PerTurnMode, "merge_prefix": MergePrefixMode,
}


def register_exporter(name: str, factory: Callable[..., SampleExporter]) -> None:
    """Add a sample mode: ``factory(keep_messages=...)`` builds its exporter.

    Raises:
        ValueError: ``name`` is already registered.
    """
    if name in _EXPORTERS:
        raise ValueError(f"sample exporter {name!r} is already registered")
    _EXPORTERS[name] = factory


def get_exporter(name: str = "trajectory", *, keep_messages: bool = True) -> SampleExporter:
    """The exporter of sample mode ``name`` (``rollout.sample_mode``).

    Raises:
        KeyError: no such mode (the message names ``rollout.sample_mode`` and lists the registered ones).
    """
    try:
        factory = _EXPORTERS[str(name)]
    except KeyError:
        raise KeyError(f"rollout.sample_mode: unknown sample mode {name!r}; registered: {sorted(_EXPORTERS)}") from None
    return factory(keep_messages=keep_messages)


def exporters() -> tuple[str, ...]:
    """The registered sample modes."""
    return tuple(sorted(_EXPORTERS))
