"""The local server's prefix-cache model (rollout.devtools.local.radix) against hand-computed hits."""

import pytest

from rollout.devtools.local.radix import RadixCache


def seq(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def test_two_prompts_sharing_a_100_token_prefix():
    cache = RadixCache(capacity=None)
    prefix = seq(0, 100)
    a, b = prefix + seq(1000, 50), prefix + seq(2000, 30)
    assert cache.match(a) == 0  # empty cache
    assert cache.insert(a) == 150
    assert cache.match(b) == 100  # the shared prefix, not b's own tail
    assert cache.insert(b) == 30  # only the new tail is added
    assert cache.size == 180
    assert cache.match(b) == 130 and cache.match(a) == 150
    assert cache.match(prefix + [1000, 1001, 7]) == 102  # diverges inside a's tail
    assert cache.match([5] + prefix) == 0


def test_multi_turn_finds_its_own_prefix():
    cache = RadixCache(capacity=None)
    turn1 = seq(0, 300)
    cache.insert(turn1 + seq(5000, 40))  # prompt + output, inserted when the turn ends
    turn2 = turn1 + seq(5000, 40) + seq(7000, 60)  # next prompt re-sends the whole context
    assert cache.match(turn2) == 340


def test_capacity_forces_eviction_of_the_least_recently_used_leaf():
    cache = RadixCache(capacity=250)
    shared = seq(0, 100)
    a, b, c = shared + seq(1000, 60), shared + seq(2000, 60), shared + seq(3000, 60)
    cache.insert(a)
    cache.insert(b)
    assert cache.size == 220
    cache.match(a)  # a is now more recent than b
    cache.insert(c)  # 280 > 250: evict the LRU leaf, b's tail (60) -> 220
    assert cache.size == 220 and cache.evicted == 60
    assert cache.match(b) == 100  # the shared prefix survived
    assert cache.match(a) == 160 and cache.match(c) == 160


def test_lru_order_evicts_oldest_first_and_parents_after_their_leaves():
    cache = RadixCache(capacity=1000)
    x, y = seq(0, 200), seq(10_000, 200)
    cache.insert(x)
    cache.insert(y)
    cache.insert(x + seq(500, 100))  # a child under x's leaf
    assert cache.size == 500
    assert cache.evict_to(300) == 200  # y is the oldest leaf
    assert cache.match(y) == 0 and cache.match(x + seq(500, 100)) == 300
    # the leaf x+tail goes first, then x itself once it has become a leaf
    assert cache.evict_to(150) == 300
    assert cache.size == 0 and cache.match(x) == 0


def test_split_edge_keeps_both_branches():
    cache = RadixCache(capacity=None)
    cache.insert(seq(0, 10))
    cache.insert(seq(0, 4) + [99, 98])
    assert cache.size == 12
    assert cache.match(seq(0, 10)) == 10
    assert cache.match(seq(0, 4) + [99, 98, 97]) == 6
    assert cache.num_leaves() == 2


def test_sequence_longer_than_capacity_is_not_kept_and_zero_capacity_caches_nothing():
    cache = RadixCache(capacity=50)
    cache.insert(seq(0, 80))
    assert cache.size == 0 and cache.match(seq(0, 80)) == 0
    off = RadixCache(capacity=0)
    assert off.insert(seq(0, 10)) == 0 and off.match(seq(0, 10)) == 0
    with pytest.raises(ValueError):
        RadixCache(capacity=-1)


def test_clear():
    cache = RadixCache(capacity=None)
    cache.insert(seq(0, 10))
    cache.clear()
    assert cache.size == 0 and cache.match(seq(0, 10)) == 0
