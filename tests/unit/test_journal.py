"""The run journal (pure: files only) and the result files appended on resume."""

from __future__ import annotations

import json

import pytest

from rollout.core.config import load_config
from rollout.core.groups import Excluded
from rollout.core.journal import EPISODES_FILE, RUN_FILES, STATE_FILE, JournalError, RunJournal, config_fingerprint
from rollout.core.output import RunWriter, error_kind, read_samples
from rollout.core.pool import make_specs
from rollout.core.records import TrainingSample


def _sample(spec, status="completed", reward=1.0, error=None) -> TrainingSample:
    meta = {"episode_id": spec.episode_id, "domain": spec.domain, "task_id": spec.task_id}
    if error:
        meta["error"] = error
    return TrainingSample(tokens=[1, 2, 3], response_length=1, loss_mask=[1], rollout_log_probs=[-0.5], reward=reward,
                          status=status, group_id=spec.group_id, sample_index=spec.sample_index, metadata=meta)


def test_a_journal_records_specs_before_and_episodes_as_delivered_and_resumes(tmp_path):
    cfg = load_config(None, ["local.enabled=true", f"rollout.output_dir={tmp_path}"])
    specs = make_specs("retail", ["0", "1", "2"], 2, prefix="b0:")
    j = RunJournal.open(tmp_path, cfg)
    assert not j.resumed and json.loads((tmp_path / STATE_FILE).read_text())["status"] == "running"
    j.record_specs(specs)
    j.record_specs(specs[:2])  # already journaled: not written twice
    for s in specs[:3]:
        j.record(_sample(s))
    # the process dies here: no close(); a torn last line as a kill mid-write leaves
    with open(tmp_path / EPISODES_FILE, "a") as f:
        f.write('{"tokens": [1, 2')
    r = RunJournal.open(tmp_path, cfg, resume=True)
    assert r.resumed and r.state["resumed"] == 1
    assert [s.episode_id for s in r.specs] == [s.episode_id for s in specs]
    assert list(r.delivered) == [s.episode_id for s in specs[:3]]
    assert [s.episode_id for s in r.undelivered()] == [s.episode_id for s in specs[3:]]
    r.close("finished")
    state = json.loads((tmp_path / STATE_FILE).read_text())
    assert state["status"] == "finished" and state["episodes_undelivered"] == 3 and state["wall_s_before"] >= 0


def test_a_directory_holding_a_run_is_refused_unless_resume_or_overwrite(tmp_path):
    cfg = load_config(None, ["local.enabled=true", f"rollout.output_dir={tmp_path}"])
    j = RunJournal.open(tmp_path, cfg)
    j.record_specs(make_specs("retail", ["0"], 1))
    j.close("interrupted", "SIGINT received")
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(JournalError, match="holds a run .*interrupted, 0 of 1 episodes delivered.*--resume.*--overwrite") as e:
        RunJournal.open(tmp_path, cfg)
    assert "\n" not in str(e.value)
    with pytest.raises(JournalError, match="exclude each other"):
        RunJournal.open(tmp_path, cfg, resume=True, overwrite=True)
    changed = load_config(None, ["local.enabled=true", f"rollout.output_dir={tmp_path}", "env.max_steps=7", "rollout.seed=3", "pool.num_actors=9"])
    with pytest.raises(JournalError, match=r"config changed since the run started \(env.max_steps, rollout.seed\)"):
        RunJournal.open(tmp_path, changed, resume=True)
    fresh = RunJournal.open(tmp_path, changed, overwrite=True)
    assert not fresh.resumed and fresh.specs == []
    assert (tmp_path / "notes.txt").read_text() == "mine"  # only the run's own files are removed
    assert all(not (tmp_path / f).exists() or (tmp_path / f).stat().st_size == 0 or f == STATE_FILE for f in RUN_FILES)


def test_the_fingerprint_ignores_endpoints_actor_counts_and_timeouts():
    a = load_config(None, ["local.enabled=true"])
    b = load_config(None, ["pool.num_actors=16", "policy.router_url=http://10.0.0.1:30000", "policy.request_timeout_s=5",
                           "rollout.output_dir=/elsewhere", "logging.level=DEBUG", "local.num_servers=3"])
    c = load_config(None, ["local.enabled=true", "policy.sampling.temperature=0.5"])
    assert config_fingerprint(a)[0] == config_fingerprint(b)[0] != config_fingerprint(c)[0]


def test_the_judge_s_endpoint_may_change_on_resume_as_the_user_s_may_but_not_its_model(tmp_path):
    judge = ["local.enabled=true", f"rollout.output_dir={tmp_path}", "env.judge.base_url=http://10.0.0.1:8000/v1", "env.judge.model=judge"]
    j = RunJournal.open(tmp_path, load_config(None, judge))
    j.record_specs(make_specs("retail", ["0"], 1))
    j.close("interrupted", "stopped")
    moved = load_config(None, [*judge, "env.judge.base_url=https://judge.example/v1", "env.judge.api_key_env=JUDGE_KEY",
                               "env.judge.timeout_s=30", "env.judge.max_retries=9", "env.judge.retry_backoff_s=2",
                               "env.judge.max_retry_wait_s=60"])
    assert config_fingerprint(moved) == config_fingerprint(load_config(None, judge))
    assert RunJournal.open(tmp_path, moved, resume=True).resumed
    for change in ("env.judge.model=another", "env.judge.kind=none", "env.judge.max_tokens=8", "env.judge.temperature=0.5"):
        with pytest.raises(JournalError, match=rf"config changed since the run started \({change.split('=')[0]}\)"):
            RunJournal.open(tmp_path, load_config(None, [*judge, change]), resume=True)


def test_a_resumed_writer_appends_skips_what_the_files_hold_and_counts_both_sessions(tmp_path):
    specs = make_specs("retail", ["0", "1", "2", "3"], 1)
    w = RunWriter(tmp_path)
    w.add_group([_sample(specs[0])])
    w.add_excluded(Excluded(_sample(specs[1], "env_error", 0.0, error="tau2 failed on call 12 at 0x7f3a"), "env_error"))
    # killed: no close(); a resumed session sees the same episodes again through the pool's restore
    w2 = RunWriter(tmp_path, resume=True)
    w2.add_group([_sample(specs[0])])
    w2.add_excluded(Excluded(_sample(specs[1], "env_error", 0.0, error="tau2 failed on call 12 at 0x7f3a"), "env_error"))
    w2.add_group([_sample(specs[2], reward=0.0)])
    w2.add_excluded(Excluded(_sample(specs[3], "env_error", 0.0, error="tau2 failed on call 40 at 0x7f3b"), "env_error"))
    summary = w2.close({"wall_s": 2.0})
    assert w2.skipped == 2
    assert [s.episode_id for s in read_samples(tmp_path / "samples.jsonl")] == [specs[0].episode_id, specs[2].episode_id]
    assert [s.episode_id for s in read_samples(tmp_path / "failed.jsonl")] == [specs[1].episode_id, specs[3].episode_id]
    assert summary["episodes"] == 4 and summary["status_counts"] == {"completed": 2, "env_error": 2}
    assert summary["mean_reward_per_domain"] == {"retail": 0.5}  # trainable episodes only, never the failures as 0
    assert summary["errors"] == [{"kind": "env_error: tau2 failed on call N at N", "count": 2}]
    assert summary["wall_s"] == 2.0 and summary["episodes_per_s"] == 2.0
    assert set(summary["files"]) == {"samples.jsonl", "failed.jsonl", "filtered.jsonl"}


def test_error_kinds_group_repeats():
    assert error_kind("policy_error", "/generate failed after 4 attempts: ClientConnectorError(127.0.0.1:3000)") == \
        error_kind("policy_error", "/generate failed after 4 attempts: ClientConnectorError(127.0.0.1:4111)")
    assert error_kind("user_error", None) == "user_error"


def _fsyncs(monkeypatch, journal_dir):
    """Record which journal file each os.fsync made durable, and the file's size at that moment."""
    import os

    seen: list[tuple[str, int]] = []
    real = os.fsync

    def spy(fd):
        path = os.readlink(f"/proc/self/fd/{fd}")
        seen.append((os.path.basename(path), os.path.getsize(path)))
        return real(fd)

    monkeypatch.setattr("rollout.core.journal.os.fsync", spy)
    return seen


def test_episode_lines_reach_the_os_at_once_and_are_durable_at_the_commit_one_fsync_for_all(tmp_path, monkeypatch):
    """record(sync=False) writes the line (a killed process keeps it: it is in the file) without an
    fsync; commit() makes all of them durable with one; specs and cancel events are durable when
    recorded, and a cancel event commits the episodes before it first; close() commits."""
    cfg = load_config(None, ["local.enabled=true", f"rollout.output_dir={tmp_path}"])
    specs = make_specs("retail", ["0", "1", "2"], 2, prefix="b0:")
    j = RunJournal.open(tmp_path, cfg)
    seen = _fsyncs(monkeypatch, tmp_path)
    j.record_specs(specs)
    assert seen == [("specs.jsonl", (tmp_path / "specs.jsonl").stat().st_size)]
    for s in specs[:3]:
        j.record(_sample(s), weight_version=0, sync=False)
    assert len(seen) == 1  # no fsync yet ...
    assert len((tmp_path / EPISODES_FILE).read_text().splitlines()) == 3  # ... but every line is in the file
    assert j.commit() == 3 and seen[-1] == (EPISODES_FILE, (tmp_path / EPISODES_FILE).stat().st_size)
    assert j.commit() == 0 and len(seen) == 2  # nothing new: no fsync
    j.record(_sample(specs[3]), sync=False)
    j.record_cancel(weight_version=0)
    assert seen[2:] == [(EPISODES_FILE, (tmp_path / EPISODES_FILE).stat().st_size), ("events.jsonl", (tmp_path / "events.jsonl").stat().st_size)]
    j.record(_sample(specs[4]))  # sync=True (the default): durable when it returns
    assert seen[-1][0] == EPISODES_FILE and j.fsyncs == len(seen) == 5
    j.record(_sample(specs[5]), sync=False)
    j.close("finished")
    assert seen[-1] == (EPISODES_FILE, (tmp_path / EPISODES_FILE).stat().st_size)
    r = RunJournal.open(tmp_path, cfg, resume=True)
    assert list(r.delivered) == [s.episode_id for s in specs]


def test_journal_lines_read_back_equal_and_a_non_finite_value_keeps_the_standard_librarys_text(tmp_path):
    cfg = load_config(None, ["local.enabled=true", f"rollout.output_dir={tmp_path}"])
    specs = make_specs("retail", ["0"], 2, prefix="b0:")
    j = RunJournal.open(tmp_path, cfg)
    j.record_specs(specs)
    a = _sample(specs[0], error="Zoë's order — ünïcode")
    b = TrainingSample(**{**_sample(specs[1]).__dict__, "rollout_log_probs": [float("-inf")]})
    j.record(a, weight_version=3, sync=False)
    j.record(b, sync=False)
    j.close("finished")
    lines = (tmp_path / EPISODES_FILE).read_bytes().splitlines()
    assert b"-Infinity" in lines[1]  # json's text, not orjson's null
    r = RunJournal.open(tmp_path, cfg, resume=True)
    assert r.delivered[a.episode_id].to_dict() == a.to_dict()
    assert r.delivered[b.episode_id].rollout_log_probs == [float("-inf")]


def test_a_journal_line_is_the_json_of_to_dict_without_copying_the_sample():
    import array

    from rollout.core.journal import DELIVERY_VERSION_KEY, sample_line

    spec = make_specs("retail", ["0"], 1)[0]
    s = _sample(spec)
    assert json.loads(sample_line(s)) == s.to_dict()
    assert json.loads(sample_line(s, 4)) == {**s.to_dict(), "metadata": {**s.metadata, DELIVERY_VERSION_KEY: 4}}
    assert DELIVERY_VERSION_KEY not in s.metadata  # the sample is not changed
    seg = TrainingSample(**{**s.__dict__, "segment_starts": [0], "tokens": array.array("q", s.tokens)})  # to_dict's list()
    assert json.loads(sample_line(seg)) == seg.to_dict() and "segment_starts" in seg.to_dict()


def _cfg(out):
    return load_config(None, ["local.enabled=true", f"rollout.output_dir={out}"])


def _finished_run(out, n_tasks: int = 1) -> list:
    specs = make_specs("retail", [str(i) for i in range(n_tasks)], 1)
    j = RunJournal.open(out, _cfg(out))
    j.record_specs(specs)
    for s in specs:
        j.record(_sample(s))
    j.close("finished")
    return specs


def test_a_folder_of_other_files_is_refused_unless_overwrite_and_left_as_it_was(tmp_path):
    """A folder that holds files but no run (a user's own config.yaml there) is not written into:
    one line naming what it holds; ``overwrite=True`` (--overwrite) writes the run there."""
    out = tmp_path / "mine"
    out.mkdir()
    (out / "config.yaml").write_text("my: own config\n")
    (out / "notes.txt").write_text("mine")
    with pytest.raises(JournalError) as e:
        RunJournal.open(out, _cfg(out))
    assert str(e.value) == (f"{out} holds files but no run (config.yaml, notes.txt): name a new or empty rollout.output_dir, or pass "
                            "--overwrite to write the run there all the same (files of a run's names are replaced, nothing else)")
    assert sorted(p.name for p in out.iterdir()) == ["config.yaml", "notes.txt"]  # nothing written
    assert (out / "config.yaml").read_text() == "my: own config\n"
    RunJournal.open(out, _cfg(out), overwrite=True).close("finished")
    assert (out / "notes.txt").read_text() == "mine" and (out / STATE_FILE).is_file()


def test_what_a_run_or_the_pool_leaves_before_the_journal_is_not_someone_elses(tmp_path):
    """Not refused: a missing or empty folder, one where only the engine's logs are (open_pool
    writes them before a trainer opens its journal), and one where a run stopped before it
    submitted anything (its run.json, summary.json, config.yaml: the corrected command starts afresh)."""
    logs = tmp_path / "logs_first"
    (logs / "local_stack_logs").mkdir(parents=True)
    (logs / "local_stack_logs" / "router.log").write_text("x")
    RunJournal.open(logs, _cfg(logs)).close("finished")
    stopped = tmp_path / "stopped"
    RunJournal.open(stopped, _cfg(stopped)).close("interrupted", "a preflight check failed")
    (stopped / "summary.json").write_text("{}")
    (stopped / "config.yaml").write_text("rollout: {}\n")
    again = RunJournal.open(stopped, _cfg(stopped))
    assert not again.resumed
    again.close("finished")
    (tmp_path / "empty").mkdir()
    for d in (tmp_path / "empty", tmp_path / "missing" / "deeper"):
        RunJournal.open(d, _cfg(d)).close("finished")


def test_resume_where_no_run_started_is_refused_creating_nothing(tmp_path, caplog):
    """--resume on a folder that holds no run (a typo in rollout.output_dir) is one line naming the
    folder, and creates nothing; where a run stopped before it submitted anything, the resume runs
    it from the beginning, saying so."""
    typo = tmp_path / "outputs" / "lcoal"
    with pytest.raises(JournalError) as e:
        RunJournal.open(typo, _cfg(typo), resume=True)
    assert str(e.value) == f"{typo} holds no run to resume (no such folder): check rollout.output_dir, or drop --resume to start a run there"
    assert not (tmp_path / "outputs").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(JournalError, match=r"holds no run to resume \(nothing in it\)"):
        RunJournal.open(empty, _cfg(empty), resume=True)
    assert list(empty.iterdir()) == []
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.yaml").write_text("my: own\n")
    with pytest.raises(JournalError, match=rf"holds no run to resume \(no {STATE_FILE} in it\)"):
        RunJournal.open(other, _cfg(other), resume=True)
    stopped = tmp_path / "stopped"
    RunJournal.open(stopped, _cfg(stopped)).close("interrupted", "SIGINT received")
    with caplog.at_level("WARNING", logger="rollout.core.journal"):
        j = RunJournal.open(stopped, _cfg(stopped), resume=True)
    assert not j.resumed and j.specs == []
    assert "stopped before it submitted any episode: --resume starts it from the beginning" in caplog.text


def test_a_finished_run_is_refused_saying_what_applies(tmp_path):
    _finished_run(tmp_path)
    with pytest.raises(JournalError) as e:
        RunJournal.open(tmp_path, _cfg(tmp_path))
    assert str(e.value) == (f"{tmp_path} holds a finished run (finished, 1 of 1 episodes delivered): nothing to resume; "
                            "pass --overwrite to run it again, or name another rollout.output_dir")


@pytest.mark.parametrize("text, expect", [("[1, 2]\n", "holds a JSON list, not the run's state"),
                                          ("not json\n", "is not the run's state (Expecting value")])
def test_a_run_json_that_is_not_a_json_object_is_one_line_for_resume_replay_and_refusal(tmp_path, text, expect):
    from rollout.core.journal import load_run, load_run_config

    _finished_run(tmp_path)
    (tmp_path / STATE_FILE).write_text(text)
    (tmp_path / "config.yaml").unlink(missing_ok=True)
    for call in (lambda: RunJournal.open(tmp_path, _cfg(tmp_path), resume=True), lambda: RunJournal.open(tmp_path, _cfg(tmp_path)),
                 lambda: load_run(tmp_path), lambda: load_run_config(tmp_path)):
        with pytest.raises(JournalError) as e:
            call()
        assert str(e.value).startswith(f"{tmp_path / STATE_FILE} ") and expect in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_an_episode_line_of_another_run_is_set_aside_on_resume_and_named_by_a_replay(tmp_path):
    """An episodes.jsonl line whose group the run's specs lack (pasted from another run) is set
    aside on resume as any damaged line is (journal_damage.jsonl, run.json, the summary's repairs);
    a replay, which only reads, names it in one line."""
    from rollout.core.journal import DAMAGE_FILE, load_run

    specs = _finished_run(tmp_path, 2)
    stranger = _sample(make_specs("retail", ["7"], 1, prefix="other:")[0])
    with open(tmp_path / EPISODES_FILE, "a") as f:
        f.write(json.dumps(stranger.to_dict()) + "\n")
    with pytest.raises(JournalError) as e:
        load_run(tmp_path)
    assert f"episode {stranger.episode_id} is of group {stranger.group_id}, which specs.jsonl lacks" in str(e.value)
    assert "\n" not in str(e.value)
    r = RunJournal.open(tmp_path, _cfg(tmp_path), resume=True)
    assert list(r.delivered) == [s.episode_id for s in specs]
    assert [(d.file, d.line, d.kind) for d in r.repairs] == [(EPISODES_FILE, 3, "corrupt")]
    assert r.repairs[0].reason.startswith("not a record: another run's episode? its group is not in specs.jsonl: other:"), r.repairs[0].reason
    assert stranger.episode_id in (tmp_path / DAMAGE_FILE).read_text()
    assert len((tmp_path / EPISODES_FILE).read_text().splitlines()) == 2


def test_a_stopped_runs_summary_accounts_for_every_planned_episode_and_a_resumes_sessions(tmp_path):
    """An interrupted run: the episodes in the files, those journaled in groups not complete yet
    and those not delivered add up to the episodes planned, and the table shows all three; after a
    resume the wall time says it spans the sessions, and this session's."""
    from rollout.app.summary import format_summary
    from rollout.core.output import where_episodes_are

    specs = make_specs("retail", ["0", "1", "2"], 2)  # 3 groups of 2
    j = RunJournal.open(tmp_path, _cfg(tmp_path))
    j.record_specs(specs)
    w = RunWriter(tmp_path)
    for s in specs[:3]:  # group 0 complete and written; one member of group 1 journaled, its group open
        j.record(_sample(s))
    w.add_group([_sample(s) for s in specs[:2]])
    j.close("interrupted", "SIGINT received")
    undelivered = len(j.undelivered())
    summary = w.close({"status": "interrupted", "reason": "SIGINT received", "undelivered": undelivered,
                       **where_episodes_are(j.delivered, w.written, undelivered), "resumed_sessions": 1, "wall_s": 30.0,
                       "session_wall_s": 12.5})
    assert (summary["episodes"], summary["episodes_in_open_groups"], summary["undelivered"], summary["episodes_planned"]) == (2, 1, 3, 6)
    table = format_summary(summary)
    rows = dict(line.rsplit(None, 1) for line in table.splitlines()[1:] if line and not line.startswith(("-", "run ", "--resume")))
    shown = {k.strip(): v for k, v in rows.items()}
    assert {k: shown.get(k) for k in ("episodes", "journaled, group incomplete", "not delivered", "episodes planned (these three)",
                                      "wall time, 2 sessions (s)", "this session (s)")} == {
        "episodes": "2", "journaled, group incomplete": "1", "not delivered": "3", "episodes planned (these three)": "6",
        "wall time, 2 sessions (s)": "30.00", "this session (s)": "12.50"}, table
    assert "--resume completes the incomplete groups and runs the episodes not delivered" in table
    assert "wall time (s)" not in table


def test_a_resumed_journal_tells_this_sessions_wall_time_from_the_whole_runs(tmp_path):
    first = RunJournal.open(tmp_path, _cfg(tmp_path))
    first.record_specs(make_specs("retail", ["0"], 1))
    first.close("interrupted", "SIGINT received")
    assert first.session_wall_s == first.wall_s
    second = RunJournal.open(tmp_path, _cfg(tmp_path), resume=True)
    second.close("finished")
    assert second.wall_s == pytest.approx(first.wall_s + second.session_wall_s) and second.session_wall_s >= 0


def test_the_summary_names_the_files_by_absolute_path_whatever_the_working_directory(tmp_path, monkeypatch):
    """A relative rollout.output_dir (under ray job submit: relative to Ray's copy of the project):
    the summary, and the paths the CLI prints from it, say where the files are."""
    monkeypatch.chdir(tmp_path)
    summary = RunWriter("outputs/rel").close()
    assert summary["files"] == {name: str(tmp_path / "outputs" / "rel" / name) for name in RunWriter.FILES}


def test_a_journal_line_that_is_json_but_not_a_sample_is_one_line_for_a_replay(tmp_path):
    """load_run (--replay, regrade): a line whose fields contradict each other (its metadata names
    another episode) was a ValueError traceback."""
    from rollout.core.journal import load_run

    _finished_run(tmp_path, 2)
    lines = (tmp_path / EPISODES_FILE).read_text().splitlines()
    bad = json.loads(lines[1])
    bad["metadata"]["episode_id"] = "someone-else"
    (tmp_path / EPISODES_FILE).write_text("\n".join([lines[0], json.dumps(bad)]) + "\n")
    with pytest.raises(JournalError) as e:
        load_run(tmp_path)
    assert str(e.value).startswith(f"{tmp_path / EPISODES_FILE}: line 2 is not a sample (") and "\n" not in str(e.value), str(e.value)
