"""The radix tree's persistent LRU index evicts exactly what a full scan would.

``ScanningTree`` drops the index before every eviction, so it rebuilds it from a scan of
the whole tree (the original algorithm); both trees get the same random operations and
must return the same eviction events in the same order.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fairserve.core.radix import RadixTree
from fairserve.core.types import tokens_to_key


class ScanningTree(RadixTree):
    """Reference: every eviction starts from a fresh scan of the tree."""

    def evict(self, num_tokens: int) -> list[bytes]:
        self._lru = None
        return super().evict(num_tokens)


keys = st.lists(st.integers(0, 3), min_size=1, max_size=8).map(tokens_to_key)
ops = st.lists(
    st.tuples(
        st.sampled_from(["insert", "touch", "lock", "unlock", "evict", "probe", "probe_lock"]),
        keys,
        st.integers(1, 6),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(ops)
def test_indexed_eviction_matches_full_scan(operations: list[tuple[str, bytes, int]]) -> None:
    indexed, scanning = RadixTree(), ScanningTree()
    locked: list[bytes] = []
    for op, key, amount in operations:
        if op == "unlock":
            if locked:
                held = locked.pop(amount % len(locked))
                indexed.unlock(held)
                scanning.unlock(held)
            continue
        if op == "evict":
            assert indexed.evict(amount) == scanning.evict(amount)
        elif op == "lock":
            locked.append(key)
            assert indexed.lock(key) == scanning.lock(key)
        elif op == "probe":  # a refused admission: the probe, released
            for tree in (indexed, scanning):
                tree.release_probe(tree.probe_lock(key)[0])
        elif op == "probe_lock":  # an admitted one: the probe, then its lock
            locked.append(key)
            for tree in (indexed, scanning):
                node, matched, _fresh = tree.probe_lock(key)
                tree.lock_probed(key, node, matched)
        else:
            assert getattr(indexed, op)(key) == getattr(scanning, op)(key)
        assert indexed.total_tokens == scanning.total_tokens
        assert indexed.protected_tokens == scanning.protected_tokens


def test_refused_probes_do_not_pile_up_in_the_index() -> None:
    """A refused admission refreshes its path and releases the probe: asked about again
    and again (every batching step under overload), its leaf keeps one entry in the index,
    not one per probe (which made the index rebuild itself from a scan of the tree)."""
    tree = RadixTree()
    for i in range(50):
        tree.insert(tokens_to_key([i, 1]))
    tree.evict(2)  # builds the index; evicts [0, 1]
    lru = tree._lru
    assert lru is not None
    entries = len(lru._heap)
    for _ in range(200):
        for i in range(25, 50):
            tree.release_probe(tree.probe_lock(tokens_to_key([i, 1]))[0])
    assert len(lru._heap) == entries
    assert tree.evict(2 * 24) == [tokens_to_key([i, 1]) for i in range(1, 25)]


def test_index_compacts_without_changing_the_order() -> None:
    """Many touches leave stale entries; compaction drops them and the LRU order holds."""
    tree = RadixTree()
    for i in range(50):
        tree.insert(tokens_to_key([i, 1]))
    tree.evict(2)  # builds the index; evicts [0, 1]
    for _ in range(200):
        for i in range(25, 50):
            tree.touch(tokens_to_key([i, 1]))
    evicted = tree.evict(2 * 24)
    assert evicted == [tokens_to_key([i, 1]) for i in range(1, 25)]
