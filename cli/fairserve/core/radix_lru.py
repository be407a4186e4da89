"""The LRU index of a radix tree's evictable leaves, kept between evictions.

Scanning the whole tree for leaves at every eviction made eviction O(tree): with a cache
of tens of thousands of prefixes and an eviction at nearly every admission under memory
pressure, that scan dominated a simulated hour. The index is a lazy heap instead: an entry
is pushed whenever a node may have become an eviction candidate (a leaf was inserted or
touched, a lock was released, a node lost its last child), and validated when popped. It
starts with the first eviction, so trees that never evict (the dispatchers' global trees)
pay nothing.

A node has at most one entry (``in_lru``): a refresh of a node that has one pushes nothing,
and a popped entry older than its node's last access goes back in with the current one
(accesses only grow, so the heap's least valid entry is still the least recently used
candidate). Under overload every batching step probes and releases the same waiting
requests' paths; one entry per probe made the heap grow by millions of stale entries and
rebuild itself from a scan of the tree, a tenth of a simulated hour.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from typing import Protocol

from fairserve.core.radix_node import Node, Owner


class LruNode(Protocol):
    """What the index reads from a tree node."""

    last_access: int
    ref: int
    in_lru: bool

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
        heap = []
        for node in nodes:
            node.in_lru = evictable(node)
            if node.in_lru:
                heap.append((node.last_access, id(node), node))
        heapq.heapify(heap)
        self._heap = heap
        self._compact_at = max(self.COMPACT_MIN_ENTRIES, 4 * len(self._heap))

    def push(self, node: LruNode) -> None:
        """``node`` may be a candidate now (checked again when popped)."""
        if node.in_lru:
            return  # its entry is re-pushed with the current access when popped stale
        if node.ref == 0 and not node.children and node.parent is not None:  # evictable
            node.in_lru = True
            heapq.heappush(self._heap, (node.last_access, id(node), node))

    def pop(self) -> LruNode | None:
        """The least recently used candidate, or None when nothing can be evicted."""
        heap = self._heap
        while heap:
            access, _, node = heapq.heappop(heap)
            if not evictable(node):
                node.in_lru = False  # pushed again when it becomes a candidate
            elif access == node.last_access:
                node.in_lru = False
                return node
            else:  # refreshed since it was pushed: back in at its current access
                heapq.heappush(heap, (node.last_access, id(node), node))
        return None

    def needs_compaction(self) -> bool:
        return len(self._heap) > self._compact_at


class OwnerLruIndex:
    """A lazy min-heap of ``(last_access, id, node)`` over one owner's leaves in a global
    tree (the nodes the owner holds and none of whose children it holds).

    A dispatcher bounds each worker's share of its global tree every few records; scanning
    the worker's whole subtree for its leaves at each bound cost more than the rest of a
    routed request. Entries are pushed when a node may have become one of the owner's
    leaves (the owner recorded a key ending there, or a child of it lost the owner);
    last-access refreshes push nothing: a popped entry older than its node's last access
    goes back in with the current one (accesses only grow, so the heap's least valid entry
    is still the least recently used leaf). Past ``compact_at`` entries the heap is dropped
    (``stale``) and the next eviction rebuilds it from a walk of the owner's subtree.
    """

    COMPACT_MIN_ENTRIES = 4096

    __slots__ = ("_compact_at", "_heap", "owner", "stale")

    def __init__(self, owner: Owner, root: Node) -> None:
        self.owner = owner
        self._heap: list[tuple[int, int, Node]] = []
        self._compact_at = self.COMPACT_MIN_ENTRIES
        self.stale = False
        self.rebuild(root)

    def rebuild(self, root: Node) -> None:
        """Start over from the owner's current leaves below ``root`` (drops stale entries)."""
        owner = self.owner
        heap: list[tuple[int, int, Node]] = []
        stack = [c for c in root.children.values() if owner in c.owners]
        while stack:
            node = stack.pop()
            below = [c for c in node.children.values() if owner in c.owners]
            if below:
                stack.extend(below)
            else:
                heap.append((node.last_access, id(node), node))
        heapq.heapify(heap)
        self._heap = heap
        self._compact_at = max(self.COMPACT_MIN_ENTRIES, 4 * len(heap))
        self.stale = False

    def push(self, node: Node) -> None:
        """``node`` may be one of the owner's leaves now (checked again when popped)."""
        heap = self._heap
        if len(heap) >= self._compact_at:
            heap.clear()  # rebuilt by the next eviction
            self.stale = True
        if not self.stale:
            heapq.heappush(heap, (node.last_access, id(node), node))

    def pop(self) -> Node | None:
        """The owner's least recently used leaf, or None when it holds none."""
        heap, owner = self._heap, self.owner
        while heap:
            access, _, node = heapq.heappop(heap)
            if node.parent is None or owner not in node.owners:
                continue
            if any(owner in c.owners for c in node.children.values()):
                continue
            if access == node.last_access:
                return node
            heapq.heappush(heap, (node.last_access, id(node), node))
        return None
