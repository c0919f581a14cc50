"""The chaos bench run for real (``python -m rollout.bench chaos``): two faults end to end; the bench's logic is tested in tests/unit/test_chaos.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.extended  # 5-10 min; the same guarantees run in CI in tests/e2e/test_interrupt_resume.py and tests/ray/test_pool_faults.py
@pytest.mark.timeout(1500)
def test_chaos_bench_sigterm_resume_and_actor_kills_lose_nothing_and_leave_nothing(tmp_path):
    out = tmp_path / "chaos.json"
    proc = subprocess.run(
        [sys.executable, "-m", "rollout.bench", "chaos", "--tasks", "20", "--faults", "driver_sigterm_resume,actor_sigkill_x3",
         "--json", str(out), "--out-dir", str(tmp_path / "runs")],
        cwd=ROOT, capture_output=True, text=True, timeout=1500,
    )
    assert out.is_file(), proc.stdout[-3000:] + proc.stderr[-5000:]
    rows = {r["fault"]: r for r in json.loads(out.read_text())}
    assert set(rows) == {"driver_sigterm_resume", "actor_sigkill_x3"}
    for name, r in rows.items():
        detail = f"{name}: {r['notes']}\n{proc.stdout[-3000:]}"
        assert r["submitted"] >= 10 and r["delivered"] == r["submitted"], detail
        assert (r["lost"], r["duplicated"], r["left_behind"]) == (0, 0, 0), detail
        assert r["ok"] and r["verdict"] == "ok" and all(r["checks"].values()), detail
        assert r["injected"]["complete"], detail
        assert all(s["outstanding"] >= 1 for s in r["injected"]["strikes"]), detail  # every strike while work was in flight
    assert rows["driver_sigterm_resume"]["checks"]["exit_143_within_10s"]
    assert rows["driver_sigterm_resume"]["injected"]["signals"] == 1
    assert len(rows["actor_sigkill_x3"]["kills"]) == 3 and rows["actor_sigkill_x3"]["injected"]["kills"] == 3
    assert proc.returncode == 0 and "actor_sigkill_x3" in proc.stdout and "3/3 kills" in proc.stdout and "notes:" in proc.stdout
