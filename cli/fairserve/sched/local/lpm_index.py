"""The LPM order of a waiting queue, kept across batching decisions (issue 23).

Why: a decision sorted the whole queue by match length, counted its requests per client and
built a request -> match map, every time: O(waiting) Python work per decision, although
between two decisions only a few requests arrive, leave, or see their match move. Under
overload (thousands waiting per worker) that made the simulator's hour grow with the square
of its length.

How: the index keeps

* the waiting queue **as the host keeps it**, predicted from the events the policy already
  gets (an arrival joins at the back, a retracted request at the front as the simulator
  puts it back, an admission or an abort leaves), each request with a position number that
  follows that order; and the queued requests per client;
* the LPM order: the requests sorted by ``(-match, arrival_s, position)`` (the order of
  :func:`~fairserve.sched.local.lpm.lpm_sorted`: longest match first, then arrival, then
  queue position), as a sorted list of keys (``bisect``) and the requests beside them;
* the match each request was sorted by.

At a decision the host's list is compared with the predicted queue (one comparison of two
lists of the same objects, in C). When they are equal the positions are the host's, so
only the requests that joined, left or were put back, and those whose match differs from
the kept one (read for every request as before, in the host's order, so the host sees the
same calls; compared in C), are re-keyed: O(log n) each plus a memory move. When they
differ (a host that keeps another order, a caller that passes any list) the index is
rebuilt from that list, which is the full sort the decision did before. Either way the
order is exactly ``lpm_sorted``'s (``tests/sched/test_dlpm_incremental.py`` compares the
decisions step by step with the full sort).

What is still read per waiting request at a decision: the host's ``match_len``, unless the
host says which matches moved (:data:`MovedMatches`: then only those and the new arrivals
are asked), and the comparisons in C.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Sequence
from itertools import compress, repeat
from operator import attrgetter, ne, neg

from fairserve.core.types import Request

MatchLen = Callable[[Request], int]

MovedMatches = Callable[[], Collection[Request] | None]
"""What a host's ``match_len`` may carry as its ``moved`` attribute (optional): called once
at the start of a decision, it returns the waiting requests whose match may differ from
what ``match_len`` last answered for them since the previous call (a kept match whose
ticket was revoked), or None when it cannot tell. The decision then asks ``match_len`` only
about those and about requests it has no match for; the host promises that every other
waiting request's match is still the one last answered, as of the decision's start."""

_NO_MATCH = float("nan")
"""A kept match for a request that has none: differs from every match."""

Key = tuple[int, float, int]
"""``(-match, arrival_s, position)``: unique, since positions are."""

_ARRIVAL = attrgetter("arrival_s")
_CLIENT = attrgetter("client")

REBUILD_FRACTION = 4
"""Past ``1/REBUILD_FRACTION`` of the queue to re-key, one sort of everything is cheaper."""

DIRTY_SLACK = 64
"""Events kept unsettled between decisions past which they are settled at once (a host
that sends events for a long time without deciding keeps no departed request alive)."""


class LPMIndex:
    """The waiting queue in the host's order and in LPM order, with per-client counts."""

    __slots__ = (
        "_back",
        "_dirty",
        "_front",
        "_keys",
        "_matched",
        "_order",
        "_sorted",
        "_unkeyed",
        "counts",
        "queue",
        "rebuilds",
        "rekeyed",
    )

    def __init__(self) -> None:
        self.queue: dict[Request, int] = {}
        """The waiting requests in the host's order (predicted) -> position number."""
        self.counts: dict[str, int] = {}
        """Requests in :attr:`queue` per client (clients with none are absent)."""
        self._back = 0
        self._front = -1
        self._dirty: list[Request] = []
        """Requests that joined, left or moved in the queue since the order was settled."""
        self._keys: dict[Request, Key] = {}
        """The requests in the LPM order -> their key."""
        self._unkeyed: dict[Request, None] = {}
        """Requests in :attr:`queue` not in the LPM order (joined or put back since)."""
        self._matched: dict[Request, int] = {}
        """The requests in the LPM order -> the match they are sorted by."""
        self._sorted: list[Key] = []
        """The keys of the requests in the LPM order, sorted (unique: positions are)."""
        self._order: list[Request] = []
        """The requests of :attr:`_sorted`, in the same order."""
        self.rebuilds = 0
        """Full sorts so far (the first decision, and whenever the host's list differed)."""
        self.rekeyed = 0
        """Requests (re-)inserted into the order without a full sort, so far."""

    # ------------------------------------------------------------ events
    def joined(self, req: Request) -> None:
        """An arrival: at the back of the queue."""
        queue = self.queue
        if req in queue:
            return  # announced twice: the host's list decides at the next decision
        queue[req] = self._back
        self._back += 1
        self._count(req.client, 1)
        self._unkeyed[req] = None
        self._touched(req)

    def put_back(self, req: Request) -> None:
        """A retraction: at the front of the queue, as the simulator puts it back."""
        if req in self.queue:
            return
        self.queue = {req: self._front, **self.queue}  # O(queue) in C: retractions are rare
        self._front -= 1
        self._count(req.client, 1)
        self._unkeyed[req] = None
        self._touched(req)

    def left(self, req: Request) -> None:
        """An admission, or an abort while waiting."""
        if self.queue.pop(req, None) is None:
            return
        self._unkeyed.pop(req, None)
        self._count(req.client, -1)
        self._touched(req)

    # ------------------------------------------------------------ a decision
    def order(
        self, waiting: list[Request], matches: list[int]
    ) -> tuple[list[Request], dict[Request, int]] | None:
        """``waiting`` in LPM order and each request's match, ``matches`` being the
        matches of ``waiting`` in its order; None when ``waiting`` lists a request twice
        (the caller sorts it itself). Afterwards :attr:`counts` counts ``waiting``."""
        if not self._describes(waiting) or len(self._unkeyed) * REBUILD_FRACTION > len(waiting):
            return self._rebuild(waiting, matches)
        self._settle()
        kept = map(self._matched.get, waiting, repeat(_NO_MATCH))
        moved = list(compress(zip(waiting, matches, strict=True), map(ne, matches, kept)))
        if len(moved) * REBUILD_FRACTION > len(waiting):
            return self._rebuild(waiting, matches)
        return self._rekey(moved)

    def order_moved(
        self, waiting: list[Request], match_len: MatchLen, moved: Iterable[Request]
    ) -> tuple[list[Request], dict[Request, int]] | None:
        """:meth:`order` for a host that says which matches may have moved (``moved``,
        see :data:`MovedMatches`): ``match_len`` is asked only about those and about the
        requests the order does not hold yet.

        When ``waiting`` is not the queue the events describe, every match is read and the
        order rebuilt from that list at once: the host reports a moved match only once, so
        a decision that left the kept matches as they were would keep a stale one for
        every later decision. None only for a list with a request twice (the caller then
        sorts it itself)."""
        if not self._describes(waiting):
            return self._rebuild(waiting, list(map(match_len, waiting)))
        self._settle()
        queue, matched = self.queue, self._matched
        reread = dict.fromkeys(self._unkeyed)
        reread.update(dict.fromkeys(req for req in moved if req in queue))
        changed: list[tuple[Request, int]] = []
        for req in sorted(reread, key=queue.__getitem__):  # in the host's order
            match = match_len(req)
            if matched.get(req, _NO_MATCH) != match:
                changed.append((req, match))
        if len(changed) * REBUILD_FRACTION > len(waiting):
            matched.update(changed)
            return self._rebuild(waiting, list(map(matched.__getitem__, waiting)))
        return self._rekey(changed)

    def _describes(self, waiting: list[Request]) -> bool:
        """Whether ``waiting`` is the queue the events describe, in the same order."""
        return len(self.queue) == len(waiting) and list(self.queue) == waiting

    def _rekey(self, moved: list[tuple[Request, int]]) -> tuple[list[Request], dict[Request, int]]:
        """Put ``moved`` (request, match) in the order by their match; every request of the
        queue is then in it."""
        ranked, order, keys, queue = self._sorted, self._order, self._keys, self.queue
        matched = self._matched
        for req, match in moved:
            old = keys.get(req)
            if old is not None:
                at = bisect_left(ranked, old)
                del ranked[at], order[at]
            key = (-match, req.arrival_s, queue[req])
            at = bisect_left(ranked, key)
            ranked.insert(at, key)
            order.insert(at, req)
            keys[req] = key
            matched[req] = match
        self._unkeyed.clear()
        self.rekeyed += len(moved)
        return list(order), matched

    # ------------------------------------------------------------ internals
    def _rebuild(
        self, waiting: Sequence[Request], matches: list[int]
    ) -> tuple[list[Request], dict[Request, int]] | None:
        """Everything from the host's list: positions are its positions."""
        positions = dict(zip(waiting, range(len(waiting)), strict=True))
        self._dirty.clear()
        if len(positions) != len(waiting):
            self._reset()
            return None
        self.rebuilds += 1
        self.queue = positions
        self._unkeyed.clear()
        self._back, self._front = len(waiting), -1
        self.counts = dict(Counter(map(_CLIENT, waiting)))
        self._matched = dict(zip(waiting, matches, strict=True))
        count = len(waiting)
        arrivals = list(map(_ARRIVAL, waiting))
        keys = list(zip(map(neg, matches), arrivals, range(count), strict=True))
        if arrivals == sorted(arrivals):  # queue order follows arrival: sort on the match
            ranks = sorted(range(count), key=matches.__getitem__, reverse=True)  # stable
        else:
            ranks = sorted(range(count), key=keys.__getitem__)
        self._sorted = list(map(keys.__getitem__, ranks))
        self._order = list(map(waiting.__getitem__, ranks))
        self._keys = dict(zip(waiting, keys, strict=True))
        return list(self._order), self._matched

    def _reset(self) -> None:
        self.queue, self.counts = {}, {}
        self._keys, self._matched, self._unkeyed = {}, {}, {}
        self._sorted, self._order = [], []
        self._dirty.clear()

    def _settle(self) -> None:
        """Take the requests that left or moved in the queue out of the order (and forget
        their match, so that the ones still waiting are put back with their new position)."""
        dirty = self._dirty
        if not dirty:
            return
        ranked, order, keys, matched, queue = (
            self._sorted,
            self._order,
            self._keys,
            self._matched,
            self.queue,
        )
        for req in dict.fromkeys(dirty):
            key = keys.get(req)
            if key is None or queue.get(req) == key[2]:
                continue
            at = bisect_left(ranked, key)
            del ranked[at], order[at]
            del keys[req]
            matched.pop(req, None)  # one put back is in ``_unkeyed`` already
        dirty.clear()

    def _touched(self, req: Request) -> None:
        dirty = self._dirty
        dirty.append(req)
        if len(dirty) > 2 * len(self.queue) + DIRTY_SLACK:
            self._settle()

    def _count(self, client: str, delta: int) -> None:
        counts = self.counts
        count = counts.get(client, 0) + delta
        if count > 0:
            counts[client] = count
        else:
            counts.pop(client, None)
