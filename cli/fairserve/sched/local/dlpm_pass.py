"""One DLPM batching decision: the passes of Algorithm 1 (lines 17-25) without O(n) rescans.

Algorithm 1 walks the LPM-ordered queue again and again. Walking it literally costs O(n)
per pass, and a decision can need many passes (each pass a client whose deficit was
refilled after its requests were passed gets another turn). The walk is replayed exactly
with three observations:

* a pass visits, in queue order, each client's remaining requests in their own order, so
  a heap of per-client cursors yields the same visiting order;
* a client with ``q <= 0`` visited while some other backlogged client has ``q > 0`` is
  skipped without a refill, and so are all its later requests until that changes — it is
  *parked* and its cursor jumps past the skipped span when it is resumed;
* the set of backlogged clients with ``q > 0`` is kept incrementally, so CHECKREFILL
  (lines 3-5) is O(1) instead of a scan of the queue.

"Backlogged" for CHECKREFILL means *has a request left in the queue*: an admitted request
leaves it; one that failed ``can_fit`` leaves the decision (memory only shrinks while
admitting) but stays queued, so its client still blocks refills while ``q > 0``; what
still fits after the passes is admitted by the fill step (:mod:`fairserve.sched.local.dlpm`).
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from collections.abc import Callable, Collection, Sequence

from fairserve.core.types import Request

Refill = Callable[[Collection[str]], None]
"""Refill every client with ``q <= 0`` until one of the given candidates has ``q > 0``."""


class DecisionState:
    """Candidates of one decision, per client, in LPM order, and who can be served now."""

    def __init__(
        self,
        order: Sequence[Request],
        deficits: dict[str, float],
        refill: Refill,
        fill: bool = True,
    ):
        self.fill = fill
        self.failed: set[str] = set()  # clients with a request that did not fit
        self.order = order
        self.deficits = deficits
        self._refill = refill
        self.lists: dict[str, list[int]] = {}
        for index, req in enumerate(order):
            self.lists.setdefault(req.client, []).append(index)
            deficits.setdefault(req.client, 0.0)  # a client never announced joins ``l`` too
        self.positive: set[str] = {c for c in self.lists if deficits.get(c, 0.0) > 0}

    def run(self, can_fit: Callable[[Request], bool], admit: Callable[[Request], None]) -> None:
        """Passes over the remaining candidates until one changes nothing."""
        while self.lists and self._pass(can_fit, admit):
            pass
        if self.fill and self.lists:
            self._fill(can_fit, admit)

    def _fill(self, can_fit: Callable[[Request], bool], admit: Callable[[Request], None]) -> None:
        """Work conservation: what still fits goes in, in LPM order, charged as usual.

        Only clients with ``q <= 0`` have candidates left here (a client with ``q > 0`` and
        candidates would have made the last pass progress)."""
        for index in sorted(i for entries in self.lists.values() for i in entries):
            req = self.order[index]
            if can_fit(req):
                admit(req)

    # ------------------------------------------------------------ one pass
    def _pass(self, can_fit: Callable[[Request], bool], admit: Callable[[Request], None]) -> bool:
        """Lines 18-25 once over the remaining candidates; True when anything changed."""
        lists, deficits, order, positive = self.lists, self.deficits, self.order, self.positive
        cursor = dict.fromkeys(lists, 0)
        heap = [(entries[0], c) for c, entries in lists.items()]
        heapq.heapify(heap)
        parked: list[str] = []
        progress = False
        while heap:
            index, client = heap[0]
            if deficits[client] <= 0:
                if not positive:  # CHECKREFILL finds nobody to serve first
                    backlogged = lists.keys() | self.failed
                    self._refill(backlogged)
                    positive.update(c for c in backlogged if deficits[c] > 0)
                    progress = True
                    self._resume(parked, index, cursor, heap)  # pushes only after ``index``
                if deficits[client] <= 0:
                    heapq.heappop(heap)
                    parked.append(client)
                    continue
            entries = lists[client]
            position = cursor[client]
            req = order[entries.pop(position)]  # leaves the decision, fitting or not
            if can_fit(req):
                admit(req)
            else:
                self.failed.add(client)  # still backlogged: it blocks refills (line 5)
            progress = True
            if position < len(entries):
                heapq.heapreplace(heap, (entries[position], client))
            else:
                heapq.heappop(heap)
            if not entries:
                del lists[client]
            if deficits[client] <= 0 or (client not in lists and client not in self.failed):
                positive.discard(client)
            if not positive and parked:  # the next visit, whoever's, runs CHECKREFILL
                self._resume(parked, index, cursor, heap)
        return progress

    def _resume(
        self,
        parked: list[str],
        index: int,
        cursor: dict[str, int],
        heap: list[tuple[int, str]],
    ) -> None:
        """Parked clients continue with their first request after ``index``."""
        for client in parked:
            entries = self.lists[client]
            cursor[client] = bisect_right(entries, index)
            if cursor[client] < len(entries):
                heapq.heappush(heap, (entries[cursor[client]], client))
        parked.clear()
