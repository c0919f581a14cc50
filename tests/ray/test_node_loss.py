"""Node loss: on a local multi-node Ray cluster, removing a worker node mid-run loses and
duplicates nothing (docs/design.md invariant 2, "also when actors die and episodes are retried").

The scenario runs in its own process (tests/support/node_loss_driver.py), because the pool's process must
not already be connected to another Ray cluster (the ``ray_cluster`` fixture connects the pytest
process to one). The driver starts a ``ray.cluster_utils.Cluster``: a head with no
CPUs (the driver sits there, the actors cannot) and two worker nodes with 2 CPUs each, so each
node can hold both 1-CPU actors. Ray's default (hybrid) scheduling puts the second actor on the
empty node (the first node's CPU utilisation, 0.5, is not below the 0.5 spread threshold), so
there is one actor per worker node. It submits 16 retail tasks to a 2-actor pool (4 episodes per
actor) against the gold-replay router, and once 2 results are in and both actors run episodes it
removes the node of the busier actor. Then it waits for Ray to restart the lost actor on the
surviving node and submits 8 more tasks, which the pool must dispatch to it again.

Ray is started with ``RAY_TMPDIR`` set to a folder of this test's own: ``Cluster`` records its
address in ``$RAY_TMPDIR/ray/ray_current_cluster`` (the machine-wide ``/tmp/ray`` by default, which
``ray.init()`` elsewhere on the machine would then connect to) and deletes it at shutdown.
``RAY_AUTH_MODE=disabled``: neither ``Cluster.add_node`` nor ``ray.init(address=<explicit>)``
turns Ray's token auth on (only a ``ray.init()`` that starts a new cluster, or one that finds a
local cluster by itself with ``~/.ray/auth_token`` present, does), so it is not needed today; it is
set so that an inherited ``RAY_AUTH_MODE=token`` cannot make the run depend on the home folder.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).resolve().parents[1] / "support" / "node_loss_driver.py"
pytestmark = [pytest.mark.ray, pytest.mark.slow]

N_TASKS = 16
N_AFTER = 8
DRIVER_TIMEOUT_S = 270


def _ours(sid: int, known: list[dict]) -> list[psutil.Process]:
    """Processes still alive from the driver's session (its process group and everything Ray
    started under it), or listed by the driver (pid and start time both match)."""
    left = {}
    for p in psutil.process_iter(["pid", "status"]):
        try:
            if (os.getsid(p.pid) == sid or os.getpgid(p.pid) == sid) and p.info["status"] != psutil.STATUS_ZOMBIE:
                left[p.pid] = p
        except (OSError, psutil.Error):
            pass
    for k in known:
        try:
            p = psutil.Process(k["pid"])
            if abs(p.create_time() - k["create_time"]) < 1.0 and p.status() != psutil.STATUS_ZOMBIE:
                left[p.pid] = p
        except psutil.Error:
            pass
    return [p for p in left.values() if p.pid != os.getpid()]


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM the driver's process group, then SIGKILL it after a grace period."""
    for sig, grace in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


@pytest.mark.timeout(DRIVER_TIMEOUT_S + 90)
@pytest.mark.extended  # 3 Ray nodes on 2 cores, ~2 min: kept out of CI's budget; tests/ray/test_pool_faults.py covers actor death (retry, actor_lost, exactly once) in CI
def test_removing_a_worker_node_mid_run_loses_and_duplicates_nothing(retail_stack, retail, tmp_path):
    ids = retail.task_ids("base")[: N_TASKS + N_AFTER]
    ray_tmp = tempfile.mkdtemp(prefix="rnl", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    env = dict(os.environ, RAY_TMPDIR=ray_tmp, RAY_AUTH_MODE="disabled", LITELLM_LOCAL_MODEL_COST_MAP="True",
               TOKENIZERS_PARALLELISM="false")
    env.pop("RAY_ADDRESS", None)
    out, log_path = tmp_path / "report.json", tmp_path / "driver.log"
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, str(DRIVER), "--out", str(out), "--router-url", retail_stack.router_url,
             "--task-ids", ",".join(ids[:N_TASKS]), "--after-task-ids", ",".join(ids[N_TASKS:])],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        try:
            proc.wait(timeout=DRIVER_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pass
        finally:
            if proc.poll() is None:
                _stop(proc)
            report = json.loads(out.read_text()) if out.exists() else {}
            left = _ours(proc.pid, report.get("pids", []))
            left_info = []
            for p in left:
                try:
                    left_info.append(p.as_dict(["pid", "ppid", "name", "status", "cmdline", "create_time"]))
                except psutil.Error:
                    pass
            for p in left:  # only processes this test started: the driver's session, or listed by it
                try:
                    p.kill()
                except psutil.Error:
                    pass
            psutil.wait_procs(left, timeout=10)
            shutil.rmtree(ray_tmp, ignore_errors=True)
    elapsed = time.monotonic() - t0
    summary = {
        "elapsed_s": round(elapsed, 1), "events": {e["what"]: e["t"] for e in report.get("events", [])},
        "statuses": dict(collections.Counter(r["status"] for r in report.get("results", []))),
        "retried": sorted(r["episode_id"] for r in report.get("results", []) if r["attempt"] > 0),
        "removed": {k: v for k, v in (report.get("removed") or {}).items() if k != "nodes"},
        "stats": report.get("stats"), "cleanup_s": report.get("cleanup_s"), "exit_wait_s": report.get("exit_wait_s"),
        "lingering": report.get("lingering"), "session_after_cleanup": report.get("session_after_cleanup"),
    }
    print("node-loss summary:", json.dumps(summary))
    tail = log_path.read_text()[-6000:]
    assert not left, f"the driver left processes running (killed now): {left_info}"
    assert proc.returncode == 0 and report.get("ok"), f"rc={proc.returncode} after {elapsed:.0f}s\n{report.get('error')}\n{tail}"
    assert not report.get("cleanup_errors"), report["cleanup_errors"]

    nodes, before, removed = report["nodes"], report["actors_before"], report.get("removed")
    # set-up: the driver on the head, one actor per worker node
    assert report["driver_node"] == nodes["head"]
    assert sorted(a["node"] for a in before) == sorted(nodes["workers"]), before
    # the node went away while episodes ran on both actors, some of them on the lost one
    assert removed is not None, f"episodes never ran on both actors at once\n{tail}"
    assert all(n > 0 for n in removed["running_per_actor"])
    lost = set(removed["in_flight_on_victim"])
    assert lost

    results = report["results"]
    counts = collections.Counter(r["episode_id"] for r in results)
    submitted = report["submitted"] + report.get("submitted_after", [])
    assert len(report["submitted"]) == N_TASKS and len(report.get("submitted_after", [])) == N_AFTER
    # exactly once: every submitted episode id delivered, none twice, nothing else
    assert sorted(counts) == sorted(submitted)
    assert set(counts.values()) == {1}, [i for i, n in counts.items() if n > 1]
    # the lost node's episodes were re-run on the surviving one and completed; none ended actor_lost
    assert all(r["status"] == "completed" and r["reward"] == 1.0 for r in results), [r for r in results if r["status"] != "completed"]
    survivor = next(n for n in nodes["workers"] if n != removed["node"])
    by_id = {r["episode_id"]: r for r in results}
    retried = {r["episode_id"] for r in results if r["attempt"] > 0}
    assert retried, "no episode of the lost node was re-run"
    for eid in lost:
        # re-run on the surviving node, or (a race) it had finished and its result reached the
        # driver just before the node went away
        r = by_id[eid]
        assert (r["attempt"] >= 1 and r["node"] == survivor) or (r["attempt"] == 0 and r["node"] == removed["node"]), r
    assert retried <= lost, "only the lost node's episodes are re-run"
    assert report["stats"]["episode_retries"] == len(retried)
    assert report["stats"]["episodes_delivered"] == len(submitted) and report["stats"]["episodes_outstanding"] == 0
    # Ray restarted the lost actor on the surviving node, and the pool gave it work again
    back = report["actors_restarted"][removed["actor"]]
    assert back["state"] == "ALIVE" and back["node"] == survivor and back["restarts"] == 1, back
    after = [r for r in results if r["phase"] == "after"]
    assert {r["worker_pid"] for r in after} == {a["pid"] for a in report["actors_restarted"]}, after
