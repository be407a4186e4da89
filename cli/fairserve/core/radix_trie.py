"""The shape under a :class:`~fairserve.core.radix.RadixTree`: nodes and the counts that follow it.

A :class:`Trie` owns the compressed nodes and everything that must change whenever a node
is added, split or detached: the token totals (all tokens, tokens per owner), the shape
version that invalidates remembered walks, and the index of eviction candidates. The tree
(local-cache operations) and its :class:`~fairserve.core.radix_owners.OwnerIndex` (owner
operations) both work on one trie through these methods; neither reaches into the other.

Nothing here points back at the tree or the owner index, so dropping a tree frees all of it
by reference counting (see :meth:`Trie.__del__`).
"""

from __future__ import annotations

from collections.abc import Iterator

from fairserve.core.radix_lru import LruIndex, OwnerLruIndex
from fairserve.core.radix_matches import MatchCache, revoke, revoke_all, revoke_inside
from fairserve.core.radix_node import Node, Owner, Walk, common_tokens
from fairserve.core.types import TOKEN_BYTES

WALK_MEMO_ENTRIES = 1024


class Trie:
    """Compressed token trie with per-owner token counts and a walk memo."""

    __slots__ = (
        "_walks",
        "_walks_shape",
        "lru",
        "matches",
        "owned",
        "owner_lru",
        "owner_tokens",
        "protected_tokens",
        "root",
        "shape",
        "total_tokens",
    )

    def __init__(self) -> None:
        self.root = Node(b"", None)
        self.total_tokens = 0
        self.protected_tokens = 0
        """Tokens in nodes some lock references: what eviction can never free."""
        self.owner_tokens: dict[Owner, int] = {}
        self.lru: LruIndex | None = None
        """Eviction candidates; built by the tree's first eviction, fed by every detach."""
        self.owner_lru: dict[Owner, OwnerLruIndex] = {}
        """Each owner's leaves, by last access; built by the owner's first LRU bound, fed
        by every insert for the owner and every node that loses the owner below its parent."""
        self.owned = True
        """Every node has an owner and none was ever locked (a pure global tree): removing
        an owner then prunes exactly the nodes it left ownerless, found in one pass."""
        self.shape = 0
        """Bumped whenever nodes are added, split or detached."""
        self._walks: dict[int, tuple[bytes, Walk]] = {}
        """Where matches ended, valid while the shape is ``_walks_shape``: a lock or an
        insert of a key just matched (a request admitted after its match, a dispatcher
        recording the key it matched) starts there instead of walking again.

        By the key object's identity (``id`` -> the key, kept alive by the entry, and its
        walk): the same object is asked again (a request's prompt key), and hashing a
        long prompt's fresh key costs ~4 us for 17 KB where nothing else hashes it. An
        equal key in another object walks again, to the same result."""
        self._walks_shape = 0
        self.matches = MatchCache()
        """Match lengths kept across batching steps (``core.radix_matches``): every shape
        change below revokes the ticket of the node where it happens."""

    def __del__(self) -> None:
        """Nodes point to their parents, so a dropped trie would be one reference cycle
        that only the cyclic garbage collector frees (a DLPM decision drops a small tree;
        collecting those dominated the collector's work in a simulated hour). Unlinking
        the parents lets reference counting free the nodes at once."""
        stack = [self.root]
        while stack:
            node = stack.pop()
            node.parent = None
            if node.inside is not None or node.ends is not None:
                revoke(node)  # a ticket and its node refer to each other
            stack.extend(node.children.values())

    # ------------------------------------------------------------------ walks
    def remember(self, key: bytes, walk: Walk) -> None:
        """Note where a match of ``key`` ended (see ``_walks``)."""
        walks = self._walks
        if self._walks_shape != self.shape or len(walks) >= WALK_MEMO_ENTRIES:
            walks.clear()
            self._walks_shape = self.shape
        walks[id(key)] = (key, walk)

    def recall(self, key: bytes) -> Walk | None:
        """Where a match of this ``key`` object ended, if the shape has not changed since."""
        if self._walks_shape != self.shape:
            return None
        entry = self._walks.get(id(key))
        return entry[1] if entry is not None and entry[0] is key else None

    def walk(self, key: bytes, owned: bool = False) -> Walk:
        """Where ``key``'s path leaves the tree (``owned``: leaves the nodes some owner
        holds): the deepest node whose whole edge the key covers, the bytes of the key it
        covers, and the child the key runs into part-way (None if none) with the tokens
        shared with it. The one walk down every query of the tree makes."""
        node, pos = self.root, 0
        n = len(key)
        startswith = key.startswith
        while pos < n:
            child = node.children.get(key[pos : pos + TOKEN_BYTES])
            if child is None or (owned and not child.owners):
                break
            edge = child.edge
            if startswith(edge, pos):
                pos += len(edge)
                node = child
                continue
            return node, pos, child, common_tokens(key, pos, edge)
        return node, pos, None, 0

    def walk_full_nodes(self, key: bytes, split_partial: bool = False) -> tuple[Node, int]:
        """Deepest node whose path is a prefix of ``key``; optionally split a partial edge."""
        node, pos, partial, shared = self.walk(key)
        if split_partial and partial is not None and shared:
            node = self.split(partial, shared)
            pos += len(node.edge)
        return node, pos // TOKEN_BYTES

    # ------------------------------------------------------------------ shape changes
    def split(self, child: Node, shared_tokens: int) -> Node:
        """Split ``child``'s edge after ``shared_tokens``; returns the new upper node."""
        cut = shared_tokens * TOKEN_BYTES
        parent = child.parent
        assert parent is not None
        self.shape += 1
        revoke_inside(child, self.matches.revoked)  # matches inside it may now end above
        upper = Node(child.edge[:cut], parent)
        upper.owners = set(child.owners)
        upper.ref = child.ref
        upper.last_access = child.last_access
        parent.children[child.edge[:TOKEN_BYTES]] = upper
        child.edge = child.edge[cut:]
        child.parent = upper
        upper.children[child.edge[:TOKEN_BYTES]] = child
        return upper

    def detach(self, node: Node) -> Node:
        """Cut ``node`` (and what hangs below it) off its parent; returns the parent.

        Only ``node``'s own tokens leave the totals: a caller detaching a subtree
        accounts for the nodes below it."""
        self.shape += 1
        parent = node.parent
        assert parent is not None
        revoked = self.matches.revoked
        revoke(node, revoked)
        if node.children:  # tickets below it too (also to free nodes and tickets at once)
            revoke_all(self.subtree(node), revoked)
        del parent.children[node.edge[:TOKEN_BYTES]]
        tokens = len(node.edge) // TOKEN_BYTES
        self.total_tokens -= tokens
        for owner in node.owners:
            self.owner_tokens[owner] -= tokens
        node.parent = None
        if parent is not self.root:
            if self.lru is not None:
                self.lru.push(parent)
            if node.owners and self.owner_lru:  # a local eviction of an owned leaf
                for owner in node.owners:
                    self.push_owner_leaf(parent, owner)
        return parent

    def push_owner_leaf(self, node: Node, owner: Owner) -> None:
        """``node`` may have become one of ``owner``'s leaves (for its kept LRU index)."""
        index = self.owner_lru.get(owner)
        if index is not None and node is not self.root:
            index.push(node)

    # ------------------------------------------------------------------ reading
    def full_key(self, node: Node) -> bytes:
        """The tokens from the root to the end of ``node``."""
        parts: list[bytes] = []
        root = self.root
        cur: Node | None = node
        while cur is not None and cur is not root:
            parts.append(cur.edge)
            cur = cur.parent
        parts.reverse()
        return b"".join(parts)

    def nodes(self) -> Iterator[Node]:
        """Every node, root excluded."""
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def subtree(self, top: Node) -> Iterator[Node]:
        """``top`` and every node below it."""
        stack = [top]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def path_to_root(self, node: Node) -> Iterator[Node]:
        """``node`` and its ancestors, root excluded."""
        cur: Node | None = node
        while cur is not None and cur is not self.root:
            yield cur
            cur = cur.parent
