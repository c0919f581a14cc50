"""Two local servers behind a real router (``manual``, ``min_group``: each episode's calls stay on one
worker), the second behind a :class:`~rollout.devtools.chaos.proxies.WorkerProxy`, through the
trainer API: a weight update that the second worker fails (a half-done cycle) is rolled forward or
back and the pool says which; a straggler worker (every call it serves waits far longer) is
over-sampled around by ``collect_groups``, and an episode stuck on it ends ``timeout`` at
``pool.episode_timeout_s``. The settling itself, without Ray: tests/component/test_weight_half_done.py."""

from __future__ import annotations

import collections
import json
import time
import urllib.request

import pytest
from support.proxied_router import proxied_router
from support.raypool import pool_config
from support.raypool import wait_until as _wait

from rollout.core.records import EpisodeStatus
from rollout.devtools.chaos.proxies import WorkerProxy

pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.fixture
def behind_proxy(two_servers, tmp_path):
    """``(router URL, the second worker's proxy)``; the servers are set back to version 0 after."""
    proxy = WorkerProxy(two_servers.worker_urls[1]).start()
    try:
        with proxied_router([two_servers.worker_urls[0], proxy.url], tmp_path / "router.log") as router:
            yield router, proxy
    finally:
        proxy.stop()
        for u in two_servers.worker_urls:
            req = urllib.request.Request(u + "/update_weights_from_disk", json.dumps({"model_path": "reset", "weight_version": "0"}).encode(),
                                         {"Content-Type": "application/json"})
            urllib.request.urlopen(req, timeout=10).read()


def _cfg(router_url: str, *overrides: str):
    return pool_config(router_url, *overrides, max_concurrent_episodes=8)


def test_a_half_done_update_is_rolled_forward_and_no_episode_meets_two_versions(ray_cluster, behind_proxy, retail):
    from rollout.core.pool import RolloutPool

    router, proxy = behind_proxy
    pool = RolloutPool(_cfg(router)).start()
    try:
        specs = pool.submit_tasks(retail.task_ids("base")[:8])
        _wait(lambda: sum(i["running"] for i in pool.worker_infos()) >= 4, "episodes running")
        proxy.fail_updates(1)
        answers = pool.update_weights_from_disk("/ckpt/v1", 1)
        report = pool.last_weight_update
        results = list(pool.results(timeout_s=300))
        stats = pool.stats()
    finally:
        pool.shutdown()
    assert report.outcome == "rolled_forward" and list(report.failed) == [proxy.url] and report.retried == [proxy.url]
    assert set(report.serving.values()) == {"1"} and sorted(answers) == sorted(report.workers)
    assert stats["weight_updates"] == 1 and stats["weight_updates_rolled_forward"] == 1 and pool.weight_version == 1
    assert sorted(r.spec.episode_id for r in results) == sorted(s.episode_id for s in specs)
    for r in results:  # a call after the update never met the old version
        versions = [int(v) for v in r.trajectory.weight_versions]
        assert versions == sorted(versions), r.trajectory.weight_versions


def test_an_update_one_worker_keeps_failing_is_rolled_back_and_generation_stays_paused(ray_cluster, behind_proxy, retail, two_servers):
    from rollout.core.pool import RolloutPool
    from rollout.core.pool.weight_repair import HalfDoneUpdateError

    router, proxy = behind_proxy
    pool = RolloutPool(_cfg(router, "pool.weight_update_retries=1")).start()
    try:
        specs = pool.submit_tasks(retail.task_ids("base")[:4])
        proxy.fail_updates(5)
        with pytest.raises(HalfDoneUpdateError) as e:
            pool.update_weights_from_disk("/ckpt/v1", 1)
        report = e.value.report
        assert report.outcome == "rolled_back" and report.rolled_back == [two_servers.worker_urls[0]] and report.retried == [proxy.url]
        assert pool.last_weight_update is report and pool.stats()["weight_updates_rolled_back"] == 1
        assert pool.paused == "abort" and pool.weight_version == 0 and set(report.serving.values()) == {"0"}
        pool.resume()  # knowingly: every worker serves version 0
        results = list(pool.results(timeout_s=300))
    finally:
        pool.shutdown()
    assert sorted(r.spec.episode_id for r in results) == sorted(s.episode_id for s in specs)
    assert all(set(r.trajectory.weight_versions) == {"0"} for r in results)


def test_a_step_over_samples_around_a_straggler_worker(ray_cluster, behind_proxy, retail):
    import itertools

    from rollout.core.pool import RolloutPool

    router, proxy = behind_proxy
    proxy.slow_down(120.0)  # every call the second worker serves waits two minutes
    pool = RolloutPool(_cfg(router)).start()
    try:
        t0 = time.monotonic()
        groups = pool.collect_groups(2, itertools.cycle(retail.task_ids("base")), max_outstanding_groups=8)
        took = time.monotonic() - t0
        excluded = list(pool.excluded())
    finally:
        pool.shutdown()
    # it did not wait for the straggler's episodes: any of them would have taken the 120 s delay
    assert len(groups) == 2 and took < 120, f"the step took {took:.0f} s"
    assert proxy.counts["generate_delayed"] >= 1  # the straggler did get episodes: they were the surplus
    statuses = collections.Counter(ex.sample.status for ex in excluded)
    assert statuses.get("cancelled", 0) >= 1 and set(statuses) <= {"cancelled", "completed"}


def test_an_episode_stuck_on_a_straggler_ends_timeout_at_the_episode_timeout(ray_cluster, two_servers, retail, tmp_path):
    from rollout.core.pool import RolloutPool

    proxy = WorkerProxy(two_servers.worker_urls[1]).start()
    try:
        proxy.slow_down(120.0)
        with proxied_router([proxy.url], tmp_path / "router.log") as router:  # the straggler alone: nothing to sample around
            pool = RolloutPool(_cfg(router, "pool.episode_timeout_s=4")).start()
            try:
                specs = pool.submit_tasks(retail.task_ids("base")[:2])
                results = list(pool.results(timeout_s=120))
            finally:
                pool.shutdown()
    finally:
        proxy.stop()
    assert sorted(r.spec.episode_id for r in results) == sorted(s.episode_id for s in specs)
    # ended by pool.episode_timeout_s (4 s): the straggler's 120 s delay would have let them complete
    assert {r.status for r in results} == {EpisodeStatus.TIMEOUT}
    assert all(r.metadata["termination_reason"] == "episode_timeout" for r in results), [r.metadata for r in results]
