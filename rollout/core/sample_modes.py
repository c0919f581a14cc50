"""The sample modes of ``rollout.sample_mode``: what training samples one episode becomes.

Every mode starts from the episode's *episode sample*: the ``trajectory`` sample
(:meth:`~rollout.core.records.InteractionResult.to_sample`, the whole append-only token sequence),
which is what the pool keeps per episode (the exactly-once ledger, the journal, the training policy
and the groups all work on it). A mode splits it into the samples the trainer gets:

* ``trajectory``: the episode sample itself (one per episode; one per segment for an episode
  of several, below).
* ``per_turn``: one sample per assistant turn. Its prompt (``tokens[:prompt_length]``) is exactly
  the ``input_ids`` of the turn's first ``/generate`` call; its response is exactly the tokens the
  turn sampled, all mask 1 with their rollout log-probs, and its ``weight_versions`` /
  ``generation_spans`` are those of the turn's calls (several when a weight update interrupted the
  turn and it was continued; a call whose tokens ``restart_turn`` discarded keeps its empty span).
  The response ends at the turn's last sampled token: the context the loop appends after it (the
  end-of-turn repair, mask 0, then the tool result or user turn) opens the NEXT turn's prompt. A
  turn that sampled no token gives no sample.
* ``merge_prefix``: consecutive turns in one sample as long as each turn's prompt extends the
  sample's tokens (prompt + response so far): the extension joins the response as context (mask
  0), then the turn's sampled tokens; a turn whose prompt does not extend it starts a new sample
  (counted in ``metadata["sample_splits"]``). After the last turn, the rest of the episode's tokens
  are appended as context where they extend the last sample. With the append-only history every
  prompt extends the previous one, so this is one sample per episode equal to the ``trajectory``
  sample, token for token.

An episode none of whose turns sampled a token (it failed before, or its context was full at
once) gives its episode sample in every mode, so every episode has at least one sample. Every
sample carries the episode's ``reward``, ``status``, group, ``metadata`` and, as top-level fields,
``episode_id`` and ``turn_indices``: the assistant turns it holds (indices in the episode's order,
from 0; every turn of the episode, or of the segment, for a ``trajectory`` sample; ``[]`` for an
episode without a ``/generate`` call). The per-turn modes and the segments also keep the copy
``metadata["turn_indices"]`` they always had (:class:`~rollout.core.records.TrainingSample`).

The turns come from :func:`turn_records`, cut out of the episode sample
(:func:`rollout.core.trajectory.turn_calls`). An episode whose prompts did not all extend each other
(``policy.history=rerender`` where a re-render changed earlier text, or a compaction by
``policy.context_strategy``) has an episode sample of several *segments*
(:attr:`TrainingSample.segment_starts`), each one append-only sequence the policy was given:
:func:`segments` cuts them apart, a turn's prompt is its segment up to the turn, and ``trajectory``
gives one sample per segment (never one sequence across a change of tokens). ``merge_prefix``
over a re-rendered history merges exactly the turns of one segment.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from rollout.core.records import InteractionResult, TrainingSample
from rollout.core.trajectory import TrajectoryError, check_segments, turn_calls

logger = logging.getLogger(__name__)


@dataclass
class TurnRecord:
    """One assistant turn: the prompt the policy was given and what it sampled.

    Attributes:
        index: the turn's index in the episode (0-based, every turn that made a ``/generate`` call).
        prompt_ids: the ``input_ids`` of the turn's first ``/generate`` call.
        response_ids: the tokens the turn sampled, in order (all mask 1).
        rollout_log_probs: their log-probs (same length as ``response_ids``).
        weight_versions: one per ``/generate`` call of the turn.
        generation_spans: ``(start, end)`` per call, indices into ``response_ids``.
    """

    index: int
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    rollout_log_probs: list[float] = field(default_factory=list)
    weight_versions: list[str | None] = field(default_factory=list)
    generation_spans: list[tuple[int, int]] = field(default_factory=list)


def segments(episode: TrainingSample) -> list[TrainingSample]:
    """The episode sample's segments, in order, each a sample of one append-only sequence: its
    prompt is the segment's tokens up to its first sampled token, its calls those whose spans lie
    in it. ``[episode]`` (the same object) when it has one segment; otherwise each carries
    ``metadata["turn_indices"]`` (the episode's turns it holds).

    Raises:
        rollout.core.trajectory.TrajectoryError: the segment starts or spans are misaligned.
    """
    starts = list(episode.segment_starts)
    if not starts:
        return [episode]
    check_segments(starts, episode.loss_mask)
    p, n = episode.prompt_length, episode.response_length
    bounds = [(-p, starts[0])] + list(zip(starts, starts[1:] + [n]))  # response indices; segment 0 from the prompt's start
    calls = list(zip(episode.generation_spans, episode.weight_versions))
    out: list[TrainingSample] = []
    turn = 0
    for a, b in bounds:
        mine = []
        while calls and calls[0][0][0] <= b:  # a later segment's calls start after its prompt, past b
            mine.append(calls.pop(0))
        tokens = episode.tokens[p + a : p + b]
        first = next((i for i in range(max(a, 0), b) if episode.loss_mask[i]), b)  # first sampled response index
        resp = b - first
        meta = dict(episode.metadata)
        spans = [[x - first, y - first] for (x, y), _ in mine]
        k = len(turn_calls(spans))
        meta["turn_indices"] = list(range(turn, turn + k))
        turn += k
        out.append(TrainingSample(
            tokens=tokens, response_length=resp, loss_mask=list(episode.loss_mask[first:b]),
            rollout_log_probs=list(episode.rollout_log_probs[first:b]), reward=episode.reward, status=episode.status,
            group_id=episode.group_id, sample_index=episode.sample_index, episode_id=episode.episode_id,
            turn_indices=list(meta["turn_indices"]), metadata=meta, raw_reward=episode.raw_reward, task_issues=list(episode.task_issues),
            weight_versions=[v for _, v in mine], generation_spans=spans, messages=episode.messages,
        ))
    if calls:
        raise TrajectoryError(f"episode {episode.episode_id}: generation spans past the last segment")
    return out


def turn_records(episode: TrainingSample) -> list[TurnRecord]:
    """The assistant turns of an episode sample, in order (empty without a call); a turn's prompt
    is its segment's tokens up to the turn (:func:`segments`).

    Raises:
        rollout.core.trajectory.TrajectoryError: a turn's span covers tokens with mask 0 (a segment
            is not one append-only trajectory).
    """
    out: list[TurnRecord] = []
    for seg in segments(episode):
        for t in _segment_turns(seg):
            t.index = len(out)
            out.append(t)
    return out


def _segment_turns(episode: TrainingSample) -> list[TurnRecord]:
    """The turns of one segment (an append-only sample), indexed from 0."""
    p = episode.prompt_length
    out: list[TurnRecord] = []
    for i, calls in enumerate(turn_calls(episode.generation_spans)):
        start, end = episode.generation_spans[calls[0]][0], episode.generation_spans[calls[-1]][1]
        if any(m != 1 for m in episode.loss_mask[start:end]):
            raise TrajectoryError(f"episode {episode.episode_id}: turn {i} spans response tokens with mask 0")
        out.append(TurnRecord(
            index=i, prompt_ids=episode.tokens[: p + start], response_ids=episode.tokens[p + start : p + end],
            rollout_log_probs=episode.rollout_log_probs[start:end],
            weight_versions=[episode.weight_versions[j] for j in calls],
            generation_spans=[(episode.generation_spans[j][0] - start, episode.generation_spans[j][1] - start) for j in calls],
        ))
    return out


class _Builder:
    """One sample being built: prompt, then response ids / mask / log-probs / calls, aligned."""

    def __init__(self, prompt_ids: list[int]):
        self.prompt = list(prompt_ids)
        self.ids: list[int] = []
        self.mask: list[int] = []
        self.logp: list[float] = []
        self.versions: list[str | None] = []
        self.spans: list[list[int]] = []
        self.turns: list[int] = []

    def tokens_len(self) -> int:
        return len(self.prompt) + len(self.ids)

    def extends(self, ids: list[int]) -> bool:
        """Whether ``ids`` starts with this sample's tokens."""
        n = len(self.prompt)
        return len(ids) >= self.tokens_len() and ids[:n] == self.prompt and ids[n : self.tokens_len()] == self.ids

    def add_context(self, ids: list[int]) -> None:
        self.ids += ids
        self.mask += [0] * len(ids)
        self.logp += [0.0] * len(ids)

    def add_turn(self, t: TurnRecord) -> None:
        off = len(self.ids)
        self.ids += t.response_ids
        self.mask += [1] * len(t.response_ids)
        self.logp += [float(x) for x in t.rollout_log_probs]
        self.versions += t.weight_versions
        self.spans += [[a + off, b + off] for a, b in t.generation_spans]
        self.turns.append(t.index)

    def sample(self, episode: TrainingSample, splits: int | None) -> TrainingSample:
        meta = dict(episode.metadata)
        meta["turn_indices"] = list(self.turns)
        if splits is not None:
            meta["sample_splits"] = splits
        return TrainingSample(
            tokens=self.prompt + self.ids, response_length=len(self.ids), loss_mask=self.mask, rollout_log_probs=self.logp,
            reward=episode.reward, status=episode.status, group_id=episode.group_id, sample_index=episode.sample_index,
            episode_id=episode.episode_id, turn_indices=list(self.turns), raw_reward=episode.raw_reward,
            task_issues=list(episode.task_issues), metadata=meta, weight_versions=self.versions, generation_spans=self.spans,
            messages=episode.messages,
        )


def per_turn_samples(episode: TrainingSample, turns: list[TurnRecord]) -> list[TrainingSample]:
    """One sample per turn that sampled a token (see the module docstring); the episode sample
    alone when none did."""
    out = []
    for t in turns:
        if not t.response_ids:
            continue
        b = _Builder(t.prompt_ids)
        b.add_turn(t)
        out.append(b.sample(episode, None))
    return out or [episode]


def merge_prefix_samples(episode: TrainingSample, turns: list[TurnRecord], tail: list[int] | None = None) -> list[TrainingSample]:
    """Consecutive turns merged while each prompt extends the sample (see the module docstring);
    every sample's ``metadata["sample_splits"]`` is the episode's number of splits. ``tail``: the
    tokens whose rest is appended after the last turn where they extend it (the last segment's;
    ``None``: the episode sample's)."""
    if not any(t.response_ids for t in turns):
        return [episode]
    builders: list[_Builder] = []
    for t in turns:
        cur = builders[-1] if builders else None
        if cur is not None and cur.extends(t.prompt_ids):
            cur.add_context(t.prompt_ids[cur.tokens_len():])
        else:
            cur = _Builder(t.prompt_ids)
            builders.append(cur)
        cur.add_turn(t)
    last = builders[-1]
    tail = episode.tokens if tail is None else tail
    if last.extends(tail):
        last.add_context(tail[last.tokens_len():])
    splits = len(builders) - 1
    if splits:
        logger.debug("episode %s: %d sample split(s) (merge_prefix)", episode.episode_id, splits)
    return [b.sample(episode, splits) for b in builders]


class TrajectoryMode:
    """``trajectory``: the episode sample, unchanged (one per episode; one per segment when it has several)."""

    name = "trajectory"

    def __init__(self, keep_messages: bool = True) -> None:
        self.keep_messages = keep_messages

    def split(self, episode: TrainingSample) -> list[TrainingSample]:
        """``[episode]`` (the same object) for one segment; else one sample per segment that
        sampled a token (:func:`segments`; all of them when none did).

        Raises:
            rollout.core.trajectory.TrajectoryError: the segments are misaligned.
        """
        segs = segments(episode)
        if len(segs) == 1:
            return segs
        return [x for x in segs if any(x.loss_mask)] or segs

    def export(self, result: InteractionResult) -> list[TrainingSample]:
        return self.split(result.to_sample(self.keep_messages))


class PerTurnMode(TrajectoryMode):
    """``per_turn``: :func:`per_turn_samples` of the append-only turns."""

    name = "per_turn"

    def split(self, episode: TrainingSample) -> list[TrainingSample]:
        """The episode's per-turn samples.

        Raises:
            rollout.core.trajectory.TrajectoryError: the episode sample is misaligned.
        """
        return per_turn_samples(episode, turn_records(episode))


class MergePrefixMode(TrajectoryMode):
    """``merge_prefix``: :func:`merge_prefix_samples` of the append-only turns."""

    name = "merge_prefix"

    def split(self, episode: TrainingSample) -> list[TrainingSample]:
        """The episode's merged samples.

        Raises:
            rollout.core.trajectory.TrajectoryError: the episode sample is misaligned.
        """
        return merge_prefix_samples(episode, turn_records(episode), segments(episode)[-1].tokens)


def episode_groups(samples: list[TrainingSample]) -> list[list[TrainingSample]]:
    """``samples`` cut into runs of consecutive samples of one episode (the order kept): how a
    mode's samples are handed out, each episode's together."""
    out: list[list[TrainingSample]] = []
    for s in samples:
        if out and out[-1][0].episode_id == s.episode_id:
            out[-1].append(s)
        else:
            out.append([s])
    return out
