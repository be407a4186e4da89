"""One DLPM batching decision: the passes of Algorithm 1 (lines 17-25), in linear time.

Algorithm 1 walks the LPM-ordered queue again and again until a walk changes nothing.
Each walk here is one Python loop over the requests still in play, with O(1) work per
request:

* CHECKREFILL (lines 3-5) asks whether any client with queued requests has ``q > 0``; the
  set of such clients is kept incrementally (``positive``) instead of scanning the queue;
* a request that failed ``can_fit`` is not asked again in this decision (memory only
  shrinks while admitting), but its client still has a queued request, so it still blocks
  refills while it has ``q > 0`` — exactly as in the paper;
* the next walk visits only the requests skipped for a non-positive deficit, in LPM order.

After the walks, the optional *fill* admits, in LPM order, whatever still fits among the
skipped requests, charged as usual (work conservation when every client with credit is
blocked on memory; see :mod:`fairserve.sched.local.dlpm`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Generator, Sequence
from operator import attrgetter

from fairserve.core.types import Request
from fairserve.sched.local.base import EXHAUSTED, FIT, Answer

_CLIENT = attrgetter("client")

Refill = Callable[[Collection[str]], None]
"""Refill every client with ``q <= 0`` until one of the given candidates has ``q > 0``."""


class DecisionState:
    """Requests still in play in one decision, queued counts per client, and who has credit."""

    def __init__(
        self,
        order: Sequence[Request],
        deficits: dict[str, float],
        refill: Refill,
        fill: bool = True,
        queue: Sequence[Request] | None = None,
        queued: dict[str, int] | None = None,
    ):
        """``queue``: the same requests as ``order`` in the host's order, to count them in
        (with thousands waiting, reading every request costs a cache miss; in queue order
        they lie in memory as they were allocated, in LPM order they are scattered).
        ``queued``: those counts already known (clients with none absent; the state takes
        it over and counts admissions off it)."""
        self.order = order
        self.deficits = deficits
        self._refill = refill
        self.fill = fill
        if queued is None:
            counted = order if queue is None else queue
            queued = Counter(map(_CLIENT, counted))  # counts in C
        self.queued: dict[str, int] = queued
        for client in self.queued:
            deficits.setdefault(client, 0.0)  # a client never announced joins ``l`` too
        self.positive: set[str] = {c for c in self.queued if deficits[c] > 0}
        self.credit_blocked = False
        self.exhausted = False
        """The host answered ``EXHAUSTED``: its budget is spent, nothing more is asked."""

    def run(self, admit: Callable[[Request], None]) -> Generator[Request, Answer, None]:
        """Walks over the requests in play until one changes nothing, then the fill; yields
        each request it asks about and receives the host's answer.

        ``EXHAUSTED`` ends the decision at once. Answering ``NO_FIT`` to everything left
        instead would change nothing: the client asked about has credit and a queued
        request, so ``positive`` stays non-empty (no refill can happen), nothing more is
        admitted, and the clients with credit are blocked on memory either way."""
        deficits, positive = self.deficits, self.positive
        candidates: Sequence[Request] = self.order
        while candidates:  # one walk, lines 18-25, per round (inline: a walk is the hot loop)
            skipped: list[Request] = []
            progress = False  # an admission, a request found not to fit, or a refill
            refilled_past_skip = False  # a refill after a skip: the next walk may admit it
            for req in candidates:
                client = req.client
                if deficits[client] <= 0:
                    if not positive:
                        self._check_refill()
                        progress = True
                        refilled_past_skip = bool(skipped)
                    if deficits[client] <= 0:
                        skipped.append(req)
                        continue
                progress = True
                answer = yield req
                if answer is FIT:
                    self._admitted(req, admit)
                elif answer is EXHAUSTED:
                    self.exhausted = True
                    break
            candidates = skipped  # the next walk visits the requests skipped for deficit
            if not progress or self.exhausted:
                break
            if positive and not refilled_past_skip:
                # Every skipped client still has q <= 0 (only refills raise q) and someone
                # queued has credit (no refill can come): the next walk would skip them all.
                break
        # Clients still holding credit with requests in play are blocked on memory.
        self.credit_blocked = bool(positive)
        if self.fill and not self.exhausted:
            for req in candidates:
                answer = yield req
                if answer is FIT:
                    self._admitted(req, admit)
                elif answer is EXHAUSTED:
                    break

    def _admitted(self, req: Request, admit: Callable[[Request], None]) -> None:
        client = req.client
        admit(req)  # charges the deficit through the policy
        self.queued[client] -= 1
        if self.queued[client] == 0 or self.deficits[client] <= 0:
            self.positive.discard(client)

    def _check_refill(self) -> None:
        """Lines 6-7: nobody with queued requests has credit, so every ``q <= 0`` gets Q^u."""
        backlogged = [c for c, n in self.queued.items() if n > 0]
        self._refill(backlogged)
        self.positive.update(c for c in backlogged if self.deficits[c] > 0)
