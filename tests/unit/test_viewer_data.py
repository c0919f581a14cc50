"""The viewer's data layer (pure: files only): reading JSONL files as they grow, a run's index
written by the real journal and result writer, the token view with the real Qwen3 tokenizer, and
two runs compared by task."""

from __future__ import annotations

import json
import logging
import os

import pytest

from rollout.app.viewer import tail as tail_mod
from rollout.app.viewer.compare import compare_runs
from rollout.app.viewer.data import NotARunError, RunIndex, check_run_dir
from rollout.app.viewer.tail import JsonlTail, read_line_at
from rollout.app.viewer.tokens import PARTIAL, SPECIAL, TokenDecoder, token_part
from rollout.core.config import load_config
from rollout.core.groups import Excluded
from rollout.core.journal import RunJournal
from rollout.core.output import RunWriter
from rollout.core.pool import make_specs
from rollout.core.records import EpisodeStatus, InteractionResult, TrainingSample
from rollout.core.sample_modes import PerTurnMode
from rollout.core.trajectory import Trajectory


def _result(spec, status="completed", reward=1.0, versions=("0", "0"), segmented=False, error=None) -> TrainingSample:
    """An episode sample as the pool journals it: two turns (one per version), a segment when asked."""
    traj = None
    if status != "env_error":
        traj = Trajectory(prompt_ids=[11, 12, 13])
        traj.append_generated([21, 22], [-0.25, -0.5], versions[0])
        traj.append_context([31, 32])
        traj.append_generated([23], [-1.5], versions[1])
        if segmented:
            traj.start_segment([11, 12, 33])
            traj.append_generated([24, 25], [-0.125, -2.0], versions[-1])
    meta = {"turns": 3 if segmented else 2, "termination_reason": "user_stop" if status == "completed" else status,
            "error": error, "timings": {"total_s": 1.25}, "reward_info": {"reward_breakdown": {"DB": reward}}}
    msgs = [{"role": "system", "content": "policy"}, {"role": "user", "content": "hi"}]
    return InteractionResult(spec, EpisodeStatus(status), reward, traj, msgs, meta).to_sample()


def _run(tmp_path, name="run"):
    out = tmp_path / name
    cfg = load_config(None, ["local.enabled=true", f"rollout.output_dir={out}"])
    journal = RunJournal.open(out, cfg)
    (out / "config.yaml").write_text(cfg.to_yaml())
    return out, journal, RunWriter(out, cfg.rollout.train_statuses)


def test_a_tail_reads_only_complete_appended_lines_and_skips_malformed_ones(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(tail_mod, "CHUNK_BYTES", 7)  # lines longer than a chunk: the carry between reads of a piece
    path = tmp_path / "x.jsonl"
    t = JsonlTail(path)
    assert t.read_new().lines == []  # missing: nothing, no error
    path.write_text('{"a": 1}\n{"b": [1, 2, 3]}\n{"c": ')
    got = t.read_new()
    assert [x.value for x in got.lines] == [{"a": 1}, {"b": [1, 2, 3]}] and [x.number for x in got.lines] == [1, 2]
    assert t.offset == len('{"a": 1}\n{"b": [1, 2, 3]}\n')  # the half line waits
    assert read_line_at(path, got.lines[1].offset, got.lines[1].length) == {"b": [1, 2, 3]}
    with open(path, "a") as f:
        f.write('3}\n{oops\n[1, 2]\n\n{"d": 4}\n')
    with caplog.at_level(logging.WARNING, logger="rollout.app.viewer.tail"):
        got = t.read_new()
    assert [x.value for x in got.lines] == [{"c": 3}, {"d": 4}] and got.skipped == 2 and not got.reset
    warned = [r.getMessage() for r in caplog.records]
    assert any("x.jsonl:4: skipping a malformed line" in m for m in warned), warned
    assert any("x.jsonl:5: skipping a malformed line (a JSON list, not an object)" in m for m in warned), warned
    assert t.read_new().lines == []
    tmp = tmp_path / "new.jsonl"
    tmp.write_text('{"e": 5}\n')
    os.replace(tmp, path)  # the file was replaced (a run started afresh): read from the start
    got = t.read_new()
    assert got.reset and [x.value for x in got.lines] == [{"e": 5}]


def test_a_run_index_follows_the_journal_and_the_result_files_as_they_grow(tmp_path, caplog):
    out, journal, writer = _run(tmp_path)
    specs = make_specs("retail", ["0", "1", "2"], 2, prefix="b0:")
    journal.record_specs(specs)
    a = _result(specs[0])
    b = _result(specs[1], reward=0.5, versions=("0", "1"))
    index = RunIndex(out)
    assert index.refresh() and index.rows() == [] and index.state()["submitted"] == 6
    journal.record(a)
    journal.record(b)
    assert index.refresh()
    rows = index.rows()
    assert [r["episode_id"] for r in rows] == [specs[0].episode_id, specs[1].episode_id]
    assert [r["outcome"] for r in rows] == ["pending", "pending"]  # delivered, the group not complete yet
    assert rows[1]["versions"] == ["0", "1"] and rows[1]["tokens"] == len(b.tokens) == 8 and rows[1]["generated"] == 3
    assert rows[0]["duration_s"] == 1.25 and rows[0]["turns"] == 2 and rows[0]["reward"] == 1.0
    seen = index.revision
    assert not index.refresh() and index.rows(seen) == []  # nothing appended: nothing changed
    writer.add_group([a, b])
    assert index.refresh()
    changed = index.rows(seen)
    assert [(r["episode_id"], r["outcome"], r["samples"]) for r in changed] == [(specs[0].episode_id, "trained", 1), (specs[1].episode_id, "trained", 1)]

    failed = _result(specs[2], status="env_error", reward=0.0, error="EnvironmentStepError: tool exploded\ntraceback ...")
    seg = _result(specs[3], segmented=True)
    for s in (failed, seg):
        journal.record(s)
    writer.add_excluded(Excluded(failed, "env_error"))
    seg.metadata["excluded_reason"] = "zero_variance"
    writer.add_excluded(Excluded(seg, "zero_variance"))
    with open(out / "episodes.jsonl", "a") as f:
        f.write("{not json\n")  # malformed lines: skipped, the reading goes on
        f.write('{"metadata": [1], "tokens": 5, "loss_mask": "x"}\n')  # an object of the wrong shape
    journal.record(_result(specs[4], status="max_steps", reward=0.0))
    with caplog.at_level(logging.WARNING):
        index.refresh()
    assert index.skipped_lines == 2 and "episodes.jsonl:5: skipping a malformed line" in caplog.text
    assert "episodes.jsonl:6: skipping a malformed line (AttributeError" in caplog.text
    by_id = {r["episode_id"]: r for r in index.rows()}
    assert by_id[failed.episode_id]["outcome"] == "failed" and by_id[failed.episode_id]["reason"] == "env_error"
    assert by_id[failed.episode_id]["error"] == "EnvironmentStepError: tool exploded" and by_id[failed.episode_id]["tokens"] == 0
    assert by_id[seg.episode_id]["outcome"] == "filtered" and by_id[seg.episode_id]["reason"] == "zero_variance"
    assert by_id[seg.episode_id]["segments"] == 2 and by_id[specs[4].episode_id]["outcome"] == "pending"

    live = index.live_summary()
    assert live["status_counts"] == {"completed": 3, "env_error": 1, "max_steps": 1}
    assert live["outcome_counts"] == {"trained": 2, "failed": 1, "filtered": 1, "pending": 1}
    assert live["excluded_counts"] == {"env_error": 1, "zero_variance": 1}
    # over trainable statuses only: the env_error episode is not averaged in as 0
    assert live["mean_reward_per_domain"] == {"retail": pytest.approx((1.0 + 0.5 + 1.0 + 0.0) / 4)}
    state = index.state()
    assert (state["episodes"], state["pending"], state["status"], state["tokenizer"]) == (5, 1, "running", "builtin:qwen3")

    ep = index.episode(seg.episode_id)
    assert "tokens" not in ep and ep["messages"][1] == {"role": "user", "content": "hi"} and ep["row"]["segments"] == 2
    [(label, sample)] = index.sample_parts(seg.episode_id)
    assert "episodes.jsonl" in label and sample["segment_starts"] == seg.segment_starts and sample["tokens"] == seg.tokens
    with pytest.raises(KeyError):
        index.episode("nope")

    epoch = index.epoch
    journal.close("interrupted", "SIGINT received")
    writer.close()
    cfg = load_config(None, ["local.enabled=true", f"rollout.output_dir={out}"])
    RunJournal.open(out, cfg, overwrite=True).record(a)  # --overwrite: the folder's run is replaced
    index.refresh()
    assert index.epoch > epoch and [r["episode_id"] for r in index.rows()] == [a.episode_id]


def test_a_folder_with_result_files_only_gets_its_rows_from_them(tmp_path):
    spec = make_specs("airline", ["7"], 1)[0]
    episode = _result(spec, versions=("0", "2"))
    samples = PerTurnMode().split(episode)
    assert len(samples) == 2
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(s.to_dict()) + "\n" for s in samples))
    index = RunIndex(tmp_path)
    index.refresh()
    [row] = index.rows()
    assert (row["episode_id"], row["domain"], row["outcome"], row["samples"]) == (spec.episode_id, "airline", "trained", 2)
    assert row["tokens"] == sum(len(s.tokens) for s in samples)
    parts = index.sample_parts(spec.episode_id)
    assert [p[1]["tokens"] for p in parts] == [s.tokens for s in samples]


def test_a_folder_written_before_episode_id_was_top_level_still_lists_its_episodes(tmp_path):
    """Lines without the top-level ``episode_id`` / ``turn_indices`` (an older run's) are read by
    their ``metadata.episode_id``, in the journal and in the result files."""
    specs = make_specs("retail", ["3"], 2)
    episodes = [_result(spec) for spec in specs]
    old = [{k: v for k, v in e.to_dict().items() if k not in ("episode_id", "turn_indices")} for e in episodes]
    assert all("episode_id" not in x and x["metadata"]["episode_id"] for x in old)
    (tmp_path / "episodes.jsonl").write_text("".join(json.dumps(x) + "\n" for x in old))
    (tmp_path / "samples.jsonl").write_text(json.dumps(old[0]) + "\n")
    index = RunIndex(tmp_path)
    index.refresh()
    assert {r["episode_id"]: r["outcome"] for r in index.rows()} == {specs[0].episode_id: "trained", specs[1].episode_id: "pending"}
    assert index.episode(specs[1].episode_id)["messages"] == episodes[1].messages


def test_a_folder_that_is_not_a_run_is_refused_in_one_line(tmp_path):
    for path, why in [(tmp_path / "missing", "does not exist"), (tmp_path, "is not a run's output folder")]:
        with pytest.raises(NotARunError, match=why) as e:
            check_run_dir(path)
        assert "\n" not in str(e.value)
    (tmp_path / "f.txt").write_text("x")
    with pytest.raises(NotARunError, match="is not a folder"):
        RunIndex(tmp_path / "f.txt")
    (tmp_path / "train_log.jsonl").write_text('{"step": 0, "reward_mean": 0.5}\n')  # the GRPO example's folder
    index = RunIndex(tmp_path)
    index.refresh()
    assert index.rows() == [] and index.train_log() == [{"step": 0, "reward_mean": 0.5}] and index.state()["has_train_log"]


def test_the_token_view_decodes_each_token_with_the_runs_tokenizer(tokenizer):
    text = "naïve 🚀 order #W2378156"
    prompt = tokenizer.encode("<|im_start|>user\n" + text + "<|im_end|>\n")
    reply = tokenizer.encode("<|im_start|>assistant\nOK")
    traj = Trajectory(prompt_ids=list(prompt))
    traj.append_context(reply[:2])
    traj.append_generated(reply[2:], [-0.5] * len(reply[2:]), "3")
    sample = TrainingSample(tokens=traj.tokens, response_length=traj.response_length, loss_mask=traj.loss_mask,
                            rollout_log_probs=traj.rollout_log_probs, reward=1.0, status="completed", group_id="g", sample_index=0,
                            weight_versions=traj.weight_versions, generation_spans=[list(s) for s in traj.generation_spans]).to_dict()
    part = token_part("episode", sample, TokenDecoder(tokenizer, "builtin:qwen3"))
    assert part["problem"] is None and part["ids"] == sample["tokens"] and len(part["text"]) == len(part["ids"])
    assert part["prompt_length"] == len(prompt) and part["loss_mask"] == sample["loss_mask"] and part["versions"] == ["3"]
    assert part["text"][0] == "<|im_start|>" and part["flags"][0] & SPECIAL
    partial = [i for i, f in enumerate(part["flags"]) if f & PARTIAL]
    assert len(partial) == 3 and "".join(part["text"][i] for i in partial) == "".join(tokenizer.convert_ids_to_tokens([part["ids"][i] for i in partial]))
    whole = "".join(t for i, t in enumerate(part["text"]) if i not in partial)
    assert whole == tokenizer.decode([x for i, x in enumerate(part["ids"]) if i not in partial])  # every other token is its own text
    assert part["segments"] == [{"start": -len(prompt), "end": len(reply), "tokens": len(prompt) + len(reply), "sampled": len(reply) - 2, "calls": 1}]

    bad = dict(sample, loss_mask=sample["loss_mask"][:-1])
    assert "misaligned" in token_part("episode", bad, None)["problem"] and token_part("episode", bad, None)["text"] is None


def test_two_runs_compared_by_task(tmp_path):
    out_a, ja, wa = _run(tmp_path, "a")
    out_b, jb, wb = _run(tmp_path, "b")
    sa = make_specs("retail", ["0", "1", "2"], 2)
    sb = make_specs("retail", ["0", "1", "3"], 2)
    rewards_a = {"0": [1.0, 1.0], "1": [0.0, 1.0], "2": [1.0, 1.0]}
    rewards_b = {"0": [1.0, 1.0], "1": [1.0, 1.0], "3": [0.0, 0.0]}
    for specs, rewards, journal in ((sa, rewards_a, ja), (sb, rewards_b, jb)):
        for s in specs:
            journal.record(_result(s, reward=rewards[s.task_id][s.sample_index]))
    jb.record(_result(make_specs("retail", ["1"], 3)[2], status="env_error", reward=0.0, error="boom"))  # not averaged in
    a, b = RunIndex(out_a, "a"), RunIndex(out_b, "b")
    a.refresh()
    b.refresh()
    got = compare_runs(a, b)
    by_task = {t["task_id"]: t for t in got["tasks"]}
    assert got["tasks"][0]["task_id"] == "1"  # changed tasks first
    assert by_task["1"]["changed"] and by_task["1"]["delta"] == pytest.approx(0.5) and by_task["1"]["b"]["episodes"] == 3
    assert by_task["1"]["b"]["statuses"] == {"completed": 2, "env_error": 1} and by_task["1"]["b"]["mean_reward"] == 1.0
    assert not by_task["0"]["changed"] and by_task["0"]["delta"] == 0.0
    assert by_task["2"]["only"] == "a" and by_task["3"]["only"] == "b" and by_task["2"]["b"] is None
    assert got["counts"] == {"tasks": 4, "changed": 1, "better": 1, "worse": 0, "only_a": 1, "only_b": 1}


def test_a_shaped_episode_shows_both_rewards_and_its_tasks_open_issues(tmp_path):
    """The row, the live summary and the episode keep the reward trained on and tau2's raw reward
    apart (rollout.reward_shaping), and the task's open issues."""
    from rollout.core.issues import TaskIssue
    from rollout.core.shaping import EpisodeReward, TurnDiscount

    out, journal, _ = _run(tmp_path)
    specs = make_specs("retail", ["4", "5"], 1)
    journal.record_specs(specs)
    issue = TaskIssue("i4", "expects a number the user never asks for")
    shaped = InteractionResult(specs[0], EpisodeStatus.COMPLETED, 0.81, None, metadata={"turns": 3,
                               "reward_shaping": [{"shaper": "turn_discount", "reward": 0.81}]}, raw_reward=1.0, task_issues=[issue])
    assert shaped.reward == pytest.approx(TurnDiscount(0.9).shape(1.0, EpisodeReward(1.0, None, 3)))
    journal.record(shaped.to_sample())
    journal.record(_result(specs[1]))
    index = RunIndex(out)
    index.refresh()
    rows = {r["task_id"]: r for r in index.rows()}
    assert (rows["4"]["reward"], rows["4"]["raw_reward"], rows["4"]["task_issues"]) == (0.81, 1.0, [issue.title])
    assert (rows["5"]["reward"], rows["5"]["raw_reward"], rows["5"]["task_issues"]) == (1.0, 1.0, [])
    live = index.live_summary()
    assert live["mean_reward_per_domain"] == {"retail": pytest.approx(0.905)} and live["mean_raw_reward_per_domain"] == {"retail": 1.0}
    assert live["episodes_with_task_issues"] == 1
    ep = index.episode(specs[0].episode_id)
    assert ep["raw_reward"] == 1.0 and ep["task_issues"] == [issue.to_dict()] and ep["metadata"]["reward_shaping"][0]["shaper"] == "turn_discount"


def _bytes_read_by_this_process() -> int:
    """``rchar`` of /proc/self/io: bytes this process's read system calls returned, every file."""
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("rchar:")).split()[1])


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="needs Linux's /proc/self/io to count the bytes read")
def test_a_growing_unterminated_line_is_read_once_not_again_on_every_poll(tmp_path):
    """A line written in pieces (a large episode sample mid-write) is completed by later reads,
    which read only the bytes appended since the last one: 8 polls of a line growing by 2 MB read
    about 16 MB, not 2 + 4 + ... + 16 = 72 MB."""
    path = tmp_path / "episodes.jsonl"
    path.write_text('{"a": 1}\n')
    t = JsonlTail(path)
    assert [x.value for x in t.read_new().lines] == [{"a": 1}]
    piece = 2 * 1024 * 1024
    before = _bytes_read_by_this_process()
    with open(path, "a") as f:
        f.write('{"b": "')
        for _ in range(8):
            f.write("x" * piece)
            f.flush()
            assert t.read_new().lines == []  # no newline yet: nothing complete
        f.write('"}\n')
    got = t.read_new()
    read = _bytes_read_by_this_process() - before
    assert [x.value for x in got.lines] == [{"b": "x" * (8 * piece)}] and got.lines[0].number == 2
    assert t.offset == path.stat().st_size
    assert read < 1.25 * 8 * piece, f"{read} bytes read for {8 * piece} bytes appended"


def test_a_line_longer_than_the_cap_is_skipped_and_the_reading_goes_on(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(tail_mod, "MAX_LINE_BYTES", 64)
    monkeypatch.setattr(tail_mod, "CHUNK_BYTES", 10)
    path = tmp_path / "x.jsonl"
    path.write_text('{"a": 1}\n{"long": "' + "y" * 50)
    t = JsonlTail(path)
    assert [x.value for x in t.read_new().lines] == [{"a": 1}]
    with open(path, "a") as f:
        f.write("y" * 50)
    with caplog.at_level(logging.WARNING, logger="rollout.app.viewer.tail"):
        assert t.read_new().lines == []  # past the cap: dropped, not held
        with open(path, "a") as f:
            f.write('"}\n{"c": 3}\n')
        got = t.read_new()
    assert [(x.value, x.number) for x in got.lines] == [({"c": 3}, 3)] and got.skipped == 1
    assert "x.jsonl:2: skipping a malformed line (longer than 64 bytes)" in caplog.text
    assert read_line_at(path, got.lines[0].offset, got.lines[0].length) == {"c": 3}


def test_run_files_that_are_not_regular_files_are_not_read(tmp_path, caplog):
    """A FIFO or a link to /dev/zero under a run file's name reads as missing (one warning), never
    blocks and never fills memory."""
    (tmp_path / "specs.jsonl").write_text('{"episode_id": "e"}\n')
    os.mkfifo(tmp_path / "run.json")
    os.mkfifo(tmp_path / "episodes.jsonl")
    os.symlink("/dev/zero", tmp_path / "summary.json")
    os.symlink("/dev/zero", tmp_path / "samples.jsonl")
    index = RunIndex(tmp_path)
    with caplog.at_level(logging.WARNING):
        index.refresh()
        state = index.state()
    assert (state["status"], state["submitted"], state["episodes"], state["has_summary"]) == ("unknown", 1, 0, False)
    assert index.summary_file() is None and index.state_file() is None
    assert "run.json: not read (only regular files are)" in caplog.text and "samples.jsonl is not a regular file" in caplog.text
    with pytest.raises(tail_mod.NotRegularFileError):
        read_line_at(tmp_path / "episodes.jsonl", 0, 10)


def test_a_line_with_an_integer_beyond_64_bits_is_skipped_as_malformed(tmp_path, caplog):
    """``metadata.turns`` written as 100000000000000000000: the page's JSON (orjson) cannot carry
    it, so its line is skipped with a warning like any malformed line, and the table holds the
    other episodes. The journal's own reader (--resume, a replay) reads it as the integer it is."""
    import orjson

    from rollout.app.viewer.server import _json
    from rollout.core.journal import load_run

    out, journal, _ = _run(tmp_path)
    specs = make_specs("retail", ["0"], 3)
    journal.record_specs(specs)
    for s in specs:
        journal.record(_result(s))
    journal.close("completed")
    lines = (out / "episodes.jsonl").read_text().splitlines()
    line = json.loads(lines[1])
    line["metadata"]["turns"] = 10**20
    lines[1] = json.dumps(line)
    (out / "episodes.jsonl").write_text("\n".join(lines) + "\n")
    index = RunIndex(out)
    with caplog.at_level(logging.WARNING):
        index.refresh()
    assert "episodes.jsonl:2: skipping a malformed line (ValueError: metadata.turns is 1e+20, beyond 64 bits)" in caplog.text
    assert [r["episode_id"] for r in index.rows()] == [specs[0].episode_id, specs[2].episode_id] and index.skipped_lines == 1
    assert _json({"rows": index.rows()}).status == 200 and orjson.loads(_json(index.live_summary()).body)["episodes"] == 2

    run = load_run(out)
    assert [s.metadata["turns"] for s, _ in run.episodes] == [2, 10**20, 2]
    cfg = load_config(None, ["local.enabled=true", f"rollout.output_dir={out}"])
    resumed = RunJournal.open(out, cfg, resume=True)
    assert resumed.repairs == [] and len(resumed.delivered) == 3
