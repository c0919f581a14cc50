"""The sample modes (rollout.sample_mode): per_turn and merge_prefix samples cut from an episode's
append-only record, the pool's streams and the files in per_turn mode, advantages per episode,
Batch and the slime converter on per-turn samples."""

from __future__ import annotations

import collections
import json

import pytest

from rollout.core.config import ConfigError, load_config
from rollout.core.export import get_exporter, sample_modes
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
    for mode in sample_modes():
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


# -- episode_id and turn_indices: top-level fields of every sample, on every path ---------------------------------------

def _segmented() -> InteractionResult:
    """Two turns, then a compaction (a new segment), then a third turn."""
    t = Trajectory(prompt_ids=[1, 2, 3])
    t.append_generated([10, 11], [-0.1, -0.2], "0")
    t.append_context(EOT + TOOL)
    t.append_generated([12], [-0.3], "0")
    t.append_context(EOT + USER)
    t.start_segment([1, 60, 61])
    t.append_generated([13, 14], [-0.4, -0.5], "0")
    t.check()
    return InteractionResult(EpisodeSpec("seg", "retail", "0", "g", 0), EpisodeStatus.COMPLETED, 1.0, t, metadata={"turns": 3})


def _no_call() -> InteractionResult:
    return InteractionResult(EpisodeSpec("none", "retail", "0", "g", 0), EpisodeStatus.POLICY_ERROR, 0.0, Trajectory(prompt_ids=[1, 2]))


# episode -> mode -> the turn_indices of its samples, in order
EXPECTED_TURNS = {
    "ep": {"trajectory": [[0, 1, 2]], "per_turn": [[0], [1], [2]], "merge_prefix": [[0, 1, 2]]},
    "seg": {"trajectory": [[0, 1], [2]], "per_turn": [[0], [1], [2]], "merge_prefix": [[0, 1], [2]]},
    "none": {"trajectory": [[]], "per_turn": [[]], "merge_prefix": [[]]},
}


def _episodes() -> dict[str, InteractionResult]:
    return {"ep": record()[0], "seg": _segmented(), "none": _no_call()}


def test_every_sample_of_every_mode_carries_episode_id_and_turn_indices_at_top_level():
    for eid, res in _episodes().items():
        for mode in sample_modes():
            samples = get_exporter(mode).export(res)
            assert [s.turn_indices for s in samples] == EXPECTED_TURNS[eid][mode], (eid, mode)
            for s in samples:
                line = json.loads(json.dumps(s.to_dict()))
                assert line["episode_id"] == s.episode_id == eid and line["turn_indices"] == s.turn_indices, (eid, mode)
                # the metadata copies are where they always were: episode_id always, turn_indices in
                # the per-turn modes and on the segments of a compacted episode (none in the trajectory sample)
                assert line["metadata"]["episode_id"] == eid
                has_copy = bool(s.generation_spans) and (mode != "trajectory" or len(samples) > 1)
                assert ("turn_indices" in line["metadata"]) == has_copy, (eid, mode)
                assert line["metadata"].get("turn_indices", s.turn_indices) == s.turn_indices
        # the episode sample (what the pool keeps, journals and excludes) holds every turn of the episode
        episode = res.to_sample()
        assert episode.episode_id == eid and episode.turn_indices == [t for ts in EXPECTED_TURNS[eid]["per_turn"] for t in ts]
        assert "turn_indices" not in episode.metadata  # the trajectory sample's metadata is what it always was


def test_a_line_written_before_the_fields_were_top_level_reads_them_from_its_metadata():
    from rollout.core.records import TrainingSample

    for eid, res in _episodes().items():
        for mode in sample_modes():
            for s in get_exporter(mode).export(res):
                old = json.loads(json.dumps(s.to_dict()))
                del old["episode_id"], old["turn_indices"]
                back = TrainingSample.from_dict(old)
                assert (back.episode_id, back.turn_indices) == (s.episode_id, s.turn_indices), (eid, mode)
                assert back.to_dict() == json.loads(json.dumps(s.to_dict()))  # a rewrite gains the fields, nothing else changes
    s = get_exporter("per_turn").export(record()[0])[1]
    with pytest.raises(ValueError, match="metadata names episode 'ep'"):
        TrainingSample.from_dict({**s.to_dict(), "episode_id": "other"})
    with pytest.raises(ValueError, match=r"turn_indices \[0\] but metadata says \[1\]"):
        TrainingSample.from_dict({**s.to_dict(), "turn_indices": [0]})


def test_the_files_and_the_journal_write_them_and_an_old_run_folder_resumes(tmp_path):
    from rollout.core.groups import Excluded
    from rollout.core.journal import EPISODES_FILE, RunJournal

    cfg = load_config(None, ["policy.router_url=http://127.0.0.1:9", "rollout.sample_mode=per_turn", f"rollout.output_dir={tmp_path}"])
    kept, failed, held = (record(EpisodeSpec(f"b0:{i}", "retail", "0", "g", i), reward=1.0)[0] for i in range(3))
    failed.status = EpisodeStatus.ENV_ERROR
    journal = RunJournal.open(tmp_path, cfg)
    journal.record_specs([kept.spec, failed.spec, held.spec])
    for r in (kept, failed, held):
        journal.record(r.to_sample(), weight_version=0)
    journal.close("interrupted", "test")
    w = RunWriter(tmp_path, cfg.rollout.train_statuses)
    w.add_group(get_exporter("per_turn").export(kept))
    w.add_excluded(Excluded(failed.to_sample(), "env_error"))
    w.add_excluded(Excluded(held.to_sample(), "zero_variance"))
    w.close()
    files = {name: [json.loads(x) for x in (tmp_path / name).read_text().splitlines()]
             for name in ("samples.jsonl", "failed.jsonl", "filtered.jsonl", EPISODES_FILE)}
    assert [(x["episode_id"], x["turn_indices"]) for x in files["samples.jsonl"]] == [("b0:0", [0]), ("b0:0", [1]), ("b0:0", [2])]
    assert [(x["episode_id"], x["turn_indices"]) for x in files["failed.jsonl"]] == [("b0:1", [0, 1, 2])]
    assert [(x["episode_id"], x["turn_indices"]) for x in files["filtered.jsonl"]] == [("b0:2", [0, 1, 2])]
    assert [(x["episode_id"], x["turn_indices"]) for x in files[EPISODES_FILE]] == [(f"b0:{i}", [0, 1, 2]) for i in range(3)]
    # a folder written before the fields were top-level: --resume reads its journal and its files
    for name, lines in files.items():
        for x in lines:
            del x["episode_id"], x["turn_indices"]
        (tmp_path / name).write_text("".join(json.dumps(x) + "\n" for x in lines))
    resumed = RunJournal.open(tmp_path, cfg, resume=True)
    assert {e: (s.episode_id, s.turn_indices) for e, s in resumed.delivered.items()} == {f"b0:{i}": (f"b0:{i}", [0, 1, 2]) for i in range(3)}
    resumed.close("finished")
    again = RunWriter(tmp_path, cfg.rollout.train_statuses, resume=True)
    again.add_group(get_exporter("per_turn").export(kept))  # already in samples.jsonl: skipped, not written twice
    summary = again.close()
    assert again.skipped == 1 and summary["episodes"] == 3 and summary["samples"] == 5
    assert [s.turn_indices for s in read_samples(tmp_path / "samples.jsonl")] == [[0], [1], [2]]


def test_the_trainer_api_streams_and_batch_carry_them():
    streams, specs = _streams("per_turn", {0: 1.0, 1: 1.0})  # equal rewards: kept (no filter configured)
    assert streams.ensure_item(None, excluded=False)
    group = streams.take_item(excluded=False)
    assert [(s.episode_id, s.turn_indices) for s in group] == [(sp.episode_id, [t]) for sp in specs for t in range(3)]
    batch = Batch.from_samples(group)
    assert batch.turn_indices == [[0], [1], [2]] * 2 and batch.episode_ids == [sp.episode_id for sp in specs for _ in range(3)]
    streams, specs = _streams("merge_prefix", {0: 1.0, 1: 0.0})
    got = []
    while streams.ensure_sample(None):
        got.append(streams.take_sample())
    assert [(s.episode_id, s.turn_indices) for s in got] == [(sp.episode_id, [0, 1, 2]) for sp in specs]
