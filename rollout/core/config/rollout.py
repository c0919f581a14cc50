"""The ``rollout`` section: what to run, where results go and what reaches training (groups,
staleness, sample modes; :mod:`rollout.core.groups`, :mod:`rollout.core.sample_modes`)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional

from rollout.core.config.base import Choice, Problems, bound_problems, setting
from rollout.core.export import SAMPLE_MODES
from rollout.core.records import DEFAULT_TRAIN_STATUSES, EpisodeStatus
from rollout.core.shaping import REWARD_SHAPERS, check_shaper_names


class PartialRollout(Choice):
    """``rollout.partial_rollout``: what a turn interrupted by a weight update becomes."""

    CONTINUE = "continue"  # keep the tokens sampled so far (old weights, mask 1) and generate the rest
    RESTART_TURN = "restart_turn"  # drop them and regenerate the turn
    DROP = "drop"  # end the episode aborted


class SampleMode(Choice):
    """The built-in values of ``rollout.sample_mode``: what training samples an episode becomes
    (:mod:`rollout.core.sample_modes`). The key is open (a string checked against
    :data:`rollout.core.export.SAMPLE_MODES`, where more modes are registered); these members name
    the built-ins for code that compares with them."""

    TRAJECTORY = "trajectory"  # one sample per episode: the whole append-only token sequence
    PER_TURN = "per_turn"  # one sample per assistant turn: the turn's prompt and the tokens it sampled
    MERGE_PREFIX = "merge_prefix"  # consecutive turns in one sample while each prompt extends it; a new sample where not


class OnStale(Choice):
    """``rollout.on_stale``: an episode older than ``rollout.max_staleness`` at delivery."""

    DROP = "drop"  # held back from training (counted)
    KEEP = "keep"  # trained anyway (counted)


class GroupFilter(Choice):
    """``rollout.filter_groups`` (null: none): which complete groups ``groups()`` drops."""

    ZERO_VARIANCE = "zero_variance"  # groups whose rewards are all equal (DAPO dynamic sampling)


class OnGroupFailure(Choice):
    """``rollout.on_group_failure``: a group member excluded from training (failure, stale)."""

    RERUN = "rerun"  # run the member again, up to rollout.max_member_reruns times
    DROP = "drop"  # drop the whole group


@dataclass
class RewardShapingConfig:
    """``rollout.reward_shaping``: opt-in shaping of the reward trainers consume
    (:mod:`rollout.core.shaping`); every sample keeps the benchmark's own reward in ``raw_reward``."""

    shapers: list[str] = setting([], doc="""
        Reward shapers applied in order to every episode the benchmark graded (status completed); [] = none: reward ==
        raw_reward. Built in: partial_credit = the mean of the reward basis's components instead of their product (first in
        the list) | action_aware = scale by the share of the task's expected actions the episode made (tau2 lists them but
        does not count them: tau2-bench #224), weighted by action_weight | turn_discount = times turn_discount ** (turns - 1)
        | a registered one (rollout.core.shaping.register_reward_shaper). The sample's reward is the shaped one,
        raw_reward the benchmark's.""")
    action_weight: float = setting(1.0, ge=0.0, le=1.0, doc="""
        action_aware: reward * ((1 - action_weight) + action_weight * matched / expected actions); 1 = the reward scales
        with the share of expected actions made, lower keeps part of it for an episode that reached the goal another way.""")
    turn_discount: float = setting(0.99, gt=0.0, le=1.0, doc="turn_discount: the per-turn discount gamma; reward * gamma ** (turns - 1).")

    def problems(self) -> Problems:
        """This section's bad values: its ranges, names no shaper is registered under, a name twice,
        partial_credit not first; no I/O."""
        yield from bound_problems(self, "rollout.reward_shaping")
        for name in self.shapers:
            if (problem := REWARD_SHAPERS.problem(str(name))) is not None:
                yield "rollout.reward_shaping.shapers", problem
        if (problem := check_shaper_names([str(n) for n in self.shapers])) is not None:
            yield "rollout.reward_shaping.shapers", problem


@dataclass
class RolloutConfig:
    """``rollout``: what to run and where results go."""

    n_samples_per_task: int = setting(1, ge=1, doc="Episodes per task: the group size.")
    output_dir: str = setting("outputs/run", doc="""
        Where the journal, samples and summary go: a folder that is missing, empty or holds this run (a folder holding other
        files is refused unless --overwrite). A leading ~ is the home folder; a relative path is relative to the working
        directory, which under ray job submit is Ray's copy of the project on the head: name an absolute folder there.""")
    keep_messages: bool = setting(True, doc="""
        Keep each episode's conversation (OpenAI chat messages: the user's turns, the assistant's replies and tool calls,
        the tool results; TrainingSample.messages) in the journal, the result files and the trainer API's samples; false:
        leave it out for space (the token fields decode to the same text).""")
    seed: int = setting(0, doc="Episode seeds are a stable hash of it, the group id and the sample index.")
    weight_version: int = setting(0, doc="The trainer's weight version at start (numeric, for max_staleness).")
    train_statuses: list[str] = setting(list(DEFAULT_TRAIN_STATUSES), doc="""
        Statuses that reach training (samples(), groups(), Batch.from_samples, samples.jsonl); the others reach the trainer
        only through the pool's excluded() stream and failed.jsonl. Default: the policy outcomes.""")
    partial_rollout: PartialRollout = setting(PartialRollout.CONTINUE, doc="""
        A turn interrupted by a weight update (pause with mode=abort): continue = keep the tokens sampled so far (old
        weights, mask 1) and generate the rest of the turn; restart_turn = drop them and regenerate the turn; drop = end the
        episode aborted.""")
    max_staleness: Optional[int] = setting(None, doc="""
        Versions the oldest /generate call of an episode may lag the trainer's current version at delivery (AReaL's
        max_head_offpolicyness); null: no bound.""")
    on_stale: OnStale = setting(OnStale.DROP, doc="""
        An episode past max_staleness: drop = held back from training (counted, re-run in groups) | keep (counted).""")
    filter_groups: Optional[GroupFilter] = setting(None, doc="""
        groups(): zero_variance drops groups whose rewards are all equal (DAPO); null: none.""")
    on_group_failure: OnGroupFailure = setting(OnGroupFailure.RERUN, doc="""
        groups(): a member excluded from training (infrastructure failure, stale) is re-run up to max_member_reruns times
        (rerun), or its whole group is dropped (drop).""")
    max_member_reruns: int = setting(2, ge=0, doc="groups(): re-runs of a member excluded from training (on_group_failure=rerun).")
    sample_mode: str = setting(SampleMode.TRAJECTORY.value, doc="""
        What samples an episode becomes (docs/design.md "A sample mode"): trajectory = one per episode (one per segment
        after a compaction) | per_turn = one per assistant turn | merge_prefix = consecutive turns in one sample while each
        prompt extends it | a registered one (rollout.register_sample_mode).""")
    reward_shaping: RewardShapingConfig = field(default_factory=RewardShapingConfig)

    def expand_paths(self) -> None:
        """Expand a leading ``~`` / ``~user`` of ``output_dir`` (:func:`os.path.expanduser`: a string
        operation on ``HOME``), once, so that every writer of the run (the pre-start check, the
        journal, the result files, the summary) names the same folder."""
        self.output_dir = os.path.expanduser(self.output_dir)

    def problems(self) -> Problems:
        """This section's bad values, as ``(key, message)``: its keys' ranges, then its rules; no I/O. (``rollout.sample_mode``'s
        rule with ``policy.history`` is :mod:`rollout.core.config.rules`'.)"""
        yield from bound_problems(self, "rollout")
        if not self.output_dir.strip():
            yield "rollout.output_dir", "is empty, which would write the run into the working directory: name a folder"
        elif self.output_dir.startswith("~"):  # left by expand_paths: no such user
            yield "rollout.output_dir", (f"{self.output_dir!r}: {self.output_dir.split(os.sep)[0]!r} is no user's home folder here "
                                         "(it would be a folder of that name in the working directory): write the path out")
        valid = {x.value for x in EpisodeStatus}
        for st in self.train_statuses:
            if st not in valid:
                yield "rollout.train_statuses", f"unknown status {st!r}; valid: {sorted(valid)}"
        if not (self.max_staleness is None or self.max_staleness >= 0):
            yield "rollout.max_staleness", "must be null (off) or >= 0"
        # registered name: rollout.sample_mode (rollout.core.export)
        if (problem := SAMPLE_MODES.problem(self.sample_mode)) is not None:
            yield "rollout.sample_mode", problem
        yield from self.reward_shaping.problems()
