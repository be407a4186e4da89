"""An owner's LRU bound evicts exactly what a full scan of its leaves would.

``evict_owner_lru`` keeps a lazy per-owner heap between evictions. ``ScanningTree`` answers
it with the original algorithm instead (a heap of all the owner's leaves, rebuilt at every
call, kept here as the reference); both trees get the same random operations and must
remove the same prefixes in the same order and end every step as the same tree.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, rule

from fairserve.core.radix import Node, Owner, RadixTree
from fairserve.core.radix_lru import OwnerLruIndex
from fairserve.core.types import tokens_to_key


def _owner_leaves(tree: RadixTree, owner: Owner) -> list[Node]:
    """Nodes ``owner`` holds but none of whose children it holds (a full walk)."""
    root = tree._trie.root
    stack = [c for c in root.children.values() if owner in c.owners]
    leaves = []
    while stack:
        node = stack.pop()
        below = [c for c in node.children.values() if owner in c.owners]
        if below:
            stack.extend(below)
        else:
            leaves.append(node)
    return leaves


def _is_owner_leaf(tree: RadixTree, node: Node | None, owner: Owner) -> bool:
    if node is None or node is tree._trie.root or owner not in node.owners:
        return False
    return not any(owner in c.owners for c in node.children.values())


def scanning_evict_lru(tree: RadixTree, owner: Owner, max_tokens: int) -> list[bytes]:
    """The original ``OwnerIndex.evict_lru``: a heap of every owner leaf at each call."""
    owners, trie = tree._owners, tree._trie
    removed: list[bytes] = []
    if owners.tokens(owner) <= max_tokens:
        return removed
    heap = [(n.last_access, id(n), n) for n in _owner_leaves(tree, owner)]
    heapq.heapify(heap)
    while heap and owners.tokens(owner) > max_tokens:
        _, _, leaf = heapq.heappop(heap)
        if owner not in leaf.owners or any(owner in c.owners for c in leaf.children.values()):
            continue
        removed.append(trie.full_key(leaf))
        parent = leaf.parent
        owners._drop_owner_subtree(leaf, owner)
        if _is_owner_leaf(tree, parent, owner):
            assert parent is not None
            heapq.heappush(heap, (parent.last_access, id(parent), parent))
    return removed


class ScanningTree(RadixTree):
    """Reference: every owner bound scans the owner's whole subtree."""

    def evict_owner_lru(self, owner: Owner, max_tokens: int, *, keys: bool = True) -> list[bytes]:
        removed = scanning_evict_lru(self, owner, max_tokens)
        return removed if keys else []


Shape = list[tuple[bytes, frozenset[Owner], int, int]]


def shape(tree: RadixTree) -> Shape:
    """Every node's full key, owners, last access and references, in key order."""
    trie = tree._trie
    return sorted(
        (trie.full_key(n), frozenset(n.owners), n.last_access, n.ref) for n in trie.nodes()
    )


OWNERS = ("w0", "w1", "w2")
Tokens = tuple[int, ...]
token_lists = st.lists(st.integers(0, 2), max_size=5).map(tuple)
"""Few distinct tokens and short keys: keys share prefixes and split edges."""


def near(keys: Bundle[Tokens]) -> st.SearchStrategy[Tokens]:
    """Random keys, an inserted key (a touch then reaches its leaf), or a prefix of one
    with a random tail."""
    cut = st.tuples(keys, st.integers(0, 5), st.lists(st.integers(0, 2), max_size=2))
    return token_lists | keys | cut.map(lambda t: t[0][: t[1]] + tuple(t[2]))


class KeptVersusScanning(RuleBasedStateMachine):
    """Random inserts, touches, bounds, removals and local evictions for several owners on
    one kept-index tree and one scanning tree: same answers, same tree after every step."""

    inserted = Bundle("inserted")

    def __init__(self) -> None:
        super().__init__()
        self.trees = (RadixTree(), ScanningTree())

    def both(self, op: Callable[[RadixTree], object]) -> None:
        kept, scanning = self.trees
        assert op(kept) == op(scanning)

    @initialize(locked_once=st.booleans())
    def start(self, locked_once: bool) -> None:
        if locked_once:  # the general pruning path (not a pure global tree)
            self.both(lambda t: t.lock(b""))
            self.both(lambda t: t.unlock(b""))

    @rule(target=inserted, key=near(inserted), owner=st.sampled_from(OWNERS))
    def insert(self, key: Tokens, owner: str) -> Tokens:
        self.both(lambda t: t.insert(tokens_to_key(key), owner))
        return key

    @rule(key=near(inserted))
    def touch(self, key: Tokens) -> None:
        self.both(lambda t: t.touch(tokens_to_key(key)))

    @rule(owner=st.sampled_from(OWNERS), under=st.integers(0, 4))
    def bound(self, owner: str, under: int) -> None:
        """A few tokens under the owner's share (0: a bound it is already within)."""
        self.both(lambda t: t.evict_owner_lru(owner, max(0, t.owner_tokens(owner) - under)))

    @rule(key=near(inserted), owner=st.sampled_from(OWNERS))
    def remove(self, key: Tokens, owner: str) -> None:
        self.both(lambda t: t.remove_owner(tokens_to_key(key), owner))

    @rule(owner=st.sampled_from(OWNERS))
    def forget(self, owner: str) -> None:
        self.both(lambda t: t.remove_owner_everywhere(owner))

    @rule(tokens=st.integers(1, 3))
    def evict_locally(self, tokens: int) -> None:
        """The local LRU detaches owned leaves too (a mixed tree)."""
        self.both(lambda t: t.evict(tokens))

    @invariant()
    def same_tree(self) -> None:
        kept, scanning = self.trees
        assert shape(kept) == shape(scanning)
        assert kept.total_tokens == scanning.total_tokens
        for owner in OWNERS:
            assert kept.owner_tokens(owner) == scanning.owner_tokens(owner)


TestKeptVersusScanning = KeptVersusScanning.TestCase
TestKeptVersusScanning.settings = settings(
    max_examples=300, stateful_step_count=50, derandomize=True, deadline=None
)


def test_unique_prompts_under_a_bound_drop_the_oldest() -> None:
    """The router's use: unique prompts for two workers, each bounded after every insert."""
    kept, scanning = RadixTree(), ScanningTree()
    for i in range(300):
        key = tokens_to_key([i % 7, i, i + 1, i + 2])
        owner = OWNERS[i % 2]
        for tree in (kept, scanning):
            tree.insert(key, owner)
        assert kept.evict_owner_lru(owner, 40) == scanning.evict_owner_lru(owner, 40)
        assert shape(kept) == shape(scanning)


def index_dropped(tree: RadixTree, owner: Owner) -> bool:
    """Whether ``owner``'s kept index dropped its entries (to rebuild at the next bound)."""
    return tree._trie.owner_lru[owner].stale


def test_stale_entries_are_dropped_and_the_order_holds() -> None:
    """Re-recording one prompt pushes an entry each time; past the compaction size the index
    drops them all and rebuilds at the next eviction, in the same order."""
    kept, scanning = RadixTree(), ScanningTree()
    for tree in (kept, scanning):
        for i in range(20):
            tree.insert(tokens_to_key([i, 1]), "w0")
        tree.evict_owner_lru("w0", 38)  # builds the kept index; drops [0, 1]
        for _ in range(OwnerLruIndex.COMPACT_MIN_ENTRIES + 10):
            tree.insert(tokens_to_key([19, 1]), "w0")
    assert index_dropped(kept, "w0")  # past the compaction size
    assert kept.evict_owner_lru("w0", 20) == scanning.evict_owner_lru("w0", 20)
    assert not index_dropped(kept, "w0")  # rebuilt by the eviction
    dropped = [tokens_to_key([i, 1]) for i in range(10, 19)]
    assert kept.evict_owner_lru("w0", 2) == scanning.evict_owner_lru("w0", 2) == dropped
    assert shape(kept) == shape(scanning)


def test_a_leaf_touched_after_the_index_was_built_goes_later() -> None:
    """A touch pushes nothing: the popped entry older than its node goes back in."""
    kept, scanning = RadixTree(), ScanningTree()
    for tree in (kept, scanning):
        for i in range(3):
            tree.insert(tokens_to_key([i]), "w0")
    assert kept.evict_owner_lru("w0", 2) == scanning.evict_owner_lru("w0", 2)
    for tree in (kept, scanning):
        tree.touch(tokens_to_key([1]))
    assert kept.evict_owner_lru("w0", 1) == scanning.evict_owner_lru("w0", 1)
    assert kept.evict_owner_lru("w0", 1) == [] and shape(kept) == shape(scanning)
    assert [n.edge for n in kept._trie.nodes()] == [tokens_to_key([1])]


def test_a_local_eviction_of_an_owned_leaf_makes_its_parent_a_leaf() -> None:
    """A mixed tree: the local LRU detaches an owned leaf, whose parent (never one of the
    owner's leaves before) the owner's index must then hold."""
    kept, scanning = RadixTree(), ScanningTree()
    for tree in (kept, scanning):
        for key in ([5], [6], [7], [0, 1], [0, 1, 3]):
            tree.insert(tokens_to_key(key), "w0")
        assert tree.evict_owner_lru("w0", 5) == [tokens_to_key([5])]  # builds the index
        evicted = tree.evict(3)  # the local LRU takes [6], [7], then [0, 1]'s child
        assert evicted == [tokens_to_key(key) for key in ([6], [7], [0, 1, 3])]
    assert kept.evict_owner_lru("w0", 0) == scanning.evict_owner_lru("w0", 0)
    assert shape(kept) == shape(scanning) == []
