"""The verl and AReaL integration tests, run from the project's own test run (and so in CI) in
environments of their own.

verl 0.9.1 pins transformers and omegaconf below the project's, and AReaL 1.0.4 pins a torch the
CPU build cannot satisfy (installed without its dependencies), so neither goes into the project's
``.venv``: ``tests/integrations/run_verl.sh`` and ``run_areal.sh`` make (or reuse)
``.venv-verl`` / ``.venv-areal`` at the repository root and run that framework's test file there.
Each case here runs one script and checks that every test of that file passed and none was skipped
(a framework that failed to import would skip them). It costs about 4.5 min (verl) and 2 min
(AReaL) on the project's 2-core machine from a fresh clone, most of it installing; a reused venv
costs about a minute each. Inside those environments this file skips itself (no recursion).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
INSIDE = "TAU_ROLLOUT_FRAMEWORK_VENV"  # set for the pytest run inside a framework's environment


def _tests_in(path: Path) -> int:
    return len(re.findall(r"^(?:async )?def test_", path.read_text(), re.M))


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("framework", ["verl", "areal"])
def test_the_integration_passes_against_the_real_framework_in_its_own_environment(framework):
    if os.environ.get(INSIDE):
        pytest.skip(f"running inside the {os.environ[INSIDE]} environment")
    test_file = HERE / f"test_{framework}.py"
    env = {**os.environ, INSIDE: framework}
    env.pop("PYTHONPATH", None)  # the framework's venv has the project installed (editable) itself
    proc = subprocess.run(["bash", str(HERE / f"run_{framework}.sh"), str(test_file.relative_to(ROOT))], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1700)
    tail = proc.stdout[-4000:] + proc.stderr[-4000:]
    assert proc.returncode == 0, tail
    # pytest's own summary line (the suite's last lines follow it: retries, unexpected skips)
    summary = next(line for line in reversed(proc.stdout.strip().splitlines()) if re.search(r"\d+ (passed|failed|error)", line))
    passed = re.search(r"(\d+) passed", summary)
    assert passed and int(passed.group(1)) == _tests_in(test_file) and "skipped" not in summary and "failed" not in summary, tail
