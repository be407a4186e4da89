"""Kept match lengths (``core.radix_matches``) equal a fresh match after any sequence of tree
changes, and are kept where nothing on their path changed.

The stateful machines of ``test_radix`` (local cache: inserts, locks, unlocks, touches, LRU
evictions; global tree: owners, removals, owner LRU bounds; the locked global tree) run with
a queue of waiting keys on top: after every step each waiting key's ``match_len`` (kept
from earlier steps where still valid) must equal a fresh walk and the reference model.
"""

from __future__ import annotations

import pytest
from hypothesis.stateful import invariant, rule

from fairserve.core import radix_matches
from fairserve.core.radix import RadixTree
from fairserve.core.radix_node import Ticket
from tests.core.test_radix import (
    STATEFUL,
    GlobalTreeMachine,
    LocalCacheMachine,
    LockedGlobalTreeMachine,
    Tokens,
    k,
    longest_held,
    near,
)

WAITING = 12


def kept(tree: RadixTree, key: bytes) -> int | None:
    """The match the tree keeps for ``key`` (None: it would walk)."""
    return tree._trie.matches.get(key)


class _Waiting:
    """A waiting queue whose matches are asked for after every step, as a host does at
    every batching step; the host also holds the ticket each match came from and learns
    from the drained revocations which ones may have moved (the simulator's feed)."""

    tree: RadixTree
    waiting: list[Tokens]
    tickets: dict[bytes, Ticket]

    def reference(self, query: Tokens) -> int:
        raise NotImplementedError

    def check_waiting(self) -> None:
        if not hasattr(self, "tickets"):  # first check: start listing revocations
            self.tickets = {}
            self.tree.track_revoked()
        revoked = self.tree.drain_revoked()
        assert revoked is not None
        gone = set(map(id, revoked))
        for key, ticket in self.tickets.items():
            # A ticket not listed as revoked still describes the key's match.
            assert id(ticket) in gone or (
                ticket.valid and ticket.tokens == self.tree.match_len_walk(key)
            )
        self.tickets = {}
        for query in self.waiting:
            key = k(query)
            cached = kept(self.tree, key)
            fresh = self.tree.match_len_walk(key)
            assert cached is None or cached == fresh
            assert self.tree.match_len(key) == fresh == self.reference(query)
            self.tickets[key] = self.tree.kept_matches[key]


class LocalWaiting(LocalCacheMachine, _Waiting):
    def __init__(self) -> None:
        super().__init__()
        self.waiting = []

    def reference(self, query: Tokens) -> int:
        return longest_held(self.present, query)

    @rule(query=near(LocalCacheMachine.inserted))
    def arrive(self, query: Tokens) -> None:
        self.waiting = [*self.waiting, query][-WAITING:]

    @invariant()
    def waiting_matches_are_fresh(self) -> None:
        self.check_waiting()


class GlobalWaiting(GlobalTreeMachine, _Waiting):
    def __init__(self) -> None:
        super().__init__()
        self.waiting = []

    def reference(self, query: Tokens) -> int:
        return longest_held(self.everything(), query)

    @rule(query=near(GlobalTreeMachine.inserted))
    def arrive(self, query: Tokens) -> None:
        self.waiting = [*self.waiting, query][-WAITING:]

    @invariant()
    def waiting_matches_are_fresh(self) -> None:
        self.check_waiting()


class LockedGlobalWaiting(LockedGlobalTreeMachine, GlobalWaiting):
    pass


TestLocalWaiting = LocalWaiting.TestCase
TestLocalWaiting.settings = STATEFUL
TestGlobalWaiting = GlobalWaiting.TestCase
TestGlobalWaiting.settings = STATEFUL
TestLockedGlobalWaiting = LockedGlobalWaiting.TestCase
TestLockedGlobalWaiting.settings = STATEFUL


# --------------------------------------------------------------------------- kept, or not
def tree_of(*keys: list[int]) -> RadixTree:
    tree = RadixTree()
    for key in keys:
        tree.insert(k(key))
    return tree


def test_a_match_is_kept_while_changes_happen_off_its_path() -> None:
    tree = tree_of([1, 2, 3, 4], [1, 2, 7, 8], [5, 6])
    waiting = k([1, 2, 3, 9])  # ends at the end of node [3, 4]'s first token
    assert tree.match_len(waiting) == 3
    tree.insert(k([5, 6, 7]))  # elsewhere
    tree.insert(k([1, 2, 7, 8, 9]))  # a sibling branch, below the shared [1, 2]
    tree.lock(k([5, 6]))
    assert kept(tree, waiting) == 3
    assert tree.match_len(waiting) == 3


def test_a_sibling_of_the_next_token_keeps_the_match() -> None:
    """Requests on one shared document keep their matches while other requests' private
    questions are inserted below it (a child for another token does not continue them)."""
    tree = tree_of([1, 2, 3])
    waiting = k([1, 2, 3, 4, 5])
    assert tree.match_len(waiting) == 3
    tree.insert(k([1, 2, 3, 7, 7]))
    assert kept(tree, waiting) == 3


def test_an_insert_that_continues_the_match_revokes_it() -> None:
    tree = tree_of([1, 2, 3])
    waiting = k([1, 2, 3, 4, 5])
    assert tree.match_len(waiting) == 3
    tree.insert(k([1, 2, 3, 4]))  # a child under the node where the match ends
    assert kept(tree, waiting) is None
    assert tree.match_len(waiting) == 4


def test_a_split_inside_the_match_moves_it_and_keeps_its_length() -> None:
    tree = tree_of([1, 2, 3, 4])
    waiting = k([1, 2, 9])  # ends inside the edge [1, 2, 3, 4]
    assert tree.match_len(waiting) == 2
    tree.insert(k([1, 2, 8]))  # splits that edge exactly where the match ends
    assert tree.match_len(waiting) == 2
    tree.insert(k([1, 2, 9, 9]))  # then continues the match under the new upper node
    assert tree.match_len(waiting) == 3 == tree.match_len_walk(waiting)


def test_a_probe_keeps_the_match_where_its_lock_would_end() -> None:
    """A refused admission probes its prompt's lock, and the next batching step asks for
    the same match: it is kept where the lock ends, after the split that a match ending
    inside an edge needs, so it is not walked again."""
    tree = tree_of([1, 2, 3, 4])
    waiting = k([1, 2, 9])  # ends inside the edge [1, 2, 3, 4]
    node, matched, _fresh = tree.probe_lock(waiting)  # splits that edge after [1, 2]
    tree.release_probe(node)
    assert matched == 2
    assert kept(tree, waiting) == 2 == tree.match_len_walk(waiting)
    tree.insert(k([1, 2, 9, 9]))  # continues it under the new upper node
    assert kept(tree, waiting) is None
    assert tree.match_len(waiting) == 3 == tree.match_len_walk(waiting)


def test_a_lock_without_a_kept_match_keeps_one() -> None:
    tree = tree_of([1, 2, 3])
    waiting = k([1, 2, 3, 4])
    assert kept(tree, waiting) is None
    assert tree.lock(waiting) == 3
    assert kept(tree, waiting) == 3 == tree.match_len_walk(waiting)
    tree.unlock(waiting)


def test_an_eviction_on_the_path_revokes_the_match() -> None:
    tree = tree_of([1, 2, 3])
    waiting = k([1, 2, 3, 4])
    assert tree.match_len(waiting) == 3
    assert tree.evict(100) == [k([1, 2, 3])]
    assert kept(tree, waiting) is None
    assert tree.match_len(waiting) == 0


def test_removing_an_owner_detaches_a_subtree_and_revokes_matches_below() -> None:
    tree = RadixTree()
    tree.insert(k([1, 2]), "w0")
    tree.insert(k([1, 2, 3, 4]), "w0")
    tree.insert(k([1, 2, 3, 4, 5, 6]), "w0")
    deep = k([1, 2, 3, 4, 5, 6, 7])
    assert tree.match_len(deep) == 6
    tree.remove_owner(k([1, 2]), "w0")  # the whole subtree goes with its top
    assert tree.match_len(deep) == 0 == tree.match_len_walk(deep)


def test_an_inserted_key_keeps_nothing() -> None:
    """The prompt of an admitted request is inserted: the cache does not keep it alive."""
    tree = tree_of([1, 2, 3])
    prompt = k([1, 2, 3])
    assert tree.match_len(prompt) == 3
    tree.insert(prompt)
    assert len(tree._trie.matches) == 0


def test_the_cache_is_bounded() -> None:
    tree = tree_of([1, 2, 3])
    tree._trie.matches.limit = tree._trie.matches._sweep_at = 4
    keys = [k([1, 2, i]) for i in range(10, 20)]
    for key in keys:
        tree.match_len(key)
        assert len(tree._trie.matches) <= 4
    assert [tree.match_len(key) for key in keys] == [2] * len(keys)


def test_keys_nothing_else_holds_are_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    """A request that left the queue without being admitted: its prompt is not kept alive
    by the cache once the kept matches have doubled."""
    monkeypatch.setattr(radix_matches, "SWEEP_MIN_ENTRIES", 8)
    tree = tree_of([1, 2, 3])
    matches = tree._trie.matches
    matches._sweep_at = 8
    live = [k([1, 2, 3, i]) for i in range(4)]
    for key in live:
        tree.match_len(key)
    for i in range(4, 20):
        tree.insert(k([9, i]))  # elsewhere; a new shape also lets the walk memo go
        tree.match_len(k([1, 2, 3, i]))  # nothing else holds these keys
    assert len(matches) < 12
    assert all(kept(tree, key) == 3 for key in live)


def test_revocations_are_listed_once_tracked() -> None:
    tree = tree_of([1, 2, 3, 4])
    assert tree.drain_revoked() is None  # not tracking: cannot tell
    tree.track_revoked()
    waiting = k([1, 2, 9])
    assert tree.match_len(waiting) == 2
    ticket = tree.kept_matches[waiting]
    assert tree.drain_revoked() == []
    tree.insert(k([1, 2, 8]))  # splits where the match ends
    assert tree.drain_revoked() == [ticket]
    assert tree.drain_revoked() == []


def test_too_many_revocations_are_not_listed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(radix_matches, "MAX_REVOKED", 1)
    tree = tree_of([1, 2, 3, 4], [5, 6, 7])
    tree.track_revoked()
    for key in ([1, 2, 9], [1, 9], [5, 6, 9]):
        tree.match_len(k(key))
    tree.insert(k([1, 2, 8]))
    tree.insert(k([5, 6, 8]))
    assert tree.drain_revoked() is None
    assert tree.drain_revoked() == []
