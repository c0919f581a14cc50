"""The seed's result shape and statuses: :class:`SeedResult` (the seed's ``InteractionResult``,
renamed) and the mapping of our statuses onto the seed's three.

==================================================================  ==========  =========================================
ours                                                                seed        why
==================================================================  ==========  =========================================
``completed``                                                       completed   the conversation ended (user, agent, transfer)
``max_steps``                                                       truncated   the seed's loop ran out of steps: ``TRUNCATED``
``truncated``                                                       truncated   the context window is full
``parse_error``                                                     aborted     the seed aborts on an unparseable turn
``tool_timeout``                                                    aborted     the seed aborts when ``env.step`` raises
``aborted``                                                         aborted     the server answered ``finish_reason`` abort
``timeout``, ``policy_error``, ``env_error``, ``user_error``,       aborted     infrastructure failures (the seed aborts on
``eval_error``, ``actor_lost``, ``cancelled``                                   a failed ``env.step``; it had no other name)
==================================================================  ==========  =========================================

``aborted`` in the seed's sense mixes policy failures with infrastructure failures: decide what to
train from ``episode_status`` (or :meth:`SeedResult.to_sample` and
:mod:`rollout.integrations.slime`, which follow ``rollout.train_statuses``), never from ``status`` alone.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from rollout.core import records
from rollout.core.records import EpisodeStatus, TrainingSample

logger = logging.getLogger(__name__)


class Status(Enum):
    """The seed's episode status (``trainable_agents.py``'s ``Status``): three values."""

    COMPLETED = "completed"
    TRUNCATED = "truncated"
    ABORTED = "aborted"


SEED_STATUS: dict[EpisodeStatus, Status] = {
    EpisodeStatus.COMPLETED: Status.COMPLETED,
    EpisodeStatus.MAX_STEPS: Status.TRUNCATED,
    EpisodeStatus.TRUNCATED: Status.TRUNCATED,
    EpisodeStatus.PARSE_ERROR: Status.ABORTED,
    EpisodeStatus.TOOL_TIMEOUT: Status.ABORTED,
    EpisodeStatus.ABORTED: Status.ABORTED,
    EpisodeStatus.TIMEOUT: Status.ABORTED,
    EpisodeStatus.POLICY_ERROR: Status.ABORTED,
    EpisodeStatus.ENV_ERROR: Status.ABORTED,
    EpisodeStatus.USER_ERROR: Status.ABORTED,
    EpisodeStatus.EVAL_ERROR: Status.ABORTED,
    EpisodeStatus.ACTOR_LOST: Status.ABORTED,
    EpisodeStatus.CANCELLED: Status.ABORTED,
}


def seed_status(status: EpisodeStatus | str) -> Status:
    """The seed's :class:`Status` for one of our statuses (the table in the module docstring).

    Args:
        status: an :class:`~rollout.core.records.EpisodeStatus` or its value (``"max_steps"``).

    Raises:
        ValueError: ``status`` is not one of ours.
    """
    return SEED_STATUS[EpisodeStatus(status)]


@dataclass
class SeedResult:
    """What :meth:`~rollout.integrations.seed.TrainableAgent.asolve` returns: the seed's ``InteractionResult``
    shape (its fields first, then ours). It was this module's ``InteractionResult``; renamed so that
    :class:`rollout.core.records.InteractionResult` is the one class of that name.

    The seed's (``trainable_agents.py``'s ``InteractionResult``):
        prompt: the first prompt's text (the system turn with the tools, the user's opening and the
            generation prompt), decoded from the ids that were sent.
        reward: tau2's reward in [0, 1]; 0.0 when none was computed (see ``episode_status``).
        messages: the OpenAI-style conversation (system, user, assistant, tool).
        info: our episode metadata (turns, termination reason, timings in seconds, token counts,
            reward breakdown, error text) plus ``episode_id``, ``task_id``, ``domain`` and
            ``status`` (ours).
        response: the assistant messages' contents joined (the seed's definition; informational).
        loss_mask: length ``response_length``; 1 exactly on tokens the policy sampled.
        tokens: prompt + response token ids (length ``len(prompt ids) + response_length``).
        status: the seed's :class:`Status` (see the module docstring's table).
        response_length: number of response tokens (``tokens[-response_length:]``; the seed set
            it on the result after building it).

    Ours:
        rollout_log_probs: length ``response_length``; the server's log-prob (natural log) of each
            sampled token, 0.0 where the mask is 0.
        weight_versions: one entry per ``/generate`` call, in order: the server's
            ``meta_info["weight_version"]`` (``None`` where it sent none).
        generation_spans: ``(start, end)`` response indices each call sampled (aligned with
            ``weight_versions``; they cover exactly the mask-1 tokens).
        episode_status: our exact :class:`~rollout.core.records.EpisodeStatus`.
        episode: the loop's own :class:`rollout.core.records.InteractionResult` (spec, trajectory).
    """

    prompt: str
    reward: float
    messages: list[dict[str, Any]]
    info: dict[str, Any]
    response: str = ""
    loss_mask: list[int] | None = None
    tokens: list[int] | None = None
    status: Status = Status.COMPLETED
    response_length: int = 0
    rollout_log_probs: list[float] | None = None
    weight_versions: list[str | None] = field(default_factory=list)
    generation_spans: list[tuple[int, int]] = field(default_factory=list)
    episode_status: EpisodeStatus = EpisodeStatus.COMPLETED
    episode: records.InteractionResult | None = None

    @property
    def prompt_token_ids(self) -> list[int]:
        """The first prompt's ids (``tokens[:-response_length]``)."""
        toks = self.tokens or []
        return toks[: len(toks) - self.response_length]

    @property
    def response_token_ids(self) -> list[int]:
        """The response ids (``tokens[-response_length:]``), aligned with ``loss_mask``."""
        toks = self.tokens or []
        return toks[len(toks) - self.response_length :]

    def to_sample(self) -> TrainingSample:
        """Our :class:`~rollout.core.records.TrainingSample` of this episode (what ``samples.jsonl``
        holds; :func:`rollout.integrations.slime.to_slime` turns either into slime's ``Sample`` fields).

        Raises:
            ValueError: the result has no ``episode`` (it was not made by :meth:`~rollout.integrations.seed.TrainableAgent.asolve`).
        """
        if self.episode is None:
            raise ValueError("this SeedResult carries no episode record (not made by TrainableAgent.asolve)")
        return self.episode.to_sample()
