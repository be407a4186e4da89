"""Virtual Token Counter (VTC, Sheng et al. OSDI'24, Algorithm 2) and its lift-less twin LCF.

Every client has a counter ``c_i`` of the (weighted) service it received. At a batching
step the client with the smallest counter among those with waiting candidates gets its
earliest request admitted; admissions and decoded tokens raise the counter. A client that
re-enters the queue is *lifted* to the level of the clients already waiting, so credit
earned while idle cannot be saved up and spent later (VTC lines 7-13).

Departures from the paper, on purpose:

* **Work conservation.** Algorithm 2 stops (``Break``) at the first request that does not
  fit; here that request is skipped and the selection goes on, so a worker is never left
  idle with fitting work (DESIGN §1). The client keeps its place with its next request.
  Skipping alone breaks Theorem 4.4 when request sizes differ and memory is the limit: the
  memory freed by small requests goes to the small-request client for ever (issue 17: a
  gap of 127k against a bound of 40k). So after ``memory_patience`` consecutive decisions
  that admitted others past the least-counter client blocked on memory, the selection
  stops at it (the ``Break``) until it fits or is no longer the least served
  (:class:`~fairserve.sched.local.patience.MemoryPatience`); running requests keep decoding.
  With it the bound ``2·max(w_p·L_input, w_q·M)`` holds on memory-bound mixed-size
  workloads (``tests/sched/test_local_memory_bound.py``); ``memory_patience=0`` is
  Algorithm 2 exactly.
* **Charged prompt tokens.** fairserve measures service prefix-aware, ``w_e`` per *extend*
  token (DLPM §3), so every policy is compared on the same yardstick; with the default
  :class:`~fairserve.core.cost.WeightedTokenCost` and no prefix cache this is exactly the
  paper's ``w_p·input``. ``charge_cached=True`` restores the paper's charge (cached prompt
  tokens count as if computed) for the *counter* only; ``service`` stays what was computed.
* **Weights.** Charges are divided by the client's weight (weighted VTC).
* **Bounded clients.** Past ``max_clients`` tracked clients (the shared ``MAX_CLIENTS``)
  an idle client is forgotten only if its counter is at most ``L``: the least of the
  counters the active clients (requests waiting or running) had when they became active,
  and of the counter of the last client to leave the queue. Every later lift floor is at
  least ``L``: a client becomes active lifted to the floor or above it; its counter never
  falls below that entry value while it stays active (a ``correct_extend`` refund takes
  back at most what that request was charged in the same period, weights unchanged); the
  last to leave was active. So the forgotten client, back at 0 and lifted, gets the counter
  it would have had: decisions are unchanged (``tests/sched/test_client_bound.py``). An
  idle client above ``L`` (over-served) is kept with its debt until the floor passes it;
  until then such clients may hold the count above the cap. The last client to leave is
  never forgotten (its counter is the idle floor). LCF has no lift: a returning client
  keeps its saved credit there, so LCF forgets any idle client (least recently arrived
  first), which turns it into a new name starting at 0, as LCF treats every newcomer.

A decision costs O(n log k) for n waiting requests of k clients (a heap of counters).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fairserve.core.types import Request
from fairserve.sched.local.base import (
    EXHAUSTED,
    FIT,
    Decision,
    LocalPolicy,
    MatchLen,
    register_local,
)
from fairserve.sched.params import MEMORY_PATIENCE, W_E, W_Q, Params, param


@dataclass(frozen=True, slots=True)
class VTCParams(Params):
    """Algorithm 2's token weights, what the counter charges, and the memory patience."""

    w_e: float = W_E.field()
    w_q: float = W_Q.field()
    charge_cached: bool = param(
        False, "charge cached prompt tokens to the counter too (the paper's w_p·input)"
    )
    memory_patience: int = MEMORY_PATIENCE.field()


@register_local
class VTC(LocalPolicy):
    """Least counter first with the counter lift on re-entry (VTC Algorithm 2)."""

    name = "vtc"
    description = "virtual token counter: serve the least-served client, lift returning clients"
    config: VTCParams
    lift = True

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.counters: dict[str, float] = {}
        self._last_left: str | None = None
        self._entered: dict[str, float] = {}
        """Each active client's counter when it became active (no refund goes below it)."""

    # ------------------------------------------------------------ events
    def _arrive(self, req: Request, now_s: float) -> None:
        client = req.client
        self.counters.setdefault(client, 0.0)
        if self.lift and self.waiting.get(client, 0) == 0:
            self._lift(client)
        if client not in self.outstanding:  # idle until now: a new active period
            self._entered[client] = self.counters[client]

    def _finished(self, req: Request, now_s: float) -> None:
        if req.client not in self.outstanding:  # its last request left: idle
            self._entered.pop(req.client, None)

    def _lift(self, client: str) -> None:
        """Lines 8-13: raise a re-entering client to the level of the waiting ones."""
        waiting = [self.counters[c] for c, n in self.waiting.items() if n > 0]
        if waiting:
            floor = min(waiting)
        elif self._last_left is not None:
            floor = self.counters.get(self._last_left, 0.0)
        else:
            return
        self.counters[client] = max(self.counters[client], floor)

    def decide(self, waiting: Sequence[Request], match_len: MatchLen, now_s: float) -> Decision:
        """Lines 19-25: smallest counter first; skip (not stop at) what does not fit."""
        queues: dict[str, deque[Request]] = {}
        for req in sorted(waiting, key=lambda r: r.arrival_s):
            queues.setdefault(req.client, deque()).append(req)
        heap = [(self.counters.get(c, 0.0), c) for c in queues]
        heapq.heapify(heap)
        admitted: list[Request] = []
        patience = self.patience
        blocked: str | None = None  # the least-counter client whose request did not fit
        bypassed = False
        while heap:
            _, client = heapq.heappop(heap)
            queue = queues[client]
            req = queue.popleft()
            answer = yield req
            if answer is FIT:
                self.on_admit(req, max(0, req.input_tokens - match_len(req)), now_s)
                admitted.append(req)
                bypassed = bypassed or (blocked is not None and client != blocked)
            else:
                if blocked is None:
                    blocked = client
                    if patience is not None and patience.hold:
                        break  # line 21's Break: freed memory waits for this request
                if answer is EXHAUSTED:
                    break  # nothing later fits: the rest would change nothing
            if queue:
                heapq.heappush(heap, (self.counters.get(client, 0.0), client))
        if patience is not None:
            patience.decided(blocked, bypassed)
        return admitted

    def _admitted(self, req: Request, extend_tokens: int, now_s: float) -> None:
        if self.waiting.get(req.client, 0) == 0:
            self._last_left = req.client
        if self.config.charge_cached:
            self.counters[req.client] += self._cached_charge(req, extend_tokens)

    def correct_extend(self, req: Request, extend_tokens: int) -> None:
        """With ``charge_cached`` the counter stays charged for the whole prompt."""
        estimate = self._estimated_extend.get(id(req))
        super().correct_extend(req, extend_tokens)
        if self.config.charge_cached and estimate is not None:
            delta = self.cost.admit_cost(req, extend_tokens) - self.cost.admit_cost(req, estimate)
            self.counters[req.client] -= delta / self.weight(req.client)

    def on_abort(self, req: Request, now_s: float, was_waiting: bool) -> None:
        super().on_abort(req, now_s, was_waiting)
        if was_waiting and self.waiting.get(req.client, 0) == 0:
            self._last_left = req.client

    def _on_service(self, client: str, weighted_amount: float) -> None:
        self.counters[client] = self.counters.get(client, 0.0) + weighted_amount

    def _forgettable(self, now_s: float) -> Callable[[str], bool]:
        """VTC: idle clients at or below every future lift floor (see the module's
        docstring), never the last one to leave (its counter is the idle floor)."""
        if not self.lift:
            return super()._forgettable(now_s)
        counters, entered = self.counters, self._entered
        last = self._last_left
        floor = min(entered.values(), default=math.inf)
        if last is None:
            floor = min(floor, 0.0)  # no lift yet when nobody waits: a client keeps its counter
        elif last not in entered:  # idle: no refund can lower its counter any more
            floor = min(floor, counters.get(last, 0.0))
        return lambda client: client != last and counters.get(client, 0.0) <= floor

    def _forget(self, client: str) -> None:
        self.counters.pop(client, None)
        self._entered.pop(client, None)

    def _cached_charge(self, req: Request, extend_tokens: int) -> float:
        full = self.cost.admit_cost(req, req.input_tokens)
        return (full - self.cost.admit_cost(req, extend_tokens)) / self.weight(req.client)

    # ------------------------------------------------------------ state
    def _client_state(self, client: str) -> dict[str, Any]:
        return {"counter": self.counters.get(client, 0.0)}


@register_local
class LCF(VTC):
    """VTC without the lift: a client back from idle spends its saved-up credit at once."""

    name = "lcf"
    description = "least counter first: VTC without the lift (unfair after idle periods)"
    lift = False
