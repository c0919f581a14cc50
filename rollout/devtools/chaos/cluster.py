"""A Ray ``Cluster`` of the bench's own in a subprocess (:class:`ClusterHelper`, ``python -m
rollout.devtools.chaos cluster``): the only place of the bench that imports Ray."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from rollout.devtools.chaos.job import ROOT
from rollout.devtools.chaos.procs import ProcessWatcher, stop_proc


class ClusterHelper:
    """``python -m rollout.devtools.chaos cluster``: a ``ray.cluster_utils.Cluster`` in a subprocess (its
    own session), driven through stdin / stdout, one JSON object a line.

    Args:
        log_dir: where its log (``cluster.log``) goes.
        env: the helper's environment (``RAY_AUTH_MODE=disabled`` is added).
        watcher: records the helper and its descendants (``None``: nothing).
        memory_limit: bytes; when given, the helper runs in a mount namespace and a memory cgroup
            of its own with this limit, its last worker node with ``RAY_memory_usage_threshold``
            ``victim_threshold`` (see :mod:`rollout.devtools.chaos.memory`).

    Raises:
        RuntimeError: the helper did not start (its log's tail in the message).
    """

    def __init__(self, log_dir: Path, env: dict[str, str], workers: int = 2, cpus: float = 1.0, memory_limit: int = 0,
                 victim_threshold: float = 0.0, watcher: ProcessWatcher | None = None):
        self._fh = open(log_dir / "cluster.log", "w")  # noqa: SIM115
        env = dict(env, RAY_AUTH_MODE="disabled")
        cmd = [sys.executable, "-m", "rollout.devtools.chaos", "cluster", "--workers", str(workers), "--cpus", str(cpus)]
        if memory_limit:
            cmd = ["unshare", "-m", "--propagation", "private", *cmd, "--memory-limit", str(memory_limit), "--victim-threshold", str(victim_threshold)]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._fh, text=True,
                                     start_new_session=True)
        if watcher is not None:
            watcher.add(self.proc.pid)
        try:
            self.info = self._read(180.0)
        except RuntimeError as e:
            self.stop()
            raise RuntimeError(f"{e}: {(log_dir / 'cluster.log').read_text()[-600:]!r}") from None

    def ask(self, cmd: dict, timeout_s: float = 120.0) -> dict:
        """Send one command, return its answer."""
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._read(timeout_s)

    def _read(self, timeout_s: float) -> dict:
        out: list[str] = []
        t = threading.Thread(target=lambda: out.append(self.proc.stdout.readline()), daemon=True)
        t.start()
        t.join(timeout_s)
        if not out or not out[0]:
            raise RuntimeError(f"the cluster helper did not answer within {timeout_s:.0f} s (log {self._fh.name})")
        return json.loads(out[0])

    def remove(self, raylet_pid: int) -> dict:
        return self.ask({"remove": raylet_pid})

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"stop": True}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(60)
            except (OSError, subprocess.TimeoutExpired):
                stop_proc(self.proc)
        cgroup = (getattr(self, "info", None) or {}).get("cgroup")
        for _ in range(20):  # empty once the cluster's last process is gone
            if not cgroup or not Path(cgroup).exists():
                break
            try:
                Path(cgroup).rmdir()
            except OSError:
                time.sleep(0.5)
        if not self._fh.closed:
            self._fh.close()


def cluster_main(argv: list[str]) -> int:
    """``python -m rollout.devtools.chaos cluster [--workers 2] [--cpus 1]``: start a Ray
    ``Cluster`` (a head without CPUs, ``--workers`` worker nodes with ``--cpus`` CPUs each), print
    ``{"address", "head_raylet_pid", "workers": [{"node_id", "raylet_pid"}]}`` as one JSON line,
    then obey JSON lines on stdin: ``{"remove": raylet_pid}`` removes that worker node (answering
    ``{"node_id", "s"}``, seconds), ``{"stop": true}`` or end of input shuts the cluster down."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m rollout.devtools.chaos cluster")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--cpus", type=float, default=1.0)
    p.add_argument("--memory-limit", type=int, default=0, help="bytes: a memory cgroup of its own (run under unshare -m)")
    p.add_argument("--victim-threshold", type=float, default=0.0, help="the last worker node's RAY_memory_usage_threshold")
    args = p.parse_args(argv)
    from ray.cluster_utils import Cluster

    from rollout.core.fate import set_parent_death_signal

    set_parent_death_signal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally: shut the cluster down
    extra = _enter_memory_cgroup(args.memory_limit) if args.memory_limit else {}
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    pressure: list[subprocess.Popen] = []
    try:
        nodes = []
        for i in range(args.workers):
            victim = args.victim_threshold and i == args.workers - 1
            if victim:  # the raylet reads its threshold from its environment when it starts
                os.environ["RAY_memory_usage_threshold"] = str(args.victim_threshold)
            nodes.append(cluster.add_node(num_cpus=args.cpus))
            os.environ.pop("RAY_memory_usage_threshold", None)
        cluster.wait_for_nodes()

        def raylet_pid(node) -> int:
            from ray._private import ray_constants

            return node.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process.pid

        by_pid = {raylet_pid(n): n for n in nodes}
        print(json.dumps({"address": cluster.address, "head_raylet_pid": raylet_pid(cluster.head_node),
                          "workers": [{"node_id": n.node_id, "raylet_pid": pid} for pid, n in by_pid.items()],
                          "victim_raylet_pid": raylet_pid(nodes[-1]) if args.victim_threshold else None, **extra}), flush=True)
        for line in sys.stdin:
            cmd = json.loads(line)
            if cmd.get("stop"):
                break
            print(json.dumps(_obey(cmd, cluster, by_pid, pressure)), flush=True)
    finally:
        for proc in pressure:
            proc.kill()
        cluster.shutdown()
    return 0


def _enter_memory_cgroup(limit: int) -> dict:
    """Move this process into a memory cgroup of its own limited to ``limit`` bytes and show that
    cgroup as ``/sys/fs/cgroup/memory`` in this (private) mount namespace, where every raylet reads
    it (:mod:`rollout.devtools.chaos.memory`); returns ``{"cgroup": its folder outside}``."""
    from rollout.devtools.chaos.memory import MEMORY_ROOT, make_cgroup

    folder = make_cgroup(limit)
    (folder / "cgroup.procs").write_text(str(os.getpid()))
    subprocess.run(["mount", "--bind", str(folder), str(MEMORY_ROOT)], check=True)
    return {"cgroup": str(folder)}


def _obey(cmd: dict, cluster, by_pid: dict, pressure: list) -> dict:
    """One command: ``remove`` a worker node (its raylet pid), report the cgroup's ``usage``, start
    ``pressure`` (bytes held by a process in the cgroup), ``release`` it, list the ``oom_kills``
    the raylets logged."""
    from rollout.devtools.chaos import memory

    if "remove" in cmd:
        node = by_pid.pop(int(cmd["remove"]))
        t0 = time.monotonic()
        cluster.remove_node(node, allow_graceful=False)
        return {"node_id": node.node_id, "s": round(time.monotonic() - t0, 2)}
    if "pressure" in cmd:
        pressure.append(memory.start_pressure(int(cmd["pressure"])))
    if cmd.get("release"):
        for proc in pressure:
            proc.kill()
            proc.wait(10)
        pressure.clear()
    if cmd.get("oom_kills"):
        return memory.oom_kills(Path(cluster.head_node.get_logs_dir_path()))
    used, limit = memory.usage()
    return {"used": used, "limit": limit, "pressure_pids": [p.pid for p in pressure]}
