"""A token radix tree: prefix cache of one worker, or the global tree of a dispatcher.

Keys are token keys (``bytes``, 4 bytes per token, see :mod:`fairserve.core.types`), so edge
comparisons are ``bytes.startswith`` calls that run as ``memcmp`` in C.

One structure serves both uses in DESIGN §3:

* a worker's **local prefix cache**: ``insert`` / ``match_len``; ``lock`` a matched path while
  a request uses it (reference counts, so in-use prefixes are never evicted); ``evict`` frees
  tokens from least-recently-used unreferenced leaves and reports the evicted prefixes
  (the eviction events a router prunes its global tree with);
* a dispatcher's **global tree**: every node keeps the set of *owners* (workers) whose cache
  holds that prefix; ``match_owners`` returns the longest prefix held by any worker and the
  workers that hold it; ``remove_owner`` applies an eviction event; ``evict_owner_lru``
  bounds an owner's share when workers report no evictions.

Invariant: a child's owners are a subset of its parent's owners (a worker that caches a
prefix caches every shorter prefix of it).
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterator
from dataclasses import dataclass

from fairserve.core.errors import ConfigError
from fairserve.core.radix_lru import LruIndex
from fairserve.core.types import TOKEN_BYTES

Owner = Hashable


class _Node:
    """One compressed edge: ``edge`` holds the tokens from the parent to this node."""

    __slots__ = ("children", "edge", "last_access", "owners", "parent", "ref")

    def __init__(self, edge: bytes, parent: _Node | None) -> None:
        self.edge = edge
        self.parent = parent
        self.children: dict[bytes, _Node] = {}
        self.owners: set[Owner] = set()
        self.ref = 0
        self.last_access = 0

    @property
    def tokens(self) -> int:
        return len(self.edge) // TOKEN_BYTES


@dataclass(frozen=True, slots=True)
class OwnerMatch:
    """Longest prefix of a key held by any owner, and the owners that hold all of it."""

    tokens: int
    owners: frozenset[Owner]


def _check_key(key: bytes) -> None:
    if len(key) % TOKEN_BYTES:
        raise ConfigError(f"token key length {len(key)} is not a multiple of {TOKEN_BYTES}")


def _common_tokens(key: bytes, pos: int, edge: bytes) -> int:
    """Number of whole tokens shared by ``key[pos:]`` and ``edge`` (binary search on memcmp)."""
    lo, hi = 0, min(len(edge), len(key) - pos) // TOKEN_BYTES
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if key.startswith(edge[: mid * TOKEN_BYTES], pos):
            lo = mid
        else:
            hi = mid - 1
    return lo


class RadixTree:
    """Radix tree over token keys with owners, reference counts and LRU eviction."""

    def __init__(self) -> None:
        self._root = _Node(b"", None)
        self._tick = 0
        self.total_tokens = 0
        self.protected_tokens = 0
        """Tokens in nodes some lock references: what ``evict`` can never free."""
        self._owner_tokens: dict[Owner, int] = {}
        self._locks: dict[bytes, list[int]] = {}  # key -> tokens each of its locks took
        self._lru: LruIndex | None = None  # built by the first eviction

    # ------------------------------------------------------------------ queries
    def match_len(self, key: bytes) -> int:
        """Tokens of ``key`` present in the tree (longest prefix match), without touching LRU."""
        node, pos = self._root, 0
        n = len(key)
        while pos < n:
            child = node.children.get(key[pos : pos + TOKEN_BYTES])
            if child is None:
                break
            if key.startswith(child.edge, pos):
                pos += len(child.edge)
                node = child
                continue
            return pos // TOKEN_BYTES + _common_tokens(key, pos, child.edge)
        return pos // TOKEN_BYTES

    def match_owners(self, key: bytes) -> OwnerMatch:
        """Longest prefix of ``key`` held by some owner, and all owners holding it."""
        # The owners are copied once, at the end: a set per edge walked would dominate.
        node, pos = self._root, 0
        n = len(key)
        while pos < n:
            child = node.children.get(key[pos : pos + TOKEN_BYTES])
            if child is None or not child.owners:
                break
            if key.startswith(child.edge, pos):
                pos += len(child.edge)
                node = child
                continue
            shared = _common_tokens(key, pos, child.edge)
            return OwnerMatch(pos // TOKEN_BYTES + shared, frozenset(child.owners))
        return OwnerMatch(pos // TOKEN_BYTES, frozenset(node.owners))

    def owner_tokens(self, owner: Owner) -> int:
        """Tokens the tree records as cached by ``owner``."""
        return self._owner_tokens.get(owner, 0)

    def owners(self) -> list[Owner]:
        """Owners that hold at least one token."""
        return [o for o, t in self._owner_tokens.items() if t > 0]

    def evictable_tokens(self) -> int:
        """Tokens in nodes that no request references (what ``evict`` could free)."""
        return self.total_tokens - self.protected_tokens

    def node_count(self) -> int:
        """Number of nodes, root excluded (for tests and diagnostics)."""
        return sum(1 for _ in self._iter_nodes())

    # ------------------------------------------------------------------ updates
    def insert(self, key: bytes, owner: Owner | None = None) -> int:
        """Insert ``key``; with ``owner``, record that the owner caches all of it.

        Returns the number of tokens newly added to the tree (not already present)."""
        _check_key(key)
        self._tick += 1
        node, pos, added = self._root, 0, 0
        while pos < len(key):
            head = key[pos : pos + TOKEN_BYTES]
            child = node.children.get(head)
            if child is None:
                child = _Node(key[pos:], node)
                node.children[head] = child
                added += child.tokens
                self.total_tokens += child.tokens
                pos = len(key)
            elif key.startswith(child.edge, pos):
                pos += len(child.edge)
            else:
                child = self._split(child, _common_tokens(key, pos, child.edge))
                pos += len(child.edge)
            child.last_access = self._tick
            if owner is not None and owner not in child.owners:
                child.owners.add(owner)
                self._owner_tokens[owner] = self._owner_tokens.get(owner, 0) + child.tokens
            node = child
        if self._lru is not None and node is not self._root:
            self._lru.push(node)
        return added

    def touch(self, key: bytes) -> int:
        """Mark the matched prefix of ``key`` as just used (LRU); returns its length.

        A match that ends inside an edge splits it there, so exactly the used prefix is
        refreshed and the returned length equals ``match_len``."""
        self._tick += 1
        node, matched = self._walk_full_nodes(key, split_partial=True)
        for cur in self._path_to_root(node):
            cur.last_access = self._tick
        if self._lru is not None and node is not self._root:
            self._lru.push(node)
        return matched

    def lock(self, key: bytes) -> int:
        """Protect the matched prefix of ``key`` from eviction; returns the tokens locked.

        Pair every ``lock`` with an ``unlock`` of the same key (also when it locked 0
        tokens). Locked nodes are never evicted or pruned, so the locked path keeps its
        node boundaries until the unlock; insertions below it are fine."""
        node, matched = self._walk_full_nodes(key, split_partial=True)
        self._locks.setdefault(key, []).append(matched)
        self._tick += 1
        for cur in self._path_to_root(node):
            if cur.ref == 0:
                self.protected_tokens += cur.tokens
            cur.ref += 1
            cur.last_access = self._tick
        return matched

    def unlock(self, key: bytes) -> None:
        """Release a ``lock`` taken on ``key``.

        The tree may have grown below the locked prefix since the lock (the host inserted
        the computed prompt), so the tree remembers how many tokens each lock took and
        releases exactly those; of several locks on one key it releases the shortest, which
        keeps the longer ones protected. Raises ConfigError when ``key`` holds no lock."""
        counts = self._locks.get(key)
        if not counts:
            raise ConfigError("unlock without a matching lock")
        tokens = min(counts)
        counts.remove(tokens)
        if not counts:
            del self._locks[key]
        node, _ = self._walk_full_nodes(key[: tokens * TOKEN_BYTES])
        for cur in self._path_to_root(node):
            cur.ref -= 1
            if cur.ref == 0:
                self.protected_tokens -= cur.tokens
                if self._lru is not None:
                    self._lru.push(cur)

    def evict(self, num_tokens: int) -> list[bytes]:
        """Free at least ``num_tokens`` from LRU unreferenced leaves (or all that can go).

        Returns the full keys of the evicted nodes: the eviction events of this cache."""
        if self._lru is None:
            self._lru = LruIndex(self._iter_nodes())
        elif self._lru.needs_compaction():
            self._lru.rebuild(self._iter_nodes())
        freed, evicted = 0, []
        while freed < num_tokens:
            leaf = self._lru.pop()
            if leaf is None:
                break
            assert isinstance(leaf, _Node)
            evicted.append(self._full_key(leaf))
            freed += leaf.tokens
            self._detach(leaf)  # pushes the parent if it became a candidate
        return evicted

    def remove_owner(self, key: bytes, owner: Owner) -> int:
        """Apply an eviction event: ``owner`` no longer caches ``key`` nor anything below it.

        Returns the owner's tokens removed. Nodes left without owners are pruned."""
        node, pos = self._root, 0
        while pos < len(key):
            child = node.children.get(key[pos : pos + TOKEN_BYTES])
            if child is None:
                return 0
            if key.startswith(child.edge, pos):
                pos += len(child.edge)
                node = child
                continue
            shared = _common_tokens(key, pos, child.edge)
            if shared == 0:
                return 0
            node = self._split(child, shared)
            pos += len(node.edge)
        if node is self._root:
            return self.remove_owner_everywhere(owner)
        return self._drop_owner_subtree(node, owner)

    def remove_owner_everywhere(self, owner: Owner) -> int:
        """Forget everything ``owner`` caches (a worker restarted or was removed)."""
        return sum(
            self._drop_owner_subtree(child, owner) for child in list(self._root.children.values())
        )

    def evict_owner_lru(self, owner: Owner, max_tokens: int) -> list[bytes]:
        """Approximate an owner's LRU cache bound: drop its LRU leaves until it holds at most
        ``max_tokens`` tokens. Returns the removed prefixes."""
        if max_tokens < 0:
            raise ConfigError(f"max_tokens must be >= 0, got {max_tokens}")
        removed: list[bytes] = []
        if self.owner_tokens(owner) <= max_tokens:
            return removed
        heap = [(n.last_access, id(n), n) for n in self._owner_leaves(owner)]
        heapq.heapify(heap)
        while heap and self.owner_tokens(owner) > max_tokens:
            _, _, leaf = heapq.heappop(heap)
            if owner not in leaf.owners or any(owner in c.owners for c in leaf.children.values()):
                continue
            removed.append(self._full_key(leaf))
            parent = leaf.parent
            self._drop_owner_subtree(leaf, owner)
            if self._is_owner_leaf(parent, owner):
                assert parent is not None
                heapq.heappush(heap, (parent.last_access, id(parent), parent))
        return removed

    # ------------------------------------------------------------------ internals
    def _iter_nodes(self) -> Iterator[_Node]:
        stack = list(self._root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def _owner_leaves(self, owner: Owner) -> Iterator[_Node]:
        stack = [c for c in self._root.children.values() if owner in c.owners]
        while stack:
            node = stack.pop()
            below = [c for c in node.children.values() if owner in c.owners]
            if below:
                stack.extend(below)
            else:
                yield node

    def _is_owner_leaf(self, node: _Node | None, owner: Owner) -> bool:
        """True when ``owner`` holds ``node`` but none of its children."""
        if node is None or node is self._root or owner not in node.owners:
            return False
        return not any(owner in c.owners for c in node.children.values())

    def _path_to_root(self, node: _Node) -> Iterator[_Node]:
        """``node`` and its ancestors, root excluded."""
        cur: _Node | None = node
        while cur is not None and cur is not self._root:
            yield cur
            cur = cur.parent

    def _walk_full_nodes(self, key: bytes, split_partial: bool = False) -> tuple[_Node, int]:
        """Deepest node whose path is a prefix of ``key``; optionally split a partial edge."""
        node, pos = self._root, 0
        while pos < len(key):
            child = node.children.get(key[pos : pos + TOKEN_BYTES])
            if child is None:
                break
            if key.startswith(child.edge, pos):
                pos += len(child.edge)
                node = child
                continue
            shared = _common_tokens(key, pos, child.edge)
            if split_partial and shared:
                node = self._split(child, shared)
                pos += len(node.edge)
            break
        return node, pos // TOKEN_BYTES

    def _split(self, child: _Node, shared_tokens: int) -> _Node:
        """Split ``child``'s edge after ``shared_tokens``; returns the new upper node."""
        cut = shared_tokens * TOKEN_BYTES
        parent = child.parent
        assert parent is not None
        upper = _Node(child.edge[:cut], parent)
        upper.owners = set(child.owners)
        upper.ref = child.ref
        upper.last_access = child.last_access
        parent.children[child.edge[:TOKEN_BYTES]] = upper
        child.edge = child.edge[cut:]
        child.parent = upper
        upper.children[child.edge[:TOKEN_BYTES]] = child
        return upper

    def _detach(self, node: _Node) -> _Node:
        parent = node.parent
        assert parent is not None
        del parent.children[node.edge[:TOKEN_BYTES]]
        self.total_tokens -= node.tokens
        for owner in node.owners:
            self._owner_tokens[owner] -= node.tokens
        node.parent = None
        if self._lru is not None and parent is not self._root:
            self._lru.push(parent)
        return parent

    def _drop_owner_subtree(self, top: _Node, owner: Owner) -> int:
        removed = 0
        stack = [top]
        while stack:
            node = stack.pop()
            if owner not in node.owners:
                continue
            node.owners.discard(owner)
            self._owner_tokens[owner] -= node.tokens
            removed += node.tokens
            stack.extend(node.children.values())
        self._prune_ownerless(top)
        return removed

    def _prune_ownerless(self, top: _Node) -> None:
        """Remove ownerless, unreferenced subtrees at or below ``top`` (global-tree mode)."""
        stack = [top]
        while stack:
            node = stack.pop()
            if node.owners or node.ref > 0 or node.parent is None:
                stack.extend(node.children.values())
                continue
            if any(n.ref > 0 for n in self._subtree(node)):
                stack.extend(node.children.values())
                continue
            for n in self._subtree(node):
                if n is not node:
                    self.total_tokens -= n.tokens
            self._detach(node)

    def _subtree(self, top: _Node) -> Iterator[_Node]:
        stack = [top]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def _full_key(self, node: _Node) -> bytes:
        parts: list[bytes] = []
        cur: _Node | None = node
        while cur is not None and cur is not self._root:
            parts.append(cur.edge)
            cur = cur.parent
        return b"".join(reversed(parts))
