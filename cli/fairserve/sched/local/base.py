"""The local-policy interface every host drives (DESIGN §2).

Event contract, identical in the simulator, the router's fair queue and the SGLang plugin:

* ``on_arrival(req, now_s)`` when a request enters the waiting queue (may raise
  :class:`~fairserve.core.errors.RequestRejected`, e.g. ``rpm``);
* ``select(waiting, can_fit, match_len, now_s)`` at a batching step: returns the requests to
  admit, in admission order, already charged with their estimated extend tokens
  (``input − match_len``). ``can_fit(req)`` answers for memory and token budget; **a True
  answer is final** (the policy admits that request), so hosts reserve inside ``can_fit``.
  A request that does not fit is skipped and the rest are still tried (work conservation).
  ``select`` is a thin driver of ``decide(waiting, match_len, now_s)``, the decision as a
  generator: it yields each candidate and receives an :class:`Answer` (``FIT``, ``NO_FIT``,
  or ``EXHAUSTED``: the engine's budget is spent, nothing more fits), and returns the
  admitted list. Pull-style hosts (SGLang's admission loop offers one request at a time to
  ``PrefillAdder.add_one_req``) drive ``decide`` directly, without a thread;
* ``correct_extend(req, extend_tokens)`` when the real extend differs from the estimate;
* ``on_decode_step(running, now_s)`` after a forward step in which every request in
  ``running`` produced one token, *after* the host incremented ``req.output_tokens``
  (``on_decode_steps(running, steps, now_s)`` for several fused steps);
* ``on_finish(req, now_s)``, ``on_abort(req, now_s)`` (left without finishing),
  ``on_retract(req, now_s)`` (moved from running back to waiting under memory pressure).

``EXHAUSTED`` means "``NO_FIT`` for this candidate and every later one": a decision that
receives it ends as if every remaining ``can_fit`` had answered False (same admissions, same
policy state; ``tests/sched/test_local_decide.py``), without asking about the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping, Sequence
from enum import Enum
from typing import Any

from fairserve.core.cost import CostModel
from fairserve.core.errors import ConfigError
from fairserve.core.types import Request
from fairserve.sched.base import MAX_CLIENTS, Scheduler
from fairserve.sched.local.patience import MemoryPatience
from fairserve.sched.named import NamedClasses
from fairserve.sched.params import MEMORY_PATIENCE

CanFit = Callable[[Request], bool]
MatchLen = Callable[[Request], int]


class Answer(Enum):
    """A host's answer to a candidate a decision yields (SGLang's ``AddReqResult``, seen
    from the policy)."""

    FIT = "fit"
    """Admitted: the engine reserved it, the policy charges it (final, like ``can_fit``)."""
    NO_FIT = "no_fit"
    """Not now (too large for what is left, or the engine's own reasons): try the others."""
    EXHAUSTED = "exhausted"
    """The engine's budget is spent: this one and every later candidate do not fit, so the
    decision ends without asking about them."""


FIT = Answer.FIT
NO_FIT = Answer.NO_FIT
EXHAUSTED = Answer.EXHAUSTED

Decision = Generator[Request, Answer, list[Request]]
"""A batching decision in progress: yields candidates, receives answers, returns the
admitted requests in admission order."""


def answer_all(decision: Decision, answer: Callable[[Request], Answer]) -> list[Request]:
    """Run ``decision`` to its end with ``answer`` for each candidate, ``EXHAUSTED``
    included; returns the admitted requests (the simulator's batch formation; the router's
    fair queue, whose full worker ends the decision)."""
    try:
        req = next(decision)
        while True:
            req = decision.send(answer(req))
    except StopIteration as end:
        admitted: list[Request] = end.value
        return admitted


def drive(decision: Decision, can_fit: CanFit) -> list[Request]:
    """:func:`answer_all` for a host that can only say yes or no (``select``; the router's
    fair queue for a request that arrives alone): every candidate is asked about."""
    return answer_all(decision, lambda req: FIT if can_fit(req) else NO_FIT)


class LocalPolicy(Scheduler):
    """Base class: waiting counts, per-client service and weights, the generic select loop.

    **Bounded client state.** Every request's client name reaches the policy, so the
    per-client state (here and in subclasses) is bounded: past :attr:`max_clients` tracked
    clients, an arrival of a new name forgets the least recently active *idle* clients
    (nothing waiting or running) that :meth:`_forgettable` allows, each policy by a rule
    that says what forgetting may change (VTC: nothing; DLPM: at most one quantum of
    credit). It forgets down to ``max_clients - max(1, max_clients // 16)`` so that a flood of new
    names pays for one scan per 1/16 of the cap, not per arrival; clients that may not be
    forgotten are kept (the next scan waits until that many more names arrived)."""

    kind = "policy"

    def __init__(
        self,
        *,
        cost: CostModel | None = None,
        weights: Mapping[str, float] | None = None,
        **params: Any,
    ) -> None:
        super().__init__(cost=cost, weights=weights, params=params)
        self.waiting: dict[str, int] = {}
        self.service: dict[str, float] = {}
        """Service per client; its order is the tracked clients' order of last becoming
        active (an idle client's last arrival was in that active period)."""
        self.outstanding: dict[str, int] = {}
        """Requests per client arrived and not yet finished or aborted (absent: idle)."""
        self.max_clients = MAX_CLIENTS
        """Tracked clients past which idle ones are forgotten (tests lower it)."""
        self.forgotten = 0
        """Clients forgotten so far (``snapshot()["clients_forgotten"]``)."""
        self._forget_at = 0
        """No scan before this many tracked clients (past a scan that could not forget
        enough, the next waits for ``max_clients // 16`` more names)."""
        self._estimated_extend: dict[int, int] = {}
        patience: int | None = getattr(self.config, MEMORY_PATIENCE.name, None)
        self.patience: MemoryPatience | None = (
            None if patience is None else MemoryPatience(patience)
        )
        """Set when the policy declares ``memory_patience`` (see :class:`MemoryPatience`)."""

    # ------------------------------------------------------------ events
    def on_arrival(self, req: Request, now_s: float) -> None:
        client = req.client
        service = self.service
        if client not in service and len(service) >= max(self.max_clients, self._forget_at):
            self._forget_idle(now_s)
        self._arrive(req, now_s)
        self.waiting[client] = self.waiting.get(client, 0) + 1
        outstanding = self.outstanding
        count = outstanding.get(client, 0)
        outstanding[client] = count + 1
        if not count:  # idle until now: the most recently active, the last forgotten
            service[client] = service.pop(client, 0.0)

    def arrive_alone(
        self, req: Request, can_fit: CanFit, match_len: MatchLen, now_s: float
    ) -> bool:
        """``on_arrival(req)`` then ``select([req], ...)``, for a host whose waiting queue
        holds nothing else (the router's fair queue, where most requests of a worker that
        keeps up arrive to an empty queue and a free slot): whether ``req`` was admitted.
        If not, it waits like any arrival (the host keeps it for the next ``select``).

        A policy may override it with a cheaper path that leaves exactly the state the two
        calls leave (a request admitted at once never needs a place in a kept waiting
        order); ``tests/router/test_fairqueue_fast_path.py`` compares the two."""
        self.on_arrival(req, now_s)
        return bool(self.select([req], can_fit, match_len, now_s))

    def select(
        self, waiting: Sequence[Request], can_fit: CanFit, match_len: MatchLen, now_s: float
    ) -> list[Request]:
        """One batching decision answered by ``can_fit``: :meth:`decide` driven to its end."""
        return drive(self.decide(waiting, match_len, now_s), can_fit)

    def decide(self, waiting: Sequence[Request], match_len: MatchLen, now_s: float) -> Decision:
        """Generic admission: passes over ``order(...)`` until a pass admits nothing.

        With a :class:`MemoryPatience` (policies declaring ``memory_patience``), the first
        admissible request that does not fit is the most entitled one blocked on memory:
        the requests behind it are admitted past it only while the patience lasts."""
        admitted: list[Request] = []
        remaining = self.order(waiting, match_len)
        patience = self.patience
        hold = patience is not None and patience.hold
        blocked: str | None = None
        bypassed = False
        exhausted = False
        while remaining and not exhausted:
            skipped: list[Request] = []
            progress = False
            for req in remaining:
                if not self.admissible(req):
                    skipped.append(req)
                    continue
                answer = yield req
                if answer is FIT:
                    self.on_admit(req, max(0, req.input_tokens - match_len(req)), now_s)
                    admitted.append(req)
                    progress = True
                    bypassed = bypassed or (blocked is not None and req.client != blocked)
                    continue
                if blocked is None:
                    blocked = req.client
                    if hold:  # Algorithm 2's Break: memory that frees up waits for it
                        progress = False
                        break
                if answer is EXHAUSTED:  # nothing later fits: no admission, no new pass
                    exhausted = True
                    break
            if not progress:
                break
            remaining = skipped
        if patience is not None:
            patience.decided(blocked, bypassed)
        return admitted

    def order(self, waiting: Sequence[Request], match_len: MatchLen) -> list[Request]:
        """Candidate order for this step (default: arrival order)."""
        return sorted(waiting, key=lambda r: r.arrival_s)

    def admissible(self, req: Request) -> bool:
        """Fairness gate checked before ``can_fit`` (default: always)."""
        return True

    def on_admit(self, req: Request, extend_tokens: int, now_s: float) -> None:
        """Charge an admission of ``extend_tokens`` computed prompt tokens."""
        self._leave_waiting(req.client)
        self._estimated_extend[id(req)] = extend_tokens
        self._charge(req.client, self.cost.admit_cost(req, extend_tokens))
        self._admitted(req, extend_tokens, now_s)

    def correct_extend(self, req: Request, extend_tokens: int) -> None:
        """Charge the difference between the real and the estimated extend tokens."""
        estimate = self._estimated_extend.get(id(req))
        if estimate is None:
            raise ConfigError(f"request {req.id!r} was not admitted by this policy")
        self._estimated_extend[id(req)] = extend_tokens
        delta = self.cost.admit_cost(req, extend_tokens) - self.cost.admit_cost(req, estimate)
        if delta:
            self._charge(req.client, delta)

    def on_decode_step(self, running: Sequence[Request], now_s: float) -> None:
        for req in running:
            self._charge(req.client, self.cost.decode_cost(req))

    def on_decode_steps(self, running: Sequence[Request], steps: int, now_s: float) -> None:
        """``steps`` decode steps at once (each request in ``running`` decoded ``steps``
        tokens, already counted in ``output_tokens``): the simulator's fused decode."""
        groups: dict[str, list[Request]] = {}
        for req in running:
            groups.setdefault(req.client, []).append(req)
        self.on_decode_groups(groups, steps, now_s)

    def on_decode_groups(
        self, groups: Mapping[str, Sequence[Request]], steps: int, now_s: float
    ) -> None:
        """:meth:`on_decode_steps` with the requests already grouped by client (the
        simulator groups them in its one pass over the batch).

        Charged once per client: every request decoded at the same instant, so the order of
        the charges cannot matter, and a batch holds thousands of requests of a few clients.
        A cost that is the same for every request (``per_request_decode`` false) is computed
        once per client instead of once per request."""
        cost = self.cost
        span_cost = cost.decode_span_cost
        uniform = not getattr(cost, "per_request_decode", True)
        for client, reqs in groups.items():
            if uniform:
                amount = span_cost(reqs[0], steps) * len(reqs)
            else:
                amount = 0.0
                for req in reqs:
                    amount += span_cost(req, steps)
            self._charge(client, amount)

    def on_finish(self, req: Request, now_s: float) -> None:
        self._estimated_extend.pop(id(req), None)
        self._left(req.client)
        self._finished(req, now_s)

    def on_abort(self, req: Request, now_s: float, was_waiting: bool) -> None:
        """A request left without finishing (client gone, error); ``was_waiting`` says where."""
        if was_waiting:
            self._leave_waiting(req.client)
        self._estimated_extend.pop(id(req), None)
        self._left(req.client)
        self._finished(req, now_s)

    def on_retract(self, req: Request, now_s: float) -> None:
        """A running request went back to the waiting queue (no new arrival, no lift)."""
        self.waiting[req.client] = self.waiting.get(req.client, 0) + 1

    # ------------------------------------------------------------ state
    def snapshot(self) -> dict[str, Any]:
        """JSON-able state for dashboards: parameters, quantum and per-client counters."""
        clients = {
            c: {
                "waiting": self.waiting.get(c, 0),
                "service": self.service.get(c, 0.0),
                "weight": self.weight(c),
                **self._client_state(c),
            }
            for c in sorted(set(self.service) | set(self.waiting) | set(self.weights))
        }
        out: dict[str, Any] = {
            "policy": self.name,
            "params": self.config.as_dict(),
            "quantum": self.quantum,
            "cost": self.cost.name,
            "clients": clients,
            "clients_tracked": len(self.service),
            "clients_forgotten": self.forgotten,
        }
        if self.patience is not None:
            out["memory_patience"] = self.patience.state()
        return out

    # ------------------------------------------------------------ hooks for subclasses
    def _arrive(self, req: Request, now_s: float) -> None:
        """Called before the request is counted as waiting (VTC's lift needs that)."""

    def _admitted(self, req: Request, extend_tokens: int, now_s: float) -> None:
        """Called after an admission was charged."""

    def _finished(self, req: Request, now_s: float) -> None:
        """Called when a request finishes or is aborted."""

    def _on_service(self, client: str, weighted_amount: float) -> None:
        """Called for every charge, with the amount divided by the client's weight."""

    def _client_state(self, client: str) -> dict[str, Any]:
        """Extra per-client fields for ``snapshot``."""
        return {}

    def _forgettable(self, now_s: float) -> Callable[[str], bool]:
        """Which idle clients may be forgotten now (default: any, the policy's decisions
        do not read per-client state). Called once per scan; the predicate is asked about
        idle clients only, least recently active first."""
        return _any_client

    def _forget(self, client: str) -> None:
        """Drop a subclass's state of an idle client being forgotten."""

    # ------------------------------------------------------------ internals
    def _charge(self, client: str, amount: float) -> None:
        self.service[client] = self.service.get(client, 0.0) + amount
        self._on_service(client, amount / self.weight(client))

    def _left(self, client: str) -> None:
        """A request of ``client`` finished or was aborted."""
        count = self.outstanding.get(client, 0)
        if count > 1:
            self.outstanding[client] = count - 1
        else:
            self.outstanding.pop(client, None)

    def _forget_idle(self, now_s: float) -> None:
        """Forget the least recently active idle clients that :meth:`_forgettable`
        allows, down to ``max_clients - max(1, max_clients // 16)`` tracked clients
        (room for the arriving one)."""
        slack = max(1, self.max_clients // 16)
        excess = len(self.service) - (self.max_clients - slack)
        allowed = self._forgettable(now_s)
        outstanding, waiting = self.outstanding, self.waiting
        chosen: list[str] = []
        for client in self.service:  # least recently active first
            if len(chosen) >= excess:
                break
            if client not in outstanding and not waiting.get(client) and allowed(client):
                chosen.append(client)
        for client in chosen:
            del self.service[client]
            waiting.pop(client, None)
            self._forget(client)
        self.forgotten += len(chosen)
        self._forget_at = len(self.service) + slack

    def _leave_waiting(self, client: str) -> None:
        count = self.waiting.get(client, 0)
        if count <= 0:
            raise ConfigError(f"client {client!r} has no waiting request to admit or abort")
        self.waiting[client] = count - 1


def _any_client(client: str) -> bool:
    return True


_POLICIES: NamedClasses[type[LocalPolicy]] = NamedClasses("local policy")

register_local = _POLICIES.register
"""Class decorator: make a policy available by its ``name``."""
local_policy_class = _POLICIES.lookup
local_policy_names = _POLICIES.names
