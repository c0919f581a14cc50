"""An actor killed by Ray's memory monitor, as a standalone driver (run by tests/ray/test_actor_oom.py
in its own process, so that this process's Ray connection is the only one).

It starts the chaos bench's throwaway cluster in a memory cgroup of its own
(:class:`rollout.devtools.chaos.cluster.ClusterHelper`, :mod:`rollout.devtools.chaos.memory`: one
actor per worker node, the second node's ``RAY_memory_usage_threshold`` low), a 2-actor
:class:`RolloutPool` on it against the router ``--router-url``, submits ``--tasks`` retail tasks,
and once one result is in and both actors run episodes, makes a process in the cgroup allocate
what takes the usage past the second node's threshold; as soon as that node's actor is dead the
pressure goes. Then it consumes the rest. It writes a JSON report to ``--out``: the specs, the
results (episode id, status, attempt), the victim's pid, the pressure, and the kills the raylets
logged.

Usage: python tests/support/actor_oom_driver.py --out report.json --router-url URL [--tasks 12]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from rollout.core.config import load_config  # noqa: E402
from rollout.devtools.chaos.cluster import ClusterHelper  # noqa: E402
from rollout.devtools.chaos.faults_infra import OOM_LIMIT, OOM_MARGIN, OOM_VICTIM_THRESHOLD  # noqa: E402


def _victim(pool, raylet_pid: int) -> int:
    for info in pool.worker_infos():
        if raylet_pid in {p.pid for p in psutil.Process(info["pid"]).parents()}:
            return info["pid"]
    raise RuntimeError("no actor on the victim node")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--router-url", required=True)
    ap.add_argument("--tasks", type=int, default=12)
    args = ap.parse_args()
    out = Path(args.out)
    report: dict = {"ok": False}
    helper = ClusterHelper(out.parent, dict(os.environ), memory_limit=OOM_LIMIT, victim_threshold=OOM_VICTIM_THRESHOLD)
    try:
        import ray

        from rollout.core.pool import RolloutPool

        ray.init(address=helper.info["address"], log_to_driver=False)
        cfg = load_config(None, [f"policy.router_url={args.router_url}", "pool.num_actors=2", "pool.num_cpus_per_actor=1",
                                 "pool.max_concurrent_episodes=2", "pool.metrics=false"])
        pool = RolloutPool(cfg).start()
        try:
            specs = pool.submit_tasks([str(i) for i in range(args.tasks)])
            results = pool.results(timeout_s=300)
            got = [next(results)]
            while sum(i["running"] for i in pool.worker_infos()) < 2 or min(i["running"] for i in pool.worker_infos()) < 1:
                time.sleep(0.05)
            victim = _victim(pool, helper.info["victim_raylet_pid"])
            before = helper.ask({"usage": True})
            need = int(OOM_VICTIM_THRESHOLD * before["limit"]) - before["used"] + OOM_MARGIN
            helper.ask({"pressure": need})
            t0 = time.monotonic()
            while psutil.pid_exists(victim) and psutil.Process(victim).status() != psutil.STATUS_ZOMBIE and time.monotonic() - t0 < 60:
                time.sleep(0.1)
            dead_s = time.monotonic() - t0
            helper.ask({"release": True})
            got += list(results)
            report.update(specs=[s.episode_id for s in specs], victim=victim, pressure=need, used_before=before["used"], dead_s=round(dead_s, 1),
                          results=[{"episode_id": r.spec.episode_id, "status": r.status.value, "attempt": r.spec.attempt} for r in got],
                          retries=pool.stats()["episode_retries"])
        finally:
            pool.shutdown()
            ray.shutdown()
        report["kills"] = helper.ask({"oom_kills": True})["kills"]
        report["victim_raylet_pid"] = helper.info["victim_raylet_pid"]
        report["ok"] = True
    except Exception:  # noqa: BLE001 (reported)
        report["error"] = traceback.format_exc()
    finally:
        helper.stop()
        out.write_text(json.dumps(report))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
