"""How ``placement=gate`` splits the workers among the actors (:func:`rollout.core.policy.kvslots.my_workers`)."""

from __future__ import annotations

import pytest

from rollout.core.policy.kvslots import my_workers

URLS = [f"http://10.0.0.{i}:30000" for i in range(1, 9)]


@pytest.mark.parametrize("workers, actors", [(4, 2), (8, 2), (3, 2), (5, 3), (4, 4), (1, 1)])
def test_with_at_least_as_many_workers_as_actors_each_worker_has_one_actor_with_all_its_kv(workers, actors):
    urls = URLS[:workers]
    parts = [my_workers(list(reversed(urls)) if a % 2 else urls, a, actors) for a in range(actors)]  # any order: the same split
    seen = [u for p in parts for u in p]
    assert sorted(seen) == sorted(urls)  # every worker used, by exactly one actor
    assert all(share == 1.0 for p in parts for share in p.values())
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1


@pytest.mark.parametrize("workers, actors", [(2, 4), (2, 3), (1, 4), (3, 8)])
def test_with_fewer_workers_than_actors_each_actor_has_one_worker_whose_kv_its_sharers_split_equally(workers, actors):
    urls = URLS[:workers]
    parts = [my_workers(urls, a, actors) for a in range(actors)]
    assert all(len(p) == 1 for p in parts)
    for u in urls:
        shares = [p[u] for p in parts if u in p]
        assert shares and sum(shares) == pytest.approx(1.0) and len(set(shares)) == 1


def test_no_workers_means_no_part():
    assert my_workers([], 0, 2) == {}
