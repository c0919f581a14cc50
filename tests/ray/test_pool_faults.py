"""Every way an episode can end is delivered once, through the trainer API: actors lost for good,
no healthy actor at all, an interrupt, and a journaled run resumed by a new pool."""

from __future__ import annotations

import collections
import time

import pytest
from support.raypool import pool_config as _cfg
from support.raypool import wait_until as _wait

from rollout.core.records import EpisodeStatus

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def _running(pool) -> int:
    return sum(i["running"] for i in pool.worker_infos())


def _pump(pool, got: list, cond, what: str, timeout_s: float = 120.0) -> None:
    """Let the pool's scheduler run (it dispatches, notices dead actors and re-queues only while
    a stream is read) until ``cond()``, keeping any result delivered meanwhile in ``got``."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        try:
            got.extend(pool.results(timeout_s=0.5))
        except TimeoutError:
            pass


def _actor_running(pool, i: int) -> int:
    import ray

    return ray.get(pool.actors[i].info.remote(), timeout=60)["running"]


def test_a_killed_actor_s_episodes_are_retried_and_typed_actor_lost_once_retries_are_spent(ray_cluster, retail_stack, retail):
    """Two actors, both generation gates closed (so every episode is held at its first /generate
    call, and nothing can finish before a kill): actor 0 dies for good, its two episodes are re-run
    (attempt 1) on actor 1 and held there too; then actor 1 dies and Ray restarts it. Its own two
    episodes (attempt 0) are re-run on the restarted actor (its gate is open) and complete; actor
    0's two, out of retries (``pool.max_episode_retries=1``), are delivered ``actor_lost``. Every
    episode is delivered exactly once."""
    import ray

    from rollout.core.pool import RolloutPool

    pool = RolloutPool(_cfg(retail_stack.router_url, "pool.max_episode_retries=1", "pool.no_actor_timeout_s=600", num_actors=2)).start()
    got: list = []
    try:
        ray.get([a.pause_generation.remote() for a in pool.actors], timeout=60)
        specs = pool.submit_tasks(retail.task_ids("base")[:4])
        _wait(lambda: [_actor_running(pool, 0), _actor_running(pool, 1)] == [2, 2], "two episodes held on each actor")
        first, second = set(pool.episodes_in_flight(0)), set(pool.episodes_in_flight(1))
        assert len(first) == len(second) == 2 and not got
        ray.kill(pool.actors[0], no_restart=True)  # gone for good
        _pump(pool, got, lambda: set(pool.episodes_in_flight(1)) == first | second and _actor_running(pool, 1) == 4,
              "actor 0's episodes re-run and held on actor 1")
        assert not got, "nothing can end while every gate is closed"
        ray.kill(pool.actors[1], no_restart=False)  # Ray restarts it, with its gate open
        got.extend(pool.results(timeout_s=300))
        stats = pool.stats()
    finally:
        pool.shutdown()
    counts = collections.Counter(r.spec.episode_id for r in got)
    assert sorted(counts) == sorted(s.episode_id for s in specs) and set(counts.values()) == {1}, "each episode delivered once"
    by_id = {r.spec.episode_id: r for r in got}
    lost = [by_id[e] for e in sorted(first)]
    assert all(r.status is EpisodeStatus.ACTOR_LOST and r.spec.attempt == 1 for r in lost), [(r.status, r.spec.attempt) for r in lost]
    assert all(r.metadata["termination_reason"] == "actor_lost" and "actor lost" in r.metadata["error"] for r in lost)
    retried = [by_id[e] for e in sorted(second)]
    assert all(r.status is EpisodeStatus.COMPLETED and r.reward == 1.0 and r.spec.attempt == 1 for r in retried), \
        [(r.status, r.spec.attempt) for r in retried]
    assert stats["episode_retries"] == 4 and stats["status_actor_lost"] == 2 and stats["status_completed"] == 2
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
