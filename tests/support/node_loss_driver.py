"""Node loss on a local multi-node Ray cluster, as a standalone driver (run by
tests/ray/test_node_loss.py in its own process, so that this process's Ray connection is the only one).

It starts a ``ray.cluster_utils.Cluster`` (a head with no CPUs, so the driver sits there and the
actors on the workers, and two worker nodes with ``--cpus`` each, enough for both actors), a
:class:`RolloutPool` on it (2 actors, 1 CPU each, ``--max-concurrent`` episodes per actor) against
the gold-replay router (``--router-url``, else a local stack of its own), behind a
:class:`FaultProxy` that delays every ``/generate`` by ``--delay`` seconds so that episodes stay
in flight a while.

1. It submits the tasks (``--task-ids``, or the first ``--tasks`` of the retail base split),
   consumes ``pool.results()``, and once ``--remove-after`` results have arrived and both actors
   run episodes, removes (``Cluster.remove_node``) the worker node of the busier actor, then
   consumes the rest.
2. It waits for Ray to restart the lost actor (on the surviving node: the only one left), then
   submits ``--after-task-ids`` and consumes them.

It writes a JSON report to ``--out``: every result (phase, episode id, status, reward, attempt,
worker pid and node), the nodes, the actors before / after, the removal, the pool's stats, timings,
and the processes it started. At the end it waits (``--exit-wait``) until every process it started
has exited, orphans of its session included (Ray's workers exit by themselves once their raylet is
gone, not at once), and kills what is left.

Usage: python tests/support/node_loss_driver.py --out report.json [--router-url URL] [--task-ids 0,1,...]
Ray's files go to ``$RAY_TMPDIR`` (a fresh folder of its own when unset, removed at the end): the
Cluster records its address in ``$RAY_TMPDIR/ray/ray_current_cluster`` and deletes it at shutdown,
which must not touch the machine-wide ``/tmp/ray`` that other Ray users on the machine rely on.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # fault_proxy
sys.path.insert(0, str(HERE.parents[1]))  # rollout, when run from anywhere
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _descendants() -> list[dict]:
    import psutil

    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            out.append({"pid": p.pid, "create_time": p.create_time(), "name": p.name()})
        except psutil.Error:
            pass
    return out


def _session_members() -> list[dict]:
    """When this process leads its own session (the test starts it so): every other process of
    the session, orphans included (a Ray worker whose raylet was killed is re-parented, so
    ``children()`` no longer lists it)."""
    import psutil

    if os.getsid(0) != os.getpid():
        return []
    out = []
    for p in psutil.process_iter(["pid", "name", "create_time", "status"]):
        try:
            if p.pid != os.getpid() and os.getsid(p.pid) == os.getpid() and p.info["status"] != psutil.STATUS_ZOMBIE:
                out.append({"pid": p.pid, "create_time": p.info["create_time"], "name": p.info["name"]})
        except (OSError, psutil.Error):
            pass
    return out


def _alive(procs: list[dict]) -> list[dict]:
    """The processes of ``procs`` (from :func:`_descendants`) still running."""
    import psutil

    out = []
    for d in procs:
        try:
            p = psutil.Process(d["pid"])
            if abs(p.create_time() - d["create_time"]) < 1.0 and p.status() != psutil.STATUS_ZOMBIE:
                out.append(d)
        except psutil.Error:
            pass
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--router-url", default=None)
    ap.add_argument("--task-ids", default=None, help="comma-separated retail task ids (default: the first --tasks of the base split)")
    ap.add_argument("--tasks", type=int, default=16)
    ap.add_argument("--after-task-ids", default="", help="comma-separated task ids submitted once the lost actor is back")
    ap.add_argument("--delay", type=float, default=0.1, help="seconds added to every /generate")
    ap.add_argument("--restart-timeout", type=float, default=90.0, help="how long to wait for the lost actor to come back")
    ap.add_argument("--cpus", type=float, default=2, help="CPUs of each worker node")
    ap.add_argument("--max-concurrent", type=int, default=4)
    ap.add_argument("--remove-after", type=int, default=2, help="results to wait for before removing a node")
    ap.add_argument("--exit-wait", type=float, default=30.0, help="how long to wait for Ray's processes to exit at the end")
    ap.add_argument("--result-timeout", type=float, default=120.0, help="give up after this long without a result")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log = logging.getLogger("node_loss_driver")
    own_tmp = None
    if not os.environ.get("RAY_TMPDIR"):
        own_tmp = os.environ["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="rnl", dir="/tmp")  # short: socket paths <= 107 bytes

    import ray
    from fault_proxy import FaultProxy
    from ray.cluster_utils import Cluster

    from rollout.benchmarks.tau2.environment import Tau2Domain
    from rollout.core.config import LocalConfig, load_config
    from rollout.core.pool import RolloutPool
    from rollout.core.tokenizer import load_tokenizer

    report: dict = {"ok": False, "args": vars(args), "results": [], "events": [], "pids": []}
    t_start = time.monotonic()

    def event(what: str, **kw) -> None:
        kw.update(what=what, t=round(time.monotonic() - t_start, 3))
        report["events"].append(kw)
        log.info("EVENT %s", kw)

    stack = cluster = pool = proxy = None
    try:
        if args.router_url is None:
            from rollout.devtools.local.stack import LocalStack

            stack = LocalStack(LocalConfig(enabled=True, backend="gold_replay"), "retail", "builtin:qwen3",
                               log_dir=Path(os.environ["RAY_TMPDIR"]) / "stack").start()
            args.router_url = stack.router_url
        tok = load_tokenizer("builtin:qwen3")
        proxy = FaultProxy(args.router_url, tok, lambda key, body: ("delay", args.delay) if args.delay > 0 else None)
        proxy.__enter__()
        task_ids = args.task_ids.split(",") if args.task_ids else Tau2Domain("retail").task_ids("base")[: args.tasks]
        event("stack_ready", router_url=args.router_url, proxy_url=proxy.url)

        # The head has no CPUs, so the driver sits on it and the actors on the workers. (Not
        # node_ip_address=127.0.0.1: ray.init rewrites a loopback address to the machine's own IP
        # and then cannot reach a GCS bound to loopback.)
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
        workers = [cluster.add_node(num_cpus=args.cpus) for _ in range(2)]
        cluster.wait_for_nodes()
        head_id = cluster.head_node.node_id
        worker_ids = [n.node_id for n in workers]
        report["nodes"] = {"head": head_id, "workers": worker_ids}
        event("cluster_ready", address=cluster.address)

        cfg = load_config(None, [
            f"policy.router_url={proxy.url}", f"pool.ray_address={cluster.address}", "pool.num_actors=2",
            f"pool.max_concurrent_episodes={args.max_concurrent}", "pool.num_cpus_per_actor=1",
        ])
        report["max_episode_retries"] = cfg.pool.max_episode_retries
        pool = RolloutPool(cfg).start()
        driver_node = ray.get_runtime_context().get_node_id()
        report["driver_node"] = driver_node

        def actor_nodes() -> list[dict]:
            """Each actor's state, node and pid from the GCS actor table (no dashboard needed)."""
            out = []
            for a in pool.actors:
                row = ray._private.state.actors(actor_id=a._actor_id.hex())
                out.append({"state": row.get("State"), "node": (row.get("Address") or {}).get("NodeID"), "pid": row.get("Pid"),
                            "restarts": row.get("NumRestarts")})
            return out

        before = actor_nodes()
        report["actors_before"] = before
        event("pool_ready", actors=before, driver_node=driver_node)
        pid_node = {a["pid"]: a["node"] for a in before}

        def record(r, phase: str, t0: float) -> None:
            report["results"].append({
                "phase": phase, "episode_id": r.spec.episode_id, "status": r.status.value, "reward": r.reward,
                "attempt": r.spec.attempt, "worker_pid": r.metadata.get("worker_pid"), "t": round(time.monotonic() - t0, 3),
                "error": r.metadata.get("error"),
            })

        # Phase 1: 2 actors on 2 worker nodes; a node goes away mid-run.
        specs = pool.submit_tasks(task_ids)
        report["submitted"] = [s.episode_id for s in specs]
        t_submit = time.monotonic()
        event("submitted", n=len(specs))
        removed = None
        for r in pool.results(timeout_s=args.result_timeout):
            record(r, "loss", t_submit)
            if removed is None and len(report["results"]) >= args.remove_after:
                infos = ray.get([a.info.remote() for a in pool.actors], timeout=30)
                running = [i["running"] for i in infos]
                if all(n > 0 for n in running):  # episodes in flight on both nodes
                    nodes = actor_nodes()
                    victim = max(range(len(running)), key=lambda k: running[k])
                    node = next(n for n in workers if n.node_id == nodes[victim]["node"])
                    in_flight = sorted(pool.episodes_in_flight(victim))
                    removed = {"actor": victim, "node": node.node_id, "running_per_actor": running, "nodes": nodes,
                               "in_flight_on_victim": in_flight, "delivered_before": len(report["results"])}
                    t_rm = time.monotonic()
                    cluster.remove_node(node)
                    removed["remove_node_s"] = round(time.monotonic() - t_rm, 3)
                    removed["t"] = round(t_rm - t_submit, 3)
                    event("node_removed", **removed)
                    report["removed"] = removed
        report["loss_phase_s"] = round(time.monotonic() - t_submit, 3)
        # processes of this session that are no longer this process's descendants: orphans of the lost node
        mine = {d["pid"] for d in _descendants()}
        report["orphans_after_loss"] = [d for d in _session_members() if d["pid"] not in mine]
        report["stats_after_loss"] = pool.stats()
        event("all_delivered", n=len(report["results"]))

        # Phase 2: the lost actor comes back (Ray restarts it on the surviving node) and the pool
        # gives it work again.
        if removed is not None:
            deadline = time.monotonic() + args.restart_timeout
            while True:
                now_nodes = actor_nodes()
                if now_nodes[removed["actor"]]["state"] == "ALIVE" or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            report["actors_restarted"] = now_nodes
            pid_node.update({a["pid"]: a["node"] for a in now_nodes})
            event("actor_back", actors=now_nodes)
            if args.after_task_ids and now_nodes[removed["actor"]]["state"] == "ALIVE":
                t_after = time.monotonic()
                after_specs = pool.submit_tasks(args.after_task_ids.split(","))
                report["submitted_after"] = [s.episode_id for s in after_specs]
                for r in pool.results(timeout_s=args.result_timeout):
                    record(r, "after", t_after)
                report["after_phase_s"] = round(time.monotonic() - t_after, 3)
                event("after_delivered", n=len(after_specs))
        for row in report["results"]:
            row["node"] = pid_node.get(row["worker_pid"])
        report["stats"] = pool.stats()
        report["actors_after"] = actor_nodes()
        report["ok"] = True
    except Exception as e:  # reported to the test, with everything gathered so far
        report["error"] = "".join(traceback.format_exception(e))
        log.error("driver failed: %s", report["error"])
    finally:
        report["pids"] = _descendants()
        for what, fn in [
            ("pool.shutdown", lambda: pool and pool.shutdown()),
            ("ray.shutdown", lambda: ray.shutdown()),
            ("cluster.shutdown", lambda: cluster and cluster.shutdown()),
            ("proxy", lambda: proxy and proxy.__exit__(None, None, None)),
            ("stack.stop", lambda: stack and stack.stop()),
        ]:
            t = time.monotonic()
            try:
                fn()
            except Exception as e:
                report.setdefault("cleanup_errors", []).append(f"{what}: {e!r}")
            report.setdefault("cleanup_s", {})[what] = round(time.monotonic() - t, 3)
            report.setdefault("alive_after", {})[what] = [p["name"] for p in _alive(report["pids"])]
        # Ray's worker processes exit on their own once their raylet is gone, not at once: wait for
        # them (they are this process's, so the test can check that nothing is left).
        t = time.monotonic()
        report["session_after_cleanup"] = _session_members()
        left = _alive(report["pids"]) + _session_members()
        while left and time.monotonic() - t < args.exit_wait:
            time.sleep(0.2)
            left = _alive(report["pids"]) + _session_members()
        report["exit_wait_s"] = round(time.monotonic() - t, 3)
        report["lingering"] = left  # still running after --exit-wait: killed here (they are ours)
        for d in left:
            try:
                os.kill(d["pid"], 9)
            except OSError:
                pass
        report["total_s"] = round(time.monotonic() - t_start, 3)
        Path(args.out).write_text(json.dumps(report, indent=1, default=str))
        if own_tmp:
            shutil.rmtree(own_tmp, ignore_errors=True)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
