"""A toy sample mode, a toy context strategy and a toy reward shaper of the test suite's own,
registered through the public ``register_*`` functions and selected by name in YAML
(tests/unit/test_registry_keys.py, tests/ray/test_registered_plugins.py,
tests/unit/test_reward_shaping.py).

Registered by path (``"support.toy_plugins:ToyCompaction"``), so that the registration reaches the
Ray actors (which build the context strategy): this module must then be importable in the actors'
processes too; the Ray test puts ``tests/`` on the ``PYTHONPATH`` of the process that starts the
local Ray cluster, as a user does for a plugin module that is not an installed package.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rollout.core.context import CompactionRequest
from rollout.core.records import InteractionResult, TrainingSample
from rollout.core.sample_modes import TrajectoryMode

# What ToyCompaction writes in place of a tool result: a text no built-in strategy writes, so that
# a sample's tokens show which strategy compacted its context.
TOY_MARKER = "[toy_compact dropped this tool result]"
SAMPLE_MODE = "toy_last_segment"
CONTEXT_STRATEGY = "toy_compact"


class ToyCompaction:
    """``toy_compact``: every tool result before the latest assistant turn becomes
    :data:`TOY_MARKER` at once (where ``drop_tool_results`` drops as few as fit); ``None`` when
    there is none left to drop or the result still does not fit."""

    name = CONTEXT_STRATEGY

    async def compact(self, request: CompactionRequest) -> list[dict[str, Any]] | None:
        msgs = request.messages
        latest = max((i for i, m in enumerate(msgs) if m.get("role") == "assistant"), default=len(msgs))
        drop = [i for i, m in enumerate(msgs[:latest]) if m.get("role") == "tool" and m.get("content") != TOY_MARKER]
        if not drop:
            return None
        out = [{**m, "content": TOY_MARKER} if i in drop else m for i, m in enumerate(msgs)]
        return out if await request.count_tokens(out) <= request.budget_tokens else None


class ToyLastSegment:
    """``toy_last_segment``: one sample per episode, its last segment (the context the episode
    ended in), with ``metadata["toy_segments"]``: how many segments ``trajectory`` would give."""

    name = SAMPLE_MODE

    def __init__(self, keep_messages: bool = True) -> None:
        self._trajectory = TrajectoryMode(keep_messages=keep_messages)

    def split(self, episode: TrainingSample) -> list[TrainingSample]:
        parts = self._trajectory.split(episode)
        last = parts[-1]
        return [dataclasses.replace(last, metadata={**last.metadata, "toy_segments": len(parts)})]

    def export(self, result: InteractionResult) -> list[TrainingSample]:
        return self.split(result.to_sample(self._trajectory.keep_messages))


class SquareShaper:
    """``toy_square`` (a reward shaper, :mod:`rollout.core.shaping`): the reward squared; a
    factory of the ``rollout.reward_shaping`` section, as registered shapers are."""

    def __init__(self, section: Any = None) -> None:
        self.section = section

    def shape(self, reward: float, episode: Any) -> float:
        return reward * reward
