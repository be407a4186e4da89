"""DoubleQ's work-conserving spill (issue 17: tree-of-thought S1's throughput).

SELECTWORKER keeps a client on the workers caching its prefixes; once the worker it picks
holds ``spill_outstanding`` of the client's own requests (its backlog), the request goes
instead to the least-loaded worker where the client has credit, at least two fewer
outstanding, and no other client's request in flight. The spill only chooses among workers with
``q[i][w] > 0``, so Theorem 5.1's bound holds with it (property below), and it never
places a request where another client has work.
"""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from fairserve.core.metrics import max_service_gap
from fairserve.core.types import Request, make_request
from fairserve.sched import registry
from fairserve.sched.dispatch.doubleq import (
    DEFAULT_SPILL_OUTSTANDING,
    DEFAULT_WORKER_QUANTUM,
    DoubleQ,
)
from fairserve.sched.registry import make_dispatcher, make_local_policy
from tests.fakes.cluster import ClientLoad, make_cluster, open_loop, prompt_tokens, worker_ids
from tests.sched.test_dispatch_fairness import bound, client_loads

_SERIAL = itertools.count()


def req(client: str, prefix: int) -> Request:
    """A 50-token prompt: 40 tokens of the prefix group ``prefix``, 10 of its own."""
    serial = next(_SERIAL)
    return make_request(f"s{serial}", client, prompt_tokens(prefix, 40, serial, 10), 5)


def doubleq(workers: int, **params: Any) -> DoubleQ:
    d = registry.make_dispatcher("doubleq", [f"w{i}" for i in range(workers)], **params)
    assert isinstance(d, DoubleQ)
    return d


def test_the_spill_is_on_by_default() -> None:
    assert doubleq(2).config.spill_outstanding == DEFAULT_SPILL_OUTSTANDING > 0


def test_a_queue_on_the_cached_worker_spills_to_a_worker_no_other_client_uses() -> None:
    d = doubleq(3, spill_outstanding=3)
    assert d.dispatch(req("b", 1)) == "w0"
    # a's prefix lands on the least-loaded worker, and a sticks there up to the threshold.
    assert [d.dispatch(req("a", 2)) for _ in range(3)] == ["w1"] * 3
    # w1 has a queue: w2 is idle; w0 has fewer outstanding but serves b.
    assert d.dispatch(req("a", 2)) == "w2"
    assert d.spills == 1
    # The spilled request's worker now holds a's prefix: a follows it there (locality),
    # least loaded among the cached workers.
    assert d.dispatch(req("a", 2)) == "w2"
    assert d.spills == 1


def test_never_onto_a_worker_where_another_client_has_a_request_in_flight() -> None:
    d = doubleq(2, spill_outstanding=3)
    b = req("b", 1)
    assert d.dispatch(b) == "w0"
    assert [d.dispatch(req("a", 2)) for _ in range(5)] == ["w1"] * 5
    assert d.spills == 0
    d.on_finish(b, "w0", 5)  # w0 serves no one now: a spills there
    assert d.dispatch(req("a", 2)) == "w0"
    assert d.spills == 1


def test_only_the_client_whose_own_backlog_fills_the_worker_spills() -> None:
    """A well-behaved client with a request or two on a worker that another client's
    backlog fills keeps its locality there (its local DLPM serves it within its bound);
    moving it would recompute its prefix elsewhere (on 4 x A100, long-QA S2's well-behaved
    clients' p99 gain against Preble fell 0.73 -> 0.40 when they were spilled)."""
    d = doubleq(3, spill_outstanding=3)
    assert [d.dispatch(req("bad", 1)) for _ in range(3)] == ["w0"] * 3
    # good's prefix is also on w0 (same group): w0 has a queue of 3, all bad's.
    d.prefixes.dispatched(req("good", 2).prompt_key, "w0")
    assert d.dispatch(req("good", 2)) == "w0"
    assert d.spills == 0
    # bad's own backlog there is at the threshold: bad spills to an idle worker.
    assert d.dispatch(req("bad", 1)) == "w1"
    assert d.spills == 1


def test_a_spill_fills_room_below_the_threshold_never_a_second_queue() -> None:
    """Under sustained overload every worker of the client is past the threshold: moving
    requests between its queues only scatters its prefixes (bench_sim's overload hour, 900 s:
    125,280 requests served, 16,426 waiting at the end, against 129,129 and 8,705 with the
    spill off; with this rule 138,221 and 11,468)."""
    d = doubleq(2, spill_outstanding=4)
    assert d.dispatch(req("a", 1)) == "w0"
    assert [d.dispatch(req("a", 2)) for _ in range(3)] == ["w1"] * 3  # its other prefix
    assert [d.dispatch(req("a", 1)) for _ in range(4)] == ["w0"] * 4  # w0: 5, w1: 3
    # w0 holds 5 of a's requests, w1 3: shorter, but with no room below the threshold.
    assert d.dispatch(req("a", 1)) == "w0"
    assert d.spills == 0


def test_off_at_zero() -> None:
    d = doubleq(2, spill_outstanding=0)
    assert [d.dispatch(req("a", 2)) for _ in range(10)] == ["w0"] * 10
    assert d.spills == 0


def test_only_onto_workers_where_the_client_has_credit() -> None:
    """Q^w = 1000: a spends its credit on w2 (requests forced there, then finished), so w2
    is idle but the spill may not use it (Theorem 5.1's condition ``q[i][w] > 0``)."""
    d = doubleq(3, spill_outstanding=3, worker_quantum=1000.0)
    assert d.dispatch(req("b", 1)) == "w0"
    assert d.dispatch(req("a", 2)) == "w1"
    while d.deficits["a"]["w2"] > 0:  # the refill gave w2 1000 too
        forced = req("a", 3)
        assert d.dispatch(forced, ["w2"]) == "w2"
        d.on_finish(forced, "w2", 5)
    assert d.deficits["a"]["w2"] <= 0 < d.deficits["a"]["w1"]
    assert [d.dispatch(req("a", 2)) for _ in range(2)] == ["w1", "w1"]  # w1: 3 outstanding
    assert d.dispatch(req("a", 2)) == "w1"  # w2 idle but no credit, w0 serves b
    assert d.spills == 0


def test_the_per_worker_in_flight_counts_follow_finishes_and_aborts() -> None:
    d = doubleq(2)
    r1, r2 = req("a", 1), req("a", 1)
    w = d.dispatch(r1)
    d.dispatch(r2, [w])
    assert d.worker_clients[w] == {"a": 2}
    d.on_finish(r1, w, 5)
    d.on_abort(r2, w)
    assert d.worker_clients == {"w0": {}, "w1": {}}
    d.add_worker("w2")
    d.remove_worker("w0")
    assert set(d.worker_clients) == {"w1", "w2"}


# No shrinking: a failing cluster run is printed as generated, shrinking it takes minutes.
@settings(
    max_examples=40,
    derandomize=True,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],
)
@given(
    workers=st.integers(2, 3),
    loads=st.lists(client_loads, min_size=2, max_size=3),
    worker_quantum=st.sampled_from([64.0, 256.0, 2048.0, float(2**23)]),
    spill=st.sampled_from([1, 2, 4]),
    quantum_u=st.sampled_from([32.0, 128.0, 512.0]),
    capacity_tokens=st.sampled_from([128, 256, 512]),
    steps=st.integers(60, 120),
    late=st.integers(0, 40),
)
def test_theorem_5_1_holds_with_the_spill_firing(
    workers: int,
    loads: list[ClientLoad],
    worker_quantum: float,
    spill: int,
    quantum_u: float,
    capacity_tokens: int,
    steps: int,
    late: int,
) -> None:
    """The bound of every client backlogged on every worker, with small thresholds and the
    clients after the first starting ``late`` steps later (alone, the first one's backlog
    spills: see the next test)."""
    named = [
        ClientLoad(
            f"c{i}",
            **{k: v for k, v in vars(load).items() if k not in ("name", "start")},
            start=late if i else 0,
        )
        for i, load in enumerate(loads)
    ]
    dispatcher = make_dispatcher(
        "doubleq", worker_ids(workers), worker_quantum=worker_quantum, spill_outstanding=spill
    )
    cluster = make_cluster(
        dispatcher,
        lambda: make_local_policy("dlpm", quantum=quantum_u),
        capacity_tokens=capacity_tokens,
    )
    cluster.run(open_loop(named, steps), 2 * steps)
    max_input = max(load.shared_tokens + load.unique_tokens for load in named)
    gap = max_service_gap(cluster.samples_all)
    assert gap.value <= bound(workers, max_input, capacity_tokens, quantum_u), gap


def test_a_client_alone_spills_its_backlog_then_follows_its_prefixes() -> None:
    """A prefix-heavy client alone for 30 steps, then a second one: the first's backlog
    spills from its cached worker onto the idle ones, and from there its requests follow
    the prefixes they placed (least loaded among the cached workers)."""
    loads = [
        ClientLoad("f", 3, shared_tokens=64, unique_tokens=8, output_tokens=4),
        ClientLoad("g", 2, shared_tokens=0, unique_tokens=16, output_tokens=4, start=30),
    ]
    for spill in (0, 4):
        dispatcher = make_dispatcher("doubleq", worker_ids(3), spill_outstanding=spill)
        assert isinstance(dispatcher, DoubleQ)
        cluster = make_cluster(
            dispatcher, lambda: make_local_policy("dlpm", quantum=128.0), capacity_tokens=256
        )
        cluster.run(open_loop(loads, 100), 200)
        # The workers f was charged on (the fixed Q^w is never used up here).
        f_workers = {w for w, q in dispatcher.deficits["f"].items() if q < DEFAULT_WORKER_QUANTUM}
        assert (dispatcher.spills > 0, len(f_workers)) == ((True, 3) if spill else (False, 1))
