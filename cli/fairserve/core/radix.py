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

from collections.abc import Iterator

from fairserve.core.errors import ConfigError
from fairserve.core.radix_lru import LruIndex
from fairserve.core.radix_node import Node, Owner, OwnerMatch, Walk, check_key, common_tokens
from fairserve.core.radix_owners import OwnerIndex
from fairserve.core.types import TOKEN_BYTES

__all__ = ["Node", "Owner", "OwnerMatch", "RadixTree"]

WALK_MEMO_ENTRIES = 1024


class RadixTree(OwnerIndex):
    """Radix tree over token keys with owners, reference counts and LRU eviction."""

    def __init__(self) -> None:
        self._root = Node(b"", None)
        self._tick = 0
        self.total_tokens = 0
        self.protected_tokens = 0
        """Tokens in nodes some lock references: what ``evict`` can never free."""
        self._owner_tokens: dict[Owner, int] = {}
        self._locks: dict[bytes, list[tuple[int, Node]]] = {}
        """key -> (tokens, deepest node) each of its locks took."""
        self._lru: LruIndex | None = None  # built by the first eviction
        self._owned = True
        """Every node has an owner and none was ever locked (a pure global tree): removing
        an owner then prunes exactly the nodes it left ownerless, found in one pass."""
        self._shape = 0
        """Bumped whenever nodes are added, split or detached."""
        self._walks: dict[bytes, Walk] = {}
        """Where matches ended, valid while the shape is ``_walks_shape``: a lock or an
        insert of a key just matched (a request admitted after its match, a dispatcher
        recording the key it matched) starts there instead of walking again."""
        self._walks_shape = 0

    def __del__(self) -> None:
        """Nodes point to their parents, so a dropped tree would be one reference cycle
        that only the cyclic garbage collector frees (a DLPM decision drops a small tree;
        collecting those dominated the collector's work in a simulated hour). Unlinking
        the parents lets reference counting free the nodes at once."""
        stack = [self._root]
        while stack:
            node = stack.pop()
            node.parent = None
            stack.extend(node.children.values())

    # ------------------------------------------------------------------ queries
    def match_len(self, key: bytes) -> int:
        """Tokens of ``key`` present in the tree (longest prefix match), without touching LRU."""
        node, pos = self._root, 0
        n = len(key)
        startswith = key.startswith
        while pos < n:
            child = node.children.get(key[pos : pos + TOKEN_BYTES])
            if child is None:
                break
            edge = child.edge
            if startswith(edge, pos):
                pos += len(edge)
                node = child
                continue
            shared = common_tokens(key, pos, edge)
            self._remember(key, (node, pos, child, shared))
            return pos // TOKEN_BYTES + shared
        self._remember(key, (node, pos, None, 0))
        return pos // TOKEN_BYTES

    def evictable_tokens(self) -> int:
        """Tokens in nodes that no request references (what ``evict`` could free)."""
        return self.total_tokens - self.protected_tokens

    def node_count(self) -> int:
        """Number of nodes, root excluded (for tests and diagnostics)."""
        return sum(1 for _ in self._iter_nodes())

    # ------------------------------------------------------------------ updates
    def insert(
        self, key: bytes, owner: Owner | None = None, *, from_lock: bytes | None = None
    ) -> int:
        """Insert ``key``; with ``owner``, record that the owner caches all of it.

        ``from_lock``, a prefix of ``key`` that holds a lock, starts the walk at the locked
        node instead of the root (the same result: a request's cached prompt is locked, so
        caching prompt + output need not compare the prompt again).

        Returns the number of tokens newly added to the tree (not already present)."""
        return self._insert(key, owner, from_lock)[1]

    def insert_locked(self, key: bytes, *, from_lock: bytes | None = None) -> int:
        """``insert(key)`` then ``lock(key)`` with a single walk down the tree (a prompt
        whose prefill completed joins the cache, locked while its request runs)."""
        node, added = self._insert(key, None, from_lock)
        self._lock_path(key, node, len(key) // TOKEN_BYTES)
        return added

    def _insert(
        self, key: bytes, owner: Owner | None, from_lock: bytes | None = None
    ) -> tuple[Node, int]:
        """Insert; returns the node ending where ``key`` ends and the tokens added."""
        n = len(key)
        if n % TOKEN_BYTES:
            check_key(key)
        if owner is None and n:
            self._owned = False
        self._tick += 1
        tick = self._tick
        node, pos, added = self._root, 0, 0
        walk = self._locked_start(key, from_lock) if from_lock is not None else self._recall(key)
        if walk is not None:
            node, pos, partial, shared = walk
            self._claim_path(node, tick, owner)  # as a walk from the root would
            if partial is not None:
                node = self._split(partial, shared)
                pos += len(node.edge)
                self._claim_path(node, tick, owner, up_to=node.parent)
        startswith = key.startswith
        while pos < n:  # the simulator's hottest walk: kept free of calls where it can be
            head = key[pos : pos + TOKEN_BYTES]
            child = node.children.get(head)
            if child is None:
                child = Node(key[pos:], node)
                node.children[head] = child
                self._shape += 1
                added = (n - pos) // TOKEN_BYTES
                self.total_tokens += added
                pos = n
            elif startswith(child.edge, pos):
                pos += len(child.edge)
            else:
                child = self._split(child, common_tokens(key, pos, child.edge))
                pos += len(child.edge)
            child.last_access = tick
            if owner is not None and owner not in child.owners:
                child.owners.add(owner)
                tokens = len(child.edge) // TOKEN_BYTES
                self._owner_tokens[owner] = self._owner_tokens.get(owner, 0) + tokens
            node = child
        if self._lru is not None and node is not self._root:
            self._lru.push(node)
        return node, added

    def _locked_start(self, key: bytes, locked_key: bytes) -> Walk:
        """The deepest node a lock on ``locked_key`` holds, and where it ends in ``key``.
        Locked nodes are never detached, and a split above one keeps it ending where it
        ended, so its path is still ``locked_key``'s prefix."""
        locks = self._locks.get(locked_key)
        if not locks or not key.startswith(locked_key):
            raise ConfigError("insert from_lock needs a locked prefix of the key")
        tokens, node = locks[0] if len(locks) == 1 else max(locks, key=lambda lk: lk[0])
        return node, tokens * TOKEN_BYTES, None, 0

    def _claim_path(
        self, node: Node, tick: int, owner: Owner | None, up_to: Node | None = None
    ) -> None:
        """What an insert's walk does to each node it passes, for ``node`` and its
        ancestors below ``up_to`` (the root by default): refresh, and add ``owner``."""
        stop = self._root if up_to is None else up_to
        cur = node
        while cur is not stop:
            cur.last_access = tick
            if owner is not None and owner not in cur.owners:
                cur.owners.add(owner)
                tokens = len(cur.edge) // TOKEN_BYTES
                self._owner_tokens[owner] = self._owner_tokens.get(owner, 0) + tokens
            cur = cur.parent  # type: ignore[assignment]

    def _remember(self, key: bytes, walk: Walk) -> None:
        walks = self._walks
        if self._walks_shape != self._shape or len(walks) >= WALK_MEMO_ENTRIES:
            walks.clear()
            self._walks_shape = self._shape
        walks[key] = walk

    def _recall(self, key: bytes) -> Walk | None:
        """Where a match of ``key`` ended, if the tree's shape has not changed since."""
        if self._walks_shape != self._shape:
            return None
        return self._walks.get(key)

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
        walk = self._recall(key)
        if walk is None:
            node, matched = self._walk_full_nodes(key, split_partial=True)
        else:
            node, pos, partial, shared = walk
            if partial is not None:
                node = self._split(partial, shared)
                pos += len(node.edge)
            matched = pos // TOKEN_BYTES
        self._lock_path(key, node, matched)
        return matched

    def _lock_path(self, key: bytes, node: Node, matched: int) -> None:
        """Take a lock on ``key`` that covers ``node`` (ending at ``matched`` tokens) and
        its ancestors."""
        self._owned = False
        locks = self._locks.get(key)
        if locks is None:
            self._locks[key] = [(matched, node)]
        else:
            locks.append((matched, node))
        self._tick += 1
        tick, root, protected = self._tick, self._root, 0
        cur = node
        while cur is not root:
            if cur.ref == 0:
                protected += len(cur.edge)
            cur.ref += 1
            cur.last_access = tick
            cur = cur.parent  # type: ignore[assignment]
        self.protected_tokens += protected // TOKEN_BYTES

    def unlock(self, key: bytes) -> None:
        """Release a ``lock`` taken on ``key``.

        The tree may have grown below the locked prefix since the lock (the host inserted
        the computed prompt), so the tree remembers how many tokens each lock took and
        releases exactly those; of several locks on one key it releases the shortest, which
        keeps the longer ones protected. Raises ConfigError when ``key`` holds no lock."""
        locks = self._locks.get(key)
        if not locks:
            raise ConfigError("unlock without a matching lock")
        if len(locks) == 1:
            node = locks.pop()[1]
            del self._locks[key]
        else:
            shortest = min(range(len(locks)), key=lambda i: locks[i][0])
            node = locks.pop(shortest)[1]
        # The locked node is still the one ending where the lock ended: locked nodes are
        # never detached, and a split above one keeps it below the new upper node.
        root, lru, freed = self._root, self._lru, 0
        cur = node
        while cur is not root:
            cur.ref -= 1
            if cur.ref == 0:
                freed += len(cur.edge)
                if lru is not None:
                    lru.push(cur)
            cur = cur.parent  # type: ignore[assignment]
        self.protected_tokens -= freed // TOKEN_BYTES

    def evict(self, num_tokens: int) -> list[bytes]:
        """Free at least ``num_tokens`` from LRU unreferenced leaves (or all that can go).

        Returns the full keys of the evicted nodes: the eviction events of this cache."""
        if self._lru is None:
            self._lru = LruIndex(self._iter_nodes())
        elif self._lru.needs_compaction():
            self._lru.rebuild(self._iter_nodes())
        freed, evicted = 0, []
        pop = self._lru.pop
        while freed < num_tokens:
            leaf = pop()
            if leaf is None:
                break
            assert isinstance(leaf, Node)
            evicted.append(self._full_key(leaf))
            freed += len(leaf.edge) // TOKEN_BYTES
            self._detach(leaf)  # pushes the parent if it became a candidate
        return evicted

    # ------------------------------------------------------------------ internals
    def _iter_nodes(self) -> Iterator[Node]:
        stack = list(self._root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def _path_to_root(self, node: Node) -> Iterator[Node]:
        """``node`` and its ancestors, root excluded."""
        cur: Node | None = node
        while cur is not None and cur is not self._root:
            yield cur
            cur = cur.parent

    def _walk_full_nodes(self, key: bytes, split_partial: bool = False) -> tuple[Node, int]:
        """Deepest node whose path is a prefix of ``key``; optionally split a partial edge."""
        node, pos = self._root, 0
        n = len(key)
        startswith = key.startswith
        while pos < n:
            child = node.children.get(key[pos : pos + TOKEN_BYTES])
            if child is None:
                break
            edge = child.edge
            if startswith(edge, pos):
                pos += len(edge)
                node = child
                continue
            shared = common_tokens(key, pos, edge)
            if split_partial and shared:
                node = self._split(child, shared)
                pos += len(node.edge)
            break
        return node, pos // TOKEN_BYTES

    def _split(self, child: Node, shared_tokens: int) -> Node:
        """Split ``child``'s edge after ``shared_tokens``; returns the new upper node."""
        cut = shared_tokens * TOKEN_BYTES
        parent = child.parent
        assert parent is not None
        self._shape += 1
        upper = Node(child.edge[:cut], parent)
        upper.owners = set(child.owners)
        upper.ref = child.ref
        upper.last_access = child.last_access
        parent.children[child.edge[:TOKEN_BYTES]] = upper
        child.edge = child.edge[cut:]
        child.parent = upper
        upper.children[child.edge[:TOKEN_BYTES]] = child
        return upper

    def _detach(self, node: Node) -> Node:
        self._shape += 1
        parent = node.parent
        assert parent is not None
        del parent.children[node.edge[:TOKEN_BYTES]]
        tokens = len(node.edge) // TOKEN_BYTES
        self.total_tokens -= tokens
        for owner in node.owners:
            self._owner_tokens[owner] -= tokens
        node.parent = None
        if self._lru is not None and parent is not self._root:
            self._lru.push(parent)
        return parent

    def _full_key(self, node: Node) -> bytes:
        parts: list[bytes] = []
        root = self._root
        cur: Node | None = node
        while cur is not None and cur is not root:
            parts.append(cur.edge)
            cur = cur.parent
        parts.reverse()
        return b"".join(parts)
