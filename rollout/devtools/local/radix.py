"""A prefix cache over token ids with a capacity in tokens and LRU eviction of leaves: the model
of SGLang's radix cache that the local server's KV layer (:mod:`rollout.devtools.local.kvmodel`)
uses. Pure Python, no I/O, no threads (the caller serialises access).

The idea is SGLang's ``RadixCache`` (``python/sglang/srt/mem_cache/radix_cache.py``): a radix tree
whose edges are runs of token ids; ``match`` finds the longest cached prefix of a prompt,
``insert`` adds a sequence (sharing what is already there), and when the cache is over its
capacity the least recently used *leaf* is evicted whole, then the next, so a prefix shared by
many sequences (a system prompt) outlives the sequences that extend it. Matching and inserting
mark every node on the path as used now.

What it leaves out of SGLang's: lock references (SGLang never evicts a node that a running
request uses; here the capacity is a separate budget from the running requests' KV, see
:mod:`rollout.devtools.local.kvmodel`), page sizes above 1, host / storage tiers. Time is a
counter that advances on every ``match`` / ``insert``, so LRU order is deterministic.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

__all__ = ["RadixCache"]


class _Node:
    __slots__ = ("children", "key", "last_used", "parent")

    def __init__(self, key: list[int], parent: _Node | None, last_used: int) -> None:
        self.key = key  # the token ids on the edge from the parent to this node
        self.parent = parent
        self.children: dict[int, _Node] = {}  # by the first token of the child's key
        self.last_used = last_used


def _common(key: list[int], ids: Sequence[int], start: int) -> int:
    """Length of the common prefix of ``key`` and ``ids[start:]``."""
    n = min(len(key), len(ids) - start)
    if key[:n] == list(ids[start:start + n]):
        return n
    i = 0
    while i < n and key[i] == ids[start + i]:
        i += 1
    return i


class RadixCache:
    """Cached token-id prefixes, at most ``capacity`` tokens, evicted leaf by leaf in LRU order.

    Args:
        capacity: the most tokens held (edges' lengths summed). 0 caches nothing (every match is
            0); None is unbounded.

    Raises:
        ValueError: a negative capacity.
    """

    def __init__(self, capacity: int | None) -> None:
        if capacity is not None and capacity < 0:
            raise ValueError(f"capacity must be >= 0 tokens or None, got {capacity}")
        self.capacity = capacity
        self.root = _Node([], None, 0)
        self.size = 0  # tokens held
        self.evicted = 0  # tokens evicted since start
        self._clock = 0

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def match(self, ids: Sequence[int]) -> int:
        """The number of leading tokens of ``ids`` found in the cache (0..len(ids)); marks the
        matched path as used now. Nothing is inserted."""
        now = self._tick()
        node, i = self.root, 0
        while i < len(ids):
            child = node.children.get(ids[i])
            if child is None:
                break
            n = _common(child.key, ids, i)
            child.last_used = now
            i += n
            if n < len(child.key):
                break
            node = child
        return i

    def insert(self, ids: Sequence[int]) -> int:
        """Cache ``ids`` (sharing the prefix already cached), mark its path as used now, then
        evict down to the capacity; returns the number of tokens newly added (before eviction)."""
        if self.capacity == 0 or not ids:
            return 0
        now = self._tick()
        node, i = self.root, 0
        while i < len(ids):
            child = node.children.get(ids[i])
            if child is None:
                leaf = _Node(list(ids[i:]), node, now)
                node.children[ids[i]] = leaf
                added = len(ids) - i
                self.size += added
                self.evict_to(self.capacity)
                return added
            n = _common(child.key, ids, i)
            if n < len(child.key):  # split the edge: child becomes mid -> child
                mid = _Node(child.key[:n], node, now)
                child.key = child.key[n:]
                child.parent = mid
                mid.children[child.key[0]] = child
                node.children[ids[i]] = mid
                child = mid
            child.last_used = now
            i += n
            node = child
        return 0

    def evict_to(self, capacity: int | None) -> int:
        """Evict least-recently-used leaves, whole, until at most ``capacity`` tokens remain
        (None: nothing); returns the tokens evicted."""
        if capacity is None or self.size <= capacity:
            return 0
        heap = [(leaf.last_used, id(leaf), leaf) for leaf in self._leaves()]
        heapq.heapify(heap)
        freed = 0
        while self.size > capacity and heap:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            assert parent is not None
            del parent.children[leaf.key[0]]
            self.size -= len(leaf.key)
            freed += len(leaf.key)
            if parent is not self.root and not parent.children:
                heapq.heappush(heap, (parent.last_used, id(parent), parent))
        self.evicted += freed
        return freed

    def clear(self) -> None:
        """Drop everything (SGLang's ``/flush_cache``)."""
        self.root = _Node([], None, 0)
        self.size = 0

    def _leaves(self) -> list[_Node]:
        out, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            else:
                out.append(node)
        return out

    def num_leaves(self) -> int:
        """How many leaves (cached sequences that no other extends) the tree has."""
        return len(self._leaves())
