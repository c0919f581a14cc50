"""The sample modes (rollout.sample_mode): per_turn and merge_prefix samples cut from an episode's
append-only record, the pool's streams and the files in per_turn mode, advantages per episode,
Batch and the slime converter on per-turn samples."""

from __future__ import annotations

import collections
import json

import pytest

from rollout.core.config import ConfigError, load_config
from rollout.core.export import exporters, get_exporter
from rollout.core.groups import episode_advantages
from rollout.core.output import RunWriter, read_samples
from rollout.core.pool.ledger import EpisodeLedger
from rollout.core.pool.specs import make_specs
from rollout.core.pool.streams import Feed, TrainingStreams
from rollout.core.records import Batch, EpisodeSpec, EpisodeStatus, InteractionResult
from rollout.core.sample_modes import TurnRecord, merge_prefix_samples, turn_records
from rollout.core.trajectory import Trajectory

EOT, TOOL, USER = [99], [50, 51], [60, 61]


def record(spec=None, reward=1.0, status=EpisodeStatus.COMPLETED) -> tuple[InteractionResult, list[list[int]]]:
    """A three-turn episode as the loop records it, and the input_ids of each /generate call:
    turn 0 stops on a stop string (end-of-turn repair, then a tool result); turn 1 is interrupted
    by a weight update and continued (two calls, versions 0 and 1); turn 2 is interrupted and
    restarted (its first call's tokens discarded), then closed by a repair."""
    t = Trajectory(prompt_ids=[1, 2, 3])
    inputs = []

    def gen(ids, lps, v):
        inputs.append(t.tokens)
        t.append_generated(ids, lps, v)

    gen([10, 11], [-0.1, -0.2], "0")
    t.append_context(EOT)
    t.append_context(TOOL)
    gen([12], [-0.3], "0")
    gen([13, 14], [-0.4, -0.5], "1")
    t.append_context(USER)
    start = t.response_length
    gen([15, 16], [-0.6, -0.7], "1")
    t.discard_from(start)
    gen([17], [-0.8], "1")
    t.append_context(EOT)
    t.check()
    spec = spec or EpisodeSpec("ep", "retail", "0", "g", 0)
    return InteractionResult(spec, status, reward, t, messages=[{"role": "user", "content": "hi"}], metadata={"turns": 3}), inputs


def test_per_turn_prompts_are_the_calls_inputs_and_responses_what_each_turn_sampled():
    res, inputs = record()
    samples = get_exporter("per_turn").export(res)
    assert [s.turn_indices for s in samples] == [[0], [1], [2]]
    s0, s1, s2 = samples
    assert s0.tokens[: s0.prompt_length] == inputs[0] and s0.tokens[s0.prompt_length:] == [10, 11]
    assert s1.tokens[: s1.prompt_length] == inputs[1]  # the turn's FIRST call: the continuation is in the response
    assert inputs[2] == inputs[1] + [12]
    assert s1.tokens[s1.prompt_length:] == [12, 13, 14] and s1.rollout_log_probs == [-0.3, -0.4, -0.5]
    assert s1.weight_versions == ["0", "1"] and s1.generation_spans == [[0, 1], [1, 3]]
    assert s1.token_weight_versions() == ["0", "1", "1"]
    assert s2.tokens[: s2.prompt_length] == inputs[3] == inputs[4]  # restarted: both calls saw the same prompt
    assert s2.tokens[s2.prompt_length:] == [17] and s2.generation_spans == [[0, 0], [0, 1]] and s2.weight_versions == ["1", "1"]
    # the repair and the tool result after turn 0 open turn 1's prompt, they are not turn 0's response
    assert s1.tokens[: s1.prompt_length][-3:] == EOT + TOOL
    for s in samples:
        assert s.loss_mask == [1] * s.response_length and len(s.rollout_log_probs) == s.response_length
        assert (s.reward, s.status, s.group_id, s.episode_id) == (1.0, "completed", "g", "ep")
        assert s.messages == res.messages and "sample_splits" not in s.metadata
    assert sum(sum(s.loss_mask) for s in samples) == sum(res.trajectory.loss_mask)


def test_merge_prefix_with_the_append_history_is_the_trajectory_sample():
    res, _ = record()
    (merged,) = get_exporter("merge_prefix").export(res)
    (traj,) = get_exporter("trajectory").export(res)
    for f in ("tokens", "response_length", "loss_mask", "rollout_log_probs", "weight_versions", "generation_spans", "reward", "status"):
        assert getattr(merged, f) == getattr(traj, f), f
    assert merged.turn_indices == traj.turn_indices == [0, 1, 2]
    assert merged.metadata["sample_splits"] == 0 and "turn_indices" not in traj.metadata


def test_a_prompt_that_does_not_extend_the_sample_starts_a_new_one_and_is_counted():
    res, _ = record()
    episode = res.to_sample()
    turns = turn_records(episode)
    # turn 2's prompt re-rendered: turn 1's tokens dropped from it (as a template dropping <think>)
    turns[2] = TurnRecord(2, [1, 2, 3, 10, 11, 99, 50, 51, 60, 61], [17], [-0.8], ["1"], [(0, 1)])
    samples = merge_prefix_samples(episode, turns)
    assert [s.turn_indices for s in samples] == [[0, 1], [2]]
    assert all(s.metadata["sample_splits"] == 1 for s in samples)
    first, second = samples
    assert first.tokens[first.prompt_length:] == [10, 11] + EOT + TOOL + [12, 13, 14]
    assert first.loss_mask == [1, 1, 0, 0, 0, 1, 1, 1]
    assert second.tokens == turns[2].prompt_ids + [17] and second.loss_mask == [1]
    assert sum(sum(s.loss_mask) for s in samples) == sum(episode.loss_mask)
    w = RunWriter.__new__(RunWriter)  # the summary's count, without files
    from rollout.core.output import RunStats

    w.stats = RunStats()
    w.stats.add_episode(samples)
    assert w.stats.summary()["sample_splits"] == 1 and w.stats.summary()["samples"] == 2


def test_an_episode_without_a_sampled_turn_gives_one_sample_in_every_mode():
    res = InteractionResult(EpisodeSpec("ep", "retail", "0", "g", 0), EpisodeStatus.POLICY_ERROR, 0.0, Trajectory(prompt_ids=[1, 2]))
    for mode in exporters():
        (s,) = get_exporter(mode).export(res)
        assert s.tokens == [1, 2] and s.response_length == 0 and s.status == "policy_error"


def test_sample_mode_is_a_validated_choice():
    assert load_config(None, ["local.enabled=true"]).rollout.sample_mode == "trajectory"
    assert load_config(None, ["local.enabled=true", "rollout.sample_mode=per_turn"]).rollout.sample_mode == "per_turn"
    with pytest.raises(ConfigError, match=r"rollout\.sample_mode.*trajectory, per_turn, merge_prefix"):
        load_config(None, ["local.enabled=true", "rollout.sample_mode=per_step"])
    with pytest.raises(KeyError, match="rollout.sample_mode"):
        get_exporter("per_step")


def _streams(mode: str, rewards: dict[int, float]):
    cfg = load_config(None, ["policy.router_url=http://127.0.0.1:9", "rollout.n_samples_per_task=2", f"rollout.sample_mode={mode}"])
    ledger = EpisodeLedger()
    specs = make_specs("retail", ["0"], 2, prefix="b0:")
    todo = collections.deque(record(s, reward=rewards[s.sample_index])[0] for s in specs)
    streams = TrainingStreams(cfg, Feed(next_delivery=lambda t: ledger.deliver(todo.popleft()) if todo else None,
                                        resubmit=lambda rr: None, submit_tasks=lambda *a: [], weight_version=lambda: 0,
                                        num_outstanding=lambda: len(todo)))
    streams.expect(specs)
    return streams, specs


def test_a_per_turn_group_holds_every_sample_of_its_episodes_with_one_advantage_per_episode():
    streams, specs = _streams("per_turn", {0: 0.0, 1: 1.0})
    assert streams.ensure_item(None, excluded=False)
    group = streams.take_item(excluded=False)
    assert [(s.episode_id, s.turn_indices) for s in group] == [(specs[0].episode_id, [0]), (specs[0].episode_id, [1]),
                                                                (specs[0].episode_id, [2]), (specs[1].episode_id, [0]),
                                                                (specs[1].episode_id, [1]), (specs[1].episode_id, [2])]
    adv = episode_advantages(group)
    assert adv[:3] == [pytest.approx(-1.0, abs=1e-4)] * 3 and adv[3:] == [pytest.approx(1.0, abs=1e-4)] * 3
    # per sample (the old formula) would weigh each episode by its number of turns: the same here, but not in general
    batch = Batch.from_samples(group)
    assert batch.tokens.shape[0] == 6 and batch.episode_ids == [s.episode_id for s in group]
    assert int(batch.loss_mask.sum()) == 2 * 6 and list(batch.rewards) == [0.0] * 3 + [1.0] * 3
    assert streams.counts["groups_kept"] == 1


def test_the_sample_stream_yields_each_sample_of_an_episode():
    streams, specs = _streams("merge_prefix", {0: 1.0, 1: 1.0})
    got = []
    while streams.ensure_sample(None):
        got.append(streams.take_sample())
    assert [s.episode_id for s in got] == [specs[0].episode_id, specs[1].episode_id]  # one merged sample each


def test_files_summary_and_resume_in_per_turn_mode(tmp_path):
    a, _ = record(EpisodeSpec("b0:0:0", "retail", "0", "g", 0, seed=1), reward=1.0)
    b, _ = record(EpisodeSpec("b0:0:1", "retail", "0", "g", 1, seed=2), reward=0.0)
    mode = get_exporter("per_turn")
    group = mode.export(a) + mode.export(b)
    w = RunWriter(tmp_path)
    w.add_group(group)
    summary = w.close()
    assert (summary["episodes"], summary["samples"], summary["trained_samples"], summary["trained_episodes"]) == (2, 6, 6, 2)
    assert summary["generated_tokens"] == 2 * 6 and summary["mean_turns"] == 3
    lines = read_samples(tmp_path / "samples.jsonl")
    assert [s.to_dict() for s in lines] == [json.loads(json.dumps(s.to_dict())) for s in group]
    resumed = RunWriter(tmp_path, resume=True)  # an earlier session wrote both episodes: counted, not written again
    resumed.add_group(group)
    again = resumed.close()
    assert resumed.skipped == 2 and (again["episodes"], again["samples"]) == (2, 6)
    assert len(read_samples(tmp_path / "samples.jsonl")) == 6


def test_slime_converts_per_turn_samples():
    pytest.importorskip("tau2")
    from rollout.integrations.slime import slime_fields

    res, _ = record()
    for s in get_exporter("per_turn").export(res):
        f = slime_fields(s)
        assert f["tokens"] == s.tokens and f["response_length"] == s.response_length
        assert f["loss_mask"] == s.loss_mask and f["rollout_log_probs"] == s.rollout_log_probs and f["reward"] == 1.0


def test_the_exactness_check_finds_a_sample_that_disagrees_with_the_wire():
    from rollout.devtools.check import sample_id_mismatches

    res, inputs = record()
    t = res.trajectory
    calls = [(inp, t.response_ids[a:b], t.rollout_log_probs[a:b]) for inp, (a, b) in zip(inputs, t.generation_spans)]
    samples = get_exporter("per_turn").export(res) + get_exporter("merge_prefix").export(res)
    assert [sample_id_mismatches(s, calls) for s in samples] == [0] * len(samples)
    bad = samples[1]
    bad.tokens[-1] += 1  # a response token the call did not generate
    assert sample_id_mismatches(bad, calls) >= 1
    shifted = samples[2]
    shifted.tokens.insert(0, 7)  # a prompt no request sent
    assert sample_id_mismatches(shifted, calls) >= 1
