"""Typed records, one per boundary of the data flow (docs/design.md "Data flow").

``EpisodeSpec`` (driver -> actor), ``Trajectory`` (the token-level record built inside an episode:
:mod:`rollout.core.trajectory`, named here too),
``InteractionResult`` (actor -> driver), ``TrainingSample`` (driver -> trainer / disk) and
``Batch`` (padded arrays for a trainer). Field names follow slime's ``Sample`` and verl's
``response_mask`` conventions: ``tokens`` = prompt + response ids, ``response_length``,
``loss_mask`` and ``rollout_log_probs`` both of length ``response_length``.
"""

from __future__ import annotations

import copy
import enum
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

from rollout.core.trajectory import Trajectory, turn_calls


class EpisodeStatus(str, enum.Enum):
    """How an episode ended; one meaning per status.

    Policy outcomes (the policy's own doing, trainable by default): ``COMPLETED``, ``MAX_STEPS``
    (the agent used ``env.max_steps`` turns without ending the conversation), ``TRUNCATED`` (the
    context window ``policy.max_context_tokens`` is full, termination reason ``context``; or a turn
    was cut at ``policy.sampling.max_new_tokens`` with ``policy.on_length=truncate``,
    ``turn_length``: slime's ``TRUNCATED``), ``PARSE_ERROR``
    (unparseable tool call with ``on_parse_error=abort``), ``TOOL_TIMEOUT`` (a tool call the model
    wrote ran past the step timeout and was killed).

    Infrastructure outcomes (never trained as reward 0 by default, docs/design.md invariant 4):
    ``ABORTED`` (a policy server answered ``finish_reason.type == "abort"``, or a weight update
    interrupted a turn with ``rollout.partial_rollout=drop``), ``TIMEOUT`` (the episode ran past
    ``pool.episode_timeout_s``), ``POLICY_ERROR`` (router / policy server failed, or answered
    malformed data), ``ENV_ERROR`` (environment code raised), ``USER_ERROR`` (the user simulator
    failed, set-up included), ``EVAL_ERROR`` (the reward evaluator raised), ``ACTOR_LOST`` (the
    Ray actor running it died ``pool.max_episode_retries + 1`` times).

    ``CANCELLED``: the driver cancelled the episode because it was no longer needed (the surplus
    of dynamic sampling, :meth:`rollout.core.pool.RolloutPool.cancel_outstanding`) or the run was
    interrupted. Neither a policy outcome nor a failure; never trained by default.
    """

    COMPLETED = "completed"
    MAX_STEPS = "max_steps"
    TRUNCATED = "truncated"
    PARSE_ERROR = "parse_error"
    TOOL_TIMEOUT = "tool_timeout"
    ABORTED = "aborted"
    TIMEOUT = "timeout"
    POLICY_ERROR = "policy_error"
    ENV_ERROR = "env_error"
    USER_ERROR = "user_error"
    EVAL_ERROR = "eval_error"
    ACTOR_LOST = "actor_lost"
    CANCELLED = "cancelled"

    @property
    def is_infrastructure_failure(self) -> bool:
        return self in INFRA_STATUSES  # failures that are not the policy's fault


INFRA_STATUSES = frozenset(
    {
        EpisodeStatus.ABORTED,
        EpisodeStatus.TIMEOUT,
        EpisodeStatus.POLICY_ERROR,
        EpisodeStatus.ENV_ERROR,
        EpisodeStatus.USER_ERROR,
        EpisodeStatus.EVAL_ERROR,
        EpisodeStatus.ACTOR_LOST,
    }
)

# The policy outcomes: what ``rollout.train_statuses`` holds by default.
DEFAULT_TRAIN_STATUSES = ("completed", "max_steps", "truncated", "parse_error", "tool_timeout")


@dataclass(frozen=True)
class EpisodeSpec:
    """What the driver asks an actor to run.

    Attributes:
        episode_id: unique id; the driver delivers exactly one result per id.
        domain: tau2 domain (a name of tau2's registry: ``airline`` | ``retail`` | ``telecom`` | ...).
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


@dataclass
class InteractionResult:
    """What an actor returns for one episode.

    Attributes:
        spec: the episode's spec.
        status: how it ended.
        reward: tau2's reward in [0, 1]; 0.0 when no reward was computed (see ``status``).
        trajectory: token record (``None`` only if the episode failed before its first prompt).
        messages: the conversation as OpenAI chat messages (see :attr:`TrainingSample.messages`).
        metadata: turns, termination reason, timings (seconds), token counts, turn-boundary
            repairs, reward breakdown, error text: :class:`rollout.core.metrics.EpisodeMetrics`
            as a JSON-ready dict (read it back with ``EpisodeMetrics.from_metadata``).
    """

    spec: EpisodeSpec
    status: EpisodeStatus
    reward: float
    trajectory: Trajectory | None
    messages: list[dict[str, Any]] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_sample(self, messages: bool = True) -> "TrainingSample":
        """Turn the result into a training sample (metadata gets the spec's identifiers).

        Args:
            messages: keep the conversation (``rollout.keep_messages``); False leaves
                :attr:`TrainingSample.messages` ``None`` (for space).
        """
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
            weight_versions=list(traj.weight_versions),
            generation_spans=[list(sp) for sp in traj.generation_spans],
            segment_starts=list(traj.segment_starts),
            reward=float(self.reward),
            status=self.status.value,
            group_id=self.spec.group_id,
            sample_index=self.spec.sample_index,
            metadata=meta,
            messages=[dict(m) for m in self.messages] if messages else None,
        )


@dataclass
class TrainingSample:
    """One training sample, one line of ``samples.jsonl``.

    ``tokens`` has length ``prompt_length + response_length``; ``loss_mask`` and
    ``rollout_log_probs`` have length ``response_length`` and index the response part of
    ``tokens`` (``tokens[-response_length:]``). ``weight_versions`` has one entry per
    ``/generate`` call of the episode, in order (the server's ``meta_info["weight_version"]``);
    ``generation_spans[j] = [start, end)`` are the response indices call ``j`` sampled (see
    :class:`Trajectory`); :meth:`token_weight_versions` spreads the versions over the tokens.

    ``messages`` is the conversation the agent had, as OpenAI chat-completions messages (``None``
    with ``rollout.keep_messages=false``): ``system`` (the policy and tools prompt), ``user``
    (the simulated user's turns), ``assistant`` (``content``, ``reasoning_content`` for a
    ``<think>`` block, ``tool_calls: [{"id", "type": "function", "function": {"name",
    "arguments": JSON string}}]``) and ``tool`` (``tool_call_id``, ``name``, ``content``, and
    ``"error": true`` when the tool failed). Marks added by the loop: ``"finish_reason":
    "length"`` on a turn cut at ``max_new_tokens``, ``"parse_error": reason`` on an assistant turn
    that did not parse (its raw text as ``content``), ``"format_feedback": true`` on the user
    message the loop sent back about it. It is for reading what happened; the token fields are
    the training data (decoding them gives the same text).

    ``segment_starts`` is empty on every sample handed to a trainer. Only an *episode sample*
    (what the pool keeps and journals per episode, :meth:`InteractionResult.to_sample`) of an
    episode whose prompts did not all extend each other (``policy.history=rerender``, a
    compaction) has it: response indices where a segment's prompt starts, the record being the
    segments' concatenation, which the sample modes cut apart (:mod:`rollout.core.sample_modes`).
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
    weight_versions: list[str | None] = field(default_factory=list)
    generation_spans: list[list[int]] = field(default_factory=list)
    messages: list[dict[str, Any]] | None = None
    segment_starts: list[int] = field(default_factory=list)

    @property
    def episode_id(self) -> str:
        """The episode's id (``metadata["episode_id"]``)."""
        return str(self.metadata.get("episode_id", ""))

    prompt_length = property(lambda self: len(self.tokens) - self.response_length, doc="Tokens before the response.")

    @property
    def turn_indices(self) -> list[int]:
        """The episode's assistant turns this sample holds (``metadata["turn_indices"]``, set by
        the ``per_turn`` and ``merge_prefix`` modes; a ``trajectory`` sample holds every turn)."""
        if "turn_indices" in self.metadata:
            return list(self.metadata["turn_indices"])
        return list(range(len(turn_calls(self.generation_spans))))

    def token_weight_versions(self) -> list[str | None]:
        """The weight version that sampled each response token (length ``response_length``;
        ``None`` where the mask is 0)."""
        out: list[str | None] = [None] * self.response_length
        for (a, b), v in zip(self.generation_spans, self.weight_versions):
            out[a:b] = [v] * (b - a)
        return out

    def numeric_weight_versions(self) -> list[int]:
        """The calls' versions as integers (for staleness).

        Raises:
            ValueError: a version is missing or not an integer (e.g. SGLang's ``"default"``).
        """
        try:
            return [int(str(v)) for v in self.weight_versions]
        except ValueError:
            raise ValueError(
                f"episode {self.metadata.get('episode_id')}: weight versions {self.weight_versions} are not all integers; "
                "rollout.max_staleness needs numeric versions (start the servers with --weight-version 0 and update with integers)"
            ) from None

    def to_dict(self) -> dict[str, Any]:
        """The sample as a JSON-ready dict of new containers (``samples.jsonl``'s line).

        Built field by field: ``dataclasses.asdict`` deep-copies every token (40 ms per 10k tokens)."""
        return {
            "tokens": list(self.tokens), "response_length": self.response_length, "loss_mask": list(self.loss_mask),
            "rollout_log_probs": list(self.rollout_log_probs), "reward": self.reward, "status": self.status,
            "group_id": self.group_id, "sample_index": self.sample_index, "metadata": copy.deepcopy(self.metadata),
            "weight_versions": list(self.weight_versions), "generation_spans": [list(s) for s in self.generation_spans],
            "messages": copy.deepcopy(self.messages),
            **({"segment_starts": list(self.segment_starts)} if self.segment_starts else {}),
        }

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
        episode_ids: length ``B``: the episode of each row (several rows per episode with
            ``rollout.sample_mode=per_turn`` / ``merge_prefix``: one advantage per episode).
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
    episode_ids: list[str] = field(default_factory=list)

    @classmethod
    def from_samples(cls, samples: list[TrainingSample], pad_token_id: int = 0, train_statuses: Iterable[str] = DEFAULT_TRAIN_STATUSES) -> "Batch":
        """Pad ``samples`` to the longest one.

        Args:
            samples: the samples, e.g. one or more groups from ``RolloutPool.groups()``.
            pad_token_id: id used for padding ``tokens``.
            train_statuses: the statuses that may be trained (pass ``cfg.rollout.train_statuses``;
                the default is the policy outcomes), so that an infrastructure failure can never
                become a row of reward 0 (docs/design.md invariant 4).

        Raises:
            ValueError: ``samples`` is empty, a sample is misaligned, or a sample's status is not
                in ``train_statuses`` (the message names the episode and its status).
        """
        if not samples:
            raise ValueError("cannot build a Batch from zero samples")
        allowed = set(train_statuses)
        bad = [s for s in samples if s.status not in allowed]
        if bad:
            names = ", ".join(f"{s.metadata.get('episode_id', '?')} ({s.status})" for s in bad[:5])
            raise ValueError(f"{len(bad)} sample(s) have a status outside train_statuses {sorted(allowed)}: {names}")
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
            episode_ids=[s.episode_id for s in samples],
        )
