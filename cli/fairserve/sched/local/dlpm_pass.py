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

**Refusals the host can predict.** Under overload the fill offers every request skipped for
deficit, thousands per decision, and nearly all are refused at once: the host saw a smaller
claim refused already. A host whose ``match_len`` carries :class:`Refusals` (the
simulator's batch formation) says which answers those would be (a claim at or above its
``limit``); the decision then does not ask about them, treats them exactly as a ``NO_FIT``
answer, and tells the host how many it refused so. Same questions that change anything,
same answers, same admissions: the host's side is a refusal without side effects.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Generator, Mapping, Sequence
from operator import attrgetter, length_hint
from typing import Protocol

from fairserve.core.types import Request
from fairserve.sched.local.base import EXHAUSTED, FIT, Answer

_CLIENT = attrgetter("client")

Refill = Callable[[Collection[str]], None]
"""Refill every client with ``q <= 0`` until one of the given candidates has ``q > 0``."""


class Refusals(Protocol):
    """What a host's ``match_len`` may carry as its ``refusals`` attribute (optional): the
    answers it can give without being asked.

    The host promises: while :attr:`needs` is not None, until the decision's next question,
    it would answer ``NO_FIT`` to any request whose need is at or above :attr:`limit`, and
    that answer would change nothing but its record of the refusal (no lock, no match read,
    nothing the next answers depend on). The decision may then skip the question; it never
    asks about a request it skipped so, asks about no request twice, and reports how many
    it skipped to :meth:`refused` before it returns (a host that only needs to know whether
    every request left waiting was refused can then count)."""

    @property
    def needs(self) -> Mapping[Request, int] | None:
        """Waiting request -> what its admission would claim, as far as the host knows
        (absent: ask); None: no prediction in this decision."""
        ...

    @property
    def limit(self) -> int:
        """Needs at or above this are refused (the host keeps it current after answers)."""
        ...

    @property
    def floor(self) -> int:
        """A need no request still waiting and not admitted in this decision is below,
        when :attr:`needs` holds every waiting request (-1 otherwise)."""
        ...

    def refused(self, count: int) -> None:
        """Record ``count`` more requests refused without being asked (each as if answered
        ``NO_FIT``)."""
        ...


class _NoRefusals:
    """A host that predicts no refusal: every request is asked about."""

    needs: Mapping[Request, int] | None = None
    limit = 0
    floor = -1

    def refused(self, count: int) -> None:
        raise AssertionError("nothing is predicted refused without a host's Refusals")


_NO_REFUSALS = _NoRefusals()
_NO_NEEDS: dict[Request, int] = {}


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
        refusals: Refusals | None = None,
    ):
        """``queue``: the same requests as ``order`` in the host's order, to count them in
        (with thousands waiting, reading every request costs a cache miss; in queue order
        they lie in memory as they were allocated, in LPM order they are scattered).
        ``queued``: those counts already known (clients with none absent; the state takes
        it over and counts admissions off it). ``refusals``: the host's predicted refusals
        (:class:`Refusals`), asked about no more."""
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
        needs = None if refusals is None else refusals.needs
        self.refusals: Refusals = _NO_REFUSALS if needs is None else refusals  # type: ignore[assignment]
        self._need_of: Callable[[Request], int | None] = (_NO_NEEDS if needs is None else needs).get
        self._settles = fill and self.refusals is not _NO_REFUSALS
        """Whether the decision may end once the host's limit is at or below its floor:
        nothing more would be asked, and the fill refuses whatever is left."""
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
        deficits, positive, refusals, need_of = (
            self.deficits,
            self.positive,
            self.refusals,
            self._need_of,
        )
        refused = 0  # predicted refusals, not asked (reported at the end)
        order = self.order
        candidates = order if isinstance(order, list) else list(order)  # exact length hints
        if self._settled():  # nothing will be asked at all
            refusals.refused(self._unasked(len(candidates), 0))
            return
        while candidates:  # one walk, lines 18-25, per round (inline: a walk is the hot loop)
            skipped: list[Request] = []
            progress = False  # an admission, a request found not to fit, or a refill
            refilled_past_skip = False  # a refill after a skip: the next walk may admit it
            walk = iter(candidates)
            limit = refusals.limit  # changes only with an answer (the protocol's promise)
            for req in walk:
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
                need = need_of(req)
                if need is not None and need >= limit:
                    refused += 1  # NO_FIT, without asking
                    continue
                answer = yield req
                limit = refusals.limit
                if answer is FIT:
                    self._admitted(req, admit)
                elif answer is EXHAUSTED:
                    self.exhausted = True
                    break
                if self._settles and self._settled():  # nothing more will be asked
                    refused += self._unasked(length_hint(walk), len(skipped))
                    refusals.refused(refused)
                    return
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
            refused += yield from self._fill(candidates, admit)
        if refused:
            refusals.refused(refused)

    def _settled(self) -> bool:
        """Nothing more will be asked: every request left would be refused unasked."""
        if not self._settles:
            return False
        refusals = self.refusals
        return refusals.limit <= refusals.floor

    def _unasked(self, rest: int, skipped: int) -> int:
        """The rest of a decision in which nothing more will be asked (every request left
        would be predicted refused), the fill on: ``rest`` requests not yet visited in the
        current walk, ``skipped`` skipped for deficit in it. Returns how many requests are
        refused without a question (all of them).

        What the walks would still do: at a request whose client has ``q <= 0`` with nobody
        queued holding credit, CHECKREFILL — the next one visited (this walk's rest, or the
        next walk over its skipped requests, which follows since this walk made progress)
        — once: afterwards someone queued has credit, and without admissions it keeps it.
        Every other visit is a refusal or a skip, and the fill refuses all that is left."""
        if not self.positive and (rest or skipped):
            self._check_refill()
        self.credit_blocked = bool(self.positive)
        return rest + skipped

    def _fill(
        self, candidates: Sequence[Request], admit: Callable[[Request], None]
    ) -> Generator[Request, Answer, int]:
        """The fill: offer the requests skipped for deficit, in LPM order, those the host
        predicts refused excepted; returns how many were refused so."""
        refusals = self.refusals
        if refusals is _NO_REFUSALS:
            for req in candidates:
                answer = yield req
                if answer is FIT:
                    self._admitted(req, admit)
                elif answer is EXHAUSTED:
                    break
            return 0
        need_of, refused = self._need_of, 0
        fill = iter(candidates)
        limit = refusals.limit  # changes only with an answer
        for req in fill:
            need = need_of(req)
            if need is not None and need >= limit:
                refused += 1
                continue
            answer = yield req
            limit = refusals.limit
            if answer is FIT:
                self._admitted(req, admit)
            elif answer is EXHAUSTED:
                break
            if self._settled():  # the rest is refused
                return refused + length_hint(fill)
        return refused

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
