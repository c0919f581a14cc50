"""The sample-export seam: what training samples an episode becomes.

An :class:`SampleExporter` turns one finished episode (:class:`~rollout.core.records.InteractionResult`)
into the training samples that reach the trainer and the files. Today there is one mode,
``trajectory``: one sample per episode, the whole append-only token sequence (prompt plus every
turn, mask 1 on sampled tokens). A new mode (e.g. one sample per assistant turn) is a class with
an ``export`` method, added with :func:`register_exporter`; the pool calls :func:`get_exporter`
once and ``export`` per delivered episode.
"""

from __future__ import annotations

from typing import Callable, Protocol

from rollout.core.records import InteractionResult, TrainingSample


class SampleExporter(Protocol):
    """Turns one finished episode into its training samples."""

    def export(self, result: InteractionResult) -> list[TrainingSample]:
        """The episode's samples, in order; every one carries the episode's id in
        ``metadata["episode_id"]``, its status and its reward.

        Raises:
            rollout.core.records.TrajectoryError: the episode's record is misaligned.
        """
        ...


class TrajectoryExporter:
    """One sample per episode: :meth:`InteractionResult.to_sample` (the ``trajectory`` mode).

    Args:
        keep_messages: keep the conversation on the sample (``rollout.keep_messages``).
    """

    def __init__(self, keep_messages: bool = True) -> None:
        self.keep_messages = keep_messages

    def export(self, result: InteractionResult) -> list[TrainingSample]:
        return [result.to_sample(self.keep_messages)]


_EXPORTERS: dict[str, Callable[..., SampleExporter]] = {"trajectory": TrajectoryExporter}


def register_exporter(name: str, factory: Callable[..., SampleExporter]) -> None:
    """Add a sample mode: ``factory(keep_messages=...)`` builds its exporter.

    Raises:
        ValueError: ``name`` is already registered.
    """
    if name in _EXPORTERS:
        raise ValueError(f"sample exporter {name!r} is already registered")
    _EXPORTERS[name] = factory


def get_exporter(name: str = "trajectory", *, keep_messages: bool = True) -> SampleExporter:
    """The exporter of sample mode ``name``.

    Raises:
        KeyError: no such mode (the message lists the registered ones).
    """
    try:
        factory = _EXPORTERS[name]
    except KeyError:
        raise KeyError(f"unknown sample mode {name!r}; registered: {sorted(_EXPORTERS)}") from None
    return factory(keep_messages=keep_messages)


def exporters() -> tuple[str, ...]:
    """The registered sample modes."""
    return tuple(sorted(_EXPORTERS))
