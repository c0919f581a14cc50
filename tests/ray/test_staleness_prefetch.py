"""Staleness and in-flight prefetch through the real pool against servers that report weight
versions: a gold-replay server of this module's own (its version moves with each update) behind
the real sglang-router, and a fault proxy in front that holds chosen calls."""

from __future__ import annotations

import collections
import threading

import pytest
from support.fault_proxy import FaultProxy
from support.raypool import pool_config
from support.raypool import wait_until as _wait

pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.fixture(scope="module")
def versioned_stack(tmp_path_factory):
    """One gold-replay server for retail at weight version "0" behind the real sglang-router, for
    this module alone (its tests move the version)."""
    from rollout.core.config import LocalConfig
    from rollout.devtools.local.stack import LocalStack

    stack = LocalStack(LocalConfig(enabled=True, backend="gold_replay", weight_version="0"), "retail", "builtin:qwen3",
                       log_dir=tmp_path_factory.mktemp("stack-versioned"))
    stack.start()
    yield stack
    stack.stop()


class _HoldSecondCall:
    """A fault-proxy rule: once :attr:`armed`, every episode's second /generate call is held until
    :attr:`release` is set (its first call was answered: the episode is mid-run)."""

    def __init__(self) -> None:
        self.calls: collections.Counter[str] = collections.Counter()
        self.armed = threading.Event()
        self.release = threading.Event()
        self.held: set[str] = set()

    def __call__(self, key: str, body: dict):
        self.calls[key] += 1
        if self.armed.is_set() and not self.release.is_set() and self.calls[key] == 2:
            self.held.add(key)
            return ("hold", self.release)
        return None


def _poll_until(pool, cond, what: str) -> None:
    _wait(lambda: pool.poll(0.5) >= 0 and cond(), what, timeout_s=300)


def test_in_flight_prefetch_runs_across_an_update_and_staleness_drops_what_lags(ray_cluster, versioned_stack, retail, tokenizer, tmp_path):
    """``rollout.max_staleness=1``. Group A is prefetched (in flight) and completes at version 0;
    the trainer updates to 1 and prefetches two more groups, B and C, whose episodes make their
    first call at version 1 and are held at their second; the trainer updates to 2 with them in
    flight, then they go on. At hand-over (version 2) A lags by 2: both members are excluded
    ``stale`` and re-run (at version 2); B and C started at 1 and lag by 1: kept, each episode's
    calls on version 1, then 2. Every episode is delivered once."""
    from rollout.core.pool import RolloutPool

    rule = _HoldSecondCall()
    tasks = iter(retail.task_ids("base")[:6])
    with FaultProxy(versioned_stack.router_url, tokenizer, rule) as proxy:
        cfg = pool_config(proxy.url, "rollout.n_samples_per_task=2", "rollout.max_staleness=1", num_actors=1, max_concurrent_episodes=4)
        pool = RolloutPool(cfg).start()
        try:
            assert pool.weight_version == 0
            assert pool.prefetch(1, tasks, in_flight=True) == 1  # A: one group kept running
            _poll_until(pool, lambda: pool.stats()["episodes_delivered"] == 2, "group A complete")
            assert pool.prefetch(1, tasks, in_flight=True) == 0  # a complete group waits: nothing more in flight
            pool.update_weights_from_disk(str(tmp_path), weight_version=1)

            rule.armed.set()
            assert pool.prefetch(2, tasks, in_flight=True) == 2  # B, C: fewer than 2 complete groups wait
            _wait(lambda: proxy.holding == 4, "B's and C's episodes held at their second call", timeout_s=300)
            pool.update_weights_from_disk(str(tmp_path), weight_version=2)
            calls_out = pool.last_pause.generate_calls_out
            rule.release.set()

            groups = pool.collect_groups(3, None, abort_surplus=False, timeout_s=300)
            excluded = list(pool.excluded())
            stats = pool.stats()
        finally:
            rule.release.set()
            pool.cancel_outstanding()
            pool.shutdown()
    assert calls_out == 4, "the update paused with B's and C's calls under way"
    assert len(groups) == 3 and pool.weight_version == 2
    by_task = {g[0].metadata["task_id"]: g for g in groups}
    a_task, b_task, c_task = (str(t) for t in retail.task_ids("base")[:3])
    assert set(by_task) == {a_task, b_task, c_task}

    # A, complete at version 0, handed over at 2: stale, both members excluded and re-run at 2
    assert sorted(e.reason for e in excluded) == ["stale", "stale"]
    assert all(e.sample.metadata["task_id"] == a_task and set(e.sample.weight_versions) == {"0"} for e in excluded)
    assert all(e.sample.metadata["staleness"] == 2 for e in excluded)
    reruns = by_task[a_task]
    assert sorted(s.episode_id for s in reruns) == sorted(e.sample.episode_id + "~r1" for e in excluded)
    assert all(set(s.weight_versions) == {"2"} for s in reruns)

    # B and C, prefetched in flight at 1 and held across the update to 2: kept, calls on 1 then 2
    for t in (b_task, c_task):
        for s in by_task[t]:
            assert s.status == "completed" and s.reward == 1.0
            assert s.weight_versions[0] == "1" and s.weight_versions[1:] and set(s.weight_versions[1:]) == {"2"}, s.weight_versions
    assert rule.held == {s.episode_id for t in (b_task, c_task) for s in by_task[t]}

    delivered = [s.episode_id for g in groups for s in g] + [e.sample.episode_id for e in excluded]
    assert len(delivered) == len(set(delivered)) == 8, "each episode delivered once"
    assert stats["excluded_stale"] == 2 and stats["weight_updates"] == 2
