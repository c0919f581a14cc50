"""What reaches training: one training policy for every path, and GRPO groups with dynamic sampling.

Plain Python, no Ray: :class:`rollout.core.pool.RolloutPool` feeds results in, and the CLI's files go
through the same :class:`TrainingPolicy`, so ``samples()``, ``groups()``, ``Batch.from_samples`` and
``samples.jsonl`` can never disagree on what is trained (docs/design.md invariant 4).

* :class:`TrainingPolicy` decides whether one sample may be trained: its status must be in
  ``rollout.train_statuses``, and, with ``rollout.max_staleness``, the oldest weight version that
  sampled it must be at most that many versions behind the trainer's current version at delivery
  (AReaL's ``max_head_offpolicyness``); ``rollout.on_stale=keep`` keeps stale samples but counts them.
* :class:`GroupAssembler` turns a stream of samples into complete groups (all
  ``n_samples_per_task`` samples of one task in one submission). A member that may not be trained
  is re-run (``rollout.on_group_failure=rerun``, at most ``rollout.max_member_reruns`` times per
  member) or its group is dropped (``drop``); ``rollout.filter_groups=zero_variance`` drops complete
  groups whose rewards are all equal: their group-normalised advantages are all zero, so they carry
  no gradient (DAPO's dynamic sampling, Yu et al. 2025, arXiv:2503.14476).

Everything kept out of training is recorded once as an :class:`Excluded` with its reason, so the
trainer sees every episode exactly once: in a kept group or in the excluded stream.
"""

from __future__ import annotations

import collections
import logging
from dataclasses import dataclass

from rollout.core.records import TrainingSample
from rollout.core.telemetry.recorder import NULL_RECORDER, Recorder
from rollout.core.telemetry.registry import GROUPS as GROUP_OUTCOMES
from rollout.core.telemetry.registry import SAMPLES_EXCLUDED

logger = logging.getLogger(__name__)

# Reasons an episode is kept out of training, besides its status (which is its own reason).
STALE = "stale"
ZERO_VARIANCE = "zero_variance"
GROUP_DROPPED = "group_dropped"  # a member could not be trained and was not (or no longer) re-run
GROUP_CANCELLED = "group_cancelled"  # the group was abandoned (surplus of dynamic sampling)
# The group totals GroupAssembler.counts always has (0 until counted); ``excluded_<reason>`` keys
# are added as exclusions happen.
GROUP_COUNTERS = ("groups_kept", "groups_filtered", "groups_dropped", "groups_cancelled", "members_rerun")


@dataclass(frozen=True)
class Excluded:
    """One sample kept out of training.

    Attributes:
        sample: the sample (``status`` says how the episode ended).
        reason: its status when that is not trainable (e.g. ``env_error``), else ``stale``,
            ``zero_variance``, ``group_dropped`` or ``group_cancelled``.
    """

    sample: TrainingSample
    reason: str


@dataclass(frozen=True)
class TrainingPolicy:
    """Whether a sample may be trained (see the module docstring).

    Attributes:
        train_statuses: statuses that may be trained.
        max_staleness: versions a sample's oldest ``/generate`` call may lag the trainer's current
            version; ``None``: no bound.
        on_stale: ``drop`` | ``keep``.
    """

    train_statuses: frozenset[str]
    max_staleness: int | None = None
    on_stale: str = "drop"

    @classmethod
    def from_config(cls, rollout_cfg) -> "TrainingPolicy":
        """From the ``rollout`` config section."""
        return cls(frozenset(rollout_cfg.train_statuses), rollout_cfg.max_staleness, rollout_cfg.on_stale)

    def staleness(self, sample: TrainingSample, current_version: int) -> int | None:
        """``current_version`` minus the oldest version that sampled ``sample`` (``None`` when no
        call was made, or when ``max_staleness`` is off).

        Raises:
            ValueError: ``max_staleness`` is set and a version is not an integer.
        """
        if self.max_staleness is None or not sample.weight_versions:
            return None
        return int(current_version) - min(sample.numeric_weight_versions())

    def exclusion(self, sample: TrainingSample, current_version: int) -> str | None:
        """Why ``sample`` may not be trained at ``current_version``, or ``None`` if it may.

        Raises:
            ValueError: see :meth:`staleness`.
        """
        if sample.status not in self.train_statuses:
            return sample.status
        try:
            lag = self.staleness(sample, current_version)
        except ValueError as e:  # a server without numeric versions: the lag is unknown, so too large
            logger.warning("%s", e)
            lag = float("inf")
        if lag is not None and lag > self.max_staleness:
            sample.metadata["staleness"] = None if lag == float("inf") else lag
            if self.on_stale == "drop":
                return STALE
            sample.metadata["stale_kept"] = True
        return None


@dataclass(frozen=True)
class Rerun:
    """A group member to run again: ``group_id``, ``sample_index`` and the rerun's number (1, 2, ...)."""

    group_id: str
    sample_index: int
    number: int


class GroupAssembler:
    """Builds complete, trainable groups from samples as they arrive (see the module docstring).

    Args:
        policy: the training policy.
        on_member_failure: ``rerun`` | ``drop``.
        max_member_reruns: re-runs per group member (then its group is dropped).
        filter_groups: ``None`` or ``"zero_variance"``.
        recorder: where exclusions (by reason) and group outcomes (kept, filtered, dropped,
            cancelled) are recorded, as :attr:`counts` counts them; ``None``: nowhere.

    Usage: :meth:`expect` each group when it is submitted, :meth:`add` each sample when it is
    delivered (the returned :class:`Rerun` s must be submitted by the caller, with
    :meth:`expect_rerun`), take complete groups with :meth:`pop_ready`, and everything kept out of
    training with :meth:`take_excluded` (:attr:`excluded` holds those not taken yet, oldest
    first). ``counts`` holds the running totals.
    """

    def __init__(self, policy: TrainingPolicy, on_member_failure: str = "rerun", max_member_reruns: int = 2, filter_groups: str | None = None,
                 recorder: Recorder | None = None):
        if on_member_failure not in ("rerun", "drop"):
            raise ValueError(f"on_member_failure must be rerun or drop, got {on_member_failure!r}")
        if filter_groups not in (None, "zero_variance"):
            raise ValueError(f"filter_groups must be None or zero_variance, got {filter_groups!r}")
        self.policy = policy
        self.on_member_failure = on_member_failure
        self.max_member_reruns = max_member_reruns
        self.filter_groups = filter_groups
        self._size: dict[str, int] = {}
        self._members: dict[str, dict[int, TrainingSample]] = {}
        self._waiting: dict[str, int] = {}  # episodes of an open group not delivered yet
        self._reruns: collections.Counter[tuple[str, int]] = collections.Counter()
        self._closed: dict[str, str] = {}  # group id -> why it was dropped (late members are excluded with it)
        self._ready: collections.deque[list[TrainingSample]] = collections.deque()
        self.excluded: collections.deque[Excluded] = collections.deque()
        self.counts: collections.Counter[str] = collections.Counter(dict.fromkeys(GROUP_COUNTERS, 0))
        self._late: list[Rerun] = []  # re-runs decided by pop_ready
        self._recorder = recorder if recorder is not None else NULL_RECORDER
        self._outcomes = {o: self._recorder.bind(GROUP_OUTCOMES, outcome=o) for o in ("kept", "filtered", "dropped", "cancelled")}

    # -- bookkeeping -------------------------------------------------------------------------
    def expect(self, group_id: str, size: int) -> None:
        """Register a submitted group of ``size`` episodes.

        Raises:
            ValueError: the group was registered before.
        """
        if group_id in self._size:
            raise ValueError(f"group {group_id} was already submitted")
        self._size[group_id] = size
        self._members[group_id] = {}
        self._waiting[group_id] = size

    def expect_rerun(self, rerun: Rerun) -> None:
        """Register that ``rerun`` was submitted (one more episode to wait for)."""
        self._waiting[rerun.group_id] = self._waiting.get(rerun.group_id, 0) + 1

    @property
    def open_groups(self) -> int:
        """Groups submitted that are neither complete nor dropped."""
        return len(self._members)

    @property
    def ready_groups(self) -> int:
        return len(self._ready)

    def open_group_ids(self) -> list[str]:
        return list(self._members)

    # -- delivery ----------------------------------------------------------------------------
    def add(self, sample: TrainingSample, current_version: int) -> list[Rerun]:
        """Take one delivered sample; returns the members to re-run (possibly none).

        Raises:
            KeyError: the sample's group was never registered with :meth:`expect`.
            ValueError: ``max_staleness`` is set and the sample's versions are not integers.
        """
        gid = sample.group_id
        if gid in self._closed:
            self._waiting[gid] -= 1
            self.exclude(sample, self._closed[gid])
            if self._waiting[gid] == 0:
                del self._waiting[gid]
            return []
        if gid not in self._members:
            raise KeyError(f"sample of unknown group {gid} (episode {sample.metadata.get('episode_id')})")
        self._waiting[gid] -= 1
        reason = self.policy.exclusion(sample, current_version)
        if reason is None:
            self._members[gid][sample.sample_index] = sample
            if len(self._members[gid]) == self._size[gid]:
                self._complete(gid)
            return []
        self.exclude(sample, reason)
        return self._member_failed(gid, sample.sample_index)

    def _member_failed(self, gid: str, index: int) -> list[Rerun]:
        key = (gid, index)
        if self.on_member_failure == "rerun" and self._reruns[key] < self.max_member_reruns:
            self._reruns[key] += 1
            self.counts["members_rerun"] += 1
            return [Rerun(gid, index, self._reruns[key])]
        self._close(gid, GROUP_DROPPED)
        self.counts["groups_dropped"] += 1
        self._outcomes["dropped"].record(1)
        return []

    def _complete(self, gid: str) -> None:
        members = self._members.pop(gid)
        self._waiting.pop(gid, None)
        group = [members[i] for i in sorted(members)]
        if self.filter_groups == "zero_variance" and len({s.reward for s in group}) == 1:
            self.counts["groups_filtered"] += 1
            self._outcomes["filtered"].record(1)
            for s in group:
                self.exclude(s, ZERO_VARIANCE)
            return
        self._ready.append(group)

    def _close(self, gid: str, reason: str) -> None:
        """Drop an open group: its members so far are excluded now, late ones on arrival; a
        re-run :meth:`pop_ready` decided for it and not handed to the caller yet is forgotten
        (the group no longer wants it)."""
        for s in self._members.pop(gid, {}).values():
            self.exclude(s, reason)
        self._late = [rr for rr in self._late if rr.group_id != gid]
        if self._waiting.get(gid, 0) > 0:
            self._closed[gid] = reason
        else:
            self._waiting.pop(gid, None)

    def exclude(self, sample: TrainingSample, reason: str) -> None:
        """Record ``sample`` as kept out of training for ``reason``."""
        sample.metadata["excluded_reason"] = reason
        self.excluded.append(Excluded(sample, reason))
        self.counts[f"excluded_{reason}"] += 1
        self._recorder.bind(SAMPLES_EXCLUDED, reason=reason).record(1)

    @property
    def excluded_waiting(self) -> int:
        """Exclusions recorded and not taken yet (see :meth:`take_excluded`)."""
        return len(self.excluded)

    def take_excluded(self) -> Excluded | None:
        """The oldest exclusion not taken yet (each is taken once), or ``None`` when there is none."""
        try:
            return self.excluded.popleft()
        except IndexError:
            return None

    def forget_member(self, group_id: str) -> None:
        """One member of ``group_id`` was delivered outside the group stream (``samples()``):
        stop tracking the group once all of its members were."""
        if group_id in self._waiting:
            self._waiting[group_id] -= 1
            if self._waiting[group_id] <= 0:
                for d in (self._waiting, self._members, self._size, self._closed):
                    d.pop(group_id, None)

    def abandon_open_groups(self) -> list[str]:
        """Drop every open group (its episodes are no longer wanted: dynamic sampling's surplus).
        Returns their ids."""
        gids = list(self._members)
        for gid in gids:
            self._close(gid, GROUP_CANCELLED)
        self.counts["groups_cancelled"] += len(gids)
        self._outcomes["cancelled"].record(len(gids))
        return gids

    def pop_ready(self, current_version: int, limit: int | None = None) -> list[list[TrainingSample]]:
        """Take up to ``limit`` complete groups, checking staleness again at hand-over: a group
        that waited until a member went stale loses that member (re-run or group dropped, as on
        arrival; see :meth:`take_late_reruns`). Returns the groups, each sorted by ``sample_index``."""
        out: list[list[TrainingSample]] = []
        while self._ready and (limit is None or len(out) < limit):
            group = self._ready.popleft()
            stale = [s for s in group if self.policy.exclusion(s, current_version) is not None]
            if not stale:
                out.append(group)
                self.counts["groups_kept"] += 1
                self._outcomes["kept"].record(1)
                continue
            gid = group[0].group_id
            self._members[gid] = {s.sample_index: s for s in group if s not in stale}
            self._waiting[gid] = 0
            for s in stale:
                self.exclude(s, STALE)
                if gid in self._members:  # not dropped by an earlier stale member
                    reruns = self._member_failed(gid, s.sample_index)  # (a drop forgets the group's earlier ones)
                    self._late.extend(reruns)
        return out

    def take_late_reruns(self) -> list[Rerun]:
        """Re-runs decided in :meth:`pop_ready` (stale members of waiting groups); the caller
        submits them like those :meth:`add` returns."""
        out, self._late = self._late, []
        return out


def rerun_episode_id(episode_id: str, number: int) -> str:
    """Episode id of a member's ``number``-th re-run (a new id: the failed episode was delivered
    under its own)."""
    base = episode_id.split("~r", 1)[0]
    return f"{base}~r{number}"


def episode_advantages(group: list[TrainingSample], eps: float = 1e-6) -> list[float]:
    """GRPO's group-normalised advantage ``(r - mean) / (std + eps)`` of each sample of ``group``,
    computed over the group's EPISODES (one reward each, population std), not over its samples:
    with ``rollout.sample_mode=per_turn`` / ``merge_prefix`` an episode has several samples, all
    with the episode's reward and the same advantage. Returns one float per sample, in order.

    Raises:
        ValueError: ``group`` is empty.
    """
    if not group:
        raise ValueError("cannot compute advantages of an empty group")
    rewards: dict[str, float] = {}
    for s in group:
        rewards.setdefault(s.episode_id, float(s.reward))
    values = list(rewards.values())
    mean = sum(values) / len(values)
    std = (sum((r - mean) ** 2 for r in values) / len(values)) ** 0.5
    return [(rewards[s.episode_id] - mean) / (std + eps) for s in group]
