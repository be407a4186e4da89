"""A bounded log of prefix-cache evictions, read by sequence number.

A router with a global prefix tree (DoubleQ) must learn what a worker dropped from its
cache, or it keeps sending requests to a worker for a prefix that is gone. The worker
appends every eviction event of its KV pool here; ``GET /fairserve/worker/evictions?since=N``
returns the events with ``seq >= N`` and the ``next`` sequence number to ask for.

Wire encoding: each event is ``{"seq": int, "tokens": [units]}``, the full evicted prefix
from the root of the cache, as the router keys it; ``"tokens": []`` means the whole cache
was flushed. The router keys token-id prompts by their ids and text prompts by their text
blocks (:mod:`fairserve.core.prefix_key`), never by the worker's tokens: so a prefix of a
text prompt the worker tokenized is published as that prompt's text key up to where the
evicted tokens end (:class:`TextPrompts`), and any other prefix as its token ids.
The log is bounded by events and by total tokens (a long prompt is one big event); a reader
that fell behind further than the log reaches gets ``"dropped": true`` and should treat its
view of this worker's cache as stale (e.g. forget it).
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass
from itertools import islice
from typing import Any

from fairserve.core.prefix_key import TEXT_UNIT_BYTES, text_key
from fairserve.core.tokenizer import pieces
from fairserve.core.types import TOKEN_BYTES, key_len, key_to_tokens

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


DEFAULT_MAX_PROMPT_TOKENS = 1 << 21
"""Tokens of text prompts remembered for translating evictions (a few times a simulated
pool's capacity: a prompt older than that has left the cache already)."""


class TextPrompts:
    """The text prompts the worker took recently, by their token keys: an evicted prefix
    that begins one of them is translated into that prompt's text key (the router's).

    Keys are kept sorted, so the prompts that begin with an evicted prefix are found by
    bisection (they follow it in byte order). The cache evicts leaves only: when a prefix
    goes, everything cached below it is gone, so any prompt that extends it gives the same
    text up to its end. Bounded by tokens, the oldest forgotten first; an eviction of a
    forgotten prompt is published as token ids (which the router ignores: its own bound on
    a worker's share of its tree ages such prefixes out)."""

    def __init__(self, max_tokens: int = DEFAULT_MAX_PROMPT_TOKENS) -> None:
        self._max_tokens = max_tokens
        self._tokens = 0
        self._sorted: list[bytes] = []
        self._texts: dict[bytes, str] = {}

    def add(self, token_key: bytes, text: str) -> None:
        """Remember the text of a prompt the worker took (``token_key``: its tokens)."""
        if token_key in self._texts:
            self._texts[token_key] = self._texts.pop(token_key)  # most recent last
            return
        bisect.insort(self._sorted, token_key)
        self._texts[token_key] = text
        self._tokens += key_len(token_key)
        while self._tokens > self._max_tokens and len(self._texts) > 1:
            oldest = next(iter(self._texts))
            del self._texts[oldest]
            del self._sorted[bisect.bisect_left(self._sorted, oldest)]
            self._tokens -= key_len(oldest)

    def router_key(self, evicted: bytes) -> bytes:
        """``evicted`` (a token key) as the router keys it: the text key of a remembered
        prompt that begins with it, up to the unit where the evicted tokens' text ends;
        else ``evicted`` itself (token ids, a flush, text not remembered).

        The unit that holds the end is kept (with that prompt's next bytes in it), never cut
        off: a shorter key would name a shorter prefix, and the router would forget prompts
        the worker still caches (a node that ends in a 2-byte word, cut back into the shared
        document above it, would drop the whole document). Kept, it can at worst leave a
        sibling that diverges within those few bytes, whose own eviction names it."""
        if not evicted:
            return evicted
        at = bisect.bisect_left(self._sorted, evicted)
        if at == len(self._sorted) or not self._sorted[at].startswith(evicted):
            return evicted
        text = self._texts[self._sorted[at]]
        count = len(evicted) // TOKEN_BYTES
        text_bytes = len("".join(pieces(text)[:count]).encode("utf-8"))
        units = -(-text_bytes // TEXT_UNIT_BYTES)
        return text_key(text)[: units * TEXT_UNIT_BYTES]
