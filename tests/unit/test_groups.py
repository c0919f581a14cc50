"""The training policy and GRPO group assembly (pure, no Ray), and the weight-version records."""

from __future__ import annotations

import collections
import json

import pytest

from rollout.core.groups import (
    GROUP_CANCELLED,
    GROUP_DROPPED,
    STALE,
    ZERO_VARIANCE,
    GroupAssembler,
    Rerun,
    TrainingPolicy,
    rerun_episode_id,
)
from rollout.core.records import (
    DEFAULT_TRAIN_STATUSES,
    Batch,
    EpisodeSpec,
    EpisodeStatus,
    InteractionResult,
    TrainingSample,
)
from rollout.core.trajectory import Trajectory, TrajectoryError

POLICY = TrainingPolicy(frozenset(DEFAULT_TRAIN_STATUSES))


def sample(gid: str, idx: int, reward: float = 1.0, status: str = "completed", versions=("0",), eid: str | None = None) -> TrainingSample:
    """A small valid sample: 2 prompt tokens, one generated token per /generate call."""
    n = len(versions)
    return TrainingSample(
        tokens=[1, 2] + list(range(10, 10 + n)), response_length=n, loss_mask=[1] * n, rollout_log_probs=[-0.5] * n,
        reward=reward, status=status, group_id=gid, sample_index=idx,
        metadata={"episode_id": eid or f"{gid}/{idx}", "domain": "retail"},
        weight_versions=list(versions), generation_spans=[[k, k + 1] for k in range(n)],
    )


# -- records -------------------------------------------------------------------------------------
def test_trajectory_records_one_version_and_span_per_call():
    t = Trajectory(prompt_ids=[1, 2, 3])
    t.append_generated([10, 11], [-0.1, -0.2], "0")
    t.append_generated([], [], "1")  # an interrupted call that sampled nothing
    t.append_generated([12], [-0.3], "1")
    t.append_context([99, 98])
    t.append_generated([13, 14], [-0.4, -0.5], 2)
    t.check()
    assert t.weight_versions == ["0", "1", "1", "2"]
    assert t.generation_spans == [(0, 2), (2, 2), (2, 3), (5, 7)]
    res = InteractionResult(EpisodeSpec("e", "retail", "0", "g", 0), EpisodeStatus.COMPLETED, 1.0, t)
    s = res.to_sample()
    assert s.token_weight_versions() == ["0", "0", "1", None, None, "2", "2"]
    assert s.numeric_weight_versions() == [0, 1, 1, 2]
    # round trip through samples.jsonl keeps them
    back = TrainingSample.from_dict(json.loads(json.dumps(s.to_dict())))
    assert back.weight_versions == s.weight_versions and back.generation_spans == [[0, 2], [2, 2], [2, 3], [5, 7]]


def test_discard_from_cuts_spans_and_check_catches_misalignment():
    t = Trajectory(prompt_ids=[1])
    t.append_context([5])
    t.append_generated([10, 11, 12], [-1.0, -1.0, -1.0], "0")
    assert t.discard_from(2) == 2  # restart_turn: drop the partial turn
    assert t.response_ids == [5, 10] and t.generation_spans == [(1, 2)]
    t.append_generated([20, 21], [-2.0, -2.0], "1")
    t.check()
    assert t.generation_spans == [(1, 2), (2, 4)]
    with pytest.raises(TrajectoryError):
        t.discard_from(9)
    t.loss_mask[0] = 1  # a context token masked 1: no call sampled it
    with pytest.raises(TrajectoryError, match="mask 1"):
        t.check()
    t.loss_mask[0] = 0
    t.generation_spans[1] = (1, 4)  # overlaps the previous call
    with pytest.raises(TrajectoryError, match="out of order"):
        t.check()
    with pytest.raises(ValueError, match="not all integers"):
        sample("g", 0, versions=("default",)).numeric_weight_versions()


def test_batch_refuses_samples_outside_train_statuses():
    good = [sample("g", 0), sample("g", 1, reward=0.0, status="truncated")]
    assert Batch.from_samples(good).tokens.shape == (2, 3)
    for bad in ("env_error", "policy_error"):
        with pytest.raises(ValueError, match=rf"g/2 \({bad}\)"):
            Batch.from_samples(good + [sample("g", 2, status=bad)])
    # a trainer that chose to train a status may pass it
    assert Batch.from_samples([sample("g", 0, status="env_error")], train_statuses=["env_error"]).rewards.tolist() == [1.0]


def test_episode_seeds_differ_across_submissions_and_are_reproducible():
    from rollout.core.pool import episode_seed, make_specs

    first = make_specs("retail", ["10", "25"], 2, seed=0, prefix="b0:")
    again = make_specs("retail", ["10", "25"], 2, seed=0, prefix="b1:")  # the same tasks, submitted again
    seeds = [s.seed for s in first + again]
    assert len(set(seeds)) == 8  # a new group samples new trajectories
    assert [s.seed for s in make_specs("retail", ["10", "25"], 2, seed=0, prefix="b0:")] == [s.seed for s in first]
    assert [s.seed for s in make_specs("retail", ["10", "25"], 2, seed=1, prefix="b0:")] != [s.seed for s in first]
    assert first[1].seed == episode_seed(0, "b0:retail/10", 1) and 0 <= first[1].seed < 2**31 - 1


# -- training policy -----------------------------------------------------------------------------
def test_training_policy_statuses_and_staleness():
    assert POLICY.exclusion(sample("g", 0), 5) is None  # no staleness bound: any lag
    for st in ("env_error", "policy_error", "aborted", "cancelled"):
        assert POLICY.exclusion(sample("g", 0, status=st), 0) == st
    bounded = TrainingPolicy(frozenset(DEFAULT_TRAIN_STATUSES), max_staleness=1)
    assert bounded.exclusion(sample("g", 0, versions=("1", "2")), 2) is None  # oldest lags by 1
    s = sample("g", 0, versions=("0", "2"))
    assert bounded.exclusion(s, 2) == STALE and s.metadata["staleness"] == 2
    keep = TrainingPolicy(frozenset(DEFAULT_TRAIN_STATUSES), max_staleness=1, on_stale="keep")
    s = sample("g", 0, versions=("0",))
    assert keep.exclusion(s, 3) is None and s.metadata["stale_kept"] is True
    # a server without numeric versions: the lag is unknown, so it counts as stale (no crash)
    assert bounded.exclusion(sample("g", 0, versions=("default",)), 0) == STALE


# -- groups --------------------------------------------------------------------------------------
def _delivered_once(asm: GroupAssembler, kept: list[list[TrainingSample]], added: list[TrainingSample]) -> None:
    """Every sample added is in exactly one kept group or excluded once."""
    seen = [s.metadata["episode_id"] for g in kept for s in g] + [e.sample.metadata["episode_id"] for e in asm.excluded]
    assert collections.Counter(seen) == collections.Counter(s.metadata["episode_id"] for s in added)


def test_complete_groups_and_reruns():
    asm = GroupAssembler(POLICY, "rerun", max_member_reruns=1)
    asm.expect("a", 2)
    asm.expect("b", 2)
    added = [sample("a", 1), sample("b", 0), sample("a", 0)]
    for s in added:
        assert asm.add(s, 0) == []
    assert asm.open_groups == 1 and asm.ready_groups == 1
    failed = sample("b", 1, status="policy_error")
    (rr,) = asm.add(failed, 0)
    assert (rr.group_id, rr.sample_index, rr.number) == ("b", 1, 1)
    asm.expect_rerun(rr)
    rerun = sample("b", 1, reward=0.0, eid=rerun_episode_id("b/1", 1))
    assert asm.add(rerun, 0) == []
    kept = asm.pop_ready(0)
    assert [[s.metadata["episode_id"] for s in g] for g in kept] == [["a/0", "a/1"], ["b/0", "b/1~r1"]]
    assert [e.reason for e in asm.excluded] == ["policy_error"]
    assert asm.counts["members_rerun"] == 1 and asm.open_groups == 0
    _delivered_once(asm, kept, added + [failed, rerun])
    with pytest.raises(ValueError):
        asm.expect("a", 2)


def test_group_dropped_when_reruns_run_out_late_members_excluded():
    asm = GroupAssembler(POLICY, "rerun", max_member_reruns=1)
    asm.expect("g", 3)
    first = sample("g", 0)
    asm.add(first, 0)
    f1 = sample("g", 1, status="env_error")
    (rr,) = asm.add(f1, 0)
    asm.expect_rerun(rr)
    f2 = sample("g", 1, status="env_error", eid="g/1~r1")
    assert asm.add(f2, 0) == []  # out of re-runs: the group is dropped
    late = sample("g", 2)
    assert asm.add(late, 0) == []
    assert asm.pop_ready(0) == [] and asm.open_groups == 0
    reasons = {e.sample.metadata["episode_id"]: e.reason for e in asm.excluded}
    assert reasons == {"g/1": "env_error", "g/1~r1": "env_error", "g/0": GROUP_DROPPED, "g/2": GROUP_DROPPED}
    assert asm.counts["groups_dropped"] == 1
    _delivered_once(asm, [], [first, f1, f2, late])


def test_on_group_failure_drop_and_zero_variance_filter():
    asm = GroupAssembler(POLICY, "drop", filter_groups="zero_variance")
    for gid in ("same", "mixed", "broken"):
        asm.expect(gid, 2)
    added = [sample("same", 0, 1.0), sample("same", 1, 1.0), sample("mixed", 0, 1.0), sample("mixed", 1, 0.0),
             sample("broken", 0, 1.0), sample("broken", 1, status="user_error")]
    for s in added:
        assert asm.add(s, 0) == []  # drop: never a re-run
    kept = asm.pop_ready(0)
    assert [g[0].group_id for g in kept] == ["mixed"]
    reasons = collections.Counter(e.reason for e in asm.excluded)
    assert reasons == {ZERO_VARIANCE: 2, "user_error": 1, GROUP_DROPPED: 1}
    assert asm.counts["groups_filtered"] == 1 and asm.counts["groups_dropped"] == 1
    _delivered_once(asm, kept, added)


def test_a_group_dropped_at_hand_over_submits_no_rerun_it_decided_before():
    """Both members stale at hand-over: member 0 may be re-run, member 1 has used its re-runs, so
    the group is dropped; the re-run decided for member 0 just before must not be submitted (its
    delivery would belong to a group the assembler no longer knows: a KeyError in the stream)."""
    policy = TrainingPolicy(frozenset(DEFAULT_TRAIN_STATUSES), max_staleness=0)
    asm = GroupAssembler(policy, "rerun", max_member_reruns=1)
    asm.expect("g", 2)
    assert [rr.sample_index for rr in asm.add(sample("g", 1, status="env_error"), 0)] == [1]  # member 1's one re-run
    asm.expect_rerun(Rerun("g", 1, 1))
    asm.add(sample("g", 0), 0)
    asm.add(sample("g", 1, eid="g/1~r1"), 0)
    assert asm.ready_groups == 1
    assert asm.pop_ready(1) == []  # at version 1 both members (version 0) are stale
    assert asm.take_late_reruns() == []
    assert asm.counts["groups_dropped"] == 1 and asm.open_groups == 0
    assert [e.reason for e in asm.excluded] == ["env_error", STALE, STALE]


def test_staleness_checked_again_at_hand_over_and_abandon():
    policy = TrainingPolicy(frozenset(DEFAULT_TRAIN_STATUSES), max_staleness=1)
    asm = GroupAssembler(policy, "rerun", max_member_reruns=2)
    asm.expect("g", 2)
    a, b = sample("g", 0, versions=("0",)), sample("g", 1, versions=("1",))
    asm.add(a, 1)
    asm.add(b, 1)
    assert asm.ready_groups == 1
    assert asm.pop_ready(2) == []  # at version 2, member 0 (version 0) lags by 2 > 1
    (rr,) = asm.take_late_reruns()
    assert (rr.sample_index, asm.open_groups) == (0, 1)
    assert [e.reason for e in asm.excluded] == [STALE]
    asm.expect_rerun(rr)
    fresh = sample("g", 0, versions=("2",), eid="g/0~r1")
    asm.add(fresh, 2)
    (group,) = asm.pop_ready(2)
    assert [s.metadata["episode_id"] for s in group] == ["g/0~r1", "g/1"]
    # abandoning open groups: their members are excluded now and on arrival
    asm.expect("h", 2)
    h0 = sample("h", 0, versions=("2",))
    asm.add(h0, 2)
    assert asm.abandon_open_groups() == ["h"]
    h1 = sample("h", 1, versions=("2",))
    asm.add(h1, 2)
    assert [e.reason for e in list(asm.excluded)[-2:]] == [GROUP_CANCELLED, GROUP_CANCELLED]
    _delivered_once(asm, [group], [a, b, fresh, h0, h1])
