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
:func:`register_sample_mode` (in :data:`SAMPLE_MODES`, a :class:`rollout.core.registry.Registry`;
or by an entry point in group ``tau_rollout.sample_modes`` of a package of your own), and
selected by name in ``rollout.sample_mode``.
"""

from __future__ import annotations

from typing import Callable, Protocol

from rollout.core.records import InteractionResult, TrainingSample
from rollout.core.registry import Registry
from rollout.core.sample_modes import MergePrefixMode, PerTurnMode, TrajectoryMode

__all__ = ["SAMPLE_MODES", "SampleExporter", "get_exporter", "register_sample_mode", "sample_modes", "unregister_sample_mode"]


class SampleExporter(Protocol):
    """Turns one finished episode into its training samples."""

    def export(self, result: InteractionResult) -> list[TrainingSample]:
        """The episode's samples, in order (at least one); every one carries the episode's id
        (``episode_id``, and its copy ``metadata["episode_id"]``), the turns it holds
        (``turn_indices``), its status and its reward.

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


# name -> factory(keep_messages=...) (``keep_messages``: keep the conversation, ``rollout.keep_messages``),
# or its "module:attribute" path; the built-ins first, in this order
SAMPLE_MODES: Registry[Callable[..., SampleExporter]] = Registry("sample_mode", "rollout.sample_mode")
SAMPLE_MODES.register("trajectory", TrajectoryMode)
SAMPLE_MODES.register("per_turn", PerTurnMode)
SAMPLE_MODES.register("merge_prefix", MergePrefixMode)


def register_sample_mode(name: str, factory: Callable[..., SampleExporter] | str, *, replace: bool = False) -> None:
    """Add a sample mode for ``rollout.sample_mode=name``: ``factory(keep_messages=...)`` builds
    its exporter (a :class:`SampleExporter`), or the ``"package.module:attribute"`` path of the
    factory, imported on first use. Sample modes run in the driver (where samples are handed
    out), so an object registered there is enough.

    Raises:
        ValueError: ``name`` is empty, holds a ``:`` or is already registered (and ``replace`` is false).
    """
    SAMPLE_MODES.register(name, factory, replace=replace)


def unregister_sample_mode(name: str) -> None:
    """Remove sample mode ``name``.

    Raises:
        rollout.core.registry.UnknownNameError: no such mode (a ``KeyError``).
    """
    SAMPLE_MODES.unregister(name)


def get_exporter(name: str = "trajectory", *, keep_messages: bool = True) -> SampleExporter:
    """The exporter of sample mode ``name`` (``rollout.sample_mode``), built now.

    Raises:
        rollout.core.registry.UnknownNameError: no such mode (a ``KeyError``; one line naming
            ``rollout.sample_mode`` and listing the registered ones).
        ImportError, AttributeError: its registered path cannot be imported.
    """
    return SAMPLE_MODES.get(str(name))(keep_messages=keep_messages)


def sample_modes() -> tuple[str, ...]:
    """The registered sample modes (and those installed packages declare), sorted."""
    return tuple(sorted(SAMPLE_MODES.names()))
