"""DoubleQ's per-dispatch shortcuts (issue 23) decide as the plain code does.

:class:`ReferenceDoubleQ` is DoubleQ with its hot path written plainly (the code before the
shortcuts: the tree walked at every choice, counters through :meth:`DoubleQ.counters`).
Random sequences of dispatches over available subsets, finishes, aborts and evictions, with
the fixed quantum and the ``worker_quantum_requests`` rule, with client weights and with the
work-conserving spill at small thresholds (issue 17), must give the same workers and leave
the same counters, refills, means and trees."""

from __future__ import annotations

import itertools
import math
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from fairserve.core.types import Request, make_request, tokens_to_key
from fairserve.sched.dispatch.doubleq import DoubleQ
from tests.fakes.cluster import prompt_tokens

WORKERS = ["w0", "w1", "w2"]
_SERIAL = itertools.count()


class ReferenceDoubleQ(DoubleQ):
    """DoubleQ's SELECTWORKER, its spill and charges, written plainly."""

    name = "doubleq-reference"

    def _choose(self, req: Request, candidates: list[str]) -> str:
        counters = self.counters(req.client)
        avail = [w for w in candidates if counters[w] > 0]
        if not avail:
            quantum = self.client_quantum(req.client, self._dispatch_charge(req))
            avail = self._refill(req.client, counters, candidates, quantum)
        owners = self.prefixes.match(req.prompt_key).owners
        cached = [w for w in avail if w in owners] if owners else []
        choice = self.least_outstanding(cached or avail)
        threshold = self.config.spill_outstanding
        own = sum(1 for c, where in self.placed if c == req.client and where == choice)
        if threshold == 0 or own < threshold:
            return choice
        free = [
            w
            for w in avail
            if self.outstanding[w] < min(self.outstanding[choice], threshold) - 1
            and all(c == req.client for c, where in self.placed if where == w)
        ]
        return self.least_outstanding(free) if free else choice

    def _init_state(self) -> None:
        super()._init_state()
        self.placed: list[tuple[str, str]] = []
        """(client, worker) of each request in flight: the spill's "no other client there"."""

    def _dispatched(self, req: Request, worker: str) -> None:
        self.placed.append((req.client, worker))
        charge = self._dispatch_charge(req)
        total, count = self.request_costs.get(req.client, (0.0, 0))
        self.request_costs[req.client] = (total + charge, count + 1)
        counters = self.deficits.pop(req.client, None) or self.counters(req.client)
        self.deficits[req.client] = counters
        counters[worker] -= charge
        self.in_flight[req.client] = self.in_flight.get(req.client, 0) + 1
        self.prefixes.dispatched(req.prompt_key, worker)

    def _left(self, client: str, worker: str) -> None:
        self.placed.remove((client, worker))
        left = self.in_flight.get(client, 0) - 1
        if left > 0:
            self.in_flight[client] = left
        else:
            self.in_flight.pop(client, None)

    def _charge_output(self, req: Request, worker: str, output_tokens: int) -> None:
        inputs = req.input_tokens
        charge = self.cost.request_cost(inputs, inputs, output_tokens) / self.weight(req.client)
        self.counters(req.client)[worker] -= charge


def _state(d: DoubleQ, probes: list[bytes]) -> dict[str, Any]:
    return {
        "deficits": {c: dict(q) for c, q in d.deficits.items()},
        "order": list(d.deficits),
        "refills": dict(d.refills),
        "request_costs": dict(d.request_costs),
        "in_flight": dict(d.in_flight),
        "outstanding": dict(d.outstanding),
        "tokens": {w: d.prefixes.worker_tokens(w) for w in WORKERS},
        "matches": [d.prefixes.match(key) for key in probes],
    }


arrive = st.tuples(
    st.just("arrive"),
    st.sampled_from(["a", "a", "a", "b", "c"]),  # a often alone on a worker: it spills
    st.integers(0, 3),  # prefix group
    st.integers(0, 40),  # shared tokens
    st.integers(1, 30),  # unique tokens
    st.integers(0, 12),  # output tokens
    st.sets(st.integers(0, 2), min_size=1),  # available workers
)
finish = st.tuples(st.just("finish"), st.integers(0, 1000), st.booleans())  # True: abort
evict = st.tuples(st.just("evict"), st.integers(0, 2), st.integers(0, 3), st.integers(1, 40))


@given(
    ops=st.lists(st.one_of(arrive, arrive, finish, evict), max_size=60),
    quantum=st.sampled_from([8.0, 20.0, 50.0, 300.0, math.inf]),
    rule=st.sampled_from([0.0, 0.0, 0.5, 2.0, 32.0]),  # small: credit on few workers
    weight_b=st.sampled_from([1.0, 0.5, 3.0]),
    spill=st.sampled_from([0, 2, 256]),
)
def test_the_shortcuts_choose_and_charge_as_the_plain_code(
    ops: list[tuple[Any, ...]], quantum: float, rule: float, weight_b: float, spill: int
) -> None:
    _same_choices_and_state(ops, quantum, rule, weight_b, spill)


@given(
    # Long runs with few finishes: queues build, so the spill decides some dispatches.
    ops=st.lists(st.one_of(arrive, arrive, arrive, finish, evict), min_size=30, max_size=80),
    quantum=st.sampled_from([50.0, 300.0, float(2**23)]),
    spill=st.sampled_from([1, 2, 4]),
)
def test_the_spill_chooses_as_the_plain_code(
    ops: list[tuple[Any, ...]], quantum: float, spill: int
) -> None:
    _same_choices_and_state(ops, quantum, 0.0, 1.0, spill)


def _same_choices_and_state(
    ops: list[tuple[Any, ...]], quantum: float, rule: float, weight_b: float, spill: int
) -> None:
    params: dict[str, Any] = {
        "worker_quantum": quantum,
        "worker_quantum_requests": rule,
        "spill_outstanding": spill,
    }
    weights = {"b": weight_b}
    fast = DoubleQ(WORKERS, weights=weights, w_e=1.0, w_q=2.0, **params)
    plain = ReferenceDoubleQ(WORKERS, weights=weights, w_e=1.0, w_q=2.0, **params)
    running: list[tuple[Request, str]] = []
    probes = [tokens_to_key(prompt_tokens(g, 40, 0, 0)) for g in range(4)]
    for op in ops:
        if op[0] == "arrive":
            _, client, group, shared, unique, output, avail = op
            tokens = prompt_tokens(group, shared, next(_SERIAL), unique)
            r = make_request(f"x{next(_SERIAL)}", client, tokens, output, output_len=output)
            available = [WORKERS[i] for i in sorted(avail)]
            worker = plain.dispatch(r, available)
            assert fast.dispatch(r, available) == worker
            running.append((r, worker))
        elif op[0] == "finish" and running:
            r, worker = running.pop(op[1] % len(running))
            for d in (fast, plain):
                if op[2]:
                    d.on_abort(r, worker)
                else:
                    d.on_finish(r, worker, r.expected_output_tokens)
        elif op[0] == "evict":
            _, w, group, length = op
            key = tokens_to_key(prompt_tokens(group, length, 0, 0))
            for d in (fast, plain):
                d.on_evict(WORKERS[w], key)
        assert _state(fast, probes) == _state(plain, probes)
