"""A full disk, a torn last line and a corrupted line in a run's files (pure: files only; the disk is
filled by a write layer that refuses with ENOSPC, as the kernel does: part of the bytes, then the
error). The real full disk, a tmpfs, is tests/component/test_disk_full.py; the run, the Ray pool
stopping and the resume, tests/ray/test_journal_faults.py."""

from __future__ import annotations

import errno
import json
import os

import pytest

from rollout.core.config import load_config
from rollout.core.groups import Excluded
from rollout.core.journal import DAMAGE_FILE, EPISODES_FILE, SPECS_FILE, STATE_FILE, JournalError, OutputWriteError, RunJournal, load_run
from rollout.core.jsonl import append_whole, read_lines, repair
from rollout.core.output import RunWriter, read_samples
from rollout.core.pool import make_specs
from rollout.core.records import TrainingSample


def _sample(spec, status="completed") -> TrainingSample:
    return TrainingSample(tokens=[1, 2, 3], response_length=1, loss_mask=[1], rollout_log_probs=[-0.5], reward=1.0, status=status,
                          group_id=spec.group_id, sample_index=spec.sample_index, metadata={"episode_id": spec.episode_id})


class FillingDisk:
    """An unbuffered appending file on a disk with ``room`` bytes left: a write past it writes what
    fits and returns that count; the next write raises ``OSError(ENOSPC)`` (the kernel's way)."""

    def __init__(self, f, room: int):
        self._f, self.room = f, room
        self.name = f.name

    def write(self, data) -> int:
        if self.room <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = self._f.write(bytes(data[: self.room]))
        self.room -= n
        return n

    def __getattr__(self, name):
        return getattr(self._f, name)


def test_a_refused_write_takes_the_line_back_and_names_the_file(tmp_path):
    path = tmp_path / "x.jsonl"
    with open(path, "ab", buffering=0) as raw:
        f = FillingDisk(raw, room=30)
        append_whole(f, b'{"a": 1}\n')
        with pytest.raises(OutputWriteError) as e:
            append_whole(f, b'{"b": "' + b"x" * 40 + b'"}\n')  # 21 bytes fit, then ENOSPC
        assert e.value.disk_full and e.value.path == path and e.value.error.errno == errno.ENOSPC
        assert str(path) in str(e.value) and "No space left on device" in str(e.value) and "the disk is full" in str(e.value)
    assert path.read_bytes() == b'{"a": 1}\n'  # whole lines only: the 21 bytes were taken back


def test_reading_tells_a_torn_last_line_from_a_corrupted_one_by_line_number(tmp_path):
    path = tmp_path / "episodes.jsonl"
    path.write_bytes(b'{"n": 1}\n\n{"n": 2}\n\x00\x00\x00\x00\n[3]\n{"n": 4}\n{"n": 5, "cut')
    records, damage = read_lines(path)
    assert records == [{"n": 1}, {"n": 2}, {"n": 4}]
    assert [(d.line, d.kind, d.size) for d in damage] == [(4, "corrupt", 4), (5, "corrupt", 3), (7, "torn", 13)]
    assert "not JSON" in damage[0].reason and "list, not an object" in damage[1].reason
    assert str(damage[2]) == f"episodes.jsonl:7 torn (13 bytes: {damage[2].reason})"
    path.write_bytes(b'{"n": 1}\n{"n": 2}')  # whole, its newline not written yet: kept
    assert read_lines(path) == ([{"n": 1}, {"n": 2}], [])


def test_repair_sets_the_damaged_lines_aside_and_keeps_the_rest_whole(tmp_path):
    path, side = tmp_path / "episodes.jsonl", tmp_path / DAMAGE_FILE
    path.write_bytes(b'{"n": 1}\n{"n": \xff2}\n{"n": 3}\n{"n": 4, "cut')
    _, damage = read_lines(path)
    repair(path, damage, side)
    assert path.read_bytes() == b'{"n": 1}\n{"n": 3}\n'
    aside = [json.loads(x) for x in side.read_text().splitlines()]
    assert [(a["file"], a["line"], a["kind"]) for a in aside] == [("episodes.jsonl", 2, "corrupt"), ("episodes.jsonl", 4, "torn")]
    assert aside[1]["text"] == '{"n": 4, "cut' and aside[0]["size"] == 9
    path.write_bytes(b'{"n": 1}\n{"n": 2}')
    repair(path, [], side)  # an unterminated whole line gets its newline: an append is not glued to it
    assert path.read_bytes() == b'{"n": 1}\n{"n": 2}\n' and len(side.read_text().splitlines()) == 2


def _journal_with(tmp_path, delivered: int):
    cfg = load_config(None, ["local.enabled=true", f"rollout.output_dir={tmp_path}"])
    specs = make_specs("retail", [str(i) for i in range(6)], 1, prefix="b0:")
    j = RunJournal.open(tmp_path, cfg)
    j.record_specs(specs)
    for s in specs[:delivered]:
        j.record(_sample(s))
    return cfg, specs, j  # not closed: the process "died"


def test_a_resume_sets_a_torn_last_line_and_a_corrupted_line_aside_reports_them_and_runs_their_episodes_again(tmp_path):
    cfg, specs, _ = _journal_with(tmp_path, delivered=4)
    lines = (tmp_path / EPISODES_FILE).read_bytes().split(b"\n")
    lines[1] = lines[1][:20] + b"\x00" * 64 + lines[1][84:]  # a block of zeros in line 2 (episode 1)
    torn = lines[3][: len(lines[3]) // 2]  # line 4 (episode 3) cut mid-line: the last line, no newline
    (tmp_path / EPISODES_FILE).write_bytes(b"\n".join(lines[:3]) + b"\n" + torn)
    r = RunJournal.open(tmp_path, cfg, resume=True)
    assert [(d.file, d.line, d.kind) for d in r.repairs] == [(EPISODES_FILE, 2, "corrupt"), (EPISODES_FILE, 4, "torn")]
    assert list(r.delivered) == [specs[0].episode_id, specs[2].episode_id]
    assert [s.episode_id for s in r.undelivered()] == [specs[i].episode_id for i in (1, 3, 4, 5)]  # set aside: run again
    state = json.loads((tmp_path / STATE_FILE).read_text())
    assert [(x["file"], x["line"], x["kind"], x["session"]) for x in state["journal_repairs"]] == [
        (EPISODES_FILE, 2, "corrupt", 1), (EPISODES_FILE, 4, "torn", 1)]
    for s in specs[1:]:  # the resumed session delivers the rest; its lines follow whole lines
        if s.episode_id not in r.delivered:
            r.record(_sample(s))
    r.close("finished")
    run = load_run(tmp_path)  # the journal reads back clean
    assert sorted(s.episode_id for s, _ in run.episodes) == sorted(s.episode_id for s in specs)
    assert [json.loads(x)["line"] for x in (tmp_path / DAMAGE_FILE).read_text().splitlines()] == [2, 4]
    again = RunJournal.open(tmp_path, cfg, resume=True)  # nothing left to repair
    assert again.repairs == [] and len(again.delivered) == 6
    again.close("finished")


def test_a_corrupted_spec_line_refuses_the_resume_naming_it_and_a_torn_one_is_set_aside(tmp_path):
    cfg, specs, _ = _journal_with(tmp_path, delivered=0)
    lines = (tmp_path / SPECS_FILE).read_bytes().split(b"\n")
    (tmp_path / SPECS_FILE).write_bytes(b"\n".join(lines[:5]) + b"\n" + lines[5][:10])  # the last spec torn
    r = RunJournal.open(tmp_path, cfg, resume=True)
    assert [(d.file, d.line, d.kind) for d in r.repairs] == [(SPECS_FILE, 6, "torn")] and len(r.specs) == 5
    r.close("interrupted")
    lines = (tmp_path / SPECS_FILE).read_bytes().split(b"\n")
    lines[2] = b"garbage" + lines[2][7:]
    (tmp_path / SPECS_FILE).write_bytes(b"\n".join(lines))
    before = (tmp_path / SPECS_FILE).read_bytes()
    with pytest.raises(JournalError, match=rf"{SPECS_FILE}:3 is corrupt .*cannot be known.*--overwrite"):
        RunJournal.open(tmp_path, cfg, resume=True)
    assert (tmp_path / SPECS_FILE).read_bytes() == before  # refused: nothing changed


def test_a_full_disk_stops_the_journal_with_whole_lines_and_a_resume_after_freeing_space_goes_on(tmp_path):
    cfg, specs, j = _journal_with(tmp_path, delivered=2)
    j._episodes_f = FillingDisk(j._episodes_f, room=100)  # the disk fills: 100 bytes left
    with pytest.raises(OutputWriteError) as e:
        j.record(_sample(specs[2]))
    assert e.value.path == tmp_path / EPISODES_FILE and e.value.disk_full
    assert specs[2].episode_id not in j.delivered  # not journaled: not delivered
    assert len(read_lines(tmp_path / EPISODES_FILE)[0]) == 2 and read_lines(tmp_path / EPISODES_FILE)[1] == []
    r = RunJournal.open(tmp_path, cfg, resume=True)  # space freed: the resume runs the rest
    assert r.repairs == [] and [s.episode_id for s in r.undelivered()] == [s.episode_id for s in specs[2:]]
    r.close("finished")


def test_a_result_file_on_a_full_disk_is_taken_back_and_a_resumed_writer_sets_damaged_lines_aside(tmp_path):
    specs = make_specs("retail", ["0", "1", "2"], 1, prefix="b0:")
    w = RunWriter(tmp_path)
    w.add_group([_sample(specs[0])])
    w._files["samples.jsonl"] = FillingDisk(w._files["samples.jsonl"], room=50)
    with pytest.raises(OutputWriteError, match="samples.jsonl"):
        w.add_group([_sample(specs[1])])
    w.add_excluded(Excluded(_sample(specs[2], "policy_error"), "policy_error"))  # another file: still written
    w.close()
    assert [s.episode_id for s in read_samples(tmp_path / "samples.jsonl")] == [specs[0].episode_id]
    with open(tmp_path / "samples.jsonl", "ab") as f:
        f.write(b'{"tokens": [1, 2')  # and a torn tail, as a crash leaves
    r = RunWriter(tmp_path, resume=True)
    assert r.written == {specs[0].episode_id, specs[2].episode_id}
    r.add_group([_sample(specs[1])])  # the episode the journal holds and the file lacked
    r.close()
    assert [s.episode_id for s in read_samples(tmp_path / "samples.jsonl")] == [specs[0].episode_id, specs[1].episode_id]
