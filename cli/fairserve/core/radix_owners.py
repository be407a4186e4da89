"""The owner half of a :class:`~fairserve.core.radix.RadixTree`: who caches which prefix.

A dispatcher's tree records, per node, the workers (*owners*) whose cache holds that
prefix. A child's owners are a subset of its parent's (a worker that caches a prefix caches
every shorter prefix of it); nodes left without owners are pruned. The tree owns one
:class:`OwnerIndex` over its :class:`~fairserve.core.radix_trie.Trie` and answers its owner
queries through it.
"""

from __future__ import annotations

from fairserve.core.errors import ConfigError
from fairserve.core.radix_lru import OwnerLruIndex
from fairserve.core.radix_node import Node, Owner, OwnerMatch
from fairserve.core.radix_trie import Trie
from fairserve.core.types import TOKEN_BYTES


class OwnerIndex:
    """Owner queries and removal over one trie (the trie keeps the per-owner counts)."""

    __slots__ = ("_trie",)

    def __init__(self, trie: Trie) -> None:
        self._trie = trie

    def match(self, key: bytes) -> OwnerMatch:
        """Longest prefix of ``key`` held by some owner, and all owners holding it."""
        # The owners are copied once, at the end: a set per edge walked would dominate.
        trie = self._trie
        walk = trie.walk(key, owned=True)
        node, pos, partial, shared = walk
        if partial is not None:
            trie.remember(key, walk)
            return OwnerMatch(pos // TOKEN_BYTES + shared, frozenset(partial.owners))
        if key[pos : pos + TOKEN_BYTES] not in node.children:  # ended on the tree's shape,
            trie.remember(key, walk)  # not on owners: where a lock or insert would start
        return OwnerMatch(pos // TOKEN_BYTES, frozenset(node.owners))

    def tokens(self, owner: Owner) -> int:
        """Tokens the tree records as cached by ``owner``."""
        return self._trie.owner_tokens.get(owner, 0)

    def holders(self) -> list[Owner]:
        """Owners that hold at least one token."""
        return [o for o, t in self._trie.owner_tokens.items() if t > 0]

    def remove(self, key: bytes, owner: Owner) -> int:
        """Apply an eviction event: ``owner`` no longer caches ``key`` nor anything below it.

        Returns the owner's tokens removed. Nodes left without owners are pruned."""
        node, matched = self._trie.walk_full_nodes(key, split_partial=True)
        if matched * TOKEN_BYTES < len(key):
            return 0  # the tree does not hold all of key: nothing of it to remove
        if node is self._trie.root:
            return self.remove_everywhere(owner)
        return self._drop_owner_subtree(node, owner)

    def remove_everywhere(self, owner: Owner) -> int:
        """Forget everything ``owner`` caches (a worker restarted or was removed)."""
        self._trie.owner_lru.pop(owner, None)  # nothing left to index
        return sum(
            self._drop_owner_subtree(child, owner)
            for child in list(self._trie.root.children.values())
        )

    def evict_lru(self, owner: Owner, max_tokens: int, *, keys: bool = True) -> list[bytes]:
        """Approximate an owner's LRU cache bound: drop its LRU leaves until it holds at most
        ``max_tokens`` tokens. Returns the removed prefixes (with ``keys``; else nothing).

        The leaves come from the owner's kept index (``Trie.owner_lru``), built here the
        first time the owner is over its bound and fed by every change since, so a bound
        does not walk the owner's whole subtree; the order is the same: least
        ``(last_access, id)`` first among the owner's current leaves."""
        if max_tokens < 0:
            raise ConfigError(f"max_tokens must be >= 0, got {max_tokens}")
        removed: list[bytes] = []
        if self.tokens(owner) <= max_tokens:
            return removed
        trie = self._trie
        index = trie.owner_lru.get(owner)
        if index is None:
            index = trie.owner_lru[owner] = OwnerLruIndex(owner, trie.root)
        elif index.stale:
            index.rebuild(trie.root)
        while self.tokens(owner) > max_tokens:
            leaf = index.pop()
            if leaf is None:
                break
            if keys:
                removed.append(trie.full_key(leaf))
            self._drop_owner_subtree(leaf, owner)  # pushes the parent if now a leaf
        return removed

    def _is_owner_leaf(self, node: Node | None, owner: Owner) -> bool:
        """True when ``owner`` holds ``node`` but none of its children."""
        if node is None or node is self._trie.root or owner not in node.owners:
            return False
        return not any(owner in c.owners for c in node.children.values())

    def _drop_owner_subtree(self, top: Node, owner: Owner) -> int:
        """Drop ``owner`` from ``top`` and below; its parent may become an owner leaf."""
        parent = top.parent
        if self._trie.owned:
            removed = self._drop_owner_owned(top, owner)
        else:
            removed = self._drop_owner_general(top, owner)
        if owner in self._trie.owner_lru and self._is_owner_leaf(parent, owner):
            assert parent is not None
            self._trie.push_owner_leaf(parent, owner)
        return removed

    def _drop_owner_general(self, top: Node, owner: Owner) -> int:
        """``_drop_owner_subtree`` for a tree that may hold locked or ownerless nodes."""
        removed = 0
        stack = [top]
        while stack:
            node = stack.pop()
            if owner not in node.owners:
                continue
            node.owners.discard(owner)
            self._trie.owner_tokens[owner] -= node.tokens
            removed += node.tokens
            stack.extend(node.children.values())
        self._prune_ownerless(top)
        return removed

    def _drop_owner_owned(self, top: Node, owner: Owner) -> int:
        """``_drop_owner_subtree`` for a pure global tree: no locks, and no ownerless node
        outlives an update, so (children's owners being subsets of their parent's) the
        nodes left ownerless are whole subtrees below the owner's own nodes."""
        owners = top.owners
        if not top.children and owner in owners:  # the usual event: one leaf
            owners.discard(owner)
            removed = len(top.edge) // TOKEN_BYTES
            self._trie.owner_tokens[owner] -= removed
            if not owners:
                self._trie.detach(top)
            return removed
        removed_bytes = inside_bytes = 0
        tops: list[Node] = []
        stack = [top]
        while stack:
            node = stack.pop()
            owners = node.owners
            if owner not in owners:
                continue
            owners.discard(owner)
            removed_bytes += len(node.edge)
            stack.extend(node.children.values())
            if not owners:
                parent = node.parent
                if node is not top and parent is not None and not parent.owners:
                    inside_bytes += len(node.edge)  # goes with an ownerless ancestor
                    node.parent = None  # no cycle left for the garbage collector
                else:
                    tops.append(node)
        removed = removed_bytes // TOKEN_BYTES
        if removed:
            self._trie.owner_tokens[owner] -= removed
        self._trie.total_tokens -= inside_bytes // TOKEN_BYTES
        for node in tops:
            self._trie.detach(node)
        return removed

    def _prune_ownerless(self, top: Node) -> None:
        """Remove ownerless, unreferenced subtrees at or below ``top`` (global-tree mode)."""
        stack = [top]
        while stack:
            node = stack.pop()
            if node.owners or node.ref > 0 or node.parent is None:
                stack.extend(node.children.values())
                continue
            if self._trie.protected_tokens and any(n.ref > 0 for n in self._trie.subtree(node)):
                stack.extend(node.children.values())
                continue
            if node.children:
                for n in self._trie.subtree(node):
                    if n is not node:
                        self._trie.total_tokens -= n.tokens
                        n.parent = None  # detached with it; no cycle left for the GC
            self._trie.detach(node)
