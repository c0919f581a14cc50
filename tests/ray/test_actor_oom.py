"""An actor killed by Ray's memory monitor (not by a signal of ours): on the chaos bench's throwaway
cluster in a memory cgroup of its own (tests/support/actor_oom_driver.py, in its own process; the
mechanism in :mod:`rollout.devtools.chaos.memory`), the monitor kills the one actor of the node
whose threshold the pressure passes; the pool re-runs its episodes and delivers every one once.

Needs root (a memory cgroup of its own, a bind mount in a mount namespace of its own): skipped,
saying why, elsewhere."""

from __future__ import annotations

import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DRIVER = ROOT / "tests" / "support" / "actor_oom_driver.py"
pytestmark = [pytest.mark.ray, pytest.mark.slow]


def _why_not() -> str | None:
    from rollout.devtools.chaos.memory import own_memory_cgroup

    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    if os.geteuid() != 0:
        return "a memory cgroup and a bind mount of the test's own need root"
    try:
        own_memory_cgroup()
    except RuntimeError as e:
        return str(e)
    return None


# Out of CI (`extended`): in a CI-equivalent run on a fresh clone (2 cores, nothing else running) its driver
# ran past 360 s where other runs took 78 s; the cause is not found yet. The chaos bench row actor_oom
# covers the same fault: python -m rollout.bench chaos --faults actor_oom.
@pytest.mark.extended
@pytest.mark.timeout(400)
def test_an_actor_killed_by_rays_memory_monitor_has_its_episodes_run_again_once(retail_stack, tmp_path):
    why = _why_not()
    if why:
        pytest.skip(why)
    ray_tmp = tempfile.mkdtemp(prefix="roo", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    env = dict(os.environ, RAY_TMPDIR=ray_tmp, RAY_AUTH_MODE="disabled", LITELLM_LOCAL_MODEL_COST_MAP="True", TOKENIZERS_PARALLELISM="false")
    env.pop("RAY_ADDRESS", None)
    out = tmp_path / "report.json"
    try:
        proc = subprocess.run([sys.executable, str(DRIVER), "--out", str(out), "--router-url", retail_stack.router_url],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=360)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    report = json.loads(out.read_text()) if out.exists() else {}
    assert proc.returncode == 0 and report.get("ok"), f"{report.get('error')}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    kills = [k for k in report["kills"] if k["raylet_pid"] == report["victim_raylet_pid"]]
    assert [k["pid"] for k in kills] == [report["victim"]] and "exceeded threshold" in kills[0]["reason"]  # the monitor, not us
    assert report["dead_s"] < 60
    counts = collections.Counter(r["episode_id"] for r in report["results"])
    assert sorted(counts) == sorted(report["specs"]) and set(counts.values()) == {1}
    assert report["retries"] >= 1 and any(r["attempt"] > 0 for r in report["results"])  # the victim's episodes ran again
    assert {r["status"] for r in report["results"]} == {"completed"}
