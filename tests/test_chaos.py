"""The chaos bench (``python -m rollout.bench chaos``) on two cheap faults, plus its counting.

The bench runs the main job in a subprocess on the local stack, SIGTERMs its driver and resumes
it, and SIGKILLs a rollout actor three times; every row must report 0 lost, 0 duplicated and 0
processes left behind (see :mod:`rollout.chaos`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rollout.chaos import FaultInjectingProxy, tally

ROOT = Path(__file__).resolve().parents[1]


def _write(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_tally_counts_lost_duplicated_and_reruns(tmp_path):
    _write(tmp_path / "specs.jsonl", [{"episode_id": e} for e in ("a", "b", "c", "d")])
    _write(tmp_path / "samples.jsonl", [{"status": "completed", "metadata": {"episode_id": e}} for e in ("a", "b~r1")])
    _write(tmp_path / "failed.jsonl", [{"status": "policy_error", "metadata": {"episode_id": e}} for e in ("b", "c")])
    _write(tmp_path / "filtered.jsonl", [{"status": "completed", "metadata": {"episode_id": "a"}}])
    _write(tmp_path / "episodes.jsonl", [{"metadata": {"episode_id": e}} for e in ("a", "b", "b~r1", "c", "c")])
    t = tally(tmp_path)
    assert t["submitted"] == 5  # a b c d + the re-run b~r1
    assert t["delivered"] == 4 and t["lost"] == 1 and t["lost_ids"] == ["d"]
    assert t["duplicated"] == 2 and t["duplicated_ids"] == ["a", "c"]  # a twice in the files, c twice in the journal
    assert t["statuses"] == {"completed": 2, "policy_error": 2} and t["reruns"] == 1


def test_fault_proxy_picks_faults_by_rid_only_for_episode_calls():
    proxy = FaultInjectingProxy("http://127.0.0.1:1", {"503": 0.5, "abort": 0.5}, hang_s=1.0)
    assert proxy.pick(None) is None and proxy.pick("probe") is None
    picks = [proxy.pick(f"b0:retail/{i}#0@0#{n}") for i in range(20) for n in range(5)]
    assert set(picks) == {"503", "abort"}  # rates summing to 1: every episode call is hit
    assert proxy.pick("b0:retail/1#0@0#3") == proxy.pick("b0:retail/1#0@0#3")  # deterministic


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.extended  # 5-10 min; the same guarantees run in CI in tests/test_interrupt_resume.py and tests/test_pool_faults.py
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
        assert r["ok"] and all(r["checks"].values()), detail
    assert rows["driver_sigterm_resume"]["checks"]["exit_143_within_10s"]
    assert len(rows["actor_sigkill_x3"]["kills"]) == 3
    assert proc.returncode == 0 and "actor_sigkill_x3" in proc.stdout and "notes:" in proc.stdout
