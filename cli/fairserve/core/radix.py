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

from collections.abc import Mapping

from fairserve.core.errors import ConfigError
from fairserve.core.radix_lru import LruIndex
from fairserve.core.radix_matches import INSIDE
from fairserve.core.radix_node import (
    Node,
    Owner,
    OwnerMatch,
    Ticket,
    Walk,
    check_key,
    common_tokens,
)
from fairserve.core.radix_owners import OwnerIndex
from fairserve.core.radix_trie import Trie
from fairserve.core.types import TOKEN_BYTES

__all__ = ["Node", "Owner", "OwnerMatch", "RadixTree"]


class RadixTree:
    """Radix tree over token keys with owners, reference counts and LRU eviction.

    Made of parts: the :class:`~fairserve.core.radix_trie.Trie` (nodes and the counts that
    follow their shape, the LRU index of eviction candidates among them), an
    :class:`~fairserve.core.radix_owners.OwnerIndex` over it (the owner queries below
    delegate to it), and here the local-cache operations: insert, lock, touch, evict."""

    def __init__(self) -> None:
        self._trie = Trie()
        self._owners = OwnerIndex(self._trie)
        self._root = self._trie.root
        self._tick = 0
        self._kept = self._trie.matches.kept
        self._locks: dict[bytes, list[tuple[int, Node]]] = {}
        """key -> (tokens, deepest node) each of its locks took."""

    @property
    def total_tokens(self) -> int:
        """Tokens in the tree."""
        return self._trie.total_tokens

    @property
    def protected_tokens(self) -> int:
        """Tokens in nodes some lock references: what ``evict`` can never free."""
        return self._trie.protected_tokens

    @property
    def _lru(self) -> LruIndex | None:
        """The trie's eviction candidates; None until the first eviction (or to rebuild)."""
        return self._trie.lru

    @_lru.setter
    def _lru(self, lru: LruIndex | None) -> None:
        self._trie.lru = lru

    # ------------------------------------------------------------------ queries
    def match_len(self, key: bytes) -> int:
        """Tokens of ``key`` present in the tree (longest prefix match), without touching LRU.

        Kept across calls until the tree changes where the match ends
        (:mod:`~fairserve.core.radix_matches`): a host asking again at every batching step
        for every waiting request walks only for the requests whose match may have moved."""
        ticket = self._kept.get(key)
        if ticket is not None and ticket.valid:
            return ticket.tokens
        tokens, end, head, shared = self._walk_match(key)
        self._trie.matches.put(key, tokens, end, head, shared)
        return tokens

    @property
    def kept_matches(self) -> Mapping[bytes, Ticket]:
        """The kept matches :meth:`match_len` reads first: ``key -> ticket``, where a
        ``valid`` ticket's ``tokens`` is the key's match length. For a host that asks for
        every waiting request at every step and reads them in its own call frame (a
        missing or stale ticket: ask :meth:`match_len`). Read only."""
        return self._kept

    def track_revoked(self) -> None:
        """List the kept matches' revoked tickets from now on (:meth:`drain_revoked`)."""
        self._trie.matches.track_revoked()

    def drain_revoked(self) -> list[Ticket] | None:
        """Tickets revoked since the last drain: a host that holds the ticket each waiting
        request's match came from (:attr:`kept_matches`) learns which matches may have
        moved. None when not tracking, or when too many were revoked to list
        (:data:`~fairserve.core.radix_matches.MAX_REVOKED`: any may have moved)."""
        return self._trie.matches.drain_revoked()

    def match_len_walk(self, key: bytes) -> int:
        """:meth:`match_len` by walking the tree, ignoring kept matches (the reference the
        tests and benchmarks compare the kept ones to)."""
        return self._walk_match(key)[0]

    def _walk_match(self, key: bytes) -> tuple[int, Node, bytes | None, int]:
        """The match length of ``key``, the node where it ends and how: inside that node's
        edge after ``shared`` of its tokens (head None), or where the edge ends, the key
        going on with ``head`` (``shared`` 0)."""
        walk = self._trie.walk(key)
        self._trie.remember(key, walk)
        node, pos, partial, shared = walk
        if partial is not None:
            return pos // TOKEN_BYTES + shared, partial, INSIDE, shared
        return pos // TOKEN_BYTES, node, key[pos : pos + TOKEN_BYTES], 0

    def evictable_tokens(self) -> int:
        """Tokens in nodes that no request references (what ``evict`` could free)."""
        return self.total_tokens - self.protected_tokens

    def node_count(self) -> int:
        """Number of nodes, root excluded (for tests and diagnostics)."""
        return sum(1 for _ in self._trie.nodes())

    # ------------------------------------------------------------------ updates
    def insert(
        self,
        key: bytes,
        owner: Owner | None = None,
        *,
        from_lock: bytes | None = None,
        new_key: bool = False,
    ) -> int:
        """Insert ``key``; with ``owner``, record that the owner caches all of it.

        ``from_lock``, a prefix of ``key`` that holds a lock, starts the walk at the locked
        node instead of the root (the same result: a request's cached prompt is locked, so
        caching prompt + output need not compare the prompt again).

        ``new_key``: ``key`` is an object just built (a finished request's prompt + output),
        not a waiting prompt whose kept match an insert drops: it is not looked up among the
        kept matches, since hashing a long new key costs microseconds (~4 us for 17 KB). A
        kept match of an equal key stays exact without that: the insert revokes it where it
        changes the shape at its end, as for any other key.

        Returns the number of tokens newly added to the tree (not already present)."""
        return self._insert(key, owner, from_lock, new_key)[1]

    def insert_locked(self, key: bytes, *, from_lock: bytes | None = None) -> int:
        """``insert(key)`` then ``lock(key)`` with a single walk down the tree (a prompt
        whose prefill completed joins the cache, locked while its request runs)."""
        node, added = self._insert(key, None, from_lock)
        self._lock_path(key, node, len(key) // TOKEN_BYTES)
        return added

    def _insert(
        self,
        key: bytes,
        owner: Owner | None,
        from_lock: bytes | None = None,
        new_key: bool = False,
    ) -> tuple[Node, int]:
        """Insert; returns the node ending where ``key`` ends and the tokens added."""
        n = len(key)
        if n % TOKEN_BYTES:
            check_key(key)
        trie = self._trie
        if owner is None and n:
            trie.owned = False
        if not new_key:
            trie.matches.forget(key)  # an inserted prompt no longer waits: keep nothing for it
        self._tick += 1
        tick = self._tick
        node, pos, added = self._root, 0, 0
        walk = self._locked_start(key, from_lock) if from_lock is not None else trie.recall(key)
        if walk is not None:
            node, pos, partial, shared = walk
            self._claim_path(node, tick, owner)  # as a walk from the root would
            if partial is not None:
                node = trie.split(partial, shared)
                pos += len(node.edge)
                self._claim_path(node, tick, owner, up_to=node.parent)
        startswith = key.startswith
        while pos < n:  # the simulator's hottest walk: kept free of calls where it can be
            head = key[pos : pos + TOKEN_BYTES]
            child = node.children.get(head)
            if child is None:
                child = Node(key[pos:], node)
                ends = node.ends
                if ends is not None and head in ends:  # matches going on with ``head``
                    ticket = ends.pop(head)
                    ticket.valid = False
                    if trie.matches.revoked is not None:
                        trie.matches.revoked.append(ticket)
                node.children[head] = child
                trie.shape += 1
                added = (n - pos) // TOKEN_BYTES
                trie.total_tokens += added
                pos = n
            elif startswith(child.edge, pos):
                pos += len(child.edge)
            else:
                child = trie.split(child, common_tokens(key, pos, child.edge))
                pos += len(child.edge)
            child.last_access = tick
            if owner is not None and owner not in child.owners:
                child.owners.add(owner)
                tokens = len(child.edge) // TOKEN_BYTES
                trie.owner_tokens[owner] = trie.owner_tokens.get(owner, 0) + tokens
            node = child
        if node is not self._root:
            if trie.lru is not None:
                trie.lru.push(node)
            if owner is not None and trie.owner_lru:
                trie.push_owner_leaf(node, owner)  # where the owner's new leaf may be
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
                owner_tokens = self._trie.owner_tokens
                owner_tokens[owner] = owner_tokens.get(owner, 0) + tokens
            cur = cur.parent  # type: ignore[assignment]

    def touch(self, key: bytes) -> int:
        """Mark the matched prefix of ``key`` as just used (LRU); returns its length.

        A match that ends inside an edge splits it there, so exactly the used prefix is
        refreshed and the returned length equals ``match_len``."""
        self._tick += 1
        trie = self._trie
        node, matched = trie.walk_full_nodes(key, split_partial=True)
        for cur in trie.path_to_root(node):
            cur.last_access = self._tick
        if trie.lru is not None and node is not self._root:
            trie.lru.push(node)
        return matched

    def lock(self, key: bytes) -> int:
        """Protect the matched prefix of ``key`` from eviction; returns the tokens locked.

        Pair every ``lock`` with an ``unlock`` of the same key (also when it locked 0
        tokens). Locked nodes are never evicted or pruned, so the locked path keeps its
        node boundaries until the unlock; insertions below it are fine."""
        node, matched = self._lock_target(key)
        self._lock_path(key, node, matched)
        return matched

    def _lock_target(self, key: bytes) -> tuple[Node, int]:
        """The node a lock on ``key`` ends at and its tokens, a partial edge split there.

        Read from the kept match (walking and keeping it first when there is none): it names
        that node. The match stays kept where the lock ends, also after a split, so a
        refused admission's request is not walked again at the next batching step."""
        ticket = self._kept.get(key)
        if ticket is None or not ticket.valid:
            self.match_len(key)
            ticket = self._kept.get(key)
            if ticket is None:  # a match_len that keeps nothing (the walking reference)
                return self._trie.walk_full_nodes(key, split_partial=True)
        node, tokens = ticket.node, ticket.tokens
        assert node is not None  # a valid ticket names its node
        if not ticket.shared:
            return node, tokens
        # The match ends inside ``node``'s edge: split there (which revokes the ticket);
        # it now ends where the new upper node ends, the key going on with its next token.
        upper = self._trie.split(node, ticket.shared)
        head = key[tokens * TOKEN_BYTES : (tokens + 1) * TOKEN_BYTES]
        self._trie.matches.put(key, tokens, upper, head, 0)
        return upper, tokens

    def probe_lock(self, key: bytes) -> tuple[Node, int, int]:
        """What ``lock(key)`` would take, for a host that decides from it whether to lock:
        the node it would end at, its tokens, and the tokens it would newly protect.

        Does to the tree what a lock immediately released does (the split, the refresh of
        the path), so following it with :meth:`lock_probed` or :meth:`release_probe`
        leaves the tree exactly as ``lock`` (then ``unlock``) would, with one walk up the
        path instead of two for a refused admission. One difference, on purpose: when the
        key already holds a lock, ``unlock`` would release the shortest of its locks (the
        earlier request's), so a refused request's longer lock stayed; a released probe
        leaves the earlier lock alone and holds nothing."""
        ticket = self._kept.get(key)
        if ticket is not None and ticket.valid and not ticket.shared:
            node, matched = ticket.node, ticket.tokens  # _lock_target's common case, inline
            assert node is not None  # a valid ticket names its node
        else:
            node, matched = self._lock_target(key)
        self._trie.owned = False
        self._tick += 1
        tick, root, fresh = self._tick, self._root, 0
        cur = node
        while cur is not root:
            if cur.ref == 0:
                fresh += len(cur.edge)
            cur.last_access = tick
            cur = cur.parent  # type: ignore[assignment]
        return node, matched, fresh // TOKEN_BYTES

    def lock_probed(self, key: bytes, node: Node, matched: int) -> None:
        """Take the lock :meth:`probe_lock` measured (nothing changed the tree since)."""
        self._lock_path(key, node, matched, new_tick=False)

    def release_probe(self, node: Node) -> None:
        """Give up a :meth:`probe_lock` without locking: what the unlock of its lock would
        have done besides restoring the counts (``node`` becomes an eviction candidate if
        it is an unreferenced leaf)."""
        lru = self._trie.lru
        if lru is not None and node is not self._root and node.ref == 0:
            lru.push(node)

    def _lock_path(self, key: bytes, node: Node, matched: int, new_tick: bool = True) -> None:
        """Take a lock on ``key`` that covers ``node`` (ending at ``matched`` tokens) and
        its ancestors, refreshed at a new tick (or at the current one, which a probe of
        this lock just gave them)."""
        self._trie.owned = False
        locks = self._locks.get(key)
        if locks is None:
            self._locks[key] = [(matched, node)]
        else:
            locks.append((matched, node))
        if new_tick:
            self._tick += 1
        tick, root, protected = self._tick, self._root, 0
        cur = node
        while cur is not root:
            if cur.ref == 0:
                protected += len(cur.edge)
            cur.ref += 1
            cur.last_access = tick
            cur = cur.parent  # type: ignore[assignment]
        self._trie.protected_tokens += protected // TOKEN_BYTES

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
        root, lru, freed = self._root, self._trie.lru, 0
        cur = node
        while cur is not root:
            cur.ref -= 1
            if cur.ref == 0:
                freed += len(cur.edge)
                if lru is not None:
                    lru.push(cur)
            cur = cur.parent  # type: ignore[assignment]
        self._trie.protected_tokens -= freed // TOKEN_BYTES

    def evict(self, num_tokens: int) -> list[bytes]:
        """Free at least ``num_tokens`` from LRU unreferenced leaves (or all that can go).

        Returns the full keys of the evicted nodes: the eviction events of this cache."""
        trie = self._trie
        lru = self._lru
        if lru is None:
            lru = self._lru = LruIndex(trie.nodes())
        elif lru.needs_compaction():
            lru.rebuild(trie.nodes())
        freed, evicted = 0, []
        pop = lru.pop
        while freed < num_tokens:
            leaf = pop()
            if leaf is None:
                break
            assert isinstance(leaf, Node)
            evicted.append(trie.full_key(leaf))
            freed += len(leaf.edge) // TOKEN_BYTES
            trie.detach(leaf)  # pushes the parent if it became a candidate
        return evicted

    # ------------------------------------------------------------------ owners
    def match_owners(self, key: bytes) -> OwnerMatch:
        """Longest prefix of ``key`` held by some owner, and all owners holding it."""
        return self._owners.match(key)

    def owner_tokens(self, owner: Owner) -> int:
        """Tokens the tree records as cached by ``owner``."""
        return self._owners.tokens(owner)

    def owners(self) -> list[Owner]:
        """Owners that hold at least one token."""
        return self._owners.holders()

    def remove_owner(self, key: bytes, owner: Owner) -> int:
        """Apply an eviction event: ``owner`` no longer caches ``key`` nor anything below it.

        Returns the owner's tokens removed. Nodes left without owners are pruned."""
        return self._owners.remove(key, owner)

    def remove_owner_everywhere(self, owner: Owner) -> int:
        """Forget everything ``owner`` caches (a worker restarted or was removed)."""
        return self._owners.remove_everywhere(owner)

    def evict_owner_lru(self, owner: Owner, max_tokens: int, *, keys: bool = True) -> list[bytes]:
        """Approximate an owner's LRU cache bound: drop its LRU leaves until it holds at most
        ``max_tokens`` tokens. Returns the removed prefixes (none with ``keys`` false: a
        host that only bounds the share need not rebuild a long prompt per leaf)."""
        return self._owners.evict_lru(owner, max_tokens, keys=keys)
