"""``python -m rollout run`` given a config file or an override that is no config: one line on
stderr naming the file (with YAML's line and column) or the key, exit 2, nothing started and no
output folder made; never a traceback. Run through the CLI (``rollout.app.cli.main``, in this
process: these refusals come before anything starts). What ``load_config`` raises for each, and
more of them: tests/unit/test_config_input.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollout.app import cli

ROOT = Path(__file__).resolve().parents[2]
KEY = "sk-proj-" + "Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4zAb7cDe0fGh3i"

# (what --config names: a file's bytes, "folder" or None for configs/local.yaml; overrides; what the line says)
CASES = {
    "unclosed-list": (b"env:\n  task_ids: [0, 1\n", [], "bad.yaml, line 3, column 1: "),
    "top-level-list": (b"- pool\n- env\n", [], "bad.yaml: the top level must be a mapping of sections"),
    "latin-1": (b"env:\n  domain: caf\xe9\n", [], "bad.yaml, line 2, column 14: not UTF-8 text (byte 0xe9)"),
    "python-tag": (b"env: !!python/object/apply:os.system ['echo pwned']\n", [],
                   "bad.yaml, line 1, column 6: the tag !!python/object/apply:os.system is not allowed"),
    "folder": ("folder", [], "configs: is a folder, not a YAML file"),
    "override-unclosed-list": (None, ["env.task_ids=[0,1"], "env.task_ids: cannot read the value '[0,1' as YAML: "),
    "override-not-a-list": (None, ["env.task_ids=abc"], "env.task_ids: expects a list of task ids (ints or strings, "),
    "repeated-task": (None, ["env.task_ids=[0,0]"], "env.task_ids: lists 0 more than once"),
    "no-task": (None, ["env.task_ids=[]"], "env.task_ids: is empty: leave it null (unset) to run every task of env.task_split"),
    "pasted-key": (None, [f"policy.api_key_env={KEY}"], f"policy.api_key_env: must name the environment variable that holds the key "
                                                        f"(e.g. OPENAI_API_KEY), not the key itself, got 'sk-…' ({len(KEY)} characters)"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_config_that_is_no_config_is_one_line_and_exit_2(tmp_path, capsys, case):
    source, overrides, expect = CASES[case]
    if source == "folder":
        config = tmp_path / "configs"
        config.mkdir()
    elif source is None:
        config = ROOT / "configs" / "local.yaml"
    else:
        config = tmp_path / "bad.yaml"
        config.write_bytes(source)
    out = tmp_path / "out"
    rc = cli.main(["run", "--config", str(config), "--no-progress", f"rollout.output_dir={out}", *overrides])
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert rc == 2 and len(lines) == 1 and "Traceback" not in captured.err, captured.err
    assert lines[0].startswith("config error: ") and expect in lines[0], lines[0]
    assert KEY not in captured.err and captured.out == ""
    assert not out.exists()  # nothing started, nothing written
