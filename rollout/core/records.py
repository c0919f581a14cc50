"""Typed records, one per boundary of the data flow (docs/design.md "Data flow").

``EpisodeSpec`` (driver -> actor), ``Trajectory`` (the token-level record built inside an episode),
``InteractionResult`` (actor -> driver), ``TrainingSample`` (driver -> trainer / disk) and
``Batch`` (padded arrays for a trainer). Field names follow slime's ``Sample`` and verl's
``response_mask`` conventions: ``tokens`` = prompt + response ids, ``response_length``,
``loss_mask`` and ``rollout_log_probs`` both of length ``response_length``.
"""

from __future__ import annotations

import array
import copy
import enum
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np


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


class TrajectoryError(ValueError):
    """Raised when an append would break token / mask / log-prob alignment."""


@dataclass
class Trajectory:
    """Token record of one episode (docs/design.md invariant 1).

    ``prompt_ids`` is the first request's prompt. Every later token is appended either as
    *generated* (sampled by the policy: mask 1, its rollout log-prob) or as *context* (template
    tokens, tool results, user turns, turn-boundary repairs: mask 0, log-prob 0.0). The three
    response lists always have the same length.

    Each ``/generate`` call is recorded once, in order: ``weight_versions[j]`` is the server's
    ``meta_info["weight_version"]`` for call ``j`` (``None`` if the server sent none) and
    ``generation_spans[j] == (start, end)`` are the response indices of the tokens call ``j``
    sampled (``end - start`` tokens; empty when it sampled none or its tokens were discarded).
    The spans are disjoint, in order, and cover exactly the positions whose mask is 1, so every
    sampled token's weight version is known (slime's ``Sample.weight_versions``, made per token).

    Append-only but for :meth:`discard_from` (the tail of an unfinished turn, ``restart_turn``).

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

    @property
    def tokens(self) -> list[int]:
        """Prompt + response ids: exactly the sequence the policy saw and sampled (a new list)."""
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
