"""The Ray pool on a shared local cluster, against the gold-replay stack."""

from __future__ import annotations

import pytest
from support.raypool import pool_config

from rollout.core.records import Batch, EpisodeStatus

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def _cfg(router_url: str, *overrides: str):
    return pool_config(router_url, *overrides, num_actors=2)


def test_pool_streams_complete_groups_exactly_once(ray_cluster, retail_stack, retail):
    from rollout.core.pool import RolloutPool
    from rollout.core.pool.actors import head_lost

    ids = retail.task_ids("base")[:4]
    with RolloutPool(_cfg(retail_stack.router_url, "rollout.n_samples_per_task=3")) as pool:
        specs = pool.submit_tasks(ids)
        assert len(specs) == 12 and pool.num_outstanding == 12
        groups = list(pool.groups())
        assert pool.num_outstanding == 0
        # each actor left its loaded database, tasks and tokenizer out of the collector's scans,
        # and runs with the configured GIL switch interval (pool.gil_switch_interval_ms = 1)
        for info in pool.worker_infos():
            tuning = info["process_tuning"]
            assert tuning["frozen"] > 50_000 and tuning["switch_interval_s"] == pytest.approx(0.001), tuning
        # and their coroutines run on uvloop (pool.event_loop's default), as each actor reports it
        assert [lag["event_loop"] for lag in pool.loop_lags()] == ["uvloop", "uvloop"]
        # the head answers, so python -m rollout would end the normal way (rollout.app.cli.exit_process)
        assert head_lost() is False
        # the driver and each actor record metrics (pool.metrics's default)
        assert pool.recorder.enabled and [info["metrics"] for info in pool.worker_infos()] == [True, True]
        # the same tasks can be submitted again: new group ids
        again = pool.submit_tasks(ids[:1], n_samples_per_task=1)
        (res,) = list(pool.results())
        assert res.spec.group_id == again[0].group_id != specs[0].group_id
    assert len(groups) == 4
    for g in groups:
        assert [s.sample_index for s in g] == [0, 1, 2]
        assert len({s.group_id for s in g}) == 1
        assert all(s.status == "completed" and s.reward == 1.0 for s in g)
    ids_seen = [s.metadata["episode_id"] for g in groups for s in g]
    assert sorted(ids_seen) == sorted(s.episode_id for s in specs)
    # the trainer API's samples name their episode and its turns at the top level (trajectory: every turn)
    assert all(s.episode_id == s.metadata["episode_id"] and s.turn_indices == list(range(s.metadata["turns"])) for g in groups for s in g)
    assert all(s.to_dict()["turn_indices"] == s.turn_indices and s.metadata["turns"] > 0 for g in groups for s in g)
    batch = Batch.from_samples([s for g in groups for s in g])
    assert batch.tokens.shape[0] == 12 and float(batch.rewards.mean()) == 1.0
    assert int(batch.loss_mask.sum()) == sum(sum(s.loss_mask) for g in groups for s in g)


def test_a_task_the_domain_lacks_is_refused_by_submit_tasks_and_nothing_is_queued(ray_cluster, retail_stack):
    """A trainer that starts the pool itself and submits an id the domain lacks gets one line with
    the valid ids (before: the episode ran and crashed on the actor, delivered as env_error, as a
    spec given to submit() still is).
    open_pool and the CLI refuse env.task_ids before anything starts: tests/e2e/test_bad_sources.py."""
    from rollout.core.config import TaskSelectionError
    from rollout.core.pool import RolloutPool

    with RolloutPool(_cfg(retail_stack.router_url, "pool.num_actors=1")) as pool:
        with pytest.raises(TaskSelectionError, match=r"^RolloutPool.submit_tasks: 99999 is not a task of tau2 domain retail, "
                                                     r"whose 114 task ids are 0 to 113$"):
            pool.submit_tasks(["0", "99999"])
        assert pool.num_outstanding == 0 and pool.submitted_ids == frozenset()  # not even task 0's episodes
        (spec,) = pool.submit_tasks(["3"], n_samples_per_task=1)
        (res,) = list(pool.results())
        assert res.spec.episode_id == spec.episode_id and res.status == EpisodeStatus.COMPLETED


def test_pool_event_loop_asyncio_gives_the_actors_asyncio_s_own_loop(ray_cluster, retail_stack, retail):
    from rollout.core.pool import RolloutPool

    ids = retail.task_ids("base")[:2]
    with RolloutPool(_cfg(retail_stack.router_url, "pool.event_loop=asyncio", "rollout.n_samples_per_task=1")) as pool:
        assert [lag["event_loop"] for lag in pool.loop_lags()] == ["asyncio", "asyncio"]
        pool.submit_tasks(ids)
        results = list(pool.results())
    assert [r.status for r in results] == [EpisodeStatus.COMPLETED] * 2
    assert all(r.reward == 1.0 for r in results)


def test_pool_metrics_false_records_nothing_on_the_driver_or_the_actors(ray_cluster, retail_stack, retail):
    from rollout.core.pool import RolloutPool
    from rollout.core.telemetry.recorder import NULL_RECORDER

    ids = retail.task_ids("base")[:2]
    with RolloutPool(_cfg(retail_stack.router_url, "pool.metrics=false", "rollout.n_samples_per_task=1")) as pool:
        assert pool.recorder is NULL_RECORDER
        assert [info["metrics"] for info in pool.worker_infos()] == [False, False]
        pool.submit_tasks(ids)
        results = list(pool.results())
        assert pool.stats()["episodes_delivered"] == 2  # the pool's own counters do not depend on the metrics
    assert [r.status for r in results] == [EpisodeStatus.COMPLETED] * 2 and all(r.reward == 1.0 for r in results)


def test_actors_on_another_loop_than_configured_fail_the_start_naming_the_key(ray_cluster, retail_stack, monkeypatch):
    """An actor whose node cannot give it uvloop gets asyncio from Ray; with pool.event_loop=uvloop
    the start fails, naming the key and the actors' pids, and stops those actors."""
    import re
    import time

    import psutil

    import rollout.core.pool.pool as pool_mod
    from rollout.core.pool import RolloutPool

    # what a node without uvloop amounts to: Ray builds the actors' loop with asyncio
    monkeypatch.setattr(pool_mod, "ray_env_vars", lambda kind: {"RAY_USE_UVLOOP": "0"})
    pool = RolloutPool(_cfg(retail_stack.router_url))
    with pytest.raises(RuntimeError, match=r"pool.event_loop=uvloop, but rollout actors .* run another loop") as err:
        pool.start()
    assert "pool.event_loop=asyncio" in str(err.value)  # the way out
    pids = [int(p) for p in re.findall(r"\((\d+), 'asyncio'\)", str(err.value))]
    assert len(pids) == 2 and pool.actors == []

    deadline = time.monotonic() + 30
    while any(map(psutil.pid_exists, pids)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(map(psutil.pid_exists, pids)), "the actors of a refused start must be stopped"
