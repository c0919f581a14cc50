"""The test session's own last lines and exit status, as CI's log shows them: a pytest session of a
few toy tests under ``-q -n 2`` with the suite's hooks (tests/conftest.py) ends with the peak load
``.ci/run`` sampled, ``retries: N`` and ``unexpected skips: N``, each named; under ``TAU_ROLLOUT_CI=1``
an unexpected skip fails it (which skips are allowed: tests/unit/test_suite_infra.py). And the shared Ray head's supervisor
(tests/support/shared_ray.py) ends its process group when the session's owner is gone."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import shared_ray

TESTS = Path(__file__).resolve().parents[1]

CONFTEST = f"""
import importlib.util, sys
sys.path.insert(0, {str(TESTS)!r})
spec = importlib.util.spec_from_file_location("suite_conftest", {str(TESTS / "conftest.py")!r})
suite = importlib.util.module_from_spec(spec)
spec.loader.exec_module(suite)
pytest_configure, pytest_sessionfinish, pytest_unconfigure = suite.pytest_configure, suite.pytest_sessionfinish, suite.pytest_unconfigure
pytest_xdist_make_scheduler = suite.pytest_xdist_make_scheduler
"""

TOYS = """
import pytest
from support import retries

def test_passes():
    retries.record("test_toys.py::test_passes", "a precondition", "not met once")

def test_skips_for_want_of_a_browser():
    pytest.skip("no Chromium at /usr/bin/chromium; apt-get install chromium")

def test_passes_too():
    pass
"""


def _session(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_toys.py").write_text(TOYS)
    # a session of its own: nothing of this session's folder, retry log or CI flag
    base = {k: v for k, v in os.environ.items() if not k.startswith("TAU_ROLLOUT_") and not k.startswith("PYTEST_")}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
                           "-c", os.devnull, str(tmp_path)], cwd=tmp_path, env={**base, **env}, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_the_last_lines_name_the_peak_load_retries_and_unexpected_skips_and_ci_fails_on_them(tmp_path):
    load = tmp_path / "load.txt"
    load.write_text("0.52\n7.25\n3.10\n")
    local = _session(tmp_path, TAU_ROLLOUT_LOAD_LOG=str(load))
    assert local.returncode == 0, local.stdout[-3000:] + local.stderr[-3000:]  # locally: reported, not failed
    tail = local.stdout.strip().splitlines()[-6:]
    assert re.fullmatch(r"2 passed, 1 skipped in [\d.]+s(?: \(.*\))?", tail[0].strip("= ")), tail
    assert tail[1:] == ["peak load (1 min): 7.25 (3 samples)", "retries: 1", "  retry: test_toys.py::test_passes: a precondition: not met once",
                        "unexpected skips: 1",
                        "  skip: test_toys.py::test_skips_for_want_of_a_browser: no Chromium at /usr/bin/chromium; apt-get install chromium"]
    ci = _session(tmp_path, TAU_ROLLOUT_CI="1")
    assert ci.returncode == 1, ci.stdout[-3000:]
    assert ci.stdout.strip().splitlines()[-2] == "unexpected skips: 1"


def test_files_start_longest_first_by_the_durations_file(tmp_path):
    """xdist's own order is by number of tests (the three-test file first); the suite's scheduler
    starts the file the durations file says is longest first, and a file it does not list as its
    folder's median."""
    (tmp_path / "conftest.py").write_text(CONFTEST)
    for name, n in (("test_three.py", 3), ("test_two.py", 2), ("test_one.py", 1), ("test_new.py", 1)):
        (tmp_path / name).write_text("".join(f"def test_{i}():\n    pass\n\n" for i in range(n)))
    seconds = {"test_one.py": 300.0, "test_two.py": 100.0, "test_three.py": 5.0}  # test_new.py: the median, 100 s
    (tmp_path / "durations.json").write_text(json.dumps(seconds))
    base = {k: v for k, v in os.environ.items() if not k.startswith("TAU_ROLLOUT_") and not k.startswith("PYTEST_")}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-v", "-n", "1", "--dist", "loadfile", "-p", "no:cacheprovider", "--rootdir",
                           str(tmp_path), "-c", os.devnull, str(tmp_path)], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**base, "TAU_ROLLOUT_DURATIONS": str(tmp_path / "durations.json")})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    files = [m.group(1) for m in re.finditer(r"PASSED (test_\w+\.py)::", proc.stdout)]
    order = [f for i, f in enumerate(files) if f not in files[:i]]
    assert order == ["test_one.py", "test_two.py", "test_new.py", "test_three.py"], proc.stdout[-3000:]


def test_the_shared_heads_supervisor_ends_its_group_when_the_sessions_owner_is_gone():
    owner = subprocess.Popen(["sleep", "300"])
    group = subprocess.Popen([sys.executable, shared_ray.__file__, "supervise", str(owner.pid), "--", "sleep", "300"],
                             start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while len(shared_ray.group_members(group.pid)) < 2:  # the supervisor and its command
            assert time.monotonic() < deadline, "the supervisor did not start its command"
            time.sleep(0.1)
        owner.kill()
        owner.wait()
        group.wait(timeout=60)  # it ends itself, the command with it
        assert shared_ray.group_members(group.pid) == []
    finally:
        for p in (owner, group):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL) if p is group else p.kill()

