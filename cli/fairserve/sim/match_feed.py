"""The simulated engine's prefix matches across batching steps, with the moved-match feed
a policy may read (issue 23).

Why: under overload every batching step asked the tree for the match of every waiting
request (thousands per worker), although between two steps only the matches on the few
paths that changed can move. The tree lists the tickets it revokes
(:meth:`~fairserve.core.radix.RadixTree.drain_revoked`); this feed remembers which ticket
each waiting request's answer came from, so it can tell a policy which requests' matches
may have moved (``match_len.moved()``,
:data:`~fairserve.sched.local.lpm_index.MovedMatches`), and answer the others from what
it answered before.

What a decision reads is what it read before: the match of a request as the tree was when
the decision first asked about it (an admission may evict below a later request's match).
A policy that calls ``moved()`` is promised every other waiting request's match as last
answered, so for it the decision "asks about" every waiting request at its start: the
answers it gets, and the ones the engine's admission uses, are the matches at the start.
A policy that does not call it gets the old per-decision memo, computed when first asked.
"""

from __future__ import annotations

import heapq
from collections.abc import Container, Iterable
from math import ceil

from fairserve.core.radix import RadixTree
from fairserve.core.radix_node import Ticket
from fairserve.core.types import TOKEN_BYTES, Request
from fairserve.sched.local.dlpm_pass import Refusals


class FeedMatchLen:
    """One decision's ``match_len``: callable, with ``moved`` (see the module docstring)."""

    __slots__ = ("_feed", "_frozen", "_memo", "needs", "refusals")

    def __init__(self, feed: MatchFeed) -> None:
        self._feed = feed
        self._memo: dict[Request, int] = {}
        self._frozen = False
        """``moved()`` was called: answers are the matches at the decision's start."""
        self.needs: dict[Request, int] | None = None
        """Once ``moved()`` was called: :attr:`MatchFeed.needs`, what admitting each held
        request would claim at the base reservation ratio, by its match at the start."""
        self.refusals: Refusals | None = None
        """What the host would refuse without being asked (set by the batch formation;
        :class:`~fairserve.sched.local.dlpm_pass.Refusals`)."""

    def __call__(self, req: Request) -> int:
        if self._frozen:
            held = self._feed.held.get(req)
            return self._feed.read(req) if held is None else held
        memo = self._memo
        cached = memo.get(req)
        if cached is None:
            cached = memo[req] = self._feed.read_unheld(req)
        return cached

    def moved(self) -> list[Request] | None:
        """The waiting requests whose match may differ from what was last answered for
        them by a decision that called ``moved()`` (None: any may); from now on this
        decision answers with the matches as they were at its start."""
        self._frozen = True
        self.needs = self._feed.needs
        return self._feed.take_moved()


class MatchFeed:
    """Matches last answered for waiting requests, valid while their ticket is."""

    __slots__ = (
        "_base_ratio",
        "_by_ticket",
        "_kept",
        "_need_heap",
        "_pending",
        "_pushed",
        "_tickets",
        "_tree",
        "_unknown",
        "_untracked",
        "held",
        "needs",
    )

    def __init__(self, tree: RadixTree, base_ratio: float = 1.0) -> None:
        self._tree = tree
        self._kept = tree.kept_matches
        self._base_ratio = base_ratio
        tree.track_revoked()
        self.held: dict[Request, int] = {}
        """Waiting request -> match last answered, valid as of the last :meth:`begin`."""
        self.needs: dict[Request, int] = {}
        """Held request -> tokens its admission claims besides its lock's: the prompt
        tokens past its held match, its output so far (recomputed after a retraction) and
        its output reservation at ``base_ratio`` (the pool's ratio when settled). Fixed
        while it waits with that match, so a host refusing everything above a claim it
        saw refused reads one number per request instead of recomputing it."""
        self._tickets: dict[Request, Ticket | None] = {}
        """Waiting request -> the ticket its held match came from (None: no prompt, or
        held without one)."""
        self._by_ticket: dict[Ticket, dict[Request, None]] = {}
        self._pending: dict[Request, None] = {}
        """Requests whose held match was dropped since the last ``moved()``."""
        self._unknown = False
        """The tree could not list its revocations: any match may have moved."""
        self._untracked: list[Request] = []
        """Held without a ticket (the tree kept none): dropped at the next decision."""
        self._need_heap: list[tuple[int, int, Request]] = []
        """``(need, serial, request)`` for every held request's :attr:`needs` entry, and
        entries gone stale (the request left, or holds another need), dropped lazily."""
        self._pushed = 0

    def begin(self) -> FeedMatchLen:
        """A decision starts: :meth:`settle`, and return the decision's ``match_len``."""
        self.settle()
        return FeedMatchLen(self)

    def settle(self) -> None:
        """Drop the held matches whose ticket was revoked since the last call (and those
        held without one). The engine calls it at every batch formation, also one that
        decides nothing, so the tree's list of revocations stays short."""
        revoked = self._tree.drain_revoked()
        if revoked is None:
            self.held.clear()
            self.needs.clear()
            self._tickets.clear()
            self._by_ticket.clear()
            self._pending.clear()
            self._untracked.clear()
            self._unknown = True
        else:
            if self._untracked:
                self._drop(req for req in self._untracked if req in self.held)
                self._untracked.clear()
            by_ticket = self._by_ticket
            for ticket in revoked:
                holders = by_ticket.pop(ticket, None)
                if holders is not None:
                    self._drop(holders)

    def _drop(self, reqs: Iterable[Request]) -> None:
        """These requests' held matches may have moved: read them again when asked."""
        held, needs, tickets, pending = self.held, self.needs, self._tickets, self._pending
        for req in reqs:
            del held[req], needs[req], tickets[req]
            pending[req] = None

    def take_moved(self) -> list[Request] | None:
        if self._unknown:
            self._unknown = False
            self._pending.clear()
            return None
        moved = list(self._pending)
        self._pending.clear()
        return moved

    def left(self, req: Request) -> None:
        """``req`` left the waiting queue (admitted or aborted)."""
        if self.held.pop(req, None) is not None:
            del self.needs[req]
            ticket = self._tickets.pop(req)
            if ticket is not None:
                holders = self._by_ticket[ticket]
                del holders[req]
                if not holders:
                    del self._by_ticket[ticket]
        self._pending.pop(req, None)

    def read(self, req: Request) -> int:
        """The match of ``req`` in the tree now, held (with its ticket) from now on."""
        key = req.prompt_key
        ticket: Ticket | None = None
        if key:
            ticket = self._kept.get(key)
            if ticket is None or not ticket.valid:
                tokens = self._tree.match_len(key)
                ticket = self._kept.get(key)
                if ticket is None:  # a tree that keeps nothing (the walking reference)
                    self._untracked.append(req)
            else:
                tokens = ticket.tokens
            cached = min(tokens, len(key) // TOKEN_BYTES - 1)
        else:
            cached = 0
        self.held[req] = cached
        remaining = req.max_output_tokens - req.output_tokens
        reserve = ceil(self._base_ratio * remaining) if remaining > 0 else 0
        need = self.needs[req] = len(key) // TOKEN_BYTES - cached + req.output_tokens + reserve
        self._pushed += 1
        heap = self._need_heap
        heapq.heappush(heap, (need, self._pushed, req))
        if len(heap) > 2 * len(self.needs) + 64:  # mostly stale: rebuild from the held
            heap[:] = [(n, i, r) for i, (r, n) in enumerate(self.needs.items())]
            heapq.heapify(heap)
        self._tickets[req] = ticket
        if ticket is not None:
            holders = self._by_ticket.get(ticket)
            if holders is None:
                self._by_ticket[ticket] = {req: None}
            else:
                holders[req] = None
        return cached

    def smallest_need(self, leaving: Container[Request] = ()) -> int | None:
        """The smallest :attr:`needs` entry, those of ``leaving`` (about to leave the queue)
        left out; None when nothing else is held. Amortised O(log n): stale entries are
        dropped from the heap as they surface, and so are those of ``leaving``."""
        heap, needs = self._need_heap, self.needs
        while heap:
            need, _serial, req = heap[0]
            if needs.get(req) == need and req not in leaving:
                return need
            heapq.heappop(heap)
        return None

    def read_unheld(self, req: Request) -> int:
        """The match of ``req`` in the tree now (the cache's ``cached_prefix``), not held."""
        key = req.prompt_key
        if not key:
            return 0
        ticket = self._kept.get(key)
        tokens = self._tree.match_len(key) if ticket is None or not ticket.valid else ticket.tokens
        return min(tokens, len(key) // TOKEN_BYTES - 1)
