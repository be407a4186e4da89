"""RadixTree against a naive reference: sets of token tuples, one per owner.

Reference model. A tree (or owner) *holds* a token tuple ``P`` when ``P`` is a prefix of a
key inserted (with that owner) and not removed since. Holdings are prefix-closed sets of
tuples, so a held set's size is exactly the token count the tree must report.

The tree is node-granular where the reference is token-granular in one place:
``remove_owner(K, o)`` drops ``o`` from the whole node that contains ``K``'s last token,
back to that node's start. The test bounds it: ``o`` loses every extension of ``K`` and
keeps everything outside ``K[:t+1]``, where ``t`` is the length of the longest key still
held by someone that is a strict prefix of ``K`` (such a key always ends at a node).

Token ids come from 0..3 and keys are short, so prefixes collide and edges split often.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)

from fairserve.core.errors import ConfigError
from fairserve.core.radix import Node, RadixTree
from fairserve.core.types import key_to_tokens, tokens_to_key

Tokens = tuple[int, ...]
OWNERS = ("w0", "w1", "w2")

token_lists = st.lists(st.integers(0, 3), max_size=8).map(tuple)
owners = st.sampled_from(OWNERS)


def near(keys: Bundle[Tokens]) -> st.SearchStrategy[Tokens]:
    """Random keys, or a prefix of an inserted key with a random tail (splits edges)."""
    cut = st.tuples(keys, st.integers(0, 8), st.lists(st.integers(0, 3), max_size=3))
    return token_lists | cut.map(lambda t: t[0][: t[1]] + tuple(t[2]))


STATEFUL = settings(max_examples=150, stateful_step_count=40, derandomize=True, deadline=None)


def k(tokens: Tokens | list[int]) -> bytes:
    return tokens_to_key(tokens)


def prefixes(tokens: Tokens) -> set[Tokens]:
    """Non-empty prefixes of ``tokens`` (one per token position)."""
    return {tokens[:i] for i in range(1, len(tokens) + 1)}


def longest_held(held: set[Tokens], query: Tokens) -> int:
    return max((i for i in range(1, len(query) + 1) if query[:i] in held), default=0)


def extends(p: Tokens, base: Tokens) -> bool:
    return p[: len(base)] == base


def walk(tree: RadixTree) -> Iterator[tuple[Tokens, Tokens, Node]]:
    """``(parent path, node path, node)`` for every node (white box: reads the nodes)."""
    stack: list[tuple[Tokens, Node]] = [((), child) for child in tree._root.children.values()]
    while stack:
        parent_path, node = stack.pop()
        path = parent_path + tuple(key_to_tokens(node.edge))
        yield parent_path, path, node
        stack.extend((path, child) for child in node.children.values())


def tree_holdings(tree: RadixTree, owner: str | None = None) -> set[Tokens]:
    """Token tuples present in the tree (held by ``owner`` when given)."""
    out: set[Tokens] = set()
    for parent_path, path, node in walk(tree):
        if owner is None or owner in node.owners:
            out |= {path[:i] for i in range(len(parent_path) + 1, len(path) + 1)}
    return out


def assert_prefix_closed(held: set[Tokens]) -> None:
    assert all(p[:-1] in held for p in held if len(p) > 1)


# --------------------------------------------------------------------------- local cache
class LocalCacheMachine(RuleBasedStateMachine):
    """A worker's prefix cache: insert, match, touch, lock/unlock, LRU evict (no owners)."""

    inserted = Bundle("inserted")

    def __init__(self) -> None:
        super().__init__()
        self.tree = RadixTree()
        self.present: set[Tokens] = set()
        self.locks: list[tuple[Tokens, int]] = []

    def locked(self) -> set[Tokens]:
        out: set[Tokens] = set()
        for key, tokens in self.locks:
            out |= prefixes(key[:tokens])
        return out

    @rule(target=inserted, key=near(inserted))
    def insert(self, key: Tokens) -> Tokens:
        expected = len(prefixes(key) - self.present)
        assert self.tree.insert(k(key)) == expected
        self.present |= prefixes(key)
        return key

    @rule(query=near(inserted))
    def match_len(self, query: Tokens) -> None:
        assert self.tree.match_len(k(query)) == longest_held(self.present, query)

    @rule(query=near(inserted))
    def touch(self, query: Tokens) -> None:
        assert self.tree.touch(k(query)) == longest_held(self.present, query)

    @rule(target=inserted, key=near(inserted))
    def insert_locked(self, key: Tokens) -> Tokens:
        expected = len(prefixes(key) - self.present)
        assert self.tree.insert_locked(k(key)) == expected
        self.present |= prefixes(key)
        self.locks.append((key, len(key)))
        return key

    @precondition(lambda self: bool(self.locks))
    @rule(
        target=inserted,
        index=st.integers(0, 1000),
        tail=st.lists(st.integers(0, 3), max_size=4).map(tuple),
        relock=st.booleans(),
    )
    def insert_from_lock(self, index: int, tail: Tokens, relock: bool) -> Tokens:
        """A walk that starts at a lock's node inserts what a walk from the root would."""
        locked = self.locks[index % len(self.locks)][0]
        key = locked + tail
        expected = len(prefixes(key) - self.present)
        if relock:
            assert self.tree.insert_locked(k(key), from_lock=k(locked)) == expected
            self.locks.append((key, len(key)))
        else:
            assert self.tree.insert(k(key), from_lock=k(locked)) == expected
        self.present |= prefixes(key)
        return key

    @rule(key=near(inserted))
    def lock(self, key: Tokens) -> None:
        tokens = self.tree.lock(k(key))
        assert tokens == longest_held(self.present, key)
        self.locks.append((key, tokens))

    @precondition(lambda self: bool(self.locks))
    @rule(index=st.integers(0, 1000))
    def unlock(self, index: int) -> None:
        key = self.locks[index % len(self.locks)][0]
        # Of several locks on one key the tree releases the shortest (see RadixTree.unlock).
        self.locks.remove(min((lk for lk in self.locks if lk[0] == key), key=lambda lk: lk[1]))
        self.tree.unlock(k(key))

    @rule(key=near(inserted))
    def unlock_unlocked_raises(self, key: Tokens) -> None:
        if any(other == key for other, _ in self.locks):
            return
        with pytest.raises(ConfigError, match="without a matching lock"):
            self.tree.unlock(k(key))

    @rule(num_tokens=st.integers(-2, 24))
    def evict(self, num_tokens: int) -> None:
        before, locked = set(self.present), self.locked()
        evictable = before - locked
        assert self.tree.evictable_tokens() == len(evictable)
        evicted = [tuple(key_to_tokens(e)) for e in self.tree.evict(num_tokens)]
        after = tree_holdings(self.tree)
        freed = len(before) - len(after)
        assert locked <= after <= before
        assert freed >= min(num_tokens, len(evictable))
        assert all(e in before and e not in after for e in evicted)
        if num_tokens <= 0:
            assert evicted == []
        elif evicted:  # stopped as soon as enough was freed: the last node was needed
            last = evicted[-1]  # its tokens: the prefixes of it that left the tree
            last_tokens = sum(1 for p in prefixes(last) if p not in after)
            assert freed - last_tokens < num_tokens
        self.present = after

    @invariant()
    def matches_reference(self) -> None:
        assert tree_holdings(self.tree) == self.present
        assert self.tree.total_tokens == len(self.present)
        assert self.tree.evictable_tokens() == len(self.present - self.locked())

    @invariant()
    def refs_never_grow_downwards(self) -> None:
        for _, _, node in walk(self.tree):
            for child in node.children.values():
                assert 0 <= child.ref <= node.ref


TestLocalCache = LocalCacheMachine.TestCase
TestLocalCache.settings = STATEFUL


# --------------------------------------------------------------------------- global tree
class GlobalTreeMachine(RuleBasedStateMachine):
    """A dispatcher's global tree: owners, match_owners, eviction events, LRU bounds."""

    inserted = Bundle("inserted")

    def __init__(self) -> None:
        super().__init__()
        self.tree = RadixTree()
        self.held: dict[str, set[Tokens]] = {o: set() for o in OWNERS}
        self.keys: dict[str, set[Tokens]] = {o: set() for o in OWNERS}

    def everything(self) -> set[Tokens]:
        return set().union(*self.held.values())

    def resync(self, owner: str) -> set[Tokens]:
        """Adopt the tree's holdings of ``owner`` (after a checked removal)."""
        after = tree_holdings(self.tree, owner)
        self.held[owner] = after
        self.keys[owner] = {key for key in self.keys[owner] if key in after}
        return after

    @rule(target=inserted, key=near(inserted), owner=owners)
    def insert(self, key: Tokens, owner: str) -> Tokens:
        expected = len(prefixes(key) - self.everything())
        assert self.tree.insert(k(key), owner) == expected
        self.held[owner] |= prefixes(key)
        if key:
            self.keys[owner].add(key)
        return key

    @rule(query=near(inserted))
    def match(self, query: Tokens) -> None:
        best = longest_held(self.everything(), query)
        holders = frozenset(o for o in OWNERS if best and query[:best] in self.held[o])
        got = self.tree.match_owners(k(query))
        assert (got.tokens, got.owners) == (best, holders)
        assert self.tree.match_len(k(query)) == best

    @rule(key=near(inserted), owner=owners)
    def remove_owner(self, key: Tokens, owner: str) -> None:
        before = set(self.held[owner])
        others = {o: set(self.held[o]) for o in OWNERS if o != owner}
        boundary = max(
            (
                len(j)
                for ks in self.keys.values()
                for j in ks
                if len(j) < len(key) and extends(key, j)
            ),
            default=0,
        )
        removed = self.tree.remove_owner(k(key), owner)
        after = self.resync(owner)
        assert not any(extends(p, key) for p in after)
        assert before - {p for p in before if extends(p, key[: boundary + 1])} <= after <= before
        assert removed == len(before) - len(after)
        assert {o: tree_holdings(self.tree, o) for o in others} == others

    @rule(owner=owners)
    def remove_owner_everywhere(self, owner: str) -> None:
        assert self.tree.remove_owner_everywhere(owner) == len(self.held[owner])
        assert self.resync(owner) == set()
        assert self.tree.owner_tokens(owner) == 0

    @rule(owner=owners, bound=st.integers(0, 12))
    def evict_owner_lru(self, owner: str, bound: int) -> None:
        before = set(self.held[owner])
        others = {o: set(self.held[o]) for o in OWNERS if o != owner}
        removed = [tuple(key_to_tokens(r)) for r in self.tree.evict_owner_lru(owner, bound)]
        after = self.resync(owner)
        assert len(after) <= bound and after <= before
        assert bool(removed) == (len(before) > bound)
        for r in removed:
            assert r in before and not any(extends(p, r) for p in after)
        if removed:  # stopped as soon as the bound held: the last removal was needed
            last_tokens = sum(1 for p in prefixes(removed[-1]) if p not in after)
            assert len(after) + last_tokens > bound
        assert {o: tree_holdings(self.tree, o) for o in others} == others

    @invariant()
    def matches_reference(self) -> None:
        for owner in OWNERS:
            held = tree_holdings(self.tree, owner)
            assert held == self.held[owner]
            assert_prefix_closed(held)
            assert self.tree.owner_tokens(owner) == len(held)
        assert self.tree.total_tokens == len(self.everything()) == len(tree_holdings(self.tree))
        assert sorted(map(str, self.tree.owners())) == [o for o in OWNERS if self.held[o]]

    @invariant()
    def child_owners_within_parent_owners(self) -> None:
        for _, _, node in walk(self.tree):
            assert node.owners  # ownerless nodes are pruned
            for child in node.children.values():
                assert child.owners <= node.owners


TestGlobalTree = GlobalTreeMachine.TestCase
TestGlobalTree.settings = STATEFUL


class LockedGlobalTreeMachine(GlobalTreeMachine):
    """The same, on a tree that once took a lock: removing an owner then takes the general
    pruning path (it may not assume that no node is locked or ownerless)."""

    def __init__(self) -> None:
        super().__init__()
        self.tree.lock(b"")
        self.tree.unlock(b"")


TestLockedGlobalTree = LockedGlobalTreeMachine.TestCase
TestLockedGlobalTree.settings = STATEFUL


# --------------------------------------------------------------------------- LRU order
@settings(max_examples=60, derandomize=True, deadline=None)
@given(
    order=st.permutations(range(6)),
    touched=st.lists(st.integers(0, 5), max_size=6),
    shared=st.booleans(),
)
def test_evict_takes_least_recently_used_leaves_first(
    order: list[int], touched: list[int], shared: bool
) -> None:
    """Leaves leave in the order they were last inserted or touched; a shared parent goes
    after all of its leaves (it was accessed whenever any of them was)."""
    tree = RadixTree()
    head = (9,) if shared else ()
    key_of = {i: (*head, 10 + i, i, i) for i in range(6)}
    recency: list[int] = []
    for i in [*order, *touched]:
        if i in recency:
            tree.touch(k(key_of[i]))
        else:
            tree.insert(k(key_of[i]))
        recency = [j for j in recency if j != i] + [i]
    evicted = [tuple(key_to_tokens(e)) for e in tree.evict(10**6)]
    expected = [key_of[i] for i in recency] + ([head] if shared else [])
    assert evicted == expected
    assert tree.total_tokens == 0


@settings(max_examples=60, derandomize=True, deadline=None)
@given(
    order=st.permutations(range(5)),
    touched=st.lists(st.integers(0, 4), max_size=5),
    keep=st.integers(0, 5),
)
def test_evict_owner_lru_drops_least_recent_first(
    order: list[int], touched: list[int], keep: int
) -> None:
    tree = RadixTree()
    key_of = {i: (i, i, i) for i in range(5)}
    recency: list[int] = []
    for i in [*order, *touched]:
        if i in recency:
            tree.touch(k(key_of[i]))
        else:
            tree.insert(k(key_of[i]), "w0")
        recency = [j for j in recency if j != i] + [i]
    removed = [tuple(key_to_tokens(r)) for r in tree.evict_owner_lru("w0", 3 * keep)]
    assert removed == [key_of[i] for i in recency[: max(0, 5 - keep)]]
    assert tree.owner_tokens("w0") == 3 * min(keep, 5)


def test_owner_eviction_without_keys_evicts_the_same_leaves() -> None:
    """``keys=False`` (a host that only bounds a share) drops exactly what ``keys=True``
    drops, returning no prefixes."""
    trees = RadixTree(), RadixTree()
    prompts = [(1, 2, 3), (1, 2, 4, 5), (6, 7), (6, 8, 9, 10), (11,)]
    for tree in trees:
        for i, prompt in enumerate(prompts):
            tree.insert(k(prompt), "w0")
            tree.insert(k(prompt[:2]), "w1" if i % 2 else "w0")
    removed = trees[0].evict_owner_lru("w0", 6)
    assert removed and trees[1].evict_owner_lru("w0", 6, keys=False) == []
    for owner in ("w0", "w1"):
        assert trees[0].owner_tokens(owner) == trees[1].owner_tokens(owner)
    for prompt in prompts:
        assert trees[0].match_owners(k(prompt)) == trees[1].match_owners(k(prompt))
    assert trees[0].node_count() == trees[1].node_count()


def test_the_walk_memo_answers_the_same_key_object_only() -> None:
    """A walk is remembered for the key object a match was asked with (no hash of a long
    prompt): the same object is recalled; an equal key in another object, or any key once
    the shape changed, walks again. Inserting either way gives the same tree."""
    key = k(list(range(1, 200)))
    trees = RadixTree(), RadixTree()
    for tree in trees:
        tree.insert(k(list(range(1, 50))), "w0")
        tree.insert(k([*range(1, 30), 7, 7]), "w1")
    first = trees[0].match_owners(key)
    walk = trees[0]._trie.recall(key)
    assert walk is not None and walk[1] == 49 * 4
    assert trees[0]._trie.recall(bytes(bytearray(key))) is None  # equal, another object
    assert trees[1].match_owners(bytes(bytearray(key))) == first
    trees[0].insert(key, "w1")  # from the remembered walk
    trees[1].insert(key, "w1")  # another object: walks from the root
    assert trees[0]._trie.recall(key) is None  # the shape changed
    for probe in (key, k(list(range(1, 60))), k([*range(1, 30), 7])):
        assert trees[0].match_owners(probe) == trees[1].match_owners(probe)
    assert trees[0].owner_tokens("w1") == trees[1].owner_tokens("w1") == 199 + 2


def test_locked_prefix_survives_eviction_even_when_least_recent() -> None:
    tree = RadixTree()
    tree.insert(k([1, 2, 3, 4]))
    tree.insert(k([5, 6]))
    assert tree.lock(k([1, 2, 9])) == 2  # splits [1,2 | 3,4]; locks [1,2]
    tree.touch(k([5, 6]))
    assert [key_to_tokens(e) for e in tree.evict(10)] == [[1, 2, 3, 4], [5, 6]]
    assert tree.match_len(k([1, 2])) == 2 and tree.evictable_tokens() == 0
    tree.unlock(k([1, 2, 9]))
    assert [key_to_tokens(e) for e in tree.evict(1)] == [[1, 2]]


def test_unlock_after_inserting_below_the_locked_prefix() -> None:
    """The usual host sequence: lock the cached prefix, insert the computed prompt, unlock."""
    tree = RadixTree()
    tree.insert(k([1, 2, 3]))
    assert tree.lock(k([1, 2, 3, 4, 5])) == 3
    tree.insert(k([1, 2, 3, 4, 5]))
    assert tree.lock(k([1, 2, 3, 4, 5])) == 5  # a second request on the same prompt
    tree.unlock(k([1, 2, 3, 4, 5]))  # releases the 3-token lock, the 5-token one stays
    assert tree.evict(10) == [] and tree.evictable_tokens() == 0
    tree.unlock(k([1, 2, 3, 4, 5]))
    assert tree.evictable_tokens() == 5


def test_lock_of_nothing_pairs_with_an_unlock() -> None:
    tree = RadixTree()
    assert tree.lock(k([7, 7])) == 0
    tree.insert(k([7, 7]))
    tree.unlock(k([7, 7]))
    assert tree.evictable_tokens() == 2


# --------------------------------------------------------------------------- edge cases
def test_empty_key() -> None:
    tree = RadixTree()
    assert tree.insert(b"", "w0") == 0
    assert tree.total_tokens == 0 and tree.node_count() == 0 and tree.owners() == []
    assert tree.match_len(b"") == 0
    match = tree.match_owners(b"")
    assert (match.tokens, match.owners) == (0, frozenset())
    assert tree.lock(b"") == 0
    tree.unlock(b"")
    with pytest.raises(ConfigError):
        tree.unlock(b"")


def test_insert_splits_edges_and_counts_new_tokens() -> None:
    tree = RadixTree()
    assert tree.insert(k([1, 2, 3, 4])) == 4
    assert tree.insert(k([1, 2, 3, 4])) == 0  # duplicate
    assert tree.insert(k([1, 2])) == 0  # strict prefix of an edge: split, nothing new
    assert tree.node_count() == 2
    assert tree.match_len(k([1, 2, 9])) == 2
    assert tree.match_len(k([1, 2, 3, 7])) == 3
    assert tree.insert(k([1, 2, 9])) == 1
    assert tree.node_count() == 3 and tree.total_tokens == 5


def test_owner_match_stops_mid_edge() -> None:
    tree = RadixTree()
    tree.insert(k([1, 2, 3, 4]), "a")
    tree.insert(k([1, 2]), "b")
    match = tree.match_owners(k([1, 2, 3, 9]))
    assert (match.tokens, match.owners) == (3, frozenset({"a"}))
    match = tree.match_owners(k([1, 2, 8]))
    assert (match.tokens, match.owners) == (2, frozenset({"a", "b"}))
    assert tree.remove_owner(k([1, 2, 3]), "a") == 2  # drops the node [3,4] of "a"
    assert tree.owner_tokens("a") == 2 and tree.total_tokens == 2


@pytest.mark.parametrize("bad", [b"\x01", b"\x01\x00\x00\x00\x02"])
def test_bad_key_length_is_a_config_error(bad: bytes) -> None:
    with pytest.raises(ConfigError, match="multiple of 4"):
        RadixTree().insert(bad)


def test_insert_from_a_key_without_lock_or_not_a_prefix_raises() -> None:
    tree = RadixTree()
    tree.insert(k([1, 2, 3]))
    with pytest.raises(ConfigError, match="locked prefix"):
        tree.insert(k([1, 2, 3, 4]), from_lock=k([1, 2]))
    tree.lock(k([1, 2]))
    with pytest.raises(ConfigError, match="locked prefix"):
        tree.insert(k([2, 2, 3, 4]), from_lock=k([1, 2]))
    assert tree.insert(k([1, 2, 3, 4]), from_lock=k([1, 2])) == 1


def test_unlock_without_lock_raises() -> None:
    tree = RadixTree()
    tree.insert(k([1, 2, 3]))
    with pytest.raises(ConfigError, match="without a matching lock"):
        tree.unlock(k([1, 2, 3]))
    tree.lock(k([1, 2, 3]))
    with pytest.raises(ConfigError, match="without a matching lock"):
        tree.unlock(k([1, 2]))  # a different key, though on the locked path
    tree.unlock(k([1, 2, 3]))
    with pytest.raises(ConfigError, match="without a matching lock"):
        tree.unlock(k([1, 2, 3]))


def test_evict_owner_lru_rejects_negative_bound() -> None:
    with pytest.raises(ConfigError, match="max_tokens"):
        RadixTree().evict_owner_lru("w0", -1)


# --------------------------------------------------------------------------- no cycles left
def test_a_dropped_tree_unlinks_its_nodes() -> None:
    """Parent links would make a dropped tree a cycle only the garbage collector frees."""
    tree = RadixTree()
    tree.insert(k([1, 2, 3]))
    tree.insert(k([1, 2, 4, 5]))
    nodes = [node for _, _, node in walk(tree)]
    assert len(nodes) == 3 and any(n.parent is not None for n in nodes)
    del tree
    assert all(n.parent is None for n in nodes)


@pytest.mark.parametrize("locked_once", [False, True])
def test_pruned_subtrees_are_unlinked(locked_once: bool) -> None:
    tree = RadixTree()
    if locked_once:  # the general pruning path
        tree.lock(b"")
        tree.unlock(b"")
    tree.insert(k([1, 2, 3, 4]), "w0")
    tree.insert(k([1, 2, 3, 5, 6]), "w0")
    tree.insert(k([1, 2]), "w1")
    below = [node for _, path, node in walk(tree) if len(path) > 2]
    assert len(below) == 3
    assert tree.remove_owner(k([1, 2, 3]), "w0") == 4
    assert tree.total_tokens == 2 and tree.node_count() == 1
    assert all(n.parent is None for n in below)


def test_a_dropped_tree_with_owners_locks_and_an_lru_unlinks_its_nodes() -> None:
    """The tree's parts (trie, owner index, LRU index) hold no reference back to the tree,
    so dropping a tree that used all of them still frees its nodes at once."""
    tree = RadixTree()
    tree.insert(k([1, 2, 3]), "w0")
    tree.insert(k([1, 2, 4, 5]), "w1")
    tree.insert(k([7, 8]))
    tree.lock(k([1, 2, 4]))
    tree.unlock(k([1, 2, 4]))
    assert tree.evict(1) and tree.match_owners(k([1, 2])).tokens == 2
    nodes = [node for _, _, node in walk(tree)]
    assert any(n.parent is not None for n in nodes)
    del tree
    assert all(n.parent is None for n in nodes)


def test_remove_owner_of_a_key_leaving_the_tree_inside_an_edge_removes_nothing() -> None:
    tree = RadixTree()
    tree.insert(k([1, 2, 3, 4]), "w0")
    assert tree.remove_owner(k([1, 2, 9]), "w0") == 0
    assert tree.remove_owner(k([5]), "w0") == 0
    assert tree.owner_tokens("w0") == 4 and tree.match_owners(k([1, 2, 3, 4])).tokens == 4
    assert tree.remove_owner(k([1, 2]), "w0") == 4  # a key ending inside an edge splits it
    assert tree.owners() == [] and tree.total_tokens == 0
