"""Match lengths a radix tree keeps between batching steps (issue 23).

Why: a local policy orders the whole waiting queue by prefix match at every batching step,
and a step changes the tree only along a few paths (the prompts it admitted, the leaves it
evicted). Walking the tree again for every waiting request made matching cost more than the
decision itself (2.7 ms against 0.85 ms over 1,000 waiting requests). Here a key's match
length is kept until the tree changes *where that match ends*.

How: a match of ``key`` ends either part-way along the edge of a node ``C``, or where the
edge of a node ``N`` ends, with no child of ``N`` for the key's next token ``h`` (or with
the key ending there too, ``h = b""``). The kept match holds a
:class:`~fairserve.core.radix_node.Ticket` that ``C`` (``C.ticket``) or ``N``
(``N.ends[h]``) holds too, and is valid while that ticket is. Tickets are revoked when:

* a child with head ``h`` is added under ``N``: ``N.ends[h]`` (the only shape change that
  can lengthen a match ending there; a child for any other token does not continue it, so
  requests on one shared document are not re-matched whenever a sibling is inserted);
* ``C`` is split: ``C.ticket`` (lengths do not change, but a match inside its edge may now
  end in the new upper node, so it is recomputed and held there; matches ending where
  ``C`` ends still end there);
* a node, or an ancestor, is detached (eviction, a global tree pruned): all of its tickets,
  since a match through it shortens.

No other change moves a match: a child added under another node of the key's path would
need a head token already taken by the path's next node; a split or a detach elsewhere
leaves the key's path as it was. Locks, touches and owners change no match length (they
may split, which revokes as above). ``tests/core/test_radix_matches.py`` checks that a
kept match equals a fresh walk after any sequence of inserts, evictions, locks, unlocks,
touches and owner removals.

Memory: the kept matches are bounded (:data:`MAX_KEPT_MATCHES`; past it they are all
dropped and rebuilt on demand); a key inserted into the tree drops its own (an admitted
prompt); and whenever the kept matches have doubled, those whose key nothing else holds
any more (the prompt of a request that left the queue without being admitted) are
dropped, so the cache never keeps more prompts alive than are waiting.
"""

from __future__ import annotations

from collections.abc import Iterable
from sys import getrefcount

from fairserve.core.radix_node import Node, Ticket

MAX_KEPT_MATCHES = 1 << 16
"""Match lengths kept at once: above the longest waiting queue a worker is expected to hold
(a decision over more than this re-walks the excess, as without the cache)."""


SWEEP_MIN_ENTRIES = 1024
"""Kept matches below which no sweep for orphaned keys runs."""

MAX_REVOKED = 1 << 16
"""Revocations listed between two drains past which :meth:`MatchCache.drain_revoked`
answers "cannot tell" (None) instead: a host that drains rarely re-reads everything once
rather than keeping an unbounded list."""


def _refcounts(keys: Iterable[bytes]) -> list[int]:
    return [getrefcount(key) for key in keys]


_ORPHAN_REFS = _refcounts({bytes(bytearray(b"probe")): 0})[0]
"""What ``_refcounts`` reads for a key only the kept matches hold (measured, not assumed:
it depends on the interpreter)."""


INSIDE: None = None
"""The ``head`` of a match that ends part-way along a node's edge."""


Revoked = list[Ticket] | None
"""Where revocations are listed for a host that asked (:meth:`MatchCache.track_revoked`);
None: not listed."""


def revoke(node: Node, revoked: Revoked = None) -> None:
    """``node`` leaves the tree: every match ending at or inside it is stale."""
    revoke_inside(node, revoked)
    ends = node.ends
    if ends is not None:
        for ticket in ends.values():
            ticket.revoke()
        if revoked is not None:
            revoked.extend(ends.values())
        node.ends = None


def revoke_inside(node: Node, revoked: Revoked = None) -> None:
    """``node``'s edge was split: matches ending inside it may now end above it."""
    inside = node.inside
    if inside is not None:
        for ticket in inside.values():
            ticket.revoke()
        if revoked is not None:
            revoked.extend(inside.values())
        node.inside = None


def revoke_all(nodes: Iterable[Node], revoked: Revoked = None) -> None:
    for node in nodes:
        revoke(node, revoked)


class MatchCache:
    """``key -> ticket``: match lengths (``ticket.tokens``) valid while their ticket is; a
    valid ticket also names where the match ends (``node``, ``shared``), so a lock can
    start there instead of walking the key again."""

    __slots__ = ("_sweep_at", "kept", "limit", "revoked")

    def __init__(self, limit: int = MAX_KEPT_MATCHES) -> None:
        self.kept: dict[bytes, Ticket] = {}
        """The tree reads it directly on its hot path; always the same dict object."""
        self.limit = limit
        self._sweep_at = min(limit, SWEEP_MIN_ENTRIES)
        self.revoked: Revoked = None
        """Tickets revoked since the last :meth:`drain_revoked`, once a host asked for them
        (:meth:`track_revoked`); every revocation of the tree appends here."""

    def track_revoked(self) -> None:
        """List revocations from now on, for :meth:`drain_revoked` (a host that keeps each
        waiting request's ticket learns which matches moved without reading them all)."""
        if self.revoked is None:
            self.revoked = []

    def drain_revoked(self) -> list[Ticket] | None:
        """The tickets revoked since the last drain (since :meth:`track_revoked` at first),
        possibly with repeats; None when not tracking or when more than
        :data:`MAX_REVOKED` were listed (then any kept match may have moved)."""
        revoked = self.revoked
        if revoked is None:
            return None
        if not revoked:
            return revoked[:0]
        self.revoked = []
        return None if len(revoked) > MAX_REVOKED else revoked

    def __len__(self) -> int:
        return len(self.kept)

    def get(self, key: bytes) -> int | None:
        """The kept match of ``key``, or None if there is none or it is stale."""
        ticket = self.kept.get(key)
        if ticket is None or not ticket.valid:
            return None
        return ticket.tokens

    def put(self, key: bytes, tokens: int, node: Node, head: bytes | None, shared: int) -> None:
        """Keep ``tokens`` as the match of ``key``, which ends inside ``node``'s edge after
        ``shared`` of its tokens (``head`` :data:`INSIDE`) or where it ends, the key going
        on with ``head`` (``shared`` 0)."""
        if head is None:
            inside = node.inside
            if inside is None:
                inside = node.inside = {}
            ticket = inside.get(shared)
            if ticket is None:
                ticket = inside[shared] = Ticket(tokens, node, shared)
        else:
            ends = node.ends
            if ends is None:
                ends = node.ends = {}
            ticket = ends.get(head)
            if ticket is None:
                ticket = ends[head] = Ticket(tokens, node, 0)
        kept = self.kept
        if len(kept) >= self._sweep_at and key not in kept:
            self._sweep()
        kept[key] = ticket

    def _sweep(self) -> None:
        """Drop the matches of keys nothing else holds; past :attr:`limit`, drop them all.
        Runs when the kept matches have doubled since the last sweep: amortised O(1)."""
        kept = self.kept
        refs = _refcounts(kept)  # before anything here holds the keys
        orphans = [key for key, held in zip(kept, refs, strict=True) if held <= _ORPHAN_REFS]
        for key in orphans:
            del kept[key]
        if len(kept) >= self.limit:
            kept.clear()  # live matches are rebuilt on their next use
        self._sweep_at = min(self.limit, max(SWEEP_MIN_ENTRIES, 2 * len(kept)))

    def forget(self, key: bytes) -> None:
        """Drop ``key``'s match (it was inserted: it is no longer a waiting prompt)."""
        self.kept.pop(key, None)

    def clear(self) -> None:
        self.kept.clear()
