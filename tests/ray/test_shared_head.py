"""The session's one Ray head (tests/support/shared_ray.py): every ask gets the same head, this
process's driver (``ray_cluster``) is on it, its actors run at niceness 0 as the suite's other
processes do (``RAY_worker_niceness``, tests/conftest.py), and a driver's job gives its own actors
what they need (``job_env``) without a cluster of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import shared_ray as head
from support.cli import cli_env

pytestmark = pytest.mark.ray
TESTS = Path(__file__).resolve().parents[1]

PROBE = """
import json, os, sys, ray
ray.init(address=sys.argv[1], log_to_driver=False)

@ray.remote(num_cpus=0)
class Probe:
    def where(self):
        import support.toy_plugins  # importable only where tests/ is on the actor's PYTHONPATH
        return {"nice": os.nice(0), "toy": support.toy_plugins.__file__, "uvloop": os.environ.get("RAY_USE_UVLOOP")}

# the actor's own env_vars, as the pool sets RAY_USE_UVLOOP, are merged into the job's
print(json.dumps(ray.get(Probe.options(runtime_env={"env_vars": {"RAY_USE_UVLOOP": "1"}}).remote().where.remote())))
"""


def test_one_head_for_the_session_and_this_driver_is_on_it(ray_cluster, shared_ray):
    assert head.address() == shared_ray  # a second ask: the same head
    assert ray_cluster.get_runtime_context().gcs_address.rsplit(":", 1)[1] == shared_ray.address.rsplit(":", 1)[1]

    @ray_cluster.remote(num_cpus=0)
    def niceness() -> int:
        return os.nice(0)

    assert ray_cluster.get(niceness.remote(), timeout=120) == 0  # Ray's default would be 15


@pytest.mark.slow
def test_a_jobs_runtime_env_reaches_its_actors_on_the_shared_head(shared_ray):
    env = head.job_env(cli_env(), {"env_vars": {"PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))}})
    proc = subprocess.run([sys.executable, "-c", PROBE, shared_ray.address], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["toy"] == str(TESTS / "support" / "toy_plugins.py") and got["uvloop"] == "1" and got["nice"] == 0, got
    # without it, the same actor cannot import the suite's module: the head's workers do not have tests/ on their path
    bare = subprocess.run([sys.executable, "-c", PROBE, shared_ray.address], env=cli_env(), capture_output=True, text=True, timeout=300)
    assert bare.returncode != 0 and "No module named 'support'" in bare.stderr, bare.stderr[-3000:]
