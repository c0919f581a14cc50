"""A driver that starts a new local Ray cluster as ``python -m rollout run`` does (the pool's own
``ray.init``, :func:`rollout.core.pool.actors._init_ray` with ``pool.ray_address=local``), runs one
actor with a ``runtime_env`` of its own (so a worker and the runtime-env agent are up), waits until
the node's metrics export port listens (the last port the node's agents open), and prints one JSON
line: every listening TCP socket of this process and of the processes it started (the cluster's:
GCS, raylet, dashboard, agents, workers), as ``[pid, process name, address, port]``. Then it
stops that cluster (``ray.shutdown``)."""

from __future__ import annotations

import json
import time

import psutil
import ray

from rollout.core.pool.actors import _init_ray


@ray.remote(num_cpus=0)
class Probe:
    def pid(self) -> int:
        import os

        return os.getpid()


def listening() -> list[list]:
    me = psutil.Process()
    out = []
    for p in [me, *me.children(recursive=True)]:
        try:
            conns = p.net_connections(kind="tcp")
            name = p.name()
        except psutil.Error:  # a process that ended meanwhile
            continue
        out += [[p.pid, name, c.laddr.ip, c.laddr.port] for c in conns if c.status == psutil.CONN_LISTEN]
    return out


def main() -> None:
    _init_ray("local")
    probe = Probe.options(runtime_env={"env_vars": {"LOCAL_CLUSTER_PORTS": "1"}}).remote()
    ray.get(probe.pid.remote(), timeout=300)
    export_port = ray._private.worker._global_node.metrics_export_port
    deadline = time.monotonic() + 120
    while not any(port == export_port for *_, port in listening()):
        assert time.monotonic() < deadline, f"the metrics export port {export_port} never listened"
        time.sleep(0.2)
    print(json.dumps({"metrics_export_port": export_port, "listening": listening()}), flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
