"""A bounded log of prefix-cache evictions, read by sequence number.

A router with a global prefix tree (DoubleQ) must learn what a worker dropped from its
cache, or it keeps sending requests to a worker for a prefix that is gone. The worker
appends every eviction event of its KV pool here; ``GET /fairserve/worker/evictions?since=N``
returns the events with ``seq >= N`` and the ``next`` sequence number to ask for.

Wire encoding: each event is ``{"seq": int, "tokens": [token ids]}``, the full evicted
prefix from the root of the cache; ``"tokens": []`` means the whole cache was flushed.
The log is bounded by events and by total tokens (a long prompt is one big event); a reader
that fell behind further than the log reaches gets ``"dropped": true`` and should treat its
view of this worker's cache as stale (e.g. forget it).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from itertools import islice
from typing import Any

from fairserve.core.types import key_len, key_to_tokens

DEFAULT_MAX_EVENTS = 4096
DEFAULT_MAX_TOKENS = 1 << 20
DEFAULT_PAGE_EVENTS = 1000


@dataclass(frozen=True, slots=True)
class EvictionEvent:
    seq: int
    key: bytes


class EvictionLog:
    """Append-only ring of eviction events with increasing sequence numbers (from 0)."""

    def __init__(
        self, max_events: int = DEFAULT_MAX_EVENTS, max_tokens: int = DEFAULT_MAX_TOKENS
    ) -> None:
        self._events: deque[EvictionEvent] = deque()
        self._max_events = max_events
        self._max_tokens = max_tokens
        self._tokens = 0
        self.next_seq = 0

    def extend(self, keys: list[bytes]) -> None:
        for key in keys:
            self._events.append(EvictionEvent(self.next_seq, key))
            self.next_seq += 1
            self._tokens += key_len(key)
        while self._events and (
            len(self._events) > self._max_events or self._tokens > self._max_tokens
        ):
            self._tokens -= key_len(self._events.popleft().key)

    @property
    def first_seq(self) -> int:
        """The oldest sequence number still held (``next_seq`` when empty)."""
        return self._events[0].seq if self._events else self.next_seq

    def read(self, since: int, limit: int = DEFAULT_PAGE_EVENTS) -> dict[str, Any]:
        """Events with ``seq >= since`` (at most ``limit``), as the endpoint's JSON.

        ``since`` beyond ``next_seq`` comes from a reader of an earlier worker process
        (sequence numbers restart at 0): it is answered like a reader that fell behind."""
        dropped = since < self.first_seq or since > self.next_seq
        start = self.first_seq if dropped else since
        events = list(islice(self._events, start - self.first_seq, start - self.first_seq + limit))
        return {
            "next": events[-1].seq + 1 if events else start,
            "events": [{"seq": e.seq, "tokens": key_to_tokens(e.key)} for e in events],
            "dropped": dropped,
        }
