"""Every way an episode can end is delivered once, through the trainer API: actors lost for good,
no healthy actor at all, an interrupt, and a journaled run resumed by a new pool."""

from __future__ import annotations

import collections

import pytest
from support.raypool import pool_config as _cfg
from support.raypool import wait_until as _wait

from rollout.core.records import EpisodeStatus

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def _running(pool) -> int:
    return sum(i["running"] for i in pool.worker_infos())


@pytest.mark.extended  # CI's budget: tests/ray/test_pool.py covers the actor-death retry path in CI; this adds the typing
def test_an_actor_that_keeps_dying_types_its_episodes_actor_lost_once_each(ray_cluster, retail_stack, retail):
    import ray

    from rollout.core.pool import RolloutPool

    pool = RolloutPool(_cfg(retail_stack.router_url, "pool.max_episode_retries=0")).start()
    try:
        # the gate holds the episodes at their first /generate call, so some are running at the kill
        ray.get(pool.actors[0].pause_generation.remote(), timeout=30)
        specs = pool.submit_tasks(retail.task_ids("base")[:6])
        _wait(lambda: _running(pool) >= 2, "episodes running")
        ray.kill(pool.actors[0], no_restart=False)  # Ray restarts it; the attempts in flight are lost
        results = list(pool.results(timeout_s=300))
    finally:
        pool.shutdown()
    counts = collections.Counter(r.spec.episode_id for r in results)
    assert sorted(counts) == sorted(s.episode_id for s in specs) and set(counts.values()) == {1}
    lost = [r for r in results if r.status is EpisodeStatus.ACTOR_LOST]
    assert lost and all(r.metadata["termination_reason"] == "actor_lost" and "actor lost" in r.metadata["error"] for r in lost)
    assert all(r.status in (EpisodeStatus.ACTOR_LOST, EpisodeStatus.COMPLETED) for r in results)
    assert EpisodeStatus.ACTOR_LOST.is_infrastructure_failure


def test_no_healthy_actor_ends_the_stream_with_every_undelivered_episode(ray_cluster, retail_stack, retail):
    import ray

    from rollout.core.pool import NoHealthyActorError, RolloutPool

    pool = RolloutPool(_cfg(retail_stack.router_url, "pool.no_actor_timeout_s=3")).start()
    try:
        # held at the gate, episodes are still undelivered when the only actor dies
        ray.get(pool.actors[0].pause_generation.remote(), timeout=30)
        specs = pool.submit_tasks(retail.task_ids("base")[:6])
        _wait(lambda: _running(pool) >= 2, "episodes running")
        ray.kill(pool.actors[0], no_restart=True)  # gone for good
        delivered = []
        # the stream gives up on pool.no_actor_timeout_s (the message names it); a stream that
        # waited on would run into the test's own timeout
        with pytest.raises(NoHealthyActorError, match="no rollout actor was healthy for 3s") as e:
            for r in pool.results():
                delivered.append(r.spec.episode_id)
    finally:
        pool.shutdown()
    undelivered = [s.episode_id for s in e.value.undelivered]
    assert sorted(delivered + undelivered) == sorted(s.episode_id for s in specs), "each episode delivered or handed back, once"
    assert all(s.attempt == 0 for s in e.value.undelivered)
    assert pool.num_outstanding == 0


def test_interrupt_hands_back_what_is_in_flight_and_a_journaled_run_resumes_in_a_new_pool(ray_cluster, retail_stack, retail, tmp_path):
    """The trainer API's resume: pool A journals and is interrupted; pool B restores the journal,
    the groups complete, and every episode was delivered exactly once across both pools."""
    from rollout.core.journal import RunJournal
    from rollout.core.pool import RolloutPool, RunInterrupted

    cfg = _cfg(retail_stack.router_url, "rollout.n_samples_per_task=2", f"rollout.output_dir={tmp_path}")
    tasks = retail.task_ids("base")[:5]
    journal = RunJournal.open(tmp_path, cfg)
    pool = RolloutPool(cfg).start()
    first: list = []
    try:
        pool.attach_journal(journal)
        specs = pool.submit_tasks(tasks)
        with pytest.raises(RunInterrupted) as e:
            for g in pool.groups():
                first.append(g)
                pool.interrupt("test stop")
        assert pool.num_outstanding == 0
    finally:
        pool.shutdown()
        journal.close("interrupted", "test stop")
    assert first and e.value.undelivered
    handed_back = {s.episode_id for s in e.value.undelivered}
    assert handed_back.isdisjoint(journal.delivered)

    resumed = RunJournal.open(tmp_path, cfg, resume=True)
    assert set(resumed.delivered) == set(journal.delivered)
    pool = RolloutPool(cfg).start()
    try:
        pool.attach_journal(resumed)
        todo = pool.restore(resumed)
        assert {s.episode_id for s in todo} == handed_back
        groups = list(pool.groups(timeout_s=300))
    finally:
        pool.shutdown()
        resumed.close("finished")
    # the groups handed out before the interrupt come out again from the journal: the caller
    # (the CLI's RunWriter) skips what it already wrote
    ids = [s.episode_id for g in groups for s in g]
    assert sorted(ids) == sorted(s.episode_id for s in specs)
    assert all(len(g) == 2 and g[0].group_id == g[1].group_id for g in groups)
    journaled = [x for x in (tmp_path / "episodes.jsonl").read_text().splitlines() if x.strip()]
    assert len(journaled) == len(specs), "each episode ran to delivery once across the two pools"
