"""One model of the workers' prompt caches per fleet, shared by dispatch and the fair queues.

The router used to model each worker's cache three times: the dispatcher's global tree, the
same tree trimmed by the router through ``getattr(dispatcher, "prefixes")``, and a private
tree per router-side fair queue, filled at another moment and forgotten by another rule
(an LRU bound, never the worker's eviction feed). Now one :class:`CacheModel` answers both
questions from one radix tree whose owners are the workers:

* the dispatcher's "which workers hold the longest prefix of this prompt" (:meth:`match`);
* a fair queue's "how much of this prompt does *my* worker hold" (:meth:`match_len`): the
  ``match_len`` its local policy orders and charges by.

Every dispatcher holds one (``Dispatcher.prefixes``), also those that never read it (round
robin, least load, per-client round robin): a fair queue in front of a stock worker needs it
whatever the dispatch. The router's worker feed hands the dispatcher's model to each fair
queue; the simulator has no router-side queue, so its dispatch records are unchanged.

**When a prompt is recorded**: when it is *released to the worker*, since a worker caches
what it was sent, not what waits in front of it. Without a router-side queue, release is
dispatch (:meth:`dispatched`; the default path, as before). For a worker behind a fair queue
(:meth:`queue_in_front`) the dispatch records nothing and the queue records at release
(:meth:`released`): recorded at dispatch, a waiting request would match itself in full,
and a policy ordering by cache hits (DLPM, LPM) would see every waiting prompt as cached.
The price: while a prompt waits, the dispatcher does not yet count it on that worker.

**How it forgets**: a worker's eviction feed (:meth:`evicted`), a worker that left or came
back with an empty cache (:meth:`forget`), and one approximate LRU bound per worker applied
at every record wherever the record comes from: the tighter of the host's limit
(:meth:`bound`, from the worker's KV capacity) and the dispatcher's
``max_tree_tokens_per_worker`` (``max_tokens_per_worker``).
"""

from __future__ import annotations

from fairserve.core.errors import ConfigError
from fairserve.core.radix import OwnerMatch, RadixTree
from fairserve.core.radix_node import common_tokens
from fairserve.core.types import TOKEN_BYTES

LRU_LOW_WATERMARK = 0.9
"""Share of the bound an over-full worker is trimmed down to: trimming scans that worker's
leaves, so trimming 10 % below the bound at once keeps the scan off most records."""


class CacheModel:
    """Which worker caches which prompt prefix (approximately), for dispatch and queues."""

    def __init__(self, max_tokens_per_worker: int = 0) -> None:
        if max_tokens_per_worker < 0:
            raise ConfigError(f"max_tokens_per_worker must be >= 0, got {max_tokens_per_worker}")
        self.tree = RadixTree()
        self.max_tokens_per_worker = max_tokens_per_worker
        self._limits: dict[str, int] = {}
        """The host's bound per worker (see :meth:`bound`)."""
        self._queued: set[str] = set()
        """Workers behind a fair queue: their prompts are recorded at release."""

    # ------------------------------------------------------------------ queries
    def match(self, key: bytes) -> OwnerMatch:
        """Longest prefix of ``key`` any worker holds, and the workers holding all of it."""
        return self.tree.match_owners(key)

    def match_len(self, key: bytes, worker: str) -> int:
        """Tokens of ``key`` that ``worker`` holds (its longest prefix match).

        A worker holding a node holds every node above it, so the walk stops at the first
        node of the key's path the worker does not hold."""
        node = self.tree._trie.root
        pos, n = 0, len(key)
        startswith = key.startswith
        while pos < n:
            child = node.children.get(key[pos : pos + TOKEN_BYTES])
            if child is None or worker not in child.owners:
                break
            edge = child.edge
            if not startswith(edge, pos):
                return pos // TOKEN_BYTES + common_tokens(key, pos, edge)
            pos += len(edge)
            node = child
        return pos // TOKEN_BYTES

    def worker_tokens(self, worker: str) -> int:
        return self.tree.owner_tokens(worker)

    @property
    def total_tokens(self) -> int:
        return self.tree.total_tokens

    # ------------------------------------------------------------------ records
    def dispatched(self, key: bytes, worker: str) -> None:
        """``worker`` was given ``key`` by the dispatcher: recorded now unless a fair queue
        in front of the worker records it at release."""
        if worker not in self._queued:
            self.record(key, worker)

    def released(self, key: bytes, worker: str) -> None:
        """``worker``'s fair queue sent it ``key``."""
        self.record(key, worker)

    def record(self, key: bytes, worker: str) -> None:
        """``worker`` will cache ``key``. Applies the worker's bound."""
        self.tree.insert(key, worker)
        self._trim(worker)

    def queue_in_front(self, worker: str, queued: bool) -> None:
        """Whether a fair queue stands in front of ``worker`` (and records its prompts)."""
        if queued:
            self._queued.add(worker)
        else:
            self._queued.discard(worker)

    # ------------------------------------------------------------------ forgetting
    def evicted(self, worker: str, key: bytes) -> None:
        """Apply an eviction event reported by ``worker`` (``b""``: all of its cache)."""
        self.tree.remove_owner(key, worker)

    def forget(self, worker: str) -> None:
        """``worker`` left (or restarted with an empty cache)."""
        self.tree.remove_owner_everywhere(worker)

    def bound(self, worker: str, max_tokens: int) -> None:
        """The host's bound on ``worker``'s share (0: none), kept for every later record
        and applied now."""
        self._limits[worker] = max_tokens
        self._trim(worker)

    def _trim(self, worker: str) -> None:
        limit = self.max_tokens_per_worker
        host = self._limits.get(worker, 0)
        if host and (not limit or host < limit):
            limit = host
        tree = self.tree
        if limit and tree.owner_tokens(worker) > limit:
            tree.evict_owner_lru(worker, int(limit * LRU_LOW_WATERMARK))
