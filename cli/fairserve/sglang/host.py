"""The scheduling core hosted inside one SGLang scheduler process.

:class:`PolicyHost` turns what SGLang's scheduler does into the local-policy events of
DESIGN §2, and nothing else: arrival (``on_arrival``), a batching decision (the policy's own
``decide``, one answer per ``add_one_req``), the real extend charge
(``correct_extend`` when SGLang's prefix match at admission differs from the one the policy
was told), a decode charge per produced token, finish, abort and retraction. It reads SGLang
objects only through the duck-typed fields of :mod:`fairserve.sglang.requests`, so the tests
drive it with fakes shaped like SGLang's.

Clock: the number of batch results processed. Every tensor-parallel rank runs its own host
and must decide exactly like the others; wall-clock time differs between processes, the
step count does not. Justitia counts virtual time in steps (``steps_per_s = 1``).

Threads: the scheduler thread calls every event; the extension's HTTP thread reads
snapshots. One lock covers the policy. A decision left open (SGLang's loop stopped for its
own reasons) is closed by the next event, before the policy sees anything else.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Iterable
from operator import attrgetter
from typing import Any, cast

from fairserve.core.errors import ConfigError
from fairserve.core.types import Request, validate_weight
from fairserve.sched.local.base import EXHAUSTED, FIT, NO_FIT, LocalPolicy
from fairserve.sched.params import QUANTUM
from fairserve.sglang.admission import (
    AdmissionBound,
    Shape,
    holds_mamba,
    request_shape,
    room_left,
)
from fairserve.sglang.config import PluginConfig
from fairserve.sglang.control import ControlChannel, PolicyChange
from fairserve.sglang.decision import Decision
from fairserve.sglang.evictions import EvictionFeed
from fairserve.sglang.feed import Column, MatchFeed
from fairserve.sglang.matches import KeptMatches
from fairserve.sglang.requests import (
    EngineCounters,
    ReqLike,
    RequestTable,
    State,
    Tracked,
    is_abort,
    real_extend_tokens,
    to_request,
)

_RID = attrgetter("rid")
_REQ = attrgetter("req")
_MATCHED = attrgetter("matched")
_NEED = attrgetter("need")
_SREQ = attrgetter("sreq")


KEPT_SLACK = 64
"""Kept matches of requests no longer waiting (none, unless SGLang admitted one outside a
decision) past which they are dropped."""


class PolicyHost:
    """One local policy driven by one SGLang scheduler (one rank)."""

    def __init__(
        self,
        config: PluginConfig,
        policy: LocalPolicy,
        results: Any,
        *,
        model_name: str | None = None,
        kv_capacity_tokens: int | None = None,
        bound: AdmissionBound | None = None,
    ) -> None:
        self.config = config
        self.policy = policy
        self.results = results
        """SGLang's ``AddReqResult`` enum (members CONTINUE, NO_TOKEN, OTHER)."""
        self.model_name = model_name
        self.kv_capacity_tokens = kv_capacity_tokens
        self.lock = threading.RLock()
        self.table = RequestTable()
        self.counters = EngineCounters()
        self.evictions = EvictionFeed()
        self.controls = ControlChannel()
        self.decision: Decision | None = None
        self.last_ticket = 0
        self.matches: KeptMatches | None = KeptMatches()
        """The waiting requests' prefix matches (None: SGLang's ``prefix_len`` only)."""
        self.feed = MatchFeed()
        """The policy's ``match_len``, which also says which matches moved."""
        self.volatile: dict[str, None] = {}
        """Waiting requests read without a kept match: read again at every decision."""
        self.ignoring: dict[str, None] = {}
        """Waiting requests with a known least need that ignore their end of sequence."""
        self._kept_reads = False
        """Whether the last decision read kept matches (else every match is read)."""
        self.bound = bound
        """None: every request the policy asks about is offered to SGLang (tests and the
        benchmark compare with it)."""
        self.shapes: dict[str, Shape | None] = {}
        """rid → what a waiting request's least need is made of
        (:func:`~fairserve.sglang.admission.request_shape`), read once per wait: it does not
        change while the request waits (None: not skipped)."""

    @property
    def now(self) -> float:
        return float(self.counters.steps)

    # ------------------------------------------------------------ arrivals
    def on_queued(self, sreq: ReqLike) -> None:
        """A request entered SGLang's waiting queue: a new arrival, or a running request
        sent back (retraction, priority preemption) — that is no new arrival."""
        with self.lock:
            self._close_decision()
            tracked = self.table.get(sreq.rid)
            if tracked is None:
                self._arrive(sreq)
            elif tracked.state is State.RUNNING:
                self.table.put_back(tracked, sreq)
                if self.matches is not None:
                    self.matches.forget(tracked.req.id)  # back with its outputs
                self.policy.on_retract(tracked.req, self.now)
                self.counters.retracted += 1

    def _arrive(self, sreq: ReqLike) -> Tracked:
        req = to_request(sreq, self.now)
        self.policy.on_arrival(req, self.now)
        return self.table.add(req, sreq)

    # ------------------------------------------------------------ one decision
    def begin_decision(self, waiting: list[Any], cache: Any = None) -> None:
        """``calc_priority`` ran: start the policy's ``decide`` over the waiting requests and
        put the first one it asks about at the front of SGLang's list.

        The policy gets the waiting requests in the table's order (:class:`RequestTable`:
        the order DLPM's kept LPM order predicts), not SGLang's. ``match_len`` is each
        request's match in SGLang's radix tree ``cache``, kept across decisions
        (:mod:`fairserve.sglang.matches`); for a cache of another shape (or none) it is
        SGLang's ``prefix_len`` as its own matching left it. It also says which matches
        moved since the policy last asked (``moved()``, see
        :class:`~fairserve.sglang.feed.MatchFeed`). Requests that left the queue without
        being admitted were aborted while waiting; requests in it the plugin has not seen
        arrive now, in SGLang's order."""
        with self.lock:
            self._close_decision()
            self._settle_queue(waiting)
            table = self.table
            queue = table.queue
            if not queue:
                if self.matches is not None:
                    self.matches.begin(cache)
                    self.matches.end()
                return
            self._read_matches(cache)
            candidates = list(queue.values())
            requests = list(map(_REQ, candidates))
            needs_known = list(map(_NEED, candidates))
            unknown = needs_known.count(None)
            by_key = table.by_key
            matched = Column(by_key, _MATCHED)
            self.feed.told = matched
            decide = self.policy.decide(requests, self.feed, self.now)
            decision = Decision(waiting, Column(by_key, _SREQ), matched, decide)
            decision.needs = {} if unknown == len(candidates) else Column(by_key, _NEED)
            decision.ignores_eos = any(rid in queue for rid in self.ignoring)
            if not unknown:
                decision.least_need = min(cast(list[int], needs_known))  # none unknown
            self.decision = decision
            decision.bring_forward(-1)

    def _read_matches(self, cache: Any) -> None:
        """Read the match (and least need, see :func:`~fairserve.sglang.admission.request_shape`) of
        every waiting request whose match may have moved since it was last read: every one where the
        matches are not kept (SGLang's ``prefix_len``), else the new and retracted ones, those
        without a kept match (a streaming session) and those whose kept match the tree may have
        moved (:meth:`KeptMatches.stale`: per group of matches ending at the same place, not per
        request). The others keep what they hold (``Tracked.matched``); the ones that changed are
        reported to :attr:`feed`."""
        table, queue = self.table, self.table.queue
        kept = self.matches.begin(cache) if self.matches is not None else None
        if kept is None or not self._kept_reads:
            ask: Iterable[str] = list(queue)
        else:
            assert self.matches is not None
            ask = dict.fromkeys([*table.unread, *self.volatile, *self.matches.stale()])
            if len(self.matches.kept) > 2 * len(queue) + KEPT_SLACK:
                for rid in self.matches.kept.keys() - queue.keys():
                    self.matches.forget(rid)
        self._kept_reads = kept is not None
        table.unread.clear()
        volatile: dict[str, None] = {}
        self.volatile = volatile
        moved = self.feed.moved_since
        shapes, ignoring = self.shapes, self.ignoring
        clip = self.bound.clip_max_new_tokens if self.bound is not None else None
        for rid in ask:
            tracked = queue.get(rid)
            if tracked is None:
                continue
            sreq = tracked.sreq
            length = kept(sreq) if kept is not None else None
            if length is None:
                volatile[rid] = None
                match = max(0, int(sreq.prefix_len))
            else:
                match = length
            if match != tracked.matched:
                tracked.matched = match
                moved[tracked.req] = None
            tracked.need = None
            ignoring.pop(rid, None)
            if clip is not None and length is not None:
                shape = shapes[rid] if rid in shapes else shapes.setdefault(
                    rid, request_shape(sreq, clip)
                )  # fmt: skip
                if shape is not None:
                    filled, outputs, ignores = shape
                    tracked.need = max(1, filled - length) + outputs
                    if ignores:
                        ignoring[rid] = None
        self.feed.prune(queue)

    def _settle_queue(self, waiting: list[Any]) -> None:
        """Settle what SGLang's waiting list says happened: requests the policy counts as
        waiting that left it without being admitted were aborted there (client gone,
        queue limit, timeout); requests in it the plugin has not seen arrive (in its
        order). The common case, nothing of the kind, is one comparison of object ids
        in C that reads no SGLang request (reading 10,000 ``rid`` fields cost ~3 ms)."""
        table = self.table
        if len(waiting) == len(table.sreqs) == len(table.queue) and _holds(waiting, table.sreqs):
            return
        present = dict(zip(map(str, map(_RID, waiting)), waiting, strict=True))
        self._abort_missing(present.keys())
        by_rid = table.by_rid
        for rid, sreq in present.items():
            tracked = by_rid.get(rid)
            if tracked is None:
                self._arrive(sreq)
            elif tracked.state is State.WAITING and tracked.sreq is not sreq:
                table.bind(tracked, sreq)

    def _reconcile(self, waiting: list[Any]) -> None:
        """Requests the policy counts as waiting that left SGLang's queue without being
        admitted were aborted there (client gone, queue limit, timeout)."""
        known = self.table.sreqs
        if len(known) == len(self.table.queue) and _holds(waiting, known, exactly=False):
            return
        present = set(map(str, map(_RID, waiting)))
        if not self.table.queue.keys() <= present:
            self._abort_missing(present)

    def _abort_missing(self, present: Collection[str]) -> None:
        gone = [t for rid, t in self.table.queue.items() if rid not in present]
        for tracked in gone:
            self._abort(tracked, was_waiting=True)

    def admit(self, original: Callable[[], Any], adder: Any, sreq: ReqLike) -> Any:
        """``PrefillAdder.add_one_req`` for ``sreq``: offer it to the engine only when the policy
        asks about it, and tell the loop whether to go on.

        Work conservation: a request the policy wanted but that does not fit the memory left is
        skipped (``NO_FIT``) and the loop continues (``CONTINUE``) while the adder has budget left;
        the loop stops when the budget is spent (``EXHAUSTED``: SGLang's own loop stops at any
        result but ``CONTINUE``) or the policy has nothing more to ask.

        After such a refusal the memory left (``rem_total_tokens``) is what every later request is
        measured against (a refusal reserves nothing), so where the adder's rule is known
        (:class:`~fairserve.sglang.admission.AdmissionBound`) the host ends the decision
        (``EXHAUSTED``) when even the least need of a waiting request does not fit it, and answers
        ``NO_FIT`` without offering them to questions about requests whose own least need does not
        fit: SGLang would refuse each one after matching it in its tree, which with a full KV pool
        and a long queue made one decision cost ~50 µs per waiting request. The admissions and the
        policy's state are those of offering every one (``EXHAUSTED`` is ``NO_FIT`` for the rest);
        the loop is told ``OTHER``, which, like the end of the list it would otherwise reach, does
        not mark the running batch full. Only after a refusal: after an admission the next request
        is offered, so SGLang's own checks before ``add_one_req`` (the running-request bound) still
        run where they did."""
        results = self.results
        with self.lock:
            decision = self.decision
            tracked = self.table.get(sreq.rid)
            if decision is None or tracked is None or tracked.state is not State.WAITING:
                return original()  # not part of a policy decision: SGLang's own rules
            position = decision.locate(sreq)
            if position < 0:  # not in the list SGLang iterates: treat it as the current slot
                position = decision.cursor
            if not decision.skip_to(tracked.req):
                self._close_decision()
                return results.OTHER
            result = original()
            admitted = bool(adder.can_run_list) and adder.can_run_list[-1] is sreq
            if admitted:
                self._admitted(decision, tracked, sreq)
            if result == results.CONTINUE or (
                not admitted
                and result == results.NO_TOKEN
                and adder.budget_state() == results.CONTINUE
                and not holds_mamba(sreq)
            ):  # admitted, or too large for what is left: try the others
                room = None if admitted else room_left(self.bound, decision, adder)
                least = decision.least_need
                if room is not None and least is not None and least >= room:
                    decision.answer(EXHAUSTED)  # nothing waiting fits what is left
                    self._close_decision()
                    return results.OTHER
                decision.answer(FIT if admitted else NO_FIT)
                if room is not None:
                    decision.skip_unfit(room)
                decision.bring_forward(position)
                return results.CONTINUE
            decision.answer(FIT if admitted else EXHAUSTED)
            self._close_decision()  # the loop stops here: nothing more fits
            return result

    def _admitted(self, decision: Decision, tracked: Tracked, sreq: ReqLike) -> None:
        self._left_queue(tracked.req.id)  # back in the queue only with more outputs
        self.table.started(tracked)
        req, extend = tracked.req, real_extend_tokens(sreq)
        req.cached_tokens = max(0, req.input_tokens - extend)
        req.admit_s = self.now
        decision.admitted.append((req, extend))
        self.counters.admit(req.input_tokens, extend)

    def _close_decision(self) -> None:
        """End the open decision; then charge the real extend where SGLang's match at
        admission differs from the match the policy was told (host-cache load-backs,
        queues too long for SGLang to match, retractions recomputing outputs)."""
        decision, self.decision = self.decision, None
        if decision is None:
            return
        decision.close()
        for req, extend in decision.admitted:
            expected = max(0, req.input_tokens - decision.matched[req])
            if extend != expected:
                self.policy.correct_extend(req, extend)

    # ------------------------------------------------------------ step results
    def on_batch_result(
        self,
        reqs: list[Any],
        waiting: list[Any] | None = None,
        launched_s: float | None = None,
        done_s: float | None = None,
    ) -> None:
        """A forward step ended: charge every token produced (a prefill's first token, one
        per decode step, several with speculative decoding), then finishes and aborts;
        ``waiting`` (SGLang's queue) settles requests aborted while waiting. The step ran
        from ``launched_s`` to ``done_s`` (monotonic seconds) for the busy time."""
        with self.lock:
            self._close_decision()
            if waiting is not None:
                self._reconcile(waiting)
            self.counters.steps += 1
            if launched_s is not None and done_s is not None:
                self.counters.busy(launched_s, done_s)
            now = self.now
            produced: dict[int, list[Request]] = {}
            ended: list[tuple[Tracked, bool]] = []
            for sreq in reqs:
                tracked = self.table.get(sreq.rid)
                if tracked is None or tracked.state is not State.RUNNING:
                    continue
                req = tracked.req
                count = len(sreq.output_ids)
                if count > req.output_tokens:
                    produced.setdefault(count - req.output_tokens, []).append(req)
                    self.counters.decode_tokens += count - req.output_tokens
                req.output_tokens = count
                if sreq.finished():
                    ended.append((tracked, is_abort(sreq)))
            for steps, group in sorted(produced.items()):
                if steps == 1:
                    self.policy.on_decode_step(group, now)
                else:
                    self.policy.on_decode_steps(group, steps, now)
            for tracked, aborted in ended:
                if aborted:
                    self._abort(tracked, was_waiting=False)
                else:
                    tracked.req.finish_s = now
                    self.policy.on_finish(tracked.req, now)
                    self.table.forget(tracked.req.id)
                    self.counters.finished += 1

    def _left_queue(self, rid: str) -> None:
        """What the host keeps about a waiting request goes when it leaves the queue."""
        self.shapes.pop(rid, None)
        self.ignoring.pop(rid, None)
        if self.matches is not None:
            self.matches.forget(rid)

    def _abort(self, tracked: Tracked, was_waiting: bool) -> None:
        self._left_queue(tracked.req.id)
        self.policy.on_abort(tracked.req, self.now, was_waiting=was_waiting)
        self.table.forget(tracked.req.id)
        self.counters.aborted += 1

    # ------------------------------------------------------------ live control
    def check_quantum(self, quantum: object) -> float:
        """Validate a new ``Q^u`` now (the HTTP thread answers 400 at once)."""
        if isinstance(quantum, bool) or not isinstance(quantum, int | float):
            raise ConfigError(f"quantum: expected a positive number, got {quantum!r}")
        with self.lock:
            if self.policy.quantum is None:
                raise ConfigError(f"policy {self.policy.name} has no quantum")
            value: float = QUANTUM.validate(f"policy {self.policy.name}", quantum)
        return float(value)

    def check_weight(self, client: str, weight: float) -> float:
        """Validate a client's new weight now (the HTTP thread answers 400 at once)."""
        validate_weight(client, weight)
        return float(weight)

    def apply_controls(self, messages: list[PolicyChange]) -> None:
        """Apply broadcast changes (every rank, same iteration, before its requests)."""
        with self.lock:
            self._close_decision()
            for message in sorted(messages, key=lambda m: m.ticket):
                if message.ticket > self.last_ticket:
                    message.apply(self.policy)
                    self.last_ticket = message.ticket
                self.controls.applied(message)

    # ------------------------------------------------------------ views
    def quantum_json(self) -> dict[str, Any]:
        with self.lock:
            return {"policy": self.policy.name, "quantum": self.policy.quantum}

    def weights_json(self) -> dict[str, Any]:
        """``/fairserve/worker/weights``: the weights set on this rank's policy."""
        with self.lock:
            return {"policy": self.policy.name, "weights": dict(self.policy.weights)}

    def state_json(self) -> dict[str, Any]:
        """``/fairserve/worker/state`` in the simulated worker's shape (DESIGN §5)."""
        with self.lock:
            clients = self.table.per_client()
            return {
                "model_name": self.model_name,
                "policy": self.policy.snapshot(),
                "engine": self.counters.as_json(),
                "waiting": sum(c["waiting"] for c in clients.values()),
                "running": sum(c["running"] for c in clients.values()),
                "clients": clients,
                "kv": {"used_tokens": None, "capacity_tokens": self.kv_capacity_tokens},
                "profile": None,
                "batching": "sglang",
                "speed": 1.0,
                "clock_steps": self.counters.steps,
                "evictions_next": self.evictions.next_seq,
            }


def _holds(waiting: list[Any], known: dict[Any, Tracked], exactly: bool = True) -> bool:
    """Whether SGLang's list ``waiting`` holds the objects ``known`` (``exactly``: and no
    other), compared by identity in C."""
    try:
        present = set(waiting)
    except TypeError:  # an unhashable request type: compare by rid
        return False
    return known.keys() == present if exactly else known.keys() <= present
