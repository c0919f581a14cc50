"""``rollout.output_dir`` on the command line: the run lands where the user asked and nowhere else.

A leading ``~`` is the home folder for every writer; an empty value, a folder of someone else's
files, a ``--resume`` of a folder where no run started and a finished run are refused in one line,
exit 2, before anything starts or is written; a run folder whose ``run.json`` or ``config.yaml``
is damaged is one line for ``--resume``, ``--replay`` and ``regrade``; the paths printed at the
end are absolute (a Ray job's relative folder is Ray's copy of the project, and the job says so).

Most cases run the CLI in this process (``rollout.app.cli.main``), as tests/e2e/test_bad_sources.py
does, recording whether the local stack or the Ray pool started. Where a refusal could be missed,
the command also names a key variable that is not set (``policy.api_key_env``), so that a missed
refusal stops at the pre-start checks instead of running a whole job.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rollout.app import cli
from rollout.core.config import load_config
from rollout.core.journal import STATE_FILE, RunJournal
from rollout.core.pool import make_specs
from rollout.core.records import TrainingSample

ROOT = Path(__file__).resolve().parents[2]
CONFIG = str(ROOT / "configs" / "local.yaml")
UNSET_KEY = "policy.api_key_env=ROLLOUT_OUTPUT_DIR_TEST_UNSET"  # a missed refusal stops at the pre-start checks


@pytest.fixture(autouse=True)
def started(monkeypatch) -> list[str]:
    """What the command started: the local stack and the Ray pool record themselves here."""
    from rollout.core.pool import RolloutPool
    from rollout.devtools.local.stack import LocalStack

    seen: list[str] = []
    for cls, name in ((LocalStack, "local stack"), (RolloutPool, "Ray pool")):
        def record(self, *a, _orig=cls.start, _name=name, **k):
            seen.append(_name)
            return _orig(self, *a, **k)
        monkeypatch.setattr(cls, "start", record)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("ROLLOUT_OUTPUT_DIR_TEST_UNSET", raising=False)
    return seen


def _main(capsys, *argv: str) -> tuple[int, str, str]:
    """``python -m rollout ARGV`` in this process: ``(exit status, stdout, the last stderr line
    that is not a log line)``."""
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip() and " INFO " not in line and " WARNING " not in line]
    return rc, out, lines[-1] if lines else ""


def _finished_run(out: Path) -> None:
    """A finished run of two episodes in ``out``, as ``rollout run`` leaves it (journal and config.yaml)."""
    cfg = load_config(CONFIG, [f"rollout.output_dir={out}", "env.task_ids=[0,1]"])
    j = RunJournal.open(out, cfg)
    specs = make_specs("retail", ["0", "1"], 1)
    j.record_specs(specs)
    for s in specs:
        j.record(TrainingSample(tokens=[1, 2, 3], response_length=1, loss_mask=[1], rollout_log_probs=[-0.5], reward=1.0, status="completed",
                                group_id=s.group_id, sample_index=s.sample_index,
                                metadata={"episode_id": s.episode_id, "domain": "retail", "task_id": s.task_id}))
    j.close("finished")
    (out / "config.yaml").write_text(cfg.to_yaml())


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True", PYTHONPATH=str(ROOT), **extra)
    env.pop("RAY_ADDRESS", None)
    env.pop("ROLLOUT_OUTPUT_DIR_TEST_UNSET", None)
    return env


def test_a_tilde_is_the_home_folder_for_the_check_the_journal_and_the_files(tmp_path):
    """``rollout.output_dir=~/x``: the pre-start check created $HOME/x while the journal wrote
    ./~/x. Now the journal is in $HOME/x and nothing lands in the working directory."""
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    proc = subprocess.run([sys.executable, "-m", "rollout", "run", "--config", CONFIG, "--no-progress", "env.task_ids=[0]",
                           "rollout.output_dir=~/x", UNSET_KEY], cwd=cwd, env=_env(HOME=str(home)), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 2 and "ROLLOUT_OUTPUT_DIR_TEST_UNSET" in proc.stderr, proc.stderr[-2000:]
    assert (home / "x" / STATE_FILE).is_file(), sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    assert list(cwd.iterdir()) == []


def test_an_empty_output_dir_is_refused_before_anything_is_written(tmp_path, capsys, monkeypatch, started):
    monkeypatch.chdir(tmp_path)
    rc, _, line = _main(capsys, "run", "--config", CONFIG, "--no-progress", "env.task_ids=[0]", 'rollout.output_dir=""', UNSET_KEY)
    assert rc == 2 and line == "config error: rollout.output_dir: is empty, which would write the run into the working directory: name a folder"
    assert list(tmp_path.iterdir()) == [] and started == []


@pytest.mark.parametrize("command", ["run", "eval"])
def test_a_folder_of_other_files_is_refused_unless_overwrite(tmp_path, capsys, started, command):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "config.yaml").write_text("my: own config\n")
    rc, _, line = _main(capsys, command, "--config", CONFIG, "--no-progress", "env.task_ids=[0]", f"rollout.output_dir={out}", UNSET_KEY)
    assert rc == 2 and line.startswith(f"error: {out} holds files but no run (config.yaml): ") and "--overwrite" in line, line
    assert [p.name for p in out.iterdir()] == ["config.yaml"] and (out / "config.yaml").read_text() == "my: own config\n"
    assert started == []


def test_resume_of_a_folder_where_no_run_started_is_refused_creating_nothing(tmp_path, capsys, started):
    typo = tmp_path / "outputs" / "lcoal"
    rc, _, line = _main(capsys, "run", "--resume", "--config", CONFIG, "--no-progress", "env.task_ids=[0]", f"rollout.output_dir={typo}", UNSET_KEY)
    assert rc == 2 and line == f"error: {typo} holds no run to resume (no such folder): check rollout.output_dir, or drop --resume to start a run there"
    assert not (tmp_path / "outputs").exists() and started == []


def test_a_finished_run_is_refused_saying_what_applies(tmp_path, capsys, started):
    out = tmp_path / "done"
    _finished_run(out)
    rc, _, line = _main(capsys, "run", "--config", CONFIG, "--no-progress", "env.task_ids=[0,1]", f"rollout.output_dir={out}", UNSET_KEY)
    assert rc == 2 and line == (f"error: {out} holds a finished run (finished, 2 of 2 episodes delivered): nothing to resume; "
                                "pass --overwrite to run it again, or name another rollout.output_dir")
    assert started == []


@pytest.mark.parametrize("state", ["[1, 2]\n", "not json\n"])
@pytest.mark.parametrize("command", ["resume", "replay", "regrade"])
def test_a_run_json_that_is_not_a_json_object_is_one_line(tmp_path, capsys, started, state, command):
    run = tmp_path / "run"
    _finished_run(run)
    (run / STATE_FILE).write_text(state)
    argv = {"resume": ["run", "--resume", "--config", CONFIG, "--no-progress", "env.task_ids=[0,1]", f"rollout.output_dir={run}", UNSET_KEY],
            "replay": ["run", "--replay", str(run)], "regrade": ["regrade", str(run), "--no-progress"]}[command]
    rc, _, line = _main(capsys, *argv)
    assert rc == 2 and line.startswith(f"error: {run / STATE_FILE} ") and "not the run's state" in line, line
    assert started == []


@pytest.mark.parametrize("text, expect", [("rollout: [unclosed\n", ", line 2, column 1: expected ',' or ']'"),
                                         ("- 1\n- 2\n", ": the top level must be a mapping of sections")])
@pytest.mark.parametrize("command", ["replay", "regrade"])
def test_a_runs_malformed_config_yaml_is_one_line(tmp_path, capsys, text, expect, command):
    run = tmp_path / "run"
    _finished_run(run)
    (run / "config.yaml").write_text(text)
    rc, _, line = _main(capsys, *(["run", "--replay", str(run)] if command == "replay" else ["regrade", str(run), "--no-progress"]))
    assert rc == 2 and line.startswith(f"config error: {run / 'config.yaml'}{expect}"), line


def test_the_printed_paths_are_absolute(tmp_path, capsys, monkeypatch):
    """A relative rollout.output_dir: the summary's files and the line the CLI prints name where
    the files are (checked through ``--replay``, which writes them without starting anything)."""
    run = tmp_path / "run"
    _finished_run(run)
    monkeypatch.chdir(tmp_path)
    rc, out, _ = _main(capsys, "run", "--replay", str(run), "rollout.output_dir=rel/replayed")
    where = tmp_path / "rel" / "replayed"
    assert rc == 0 and f"samples: {where / 'samples.jsonl'}  (kept out of training: {where / 'failed.jsonl'}, {where / 'filtered.jsonl'})" in out, out
    assert json.loads((where / "summary.json").read_text())["files"]["samples.jsonl"] == str(where / "samples.jsonl")
    assert len((where / "samples.jsonl").read_text().splitlines()) == 2


@pytest.mark.parametrize("relative", [True, False])
def test_the_ray_jobs_entry_point_warns_that_a_relative_output_dir_lands_in_rays_copy(tmp_path, relative):
    """launch/job.py runs in Ray's copy of the project: a relative rollout.output_dir lands there,
    not where the user submitted from; the job's log says so, with the absolute path."""
    out = "outputs/job" if relative else str(tmp_path / "abs")
    proc = subprocess.run([sys.executable, str(ROOT / "launch" / "job.py"), "--config", CONFIG, "env.task_ids=[0]", f"rollout.output_dir={out}",
                           UNSET_KEY], cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 2 and "ROLLOUT_OUTPUT_DIR_TEST_UNSET" in proc.stderr, proc.stderr[-2000:]
    warning = [line for line in proc.stderr.splitlines() if line.startswith("warning: rollout.output_dir=")]
    if relative:
        assert warning == [f"warning: rollout.output_dir=outputs/job is relative: in a Ray job it lands in Ray's copy of the project on the head "
                           f"({tmp_path / 'outputs' / 'job'}), not in the folder you submitted from; name an absolute folder (shared "
                           "storage on a cluster)"], proc.stderr[-2000:]
    else:
        assert warning == [], warning
