import array

import numpy as np
import pytest

from rollout.core.records import Batch, EpisodeSpec, EpisodeStatus, InteractionResult
from rollout.core.trajectory import Trajectory, TrajectoryError


def test_trajectory_keeps_tokens_mask_logprobs_aligned():
    t = Trajectory(prompt_ids=[1, 2, 3])
    t.append_generated([4, 5], [-0.1, -0.2])
    t.append_context([6])
    t.append_generated([7], [-0.3])
    assert t.tokens == [1, 2, 3, 4, 5, 6, 7]
    assert t.loss_mask == [1, 1, 0, 1]
    assert t.rollout_log_probs == [-0.1, -0.2, 0.0, -0.3]
    t.check()
    with pytest.raises(TrajectoryError):
        t.append_generated([8, 9], [-0.1])


def _ops(t: Trajectory) -> Trajectory:
    """The same appends and discards on any form; big ids, tiny log-probs, an empty call, context
    ids as a list and as an int64 array (what the episode loop appends)."""
    t.append_generated([4, 151_643, 2**40], [-0.1, -1e-300, -23.75])
    t.append_context([6, 7])
    t.append_context(array.array("q", [12, 2**41]))
    t.append_generated([], [], "v1")
    t.append_generated([8, 9, 10], [-0.5, -0.25, -0.125], "v2")
    assert t.discard_from(t.response_length - 2) == 2
    t.append_generated([11], [-2.0], "v2")
    return t


def test_a_compact_trajectory_gives_the_same_record_and_is_not_walked_by_the_gc():
    import gc

    plain = _ops(Trajectory(prompt_ids=[1, 2, 3]))
    compact = Trajectory(prompt_ids=[1, 2, 3]).compact()
    _ops(compact)
    assert compact.is_compact
    # the collector visits what tp_traverse gives: for a list, each item; for an array, its type alone
    assert len(gc.get_referents(plain.response_ids)) == plain.response_length
    for seq in (compact.prompt_ids, compact.response_ids, compact.loss_mask, compact.rollout_log_probs):
        assert not [x for x in gc.get_referents(seq) if not isinstance(x, type)]
    compact.check()
    assert compact.tokens == plain.tokens and type(compact.tokens) is list
    assert compact.token_array().dtype == np.int64 and compact.token_array().tolist() == plain.tokens == plain.token_array().tolist()
    assert len(compact) == len(plain) and compact.response_length == plain.response_length
    compact.expand()
    assert not compact.is_compact
    assert compact == plain  # every field, values and types: lists of ints and floats again
    for name in ("prompt_ids", "response_ids", "loss_mask", "rollout_log_probs"):
        assert type(getattr(compact, name)) is list
        assert [type(x) for x in getattr(compact, name)] == [type(x) for x in getattr(plain, name)]
    assert compact.rollout_log_probs[1] == -1e-300 and compact.response_ids[2] == 2**40
    assert compact.expand() is compact and compact == plain  # expanding lists changes nothing
    with pytest.raises(TrajectoryError):  # the alignment check holds on the compact form too
        Trajectory(prompt_ids=[1]).compact().append_generated([2, 3], [-0.1])


def test_a_compact_trajectory_grows_while_something_holds_every_object_the_collector_tracks():
    """An ``array.array`` cannot grow while a buffer of it is exported. Building the /generate ids
    must leave no view of the live arrays that anything else could keep: here a profile hook, run
    at every call into C and every return from one while the ids are built, keeps every
    memoryview the collector tracks (as any ``gc.get_objects()`` caller could, another thread
    for one). Views made by ``np.frombuffer`` on the arrays themselves made the next append
    raise ``BufferError``."""
    import gc
    import sys

    traj = Trajectory(prompt_ids=list(range(50))).compact()
    traj.append_generated([7, 8], [-0.5, -0.25], "0")
    kept: list = []

    def keep(frame, event, arg):
        if event in ("c_call", "c_return"):
            kept.extend(o for o in gc.get_objects() if isinstance(o, memoryview))

    sys.setprofile(keep)
    try:
        ids = traj.token_array()
    finally:
        sys.setprofile(None)
    traj.append_generated([9], [-1.0], "1")
    traj.append_context([10, 11])
    assert ids.dtype == np.int64 and ids.tolist() == list(range(50)) + [7, 8]
    assert traj.tokens == list(range(50)) + [7, 8, 9, 10, 11]
    traj.check()

def test_infra_statuses_are_flagged():
    assert EpisodeStatus.POLICY_ERROR.is_infrastructure_failure
    assert EpisodeStatus.USER_ERROR.is_infrastructure_failure
    assert not EpisodeStatus.COMPLETED.is_infrastructure_failure
    assert not EpisodeStatus.PARSE_ERROR.is_infrastructure_failure


def _sample(prompt, gen, ctx, reward, idx):
    t = Trajectory(prompt_ids=prompt)
    t.append_generated(gen, [-1.0] * len(gen))
    t.append_context(ctx)
    spec = EpisodeSpec(f"e{idx}", "retail", "0", "g", idx)
    return InteractionResult(spec, EpisodeStatus.COMPLETED, reward, t).to_sample()


def test_batch_pads_and_aligns_masks_with_tokens():
    a = _sample([1, 2], [3, 4], [5], 1.0, 0)
    b = _sample([1, 2, 3, 4], [9], [], 0.0, 1)
    assert a.response_length == 3 and a.prompt_length == 2
    batch = Batch.from_samples([a, b], pad_token_id=-1)
    assert batch.tokens.shape == (2, 5)
    assert batch.tokens[1].tolist() == [1, 2, 3, 4, 9]
    assert batch.tokens[0].tolist() == [1, 2, 3, 4, 5]
    assert batch.attention_mask.sum(1).tolist() == [5, 5]
    np.testing.assert_array_equal(batch.loss_mask[0], [0, 0, 1, 1, 0])
    np.testing.assert_array_equal(batch.loss_mask[1], [0, 0, 0, 0, 1])
    np.testing.assert_array_equal(batch.rollout_log_probs[0], [0, 0, -1, -1, 0])
    assert batch.rewards.tolist() == [1.0, 0.0]
    with pytest.raises(ValueError):
        Batch.from_samples([])


def test_training_sample_to_dict_is_asdict_with_new_containers():
    import dataclasses

    from rollout.core.records import TrainingSample

    s = TrainingSample(tokens=[1, 2, 3, 4], response_length=2, loss_mask=[1, 0], rollout_log_probs=[-0.5, 0.0], reward=1.0, status="completed",
                       group_id="g", sample_index=1, metadata={"nested": {"a": [1, 2]}, "x": 1.5}, weight_versions=["0", None],
                       generation_spans=[[0, 1]])
    d = s.to_dict()
    # segment_starts is written only for an episode record of several segments (a trajectory
    # line stays what it was before segments existed)
    whole = dataclasses.asdict(s)
    assert whole.pop("segment_starts") == [] and d == whole and list(d) == [f.name for f in dataclasses.fields(s)][:-1]
    segmented = dataclasses.replace(s, segment_starts=[1])
    assert segmented.to_dict() == dataclasses.asdict(segmented) and TrainingSample.from_dict(segmented.to_dict()) == segmented
    d["tokens"].append(9)
    d["metadata"]["nested"]["a"].append(3)
    d["generation_spans"][0].append(7)
    assert s.tokens == [1, 2, 3, 4] and s.metadata["nested"]["a"] == [1, 2] and s.generation_spans == [[0, 1]]  # nothing shared
