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

**Kept matches**: a fair queue's policy asks :meth:`match_len` for every waiting request at
every decision, so the answers are kept per worker until they may have changed. A record of
``K`` for worker ``w`` can only lengthen the match of a kept key ``X`` whose match stopped
exactly where ``w``'s hold on ``K`` stopped before the record, on the same next token (a
longer shared prefix would have been held already); so the kept keys are filed by their
match plus the next token (a hash of that prefix: a collision only drops a match that was
still right), and a record drops that one file. Anything that takes from ``w`` (eviction,
bound, forgetting) drops all of ``w``'s kept matches; the queue drops a request's match when
the request stops waiting (:meth:`done_asking`), so only waiting prompts are kept.
"""

from __future__ import annotations

from fairserve.core.errors import ConfigError
from fairserve.core.radix import OwnerMatch, RadixTree
from fairserve.core.radix_node import common_tokens
from fairserve.core.types import TOKEN_BYTES

MAX_KEPT_MATCHES = 1 << 14
"""Kept matches per worker; past it they are all dropped (a safety net: a queue drops its
requests' matches as they leave, and the router holds at most 4,096 requests)."""

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
        self._kept: dict[str, dict[bytes, tuple[int, int | None]]] = {}
        """Per worker, key -> (the match length :meth:`match_len` answered, its file)."""
        self._files: dict[str, dict[int, set[bytes]]] = {}
        """Per worker, the kept keys by where their match stops: the hash of the key's first
        match + 1 tokens (a key matched in full has no file: no record lengthens it)."""

    # ------------------------------------------------------------------ queries
    def match(self, key: bytes) -> OwnerMatch:
        """Longest prefix of ``key`` any worker holds, and the workers holding all of it."""
        return self.tree.match_owners(key)

    def match_len(self, key: bytes, worker: str) -> int:
        """Tokens of ``key`` that ``worker`` holds (its longest prefix match), kept until a
        change to ``worker``'s share may have moved it."""
        kept = self._kept.get(worker)
        if kept is None:
            kept = self._kept[worker] = {}
            self._files[worker] = {}
        else:
            entry = kept.get(key)
            if entry is not None:
                return entry[0]
        tokens = self.walk_len(key, worker)
        if len(kept) >= MAX_KEPT_MATCHES:
            self._drop_kept(worker)
        stop = (tokens + 1) * TOKEN_BYTES
        file = hash(key[:stop]) if stop <= len(key) else None
        kept[key] = (tokens, file)
        if file is not None:
            self._files[worker].setdefault(file, set()).add(key)
        return tokens

    def peek_len(self, key: bytes, worker: str) -> int:
        """:meth:`match_len` without keeping the answer: for a request that stops waiting at
        once (a fair queue with nothing waiting releases it in the same call), where keeping
        its match would only cost a hash of the matched prefix and a file to drop again."""
        kept = self._kept.get(worker)
        if kept:
            entry = kept.get(key)
            if entry is not None:
                return entry[0]
        return self.walk_len(key, worker)

    def done_asking(self, key: bytes, worker: str) -> None:
        """Nobody waits on ``key``'s match on ``worker`` any more: do not keep it."""
        kept = self._kept.get(worker)
        entry = kept.pop(key, None) if kept else None
        if entry is None or entry[1] is None:
            return
        files = self._files[worker]
        keys = files.get(entry[1])
        if keys is not None:
            keys.discard(key)
            if not keys:
                del files[entry[1]]

    def walk_len(self, key: bytes, worker: str) -> int:
        """:meth:`match_len` by walking the tree. A worker holding a node holds every node
        above it, so the walk stops at the first node of the path the worker lacks."""
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
        if self._kept.get(worker):
            self._lengthened(key, worker)
        self.tree.insert(key, worker)
        self._trim(worker)

    def _lengthened(self, key: bytes, worker: str) -> None:
        """Drop the kept matches a record of ``key`` may lengthen (see the module's note).

        ``key``'s own kept match, when there is one (a queue records a prompt it was asked
        about), is its current match and its file: no walk and no hash of the prefix again."""
        kept = self._kept[worker]
        entry = kept.get(key)
        if entry is not None:
            file = entry[1]
        else:
            stop = (self.walk_len(key, worker) + 1) * TOKEN_BYTES
            file = hash(key[:stop]) if stop <= len(key) else None
        if file is None:
            return  # held in full already: the record adds nothing
        for other in self._files[worker].pop(file, ()):
            kept.pop(other, None)

    def _drop_kept(self, worker: str) -> None:
        kept = self._kept.get(worker)
        if kept:
            kept.clear()
            self._files[worker].clear()

    def queue_in_front(self, worker: str, queued: bool) -> None:
        """Whether a fair queue stands in front of ``worker`` (and records its prompts)."""
        if queued:
            self._queued.add(worker)
        else:
            self._queued.discard(worker)

    # ------------------------------------------------------------------ forgetting
    def evicted(self, worker: str, key: bytes) -> None:
        """Apply an eviction event reported by ``worker`` (``b""``: all of its cache)."""
        if self.tree.remove_owner(key, worker):
            self._drop_kept(worker)

    def forget(self, worker: str) -> None:
        """``worker`` left (or restarted with an empty cache)."""
        self.tree.remove_owner_everywhere(worker)
        self._drop_kept(worker)

    def bound(self, worker: str, max_tokens: int) -> None:
        """The host's bound on ``worker``'s share (0: none), kept for every later record
        and applied now.

        The router bounds a worker at each of its dispatches: the same bound again is
        nothing to do, since every record trims to it and nothing else adds to a share."""
        if self._limits.get(worker) == max_tokens:
            return
        self._limits[worker] = max_tokens
        self._trim(worker)

    def _trim(self, worker: str) -> None:
        limit = self.max_tokens_per_worker
        host = self._limits.get(worker, 0)
        if host and (not limit or host < limit):
            limit = host
        tree = self.tree
        if limit and tree.owner_tokens(worker) > limit:
            tree.evict_owner_lru(worker, int(limit * LRU_LOW_WATERMARK), keys=False)
            self._drop_kept(worker)
