"""SGLang's prefix-cache evictions as the fairserve eviction feed.

The router's global tree (DoubleQ) must learn what a worker dropped from its cache. SGLang
reports every radix node it removes to its ``KVCacheEventRecorder`` (whether or not KV
events are published); the plugin hooks that call and turns the node into the tokens from
the root of the tree to the end of the node, the wire format of the simulated worker's feed
(``GET /fairserve/worker/evictions``: ``{"next", "events": [{"seq", "tokens"}], "dropped"}``,
``tokens: []`` for a flushed cache).

The log mirrors ``fairserve.worker.evictions`` (same bounds, same reader semantics); the
plugin cannot import the worker package (a higher layer), so it keeps its own.
"""

from __future__ import annotations

import threading
from collections import deque
from itertools import islice
from typing import Any, Protocol

DEFAULT_MAX_EVENTS = 4096
DEFAULT_MAX_TOKENS = 1 << 20


class NodeKey(Protocol):
    token_ids: Any

    def __len__(self) -> int: ...


class TreeNodeLike(Protocol):
    """What the plugin reads of SGLang's ``TreeNode``: its parent and its key."""

    parent: Any
    key: Any


def node_tokens(node: TreeNodeLike) -> list[int]:
    """Tokens from the root of the tree to the end of ``node`` (the evicted prefix).

    A key's logical length can be shorter than its token array (bigram keys hold one token
    more; capped keys a ``limit``), so each key contributes its first ``len(key)`` tokens."""
    parts: list[list[int]] = []
    current: Any = node
    while current is not None and current.key is not None and current.parent is not None:
        key = current.key
        parts.append([int(t) for t in key.token_ids[: len(key)]])
        current = current.parent
    return [token for part in reversed(parts) for token in part]


def cache_recorders(tree_cache: object) -> tuple[object, ...]:
    """The event recorders of the scheduler's own prefix cache: ``kv_events`` of the cache
    (``RadixCache``) and of its tree core (``UnifiedRadixCache``).

    SGLang builds other radix trees too: ``SchedulePolicy`` keeps an in-batch tree of the
    waiting queue and resets it at every LPM ordering, which reports "all cleared" through
    that tree's own recorder. Those are no evictions of the worker's cache, so the hooks
    (which sit on the recorder class, for every instance) accept only these recorders."""
    found: list[object] = []
    for owner in (tree_cache, getattr(tree_cache, "tree_core", None)):
        recorder = getattr(owner, "kv_events", None) if owner is not None else None
        if recorder is not None and not any(recorder is r for r in found):
            found.append(recorder)
    return tuple(found)


def is_cache_recorder(tree_cache: object, recorder: object) -> bool:
    """Whether ``recorder`` reports for the scheduler's own prefix cache ``tree_cache``."""
    return any(recorder is r for r in cache_recorders(tree_cache))


def is_device_medium(medium: object) -> bool:
    """Only removals from GPU memory matter: a prefix that moved to host memory still hits."""
    return medium is None or getattr(medium, "name", str(medium)).upper().endswith("GPU")


class EvictionFeed:
    """Append-only, bounded, thread-safe log of evicted prefixes with sequence numbers."""

    def __init__(
        self, max_events: int = DEFAULT_MAX_EVENTS, max_tokens: int = DEFAULT_MAX_TOKENS
    ) -> None:
        self._events: deque[tuple[int, list[int]]] = deque()
        self._max_events = max_events
        self._max_tokens = max_tokens
        self._tokens = 0
        self._lock = threading.Lock()
        self.next_seq = 0

    def append(self, tokens: list[int]) -> None:
        """One evicted prefix (``[]``: the whole cache was flushed)."""
        with self._lock:
            self._events.append((self.next_seq, tokens))
            self.next_seq += 1
            self._tokens += len(tokens)
            while self._events and (
                len(self._events) > self._max_events or self._tokens > self._max_tokens
            ):
                self._tokens -= len(self._events.popleft()[1])

    def read(self, since: int, limit: int) -> dict[str, Any]:
        """Events with ``seq >= since``; ``dropped`` when the reader fell behind the log (or
        comes from an earlier process: ``since`` beyond ``next``)."""
        with self._lock:
            first = self._events[0][0] if self._events else self.next_seq
            dropped = since < first or since > self.next_seq
            start = first if dropped else since
            events = list(islice(self._events, start - first, start - first + limit))
            return {
                "next": events[-1][0] + 1 if events else start,
                "events": [{"seq": seq, "tokens": tokens} for seq, tokens in events],
                "dropped": dropped,
            }
