"""DoubleQ's Q^w rule: each client's quantum is ``k`` of its own mean requests.

``Q^w_i = k · c̄_i`` (``worker_quantum_requests`` = k > 0; 0, the default, is the fixed
``worker_quantum``), with ``c̄_i`` the mean dispatch charge (``w_e``·input tokens / weight)
of client ``i``'s requests, this one included. A fixed ``worker_quantum``, given explicitly
or set live, turns the rule off. The rule only
changes how many requests a client may send to a worker per round, never the condition
``q_{i,w} > 0`` at dispatch, so Theorem 5.1's bound holds as it is (property below).
"""

from __future__ import annotations

import itertools
import math
from typing import Any

from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from fairserve.core.metrics import max_service_gap
from fairserve.core.types import Request, make_request
from fairserve.sched import registry
from fairserve.sched.dispatch.doubleq import (
    DEFAULT_WORKER_QUANTUM,
    RULE_WORKER_QUANTUM_REQUESTS,
    DoubleQ,
)
from fairserve.sched.registry import make_dispatcher, make_local_policy
from tests.fakes.cluster import ClientLoad, make_cluster, open_loop, prompt_tokens, worker_ids
from tests.sched.test_dispatch_fairness import bound, client_loads

_SERIAL = itertools.count()


def req(client: str = "a", prefix: int = 7, shared: int = 40, unique: int = 10) -> Request:
    serial = next(_SERIAL)
    tokens = prompt_tokens(prefix, shared, serial, unique)
    return make_request(f"q{serial}", client, tokens, 5, output_len=5)


def doubleq(workers: int = 2, **params: Any) -> DoubleQ:
    """DoubleQ with the rule at its measured k unless ``params`` say otherwise."""
    params.setdefault("worker_quantum_requests", RULE_WORKER_QUANTUM_REQUESTS)
    d = registry.make_dispatcher("doubleq", [f"w{i}" for i in range(workers)], **params)
    assert isinstance(d, DoubleQ)
    return d


def test_the_default_is_the_fixed_quantum() -> None:
    d = registry.make_dispatcher("doubleq", ["w0", "w1"])
    assert isinstance(d, DoubleQ) and d.config.worker_quantum_requests == 0
    d.dispatch(req())
    assert d.deficits["a"] == {"w0": DEFAULT_WORKER_QUANTUM - 50, "w1": DEFAULT_WORKER_QUANTUM}
    assert d.quantum == d.client_quantum("a") == DEFAULT_WORKER_QUANTUM


def test_quantum_is_k_of_the_clients_mean_requests() -> None:
    d = doubleq()
    k = RULE_WORKER_QUANTUM_REQUESTS
    first = req()  # 50 input tokens: the first refill uses this request's own charge
    d.dispatch(first)
    assert d.deficits["a"] == {"w0": k * 50 - 50, "w1": k * 50}
    assert d.client_quantum("a") == k * 50
    assert d.snapshot()["clients"]["a"]["worker_quantum"] == k * 50


def test_each_client_gets_its_own_request_size_so_both_spread_after_k_requests() -> None:
    """A client of 4x larger prompts gets a 4x larger quantum: in requests, both stick to
    their cached worker for the same number of calls before they must spread."""
    d = doubleq(worker_quantum_requests=4)
    small = [d.dispatch(req("small", prefix=1, shared=40, unique=10)) for _ in range(8)]
    large = [d.dispatch(req("large", prefix=2, shared=160, unique=40)) for _ in range(8)]
    assert d.client_quantum("large") == 4 * d.client_quantum("small") == 4 * 4 * 50
    assert small == large == ["w0"] * 4 + ["w1"] * 4


def test_the_mean_follows_the_clients_requests_and_weight() -> None:
    d = doubleq(worker_quantum_requests=10)
    d.set_weight("a", 2.0)
    for unique in (10, 60):  # 50 then 100 input tokens, charged at half (weight 2)
        d.dispatch(req(unique=unique))
    assert d.client_quantum("a") == 10 * (25 + 50) / 2


def test_explicit_worker_quantum_is_fixed_and_turns_the_rule_off() -> None:
    d = registry.make_dispatcher("doubleq", ["w0", "w1"], worker_quantum=300)
    assert isinstance(d, DoubleQ)
    assert d.config.worker_quantum_requests == 0
    d.dispatch(req())
    assert d.deficits["a"] == {"w0": 250.0, "w1": 300.0}
    assert d.quantum == 300.0


def test_with_both_given_the_rule_decides() -> None:
    """Every parameter can be given at once (``--param`` lists, the registry's own test):
    then ``worker_quantum_requests`` says whether the fixed value is used."""
    fixed = doubleq(worker_quantum=300, worker_quantum_requests=0)
    assert fixed.quantum == 300.0
    rule = doubleq(worker_quantum=300, worker_quantum_requests=8)
    rule.dispatch(req())
    assert rule.deficits["a"] == {"w0": 8 * 50 - 50, "w1": 8 * 50}


def test_set_quantum_live_replaces_the_rule_with_that_fixed_value() -> None:
    d = doubleq()
    d.dispatch(req())
    assert d.quantum == RULE_WORKER_QUANTUM_REQUESTS * 50  # all clients' mean request
    d.set_quantum(1000.0)
    assert d.config.worker_quantum_requests == 0 and d.quantum == 1000.0
    assert d.client_quantum("a") == 1000.0


def test_a_cost_model_that_charges_nothing_at_dispatch_falls_back_to_the_fixed_quantum() -> None:
    from fairserve.core.cost import KVTokenTimeCost

    d = DoubleQ(
        ["w0", "w1"], cost=KVTokenTimeCost(), worker_quantum_requests=RULE_WORKER_QUANTUM_REQUESTS
    )
    d.dispatch(req())
    assert d.client_quantum("a") == d.config.worker_quantum
    assert d.deficits["a"]["w0"] == d.config.worker_quantum


def test_forgotten_clients_lose_their_mean_too() -> None:
    from fairserve.sched.base import MAX_CLIENTS

    d = doubleq()
    for i in range(MAX_CLIENTS + 5):
        r = req(f"c{i}")
        w = d.dispatch(r)
        d.on_finish(r, w, 5)
    assert len(d.request_costs) <= MAX_CLIENTS and "c0" not in d.request_costs


# ---------------------------------------------------------------- properties
arrive = st.tuples(
    st.sampled_from(["a", "b"]),
    st.integers(0, 2),  # prefix group
    st.integers(0, 60),  # shared tokens
    st.integers(1, 40),  # unique tokens
)


@settings(max_examples=80, derandomize=True, deadline=None)
@given(
    arrivals=st.lists(arrive, min_size=1, max_size=80),
    k=st.sampled_from([1.0, 4.0, 32.0]),
    workers=st.integers(2, 4),
)
def test_a_client_never_puts_more_than_k_plus_one_of_its_largest_requests_ahead_anywhere(
    arrivals: list[tuple[str, int, int, int]], k: float, workers: int
) -> None:
    """What the rule bounds: whatever the prefixes, the service a client sent to any two
    workers differs by at most one quantum plus one request (every refill credits every
    worker alike, and a worker is used only with credit), and under the rule a quantum is
    at most k of the client's largest requests."""
    d = doubleq(workers, worker_quantum_requests=k)
    sent: dict[str, dict[str, float]] = {}
    largest: dict[str, float] = {}
    for client, group, shared, unique in arrivals:
        r = req(client, group, shared, unique)
        worker = d.dispatch(r)
        per_worker = sent.setdefault(client, dict.fromkeys(d.workers, 0.0))
        per_worker[worker] += r.input_tokens
        largest[client] = max(largest.get(client, 0.0), float(r.input_tokens))
    for client, per_worker in sent.items():
        spread = max(per_worker.values()) - min(per_worker.values())
        assert spread <= (k + 1) * largest[client] + 1e-9, (client, per_worker)
        assert all(q > -largest[client] - 1e-9 for q in d.deficits[client].values())


@settings(max_examples=40, derandomize=True, deadline=None, phases=[Phase.explicit, Phase.generate])
@given(
    workers=st.integers(2, 3),
    loads=st.lists(client_loads, min_size=2, max_size=3),
    k=st.sampled_from([1.0, 4.0, 32.0]),
    quantum_u=st.sampled_from([32.0, 128.0, 512.0]),
    capacity_tokens=st.sampled_from([128, 256, 512]),
    steps=st.integers(60, 120),
)
def test_theorem_5_1_holds_under_the_rule(
    workers: int,
    loads: list[ClientLoad],
    k: float,
    quantum_u: float,
    capacity_tokens: int,
    steps: int,
) -> None:
    named = [
        ClientLoad(f"c{i}", **{key: v for key, v in vars(load).items() if key != "name"})
        for i, load in enumerate(loads)
    ]
    dispatcher = make_dispatcher("doubleq", worker_ids(workers), worker_quantum_requests=k)
    cluster = make_cluster(
        dispatcher,
        lambda: make_local_policy("dlpm", quantum=quantum_u),
        capacity_tokens=capacity_tokens,
        cache_tokens=256,
    )
    cluster.run(open_loop(named, steps), 2 * steps)
    max_input = max(load.shared_tokens + load.unique_tokens for load in named)
    gap = max_service_gap(cluster.samples_all)
    assert gap.value <= bound(workers, max_input, capacity_tokens, quantum_u), gap


def test_quantum_is_finite_so_theorem_a5_does_not_apply() -> None:
    d = doubleq()
    for _ in range(50):
        d.dispatch(req())
    assert math.isfinite(d.client_quantum("a")) and math.isfinite(d.quantum)
