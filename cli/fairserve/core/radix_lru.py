"""The LRU index of a radix tree's evictable leaves, kept between evictions.

Scanning the whole tree for leaves at every eviction made eviction O(tree): with a cache
of tens of thousands of prefixes and an eviction at nearly every admission under memory
pressure, that scan dominated a simulated hour. The index is a lazy heap instead: an entry
is pushed whenever a node may have become an eviction candidate (a leaf was inserted or
touched, a lock was released, a node lost its last child), and validated when popped, so
stale entries cost nothing but their slot. It starts with the first eviction, so trees that
never evict (the dispatchers' global trees) pay nothing.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from typing import Protocol


class LruNode(Protocol):
    """What the index reads from a tree node."""

    last_access: int
    ref: int

    @property
    def children(self) -> Mapping[bytes, object]: ...

    @property
    def parent(self) -> object | None: ...


def evictable(node: LruNode) -> bool:
    """Attached, unreferenced and without children: what LRU eviction may take."""
    return node.parent is not None and node.ref == 0 and not node.children


class LruIndex:
    """A lazy min-heap of ``(last_access, id, node)`` over a tree's candidate leaves."""

    COMPACT_MIN_ENTRIES = 4096

    def __init__(self, nodes: Iterable[LruNode]) -> None:
        self._heap: list[tuple[int, int, LruNode]] = []
        self._compact_at = self.COMPACT_MIN_ENTRIES
        self.rebuild(nodes)

    def rebuild(self, nodes: Iterable[LruNode]) -> None:
        """Start over from the tree's current nodes (drops every stale entry)."""
        self._heap = [(n.last_access, id(n), n) for n in nodes if evictable(n)]
        heapq.heapify(self._heap)
        self._compact_at = max(self.COMPACT_MIN_ENTRIES, 4 * len(self._heap))

    def push(self, node: LruNode) -> None:
        """``node`` may be a candidate now (checked again when popped)."""
        if node.ref == 0 and not node.children and node.parent is not None:  # evictable
            heapq.heappush(self._heap, (node.last_access, id(node), node))

    def pop(self) -> LruNode | None:
        """The least recently used candidate, or None when nothing can be evicted."""
        heap = self._heap
        while heap:
            access, _, node = heapq.heappop(heap)
            if access == node.last_access and evictable(node):
                return node
        return None

    def needs_compaction(self) -> bool:
        return len(self._heap) > self._compact_at
