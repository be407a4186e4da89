"""Deficit Longest Prefix Match (DLPM, Algorithm 1 of the DLPM/DoubleQ paper).

LPM order inside deficit round robin: every client has a deficit ``q``; a request is
admitted in longest-prefix-first order only while its client's ``q > 0``; an admission
costs ``w_e·extend`` and every decoded token ``w_q`` (both divided by the client's weight).
When a request's client has ``q <= 0`` the scheduler runs CHECKREFILL: if no client with
queued requests has ``q > 0``, every known client with ``q <= 0`` gets the quantum ``Q^u``.
A new client starts at ``q = 0``. This keeps LPM's cache locality (clients are switched
only when their quantum is spent) with the bound ``|W_f − W_g| <= 2·(U + Q^u)`` between
backlogged clients, ``U = w_e·L_input + w_q·M`` (Theorems 4.1 and 4.2).

**Work-conservation refinement.** In the paper a client with ``q > 0`` whose requests do
not fit blocks CHECKREFILL, so the clients with ``q <= 0`` are skipped even when their
requests fit, and the worker idles. Here Algorithm 1 runs unchanged (a client whose
requests failed ``can_fit`` still counts as backlogged and still blocks refills, so every
backlogged client is refilled the same number of times — the step Theorem 4.1's proof
rests on); then a *fill* step admits, in LPM order, whatever else still fits, charged as
usual, so the fillers' deficits go further below zero and they repay it before their next
refill. ``work_conserving=false`` leaves the fill out (Algorithm 1 exactly).

**Fill patience.** The fill alone lets small requests of clients without credit take every
token that frees up, so a client with credit whose requests are larger (a long prompt not
in the cache) can starve for as long as the others keep sending: seen in the simulator, a
long-context client got nothing for a whole run. After ``fill_patience`` consecutive
decisions that end with a client with credit blocked on memory, the fill pauses (the
worker keeps decoding its batch; only new admissions wait) until that client's request
fits, then resumes. This is the shared :class:`~fairserve.sched.local.patience.MemoryPatience`
that VTC, LCF and Justitia use too (there counted in bypasses of the least-served client).

Why not the simpler refinement "a client whose requests all failed ``can_fit`` is not
backlogged for CHECKREFILL": the LPM-first client then takes the freed memory at every
decision, is refilled every time, and a small-request client behind it gets nothing.
Over 1,500 randomised workloads it broke the ``2·(U + Q^u)`` bound in 16 (up to 1.37x);
with the fill none did (worst 0.87 of the bound). The fill can still exceed it when one
client's requests are persistently larger than the memory that frees up while others'
small ones take it (fragmentation, which the proof does not consider; the fill patience
bounds how long). With equal memory
needs the fill never admits anything (what does not fit for one fits for none), so the
decisions are Algorithm 1's.

**Bounded clients.** A client keeps its deficit when its queue empties, and every refill
raises the idle clients with ``q <= 0`` too, so an idle client soon holds ``0 < q <= Q^u``.
Past ``max_clients`` tracked clients only such idle clients are forgotten (never one in
debt, whose debt would be forgiven): one that returns starts at ``q = 0`` like a new
client, so forgetting costs it at most ``Q^u`` of credit (plus prompt charges refunded
by ``correct_extend`` after a refill had already paid for them; it waits for the next refill,
which CHECKREFILL runs as soon as no queued client has credit) and gives nobody more
(``tests/sched/test_client_bound.py``).

**Cost of a decision.** ``match_len`` is called once per waiting request (hosts answer
from kept matches: the radix tree keeps each waiting request's match across steps,
:mod:`~fairserve.core.radix_matches`). The LPM order and the queued requests per client are
kept across decisions (:mod:`~fairserve.sched.local.lpm_index`): fed by the arrival,
admission, retraction and abort events, a decision re-keys only the requests that joined,
left, or whose match moved (O(log n) each), and sorts everything (O(n log n)) only when the
host's list is not the queue those events describe. Each pass of Algorithm 1 is one loop
with O(1) work per request (CHECKREFILL keeps the set of queued clients with credit
incrementally, see :mod:`~fairserve.sched.local.dlpm_pass`), and a later pass visits only
the requests the previous one skipped for deficit. A host whose ``match_len`` says which
matches moved (``moved()``, :data:`~fairserve.sched.local.lpm_index.MovedMatches`; the
simulator's :mod:`~fairserve.sim.match_feed`) is asked only about those and the arrivals.
What stays O(waiting) per decision: the walks and the fill, one Python step per request,
and, unless the host answers ``EXHAUSTED``, one question per request that the deficits
let through (under overload nearly every waiting request, most refused at once: the fill
offers every skipped request). Figures, matching included, in ``tests/perf``
(``bench_sched.py --only select``).
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace
from typing import Any

from fairserve.core.radix_node import common_tokens
from fairserve.core.types import TOKEN_BYTES, Request
from fairserve.sched.local.base import (
    FIT,
    CanFit,
    Decision,
    LocalPolicy,
    MatchLen,
    drive,
    register_local,
)
from fairserve.sched.local.dlpm_pass import DecisionState
from fairserve.sched.local.lpm import lpm_sorted
from fairserve.sched.local.lpm_index import LPMIndex
from fairserve.sched.local.patience import MemoryPatience
from fairserve.sched.params import QUANTUM, W_E, W_Q, Params, param


@dataclass(frozen=True, slots=True)
class DLPMParams(Params):
    """Algorithm 1's quantum and costs, and the work-conservation refinement's switches."""

    quantum: float = QUANTUM.field()
    w_e: float = W_E.field()
    w_q: float = W_Q.field()
    work_conserving: bool = param(
        True,
        "admit what still fits after the deficit passes (false: Algorithm 1 exactly, may idle)",
    )
    fill_patience: int = param(
        8,
        "decisions a client with credit may stay blocked on memory before the fill pauses "
        "so freed memory goes to it (0: pause at once)",
        minimum=0,
    )


INDEX_MIN_WAITING = 1_000
"""Below this many waiting requests a decision whose host reads every match anyway sorts
the queue instead of using the kept order: re-keying what changed costs ~5 µs a request
(a binary search on tuples, a memory move), sorting ~0.25 µs per waiting request, so with
a batch's worth of changes (tens) the kept order pays only from about a thousand waiting."""

CREDIT_BLOCKED = "clients with credit"
"""What DLPM reports blocked to its :class:`MemoryPatience`: any client with credit."""


@register_local
class DLPM(LocalPolicy):
    """LPM order gated by per-client deficit counters with quantum refills."""

    name = "dlpm"
    description = "deficit longest prefix match: LPM cache reuse with a per-client quantum"
    config: DLPMParams

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.deficits: dict[str, float] = {}
        self.refills = 0
        self.lpm_index = LPMIndex()
        """The waiting queue's LPM order and per-client counts, kept across decisions."""
        self.incremental = True
        """Decide from :attr:`lpm_index` (False: sort the whole queue at every decision,
        the reference ``tests/sched/test_dlpm_incremental.py`` compares it with)."""
        self.index_min_waiting = INDEX_MIN_WAITING
        """Waiting requests from which a decision without a moved-match feed uses the kept
        order (tests lower it)."""
        self.patience = self._fill_patience = MemoryPatience(self.config.fill_patience)
        """The shared memory patience, fed with "a client with credit is blocked" (any
        of them, bypassed or not: DLPM's original fill patience, so its records stay as
        they were)."""

    @property
    def blocked_decisions(self) -> int:
        """Consecutive decisions that ended with a client with credit blocked on memory."""
        return self._fill_patience.bypasses

    # ------------------------------------------------------------ configuration
    @property
    def quantum(self) -> float:
        return self.config.quantum

    def set_quantum(self, quantum: float) -> None:
        """Set ``Q^u`` live; the next refill (next decision at the latest) uses it.

        Lowering it also caps credit already handed out at the new quantum: otherwise a
        client refilled under the old, larger quantum keeps spending it while the others
        (refilled with the new one) wait, which is the opposite of what the operator asked."""
        value = float(QUANTUM.validate(f"policy {self.name}", quantum))
        self.config = replace(self.config, quantum=value)
        for client, q in self.deficits.items():
            if q > value:
                self.deficits[client] = value

    # ------------------------------------------------------------ events
    def _arrive(self, req: Request, now_s: float) -> None:
        """Line 12: a client seen for the first time joins the list ``l`` with ``q = 0``."""
        self.deficits.setdefault(req.client, 0.0)
        self.lpm_index.joined(req)

    def on_retract(self, req: Request, now_s: float) -> None:
        super().on_retract(req, now_s)
        self.lpm_index.put_back(req)

    def on_abort(self, req: Request, now_s: float, was_waiting: bool) -> None:
        super().on_abort(req, now_s, was_waiting)
        if was_waiting:
            self.lpm_index.left(req)

    def _admitted(self, req: Request, extend_tokens: int, now_s: float) -> None:
        self.lpm_index.left(req)

    def _on_service(self, client: str, weighted_amount: float) -> None:
        """Lines 24 and 27: admissions and decoded tokens are taken off the deficit."""
        self.deficits[client] = self.deficits.get(client, 0.0) - weighted_amount

    def decide(self, waiting: Sequence[Request], match_len: MatchLen, now_s: float) -> Decision:
        """Lines 16-25, replayed pass by pass until a pass changes nothing.

        The extend charged at admission counts as cached the longest of the match in the
        worker's cache and the prefix shared with requests admitted earlier in the same
        decision: charging the shared prefix again and refunding it after the decision
        (``correct_extend``) would trigger refills on phantom costs and leave the client
        with ``q`` far above ``Q^u``, starving everyone else until it is spent."""
        if len(waiting) == 1:
            return self._decide_one(waiting[0], match_len, now_s)
        return self._decide_passes(waiting, match_len, now_s)

    def _select_passes(
        self, waiting: Sequence[Request], can_fit: CanFit, match_len: MatchLen, now_s: float
    ) -> list[Request]:
        """The general decision even for a queue of one (tests compare the shortcut to it)."""
        return drive(self._decide_passes(waiting, match_len, now_s), can_fit)

    def _decide_passes(
        self, waiting: Sequence[Request], match_len: MatchLen, now_s: float
    ) -> Decision:
        """The general decision: LPM order, Algorithm 1's passes, then the fill."""
        queue = waiting if isinstance(waiting, list) else list(waiting)
        kept = self._kept_order(queue, match_len) if self.incremental else None
        queued: dict[str, int] | None = None
        if kept is None:
            matches = list(map(match_len, waiting))  # once per request per decision
            if self.incremental and len(queue) >= self.index_min_waiting:
                kept = self.lpm_index.order(queue, matches)
        if kept is None:
            matched = dict(zip(waiting, matches, strict=True))  # identity keys (``eq=False``)
            order = lpm_sorted(waiting, matches, matched)
        else:
            order, matched = kept
            queued = dict(self.lpm_index.counts)
        admitted: list[Request] = []
        batch = _AdmittedPrompts()

        def admit(req: Request) -> None:
            cached = batch.cached_tokens(req.prompt_key, matched[req])
            self.on_admit(req, max(0, req.input_tokens - cached), now_s)
            batch.add(req.prompt_key)
            admitted.append(req)

        fill = self.config.work_conserving and not self._fill_patience.hold
        state = DecisionState(
            order,
            self.deficits,
            self._refill,
            fill,
            queue=waiting,
            queued=queued,
            refusals=getattr(match_len, "refusals", None),
        )
        yield from state.run(admit)
        self._fill_patience.decided(CREDIT_BLOCKED if state.credit_blocked else None, bypassed=True)
        return admitted

    def _kept_order(
        self, queue: list[Request], match_len: MatchLen
    ) -> tuple[list[Request], dict[Request, int]] | None:
        """The kept order when the host's ``match_len`` says which matches moved
        (:data:`~fairserve.sched.local.lpm_index.MovedMatches`); None otherwise."""
        moved_of = getattr(match_len, "moved", None)
        moved = moved_of() if moved_of is not None else None
        if moved is None:
            return None
        return self.lpm_index.order_moved(queue, match_len, moved)

    def _decide_one(self, req: Request, match_len: MatchLen, now_s: float) -> Decision:
        """:meth:`decide` for a queue of one request, which is most decisions of a worker
        that keeps up; the same deficits, refills and fill patience as the general passes
        (the only backlogged client is refilled if it has no credit, then the request is
        admitted if it fits), without their per-decision set-up."""
        client = req.client
        if self.deficits.setdefault(client, 0.0) <= 0:
            self._refill((client,))  # CHECKREFILL: nobody queued has credit
        if (yield req) is not FIT:  # the client now has credit and is blocked on memory
            self._fill_patience.decided(CREDIT_BLOCKED, bypassed=True)
            return []
        self.on_admit(req, max(0, req.input_tokens - match_len(req)), now_s)
        self._fill_patience.decided(None, bypassed=False)
        return [req]

    def _refill(self, candidates: Collection[str]) -> None:
        """Lines 6-7, as many times in a row as it takes to give a candidate ``q > 0``.

        Algorithm 1 refills once per visit while every backlogged client has ``q <= 0``;
        doing the consecutive refills at once gives the same deficits without a visit
        each (only which requests of this pass are skipped differs; they are retried in
        the next pass)."""
        quantum = self.config.quantum
        rounds = min(math.floor(-self.deficits.get(c, 0.0) / quantum) + 1 for c in candidates)
        rounds = max(1, rounds)
        while True:
            for client, q in self.deficits.items():
                if q <= 0:
                    need = math.floor(-q / quantum) + 1
                    self.deficits[client] = q + quantum * min(rounds, need)
            self.refills += rounds
            if any(self.deficits.get(c, 0.0) > 0 for c in candidates):
                return
            rounds = 1  # float rounding left everyone at exactly 0: one more round

    def _forgettable(self, now_s: float) -> Callable[[str], bool]:
        """Idle clients holding credit (see the module's docstring: at most ``Q^u`` lost)."""
        deficits = self.deficits
        return lambda client: deficits.get(client, 0.0) > 0

    def _forget(self, client: str) -> None:
        self.deficits.pop(client, None)

    # ------------------------------------------------------------ state
    def snapshot(self) -> dict[str, Any]:
        out = super().snapshot()
        out["refills"] = self.refills
        return out

    def _client_state(self, client: str) -> dict[str, Any]:
        return {"deficit": self.deficits.get(client, 0.0)}


class _AdmittedPrompts:
    """Prompts admitted so far in one decision, whose prefixes later admissions share.

    Kept sorted: the admitted prompt sharing the longest prefix with a key is next to where
    the key sorts (byte order follows shared prefixes), so a lookup compares two
    neighbours, not every prompt (building a radix tree of the batch cost a fifth of a
    decision)."""

    def __init__(self) -> None:
        self._keys: list[bytes] = []

    def cached_tokens(self, key: bytes, matched: int) -> int:
        """``max(matched, tokens key shares with an admitted prompt)``."""
        keys = self._keys
        if not keys or len(key) <= matched * TOKEN_BYTES:
            return matched
        at = bisect_left(keys, key)
        # Sharing more than ``matched`` tokens means starting with this (a view: no copy).
        longer = memoryview(key)[: (matched + 1) * TOKEN_BYTES]
        best = matched
        for other in keys[max(0, at - 1) : at + 1]:
            if other.startswith(longer):
                best = max(best, common_tokens(key, 0, other))
        return best

    def add(self, key: bytes) -> None:
        insort(self._keys, key)
