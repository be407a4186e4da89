"""A lock probe (``RadixTree.probe_lock``, then ``lock_probed`` or ``release_probe``) leaves
the tree exactly as ``lock`` (then ``unlock``, for a refused admission) does.

The simulator decides an admission from what the lock would protect and, when it refuses,
only refreshes the path instead of locking and unlocking it (issue 23: hundreds of thousands
of refused attempts in an overloaded simulated hour). The LRU order decides which prefixes
are evicted, and with them every later match, so the two trees must agree on every node's
edge, references and last access, and on what each eviction takes.

The probing tree also asks ``match_len`` (its kept matches name the node a lock starts at);
its twin only walks (``match_len_walk``), so it locks as before the kept node existed.
"""

from __future__ import annotations

from hypothesis import assume
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, precondition, rule

from fairserve.core.radix import RadixTree
from tests.core.test_radix import STATEFUL, Tokens, k, near, walk


def shape(tree: RadixTree) -> list[tuple[Tokens, int, int]]:
    """Every node's path, references and last access, in path order."""
    return sorted((path, node.ref, node.last_access) for _, path, node in walk(tree))


class ProbeMachine(RuleBasedStateMachine):
    inserted = Bundle("inserted")
    asked = Bundle("asked")
    """Keys whose match was asked (kept by the probing tree): a host locks those."""

    def __init__(self) -> None:
        super().__init__()
        self.tree = RadixTree()  # probes, kept matches
        self.twin = RadixTree()  # lock and unlock, walks
        self.locks: list[Tokens] = []

    @rule(target=inserted, key=near(inserted))
    def insert(self, key: Tokens) -> Tokens:
        assert self.tree.insert(k(key)) == self.twin.insert(k(key))
        return key

    @rule(target=asked, query=near(inserted))
    def match(self, query: Tokens) -> Tokens:
        assert self.tree.match_len(k(query)) == self.twin.match_len_walk(k(query))
        return query

    @rule(query=near(inserted))
    def touch(self, query: Tokens) -> None:
        assert self.tree.touch(k(query)) == self.twin.touch(k(query))

    @rule(key=asked | near(inserted))
    def refused(self, key: Tokens) -> None:
        """An admission refused after measuring its lock.

        Only for a key that holds no lock already: with one, the twin's ``unlock`` releases
        the shortest lock on the key (another request's) and keeps the refused request's,
        while the probe leaves the admitted request's lock as it was and holds nothing for
        the refused one, which is what a refusal means. The simulator's records are equal
        either way on the pinned configurations (tests/sim/test_records_equivalence.py)."""
        assume(key not in self.locks)
        protected = self.twin.protected_tokens
        locked = self.twin.lock(k(key))
        fresh = self.twin.protected_tokens - protected
        self.twin.unlock(k(key))
        node, matched, would_protect = self.tree.probe_lock(k(key))
        self.tree.release_probe(node)
        assert (matched, would_protect) == (locked, fresh)

    @rule(key=asked | near(inserted))
    def admitted(self, key: Tokens) -> None:
        locked = self.twin.lock(k(key))
        node, matched, _ = self.tree.probe_lock(k(key))
        self.tree.lock_probed(k(key), node, matched)
        assert matched == locked
        self.locks.append(key)

    @precondition(lambda self: bool(self.locks))
    @rule(index=st.integers(0, 1000))
    def unlock(self, index: int) -> None:
        key = self.locks.pop(index % len(self.locks))
        self.tree.unlock(k(key))
        self.twin.unlock(k(key))

    @rule(num_tokens=st.integers(0, 24))
    def evict(self, num_tokens: int) -> None:
        assert self.tree.evict(num_tokens) == self.twin.evict(num_tokens)

    @invariant()
    def same_tree(self) -> None:
        assert shape(self.tree) == shape(self.twin)
        assert self.tree.protected_tokens == self.twin.protected_tokens
        assert self.tree.total_tokens == self.twin.total_tokens


TestProbe = ProbeMachine.TestCase
TestProbe.settings = STATEFUL


def test_a_refused_probe_refreshes_the_path_like_a_lock_and_unlock() -> None:
    """The prefix a refused admission matched is the most recently used: evicted last."""
    tree = RadixTree()
    old, new = k([1, 2, 3]), k([5, 6, 7])
    tree.insert(old)
    tree.insert(new)
    node, matched, fresh = tree.probe_lock(k([1, 2, 3, 4]))
    assert (matched, fresh) == (3, 3)
    tree.release_probe(node)
    assert tree.protected_tokens == 0
    assert tree.evict(1) == [new]
