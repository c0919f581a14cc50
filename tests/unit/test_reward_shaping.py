"""Reward shaping (``rollout.reward_shaping``, :mod:`rollout.core.shaping`): the built-in shapers'
arithmetic, the raw reward kept beside the shaped one on the result, every sample and the batch,
only graded episodes shaped, a failing shaper typed as ``eval_error``, the config's checks and a
shaper registered by path and selected in YAML."""

from __future__ import annotations

import json
import math

import pytest

from rollout.core.config import ConfigError, RewardShapingConfig, load_config
from rollout.core.records import Batch, EpisodeSpec, EpisodeStatus, InteractionResult, TrainingSample
from rollout.core.runner import finalize_result
from rollout.core.sample_modes import merge_prefix_samples, per_turn_samples, turn_records
from rollout.core.shaping import (
    REWARD_SHAPERS,
    ActionAware,
    EpisodeReward,
    PartialCredit,
    RewardShaping,
    TurnDiscount,
    register_reward_shaper,
    unregister_reward_shaper,
)
from rollout.core.trajectory import Trajectory

LOCAL = ["local.enabled=true"]
SPEC = EpisodeSpec("e/0", "retail", "3", "g/3", 0)


def _info(breakdown, actions=None):
    return {"reward_breakdown": breakdown, "db_match": breakdown.get("DB") == 1.0, "communicate_met": None, "action_match": actions}


def _result(reward=1.0, status=EpisodeStatus.COMPLETED, info=None, turns=5):
    traj = Trajectory(prompt_ids=[1, 2, 3])
    traj.append_generated([4, 5], [-0.5, -0.25], "0")
    traj.append_context([6])
    traj.append_generated([7], [-0.125], "0")
    meta = {"turns": turns, "termination_reason": "user_stop"}
    if info is not None:
        meta["reward_info"] = info
    return InteractionResult(SPEC, status, reward, traj, metadata=meta)


def _shaping(*names, **kw) -> RewardShaping:
    return RewardShaping.from_config(RewardShapingConfig(shapers=list(names), **kw))


def test_each_built_in_shaper_does_its_arithmetic():
    ep = EpisodeReward(0.0, _info({"DB": 0.0, "COMMUNICATE": 1.0}, [True, False, True, True]), turns=5)
    assert PartialCredit().shape(0.0, ep) == 0.5  # the mean of the basis's components, not their product
    assert ActionAware(1.0).shape(0.8, ep) == pytest.approx(0.8 * 3 / 4)
    assert ActionAware(0.5).shape(0.8, ep) == pytest.approx(0.8 * (0.5 + 0.5 * 3 / 4))
    assert ActionAware(0.0).shape(0.8, ep) == 0.8
    assert TurnDiscount(0.9).shape(1.0, ep) == pytest.approx(0.9 ** 4)
    bare = EpisodeReward(1.0, {"reward_breakdown": {}, "action_match": None}, turns=1)
    assert PartialCredit().shape(1.0, bare) == ActionAware(1.0).shape(1.0, bare) == TurnDiscount(0.5).shape(1.0, bare) == 1.0
    assert PartialCredit().shape(0.3, EpisodeReward(0.3, None, 2)) == 0.3  # no breakdown: unchanged


def test_shapers_apply_in_order_and_the_raw_reward_is_kept():
    shaping = _shaping("partial_credit", "action_aware", "turn_discount", action_weight=1.0, turn_discount=0.9)
    res = shaping.apply(_result(0.0, info=_info({"DB": 1.0, "COMMUNICATE": 0.0}, [True, True, False, True]), turns=3))
    expected = 0.5 * 0.75 * 0.9 ** 2
    assert res.raw_reward == 0.0 and res.reward == pytest.approx(expected)
    assert [s["shaper"] for s in res.metadata["reward_shaping"]] == ["partial_credit", "action_aware", "turn_discount"]
    assert [s["reward"] for s in res.metadata["reward_shaping"]] == pytest.approx([0.5, 0.375, expected])
    sample = res.to_sample()
    assert (sample.reward, sample.raw_reward) == (pytest.approx(expected), 0.0)
    line = json.loads(json.dumps(sample.to_dict()))
    assert line["raw_reward"] == 0.0 and TrainingSample.from_dict(line).raw_reward == 0.0
    assert Batch.from_samples([sample]).raw_rewards.tolist() == [0.0] and Batch.from_samples([sample]).rewards[0] == pytest.approx(expected)


def test_only_graded_episodes_are_shaped_and_no_shapers_change_nothing():
    shaping = _shaping("turn_discount", turn_discount=0.5)
    for status in (EpisodeStatus.MAX_STEPS, EpisodeStatus.EVAL_ERROR, EpisodeStatus.USER_ERROR):
        res = shaping.apply(_result(0.0, status=status))
        assert (res.reward, res.raw_reward) == (0.0, 0.0) and "reward_shaping" not in res.metadata
    res = RewardShaping().apply(_result(1.0, info=_info({"DB": 1.0}, [False])))
    assert (res.reward, res.raw_reward) == (1.0, 1.0) and "reward_shaping" not in res.metadata
    # a result made without shaping reads raw_reward = reward, and so does an old line without it
    assert InteractionResult(SPEC, EpisodeStatus.COMPLETED, 0.7, None).raw_reward == 0.7
    old = _result(1.0).to_sample().to_dict()
    del old["raw_reward"], old["task_issues"]
    assert TrainingSample.from_dict(old).raw_reward == 1.0 and TrainingSample.from_dict(old).task_issues == []


def test_every_sample_of_an_episode_keeps_the_raw_reward_in_every_sample_mode():
    res = _shaping("turn_discount", turn_discount=0.5).apply(_result(1.0, info=_info({"DB": 1.0}), turns=2))
    episode = res.to_sample()
    turns = turn_records(episode)
    for samples in (per_turn_samples(episode, turns), merge_prefix_samples(episode, turns), [episode]):
        assert samples and all((s.reward, s.raw_reward) == (0.5, 1.0) for s in samples)


def test_a_failing_shaper_makes_the_episode_eval_error_never_a_crash():
    class Broken:
        def shape(self, reward, episode):
            return float("nan")

    register_reward_shaper("broken_for_test", lambda section: Broken())
    try:
        res = finalize_result(_result(1.0, info=_info({"DB": 1.0})), _shaping("broken_for_test"))
    finally:
        unregister_reward_shaper("broken_for_test")
    assert res.status is EpisodeStatus.EVAL_ERROR and res.reward == 0.0 and res.raw_reward == 1.0
    assert "reward shaper 'broken_for_test' answered nan" in res.metadata["error"]


def test_the_config_checks_names_order_and_ranges_naming_the_key():
    cfg = load_config(None, [*LOCAL, "rollout.reward_shaping.shapers=[partial_credit,action_aware,turn_discount]",
                             "rollout.reward_shaping.action_weight=0.5"])
    assert cfg.rollout.reward_shaping == RewardShapingConfig(["partial_credit", "action_aware", "turn_discount"], 0.5, 0.99)
    assert load_config(None, LOCAL).rollout.reward_shaping.shapers == []  # off by default
    bad = {
        "rollout.reward_shaping.shapers=[action_aware,partial_credit]":
            "rollout.reward_shaping.shapers: partial_credit replaces the benchmark's reward, so it must come first "
            "(got ['action_aware', 'partial_credit'])",
        "rollout.reward_shaping.shapers=[turn_discount,turn_discount]": "rollout.reward_shaping.shapers: names 'turn_discount' twice",
        "rollout.reward_shaping.shapers=[discount]": "rollout.reward_shaping.shapers: no reward shaper 'discount' is registered "
                                                     "(registered: partial_credit, action_aware, turn_discount)",
        "rollout.reward_shaping.turn_discount=0": "rollout.reward_shaping.turn_discount: must be in (0.0, 1.0]",
        "rollout.reward_shaping.action_weight=1.5": "rollout.reward_shaping.action_weight: must be in [0.0, 1.0]",
    }
    for override, message in bad.items():
        with pytest.raises(ConfigError) as e:
            load_config(None, [*LOCAL, override])
        assert str(e.value) == message


def test_a_shaper_registered_by_path_is_selected_in_yaml(tmp_path):
    register_reward_shaper("toy_square", "support.toy_plugins:SquareShaper")
    try:
        assert "toy_square" in REWARD_SHAPERS.paths()  # a path entry: it travels to the Ray actors
        cfg = load_config(None, [*LOCAL, "rollout.reward_shaping.shapers=[toy_square]"])
        res = RewardShaping.from_config(cfg.rollout.reward_shaping).apply(_result(0.5, info=_info({"DB": 0.5})))
    finally:
        unregister_reward_shaper("toy_square")
    assert (res.reward, res.raw_reward) == (0.25, 0.5) and math.isclose(res.metadata["reward_shaping"][0]["reward"], 0.25)


def test_the_trainers_outputs_train_on_the_shaped_reward_and_keep_tau2s():
    """verl's reward_score and slime's reward are what trainers consume (shaped); verl's
    reward_extra_info tau2_reward and slime's metadata keep tau2's raw reward."""
    from rollout.integrations.slime import slime_fields
    from rollout.integrations.verl_output import output_fields

    sample = _shaping("turn_discount", turn_discount=0.5).apply(_result(1.0, info=_info({"DB": 1.0}), turns=3)).to_sample()
    verl = output_fields(sample, trainable=True, turns=3, metrics={}, versions=None, fallback_prompt=[0])
    assert verl["reward_score"] == 0.25 and verl["extra_fields"]["reward_extra_info"]["tau2_reward"] == 1.0
    assert verl["extra_fields"]["tau2_task_issues"] == []
    slime = slime_fields(sample)
    assert slime["reward"] == 0.25 and slime["metadata"]["raw_reward"] == 1.0 and slime["metadata"]["task_issues"] == []
