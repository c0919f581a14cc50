"""Typed records, one per boundary of the data flow (DESIGN.md "Data flow").

``EpisodeSpec`` (driver -> actor), ``Trajectory`` (the token-level record built inside an episode),
``InteractionResult`` (actor -> driver), ``TrainingSample`` (driver -> trainer / disk) and
``Batch`` (padded arrays for a trainer). Field names follow slime's ``Sample`` and verl's
``response_mask`` conventions: ``tokens`` = prompt + response ids, ``response_length``,
``loss_mask`` and ``rollout_log_probs`` both of length ``response_length``.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np


class EpisodeStatus(str, enum.Enum):
    """How an episode ended.

    Policy outcomes (the policy's own doing, trainable): ``COMPLETED``, ``TRUNCATED`` (max steps
    or context window), ``PARSE_ERROR`` (unparseable tool call with ``on_parse_error=abort``),
    ``TOOL_TIMEOUT`` (a tool call the model wrote ran past the step timeout and was killed).

    Infrastructure outcomes (never trained as reward 0 by default, DESIGN.md invariant 4):
    ``ABORTED`` (the server aborted generation), ``POLICY_ERROR`` (router / policy server failed),
    ``ENV_ERROR`` (environment code raised), ``USER_ERROR`` (user simulator failed),
    ``EVAL_ERROR`` (the reward evaluator raised).
    """

    COMPLETED = "completed"
    TRUNCATED = "truncated"
    PARSE_ERROR = "parse_error"
    TOOL_TIMEOUT = "tool_timeout"
    ABORTED = "aborted"
    POLICY_ERROR = "policy_error"
    ENV_ERROR = "env_error"
    USER_ERROR = "user_error"
    EVAL_ERROR = "eval_error"

    @property
    def is_infrastructure_failure(self) -> bool:
        """True for failures that are not the policy's fault."""
        return self in INFRA_STATUSES


INFRA_STATUSES = frozenset(
    {
        EpisodeStatus.ABORTED,
        EpisodeStatus.POLICY_ERROR,
        EpisodeStatus.ENV_ERROR,
        EpisodeStatus.USER_ERROR,
        EpisodeStatus.EVAL_ERROR,
    }
)


@dataclass(frozen=True)
class EpisodeSpec:
    """What the driver asks an actor to run.

    Attributes:
        episode_id: unique id; the driver delivers exactly one result per id.
        domain: tau2 domain (``airline`` | ``retail``).
        task_id: tau2 task id (a string, as in tau2's ``tasks.json``).
        group_id: id of the group of ``n_samples_per_task`` samples of one task (GRPO group).
        sample_index: index of this sample in its group, ``0 <= sample_index < n``.
        seed: sampling seed sent to the policy server (``sampling_seed``) and used by simulators.
        weight_version: the policy weight version the trainer expects; copied into metadata.
        attempt: retry counter, 0 for the first attempt (set by the driver on retries).
    """

    episode_id: str
    domain: str
    task_id: str
    group_id: str
    sample_index: int
    seed: int = 0
    weight_version: int = 0
    attempt: int = 0


class TrajectoryError(ValueError):
    """Raised when an append would break token / mask / log-prob alignment."""


@dataclass
class Trajectory:
    """Append-only token record of one episode (DESIGN.md invariant 1).

    ``prompt_ids`` is the first request's prompt. Every later token is appended either as
    *generated* (sampled by the policy: mask 1, its rollout log-prob) or as *context* (template
    tokens, tool results, user turns, turn-boundary repairs: mask 0, log-prob 0.0). The three
    response lists always have the same length.
    """

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    rollout_log_probs: list[float] = field(default_factory=list)

    @property
    def tokens(self) -> list[int]:
        """Prompt + response ids: exactly the sequence the policy saw and sampled."""
        return self.prompt_ids + self.response_ids

    def __len__(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    @property
    def response_length(self) -> int:
        return len(self.response_ids)

    def append_generated(self, ids: list[int], log_probs: list[float]) -> None:
        """Append ids sampled by the policy, with their log-probs (mask 1).

        Raises:
            TrajectoryError: ``len(ids) != len(log_probs)``.
        """
        if len(ids) != len(log_probs):
            raise TrajectoryError(f"{len(ids)} generated ids but {len(log_probs)} log-probs")
        self.response_ids.extend(ids)
        self.loss_mask.extend([1] * len(ids))
        self.rollout_log_probs.extend(float(x) for x in log_probs)

    def append_context(self, ids: list[int]) -> None:
        """Append ids the policy did not sample (mask 0, log-prob 0.0)."""
        self.response_ids.extend(ids)
        self.loss_mask.extend([0] * len(ids))
        self.rollout_log_probs.extend([0.0] * len(ids))

    def check(self) -> None:
        """Raise :class:`TrajectoryError` if the three response lists are misaligned."""
        n = len(self.response_ids)
        if len(self.loss_mask) != n or len(self.rollout_log_probs) != n:
            raise TrajectoryError(
                f"misaligned trajectory: {n} ids, {len(self.loss_mask)} mask, {len(self.rollout_log_probs)} log-probs"
            )


@dataclass
class InteractionResult:
    """What an actor returns for one episode.

    Attributes:
        spec: the episode's spec.
        status: how it ended.
        reward: tau2's reward in [0, 1]; 0.0 when no reward was computed (see ``status``).
        trajectory: token record (``None`` only if the episode failed before its first prompt).
        messages: the OpenAI-style conversation (system, user, assistant, tool), for inspection.
        metadata: turns, termination reason, timings (seconds), token counts, turn-boundary
            repairs, reward breakdown, error text.
    """

    spec: EpisodeSpec
    status: EpisodeStatus
    reward: float
    trajectory: Trajectory | None
    messages: list[dict[str, Any]] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_sample(self) -> "TrainingSample":
        """Turn the result into a training sample (metadata gets the spec's identifiers)."""
        traj = self.trajectory or Trajectory(prompt_ids=[])
        traj.check()
        meta = dict(self.metadata)
        meta.update(
            episode_id=self.spec.episode_id,
            task_id=self.spec.task_id,
            domain=self.spec.domain,
            seed=self.spec.seed,
            weight_version=self.spec.weight_version,
            attempt=self.spec.attempt,
        )
        return TrainingSample(
            tokens=traj.tokens,
            response_length=traj.response_length,
            loss_mask=list(traj.loss_mask),
            rollout_log_probs=list(traj.rollout_log_probs),
            reward=float(self.reward),
            status=self.status.value,
            group_id=self.spec.group_id,
            sample_index=self.spec.sample_index,
            metadata=meta,
        )


@dataclass
class TrainingSample:
    """One training sample, one line of ``samples.jsonl``.

    ``tokens`` has length ``prompt_length + response_length``; ``loss_mask`` and
    ``rollout_log_probs`` have length ``response_length`` and index the response part of
    ``tokens`` (``tokens[-response_length:]``).
    """

    tokens: list[int]
    response_length: int
    loss_mask: list[int]
    rollout_log_probs: list[float]
    reward: float
    status: str
    group_id: str
    sample_index: int
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def prompt_length(self) -> int:
        return len(self.tokens) - self.response_length

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrainingSample":
        return cls(**d)


@dataclass
class Batch:
    """Samples as right-padded arrays, shaped as trainers expect.

    Attributes:
        tokens: int64 ``[B, T]``, prompt + response, right-padded with ``pad_token_id``.
        attention_mask: int8 ``[B, T]``, 1 on real tokens.
        prompt_lengths / response_lengths: int64 ``[B]``.
        loss_mask: float32 ``[B, T]``, aligned with ``tokens`` (0 on prompt and padding).
        rollout_log_probs: float32 ``[B, T]``, aligned with ``tokens`` (0 where mask is 0).
        rewards: float32 ``[B]``.
        statuses, group_ids: lists of length ``B``; sample_indices: int64 ``[B]``.
    """

    tokens: np.ndarray
    attention_mask: np.ndarray
    prompt_lengths: np.ndarray
    response_lengths: np.ndarray
    loss_mask: np.ndarray
    rollout_log_probs: np.ndarray
    rewards: np.ndarray
    sample_indices: np.ndarray
    statuses: list[str]
    group_ids: list[str]

    @classmethod
    def from_samples(cls, samples: list[TrainingSample], pad_token_id: int = 0) -> "Batch":
        """Pad ``samples`` to the longest one.

        Raises:
            ValueError: ``samples`` is empty or a sample is misaligned.
        """
        if not samples:
            raise ValueError("cannot build a Batch from zero samples")
        b = len(samples)
        t = max(len(s.tokens) for s in samples)
        tokens = np.full((b, t), pad_token_id, dtype=np.int64)
        attn = np.zeros((b, t), dtype=np.int8)
        mask = np.zeros((b, t), dtype=np.float32)
        logp = np.zeros((b, t), dtype=np.float32)
        for i, s in enumerate(samples):
            n, r = len(s.tokens), s.response_length
            if len(s.loss_mask) != r or len(s.rollout_log_probs) != r or r > n:
                raise ValueError(f"sample {i} ({s.metadata.get('episode_id')}) is misaligned")
            tokens[i, :n] = s.tokens
            attn[i, :n] = 1
            mask[i, n - r : n] = s.loss_mask
            logp[i, n - r : n] = s.rollout_log_probs
        return cls(
            tokens=tokens,
            attention_mask=attn,
            prompt_lengths=np.array([s.prompt_length for s in samples], dtype=np.int64),
            response_lengths=np.array([s.response_length for s in samples], dtype=np.int64),
            loss_mask=mask,
            rollout_log_probs=logp,
            rewards=np.array([s.reward for s in samples], dtype=np.float32),
            sample_indices=np.array([s.sample_index for s in samples], dtype=np.int64),
            statuses=[s.status for s in samples],
            group_ids=[s.group_id for s in samples],
        )
