"""Match lengths a radix tree keeps between batching steps (issue 23).

Why: a local policy orders the whole waiting queue by prefix match at every batching step,
and a step changes the tree only along a few paths (the prompts it admitted, the leaves it
evicted). Walking the tree again for every waiting request made matching cost more than the
decision itself (2.7 ms against 0.85 ms over 1,000 waiting requests). Here a key's match
length is kept until the tree changes *where that match ends*.

How: a match of ``key`` ends either at the end of a node ``N`` (no child of ``N`` continues
the key) or part-way along the edge of a child ``C``. That node, ``N`` or ``C``, holds a
:class:`~fairserve.core.radix_node.Ticket`; the kept match holds the same ticket, and is
valid while the ticket is.
A node's ticket is revoked (and the node starts a fresh one when next needed) when:

* a child is added under it: the only shape change that can lengthen a match ending at
  its end (a child for the key's next token did not exist, or the match would go on);
* it is split: lengths do not change, but a match that ended inside its edge may now end
  in the new upper node, so it is recomputed and registered there;
* it, or an ancestor, is detached (eviction, a global tree pruned): a match through it
  shortens.

No other change moves a match: a child added under any other node of the key's path would
need a head token already taken by the path's next node; a split or a detach elsewhere
leaves the key's path as it was. Locks, touches and owners change no match length (they
may split, which revokes as above). ``tests/core/test_radix_matches.py`` checks that a
kept match equals a fresh walk after any sequence of inserts, evictions, locks, unlocks,
touches and owner removals.

Memory: the kept matches are bounded (:data:`MAX_KEPT_MATCHES`; past it they are all
dropped and rebuilt on demand) and a key inserted into the tree drops its own, so the
prompts of requests that left the queue are not kept alive by the cache.
"""

from __future__ import annotations

from collections.abc import Iterable

from fairserve.core.radix_node import Node, Ticket

MAX_KEPT_MATCHES = 1 << 16
"""Match lengths kept at once: above the longest waiting queue a worker is expected to hold
(a decision over more than this re-walks the excess, as without the cache)."""


def revoke(node: Node) -> None:
    """The shape at ``node`` changed: every match ending there is stale."""
    ticket = node.ticket
    if ticket is not None:
        ticket.valid = False
        node.ticket = None


def revoke_all(nodes: Iterable[Node]) -> None:
    for node in nodes:
        revoke(node)


class MatchCache:
    """``key -> (tokens, ticket)``: match lengths valid while their ticket is."""

    __slots__ = ("_kept", "limit")

    def __init__(self, limit: int = MAX_KEPT_MATCHES) -> None:
        self._kept: dict[bytes, tuple[int, Ticket]] = {}
        self.limit = limit

    def __len__(self) -> int:
        return len(self._kept)

    def get(self, key: bytes) -> int | None:
        """The kept match of ``key``, or None if there is none or it is stale."""
        kept = self._kept.get(key)
        if kept is None or not kept[1].valid:
            return None
        return kept[0]

    def put(self, key: bytes, tokens: int, node: Node) -> None:
        """Keep ``tokens`` as the match of ``key``, which ends at (or inside) ``node``."""
        ticket = node.ticket
        if ticket is None:
            ticket = node.ticket = Ticket()
        kept = self._kept
        if len(kept) >= self.limit and key not in kept:
            kept.clear()  # amortised O(1); live matches are rebuilt on their next use
        kept[key] = (tokens, ticket)

    def forget(self, key: bytes) -> None:
        """Drop ``key``'s match (it was inserted: it is no longer a waiting prompt)."""
        self._kept.pop(key, None)

    def clear(self) -> None:
        self._kept.clear()
