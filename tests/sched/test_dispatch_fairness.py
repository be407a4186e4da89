"""DoubleQ's fairness in a multi-worker cluster: Theorem 5.1 and the Theorem A.5 counterexample.

Every worker runs local DLPM. Service is what the workers *processed* (``w_e``·extend +
``w_q``·decoded), summed over workers; the bound is ``2·|W|·(U + Q^u)`` with
``U = w_e·L_input + w_q·M`` and ``M`` = a worker's token capacity.

"Continuously backlogged" (see :mod:`tests.fakes.cluster`): Theorem 5.1 is checked on its
premise, a client waiting on **every** worker (``samples_all``); the proof adds the
per-worker DLPM bounds, and DoubleQ's job is to make the premise true by spreading a
client's work. Theorem A.5 is about the client-level notion, waiting on **any** worker
(``samples``): with ``Q^w = inf`` the sticky client is backlogged but only on one worker,
and the gap grows with the horizon; with a finite ``Q^w`` the same workload stays bounded.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from fairserve.core.metrics import ServiceSample, max_service_gap
from fairserve.sched.dispatch.doubleq import DoubleQ
from fairserve.sched.registry import make_dispatcher, make_local_policy
from tests.fakes.cluster import ClientLoad, Cluster, make_cluster, open_loop, worker_ids

W_E, W_Q = 1.0, 2.0


def bound(workers: int, max_input_tokens: int, capacity_tokens: int, quantum_u: float) -> float:
    """``2·|W|·(U + Q^u)``, ``U = w_e·L_input + w_q·M`` (Theorem 5.1)."""
    u = W_E * max_input_tokens + W_Q * capacity_tokens
    return 2 * workers * (u + quantum_u)


def doubleq_cluster(
    workers: int,
    worker_quantum: float,
    quantum_u: float,
    capacity_tokens: int,
    cache_tokens: int = 1 << 20,
) -> Cluster:
    dispatcher = make_dispatcher("doubleq", worker_ids(workers), worker_quantum=worker_quantum)
    return make_cluster(
        dispatcher,
        lambda: make_local_policy("dlpm", quantum=quantum_u),
        capacity_tokens=capacity_tokens,
        cache_tokens=cache_tokens,
    )


def both_backlogged(samples: list[ServiceSample], f: str, g: str) -> int:
    return sum(1 for s in samples if {f, g} <= s.backlogged)


# ---------------------------------------------------------------- Theorem 5.1
client_loads = st.builds(
    ClientLoad,
    name=st.just(""),
    per_step=st.integers(1, 3),
    every=st.integers(1, 2),
    shared_tokens=st.sampled_from([0, 0, 16, 32, 64]),  # prefix-heavy or not
    unique_tokens=st.integers(4, 24),
    output_tokens=st.integers(1, 8),
)


# No shrinking: a failing cluster run is printed as generated, shrinking it takes minutes.
@settings(
    max_examples=60,
    derandomize=True,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],
)
@given(
    workers=st.integers(2, 3),
    loads=st.lists(client_loads, min_size=2, max_size=3),
    worker_quantum=st.sampled_from([64.0, 256.0, 1024.0, 2048.0]),
    quantum_u=st.sampled_from([32.0, 128.0, 512.0]),
    capacity_tokens=st.sampled_from([128, 256, 512]),
    cache_tokens=st.sampled_from([256, 1 << 20]),  # with and without cache evictions
    steps=st.integers(60, 120),
)
def test_theorem_5_1_gap_between_clients_backlogged_on_every_worker(
    workers: int,
    loads: list[ClientLoad],
    worker_quantum: float,
    quantum_u: float,
    capacity_tokens: int,
    cache_tokens: int,
    steps: int,
) -> None:
    named = [
        ClientLoad(f"c{i}", **{k: v for k, v in vars(load).items() if k != "name"})
        for i, load in enumerate(loads)
    ]
    cluster = doubleq_cluster(
        workers, worker_quantum, quantum_u, capacity_tokens, cache_tokens=cache_tokens
    )
    cluster.run(open_loop(named, steps), 2 * steps)
    max_input = max(load.shared_tokens + load.unique_tokens for load in named)
    gap = max_service_gap(cluster.samples_all)
    assert gap.value <= bound(workers, max_input, capacity_tokens, quantum_u), gap


@pytest.mark.parametrize("worker_quantum", [256.0, 2048.0])
def test_theorem_5_1_prefix_heavy_overload_keeps_both_clients_everywhere(
    worker_quantum: float,
) -> None:
    """Both clients far over their share: DoubleQ spreads even the prefix-heavy one, so
    both wait on every worker nearly all the time, and the gap stays within the bound."""
    steps = 400
    loads = [
        ClientLoad("f", 3, shared_tokens=64, unique_tokens=8, output_tokens=4),
        ClientLoad("g", 3, shared_tokens=0, unique_tokens=72, output_tokens=4),
    ]
    cluster = doubleq_cluster(2, worker_quantum, 128.0, 512)
    cluster.run(open_loop(loads, steps), steps)
    assert both_backlogged(cluster.samples_all, "f", "g") >= 0.9 * steps
    gap = max_service_gap(cluster.samples_all)
    assert gap.value <= bound(2, 72, 512, 128.0), gap


def test_the_bound_check_catches_an_unfair_local_policy() -> None:
    """The same check fails with FCFS on the workers: the property can fail."""
    dispatcher = make_dispatcher("doubleq", worker_ids(2), worker_quantum=256)
    cluster = make_cluster(dispatcher, lambda: make_local_policy("fcfs"), capacity_tokens=512)
    cluster.run(open_loop(A5_LOADS, 200), 200)
    gap = max_service_gap(cluster.samples_all)
    assert gap.value > bound(2, 72, 512, 128)


# ---------------------------------------------------------------- Theorem A.5
# f: a long shared prefix (sticky); g: prefix-free, twice the rate (spread by load).
# Same input length (72 tokens), both over their fair share of two workers.
A5_LOADS = [
    ClientLoad("f", 2, shared_tokens=64, unique_tokens=8, output_tokens=4),
    ClientLoad("g", 4, shared_tokens=0, unique_tokens=72, output_tokens=4),
]
A5_QU, A5_CAPACITY, A5_STEPS = 128.0, 512, 300
A5_BOUND = bound(2, 72, A5_CAPACITY, A5_QU)


def a5_run(worker_quantum: float) -> Cluster:
    cluster = doubleq_cluster(2, worker_quantum, A5_QU, A5_CAPACITY)
    cluster.run(open_loop(A5_LOADS, A5_STEPS), A5_STEPS)
    assert len(cluster.samples) == A5_STEPS
    return cluster


def test_theorem_a5_infinite_worker_quantum_gap_grows_without_bound() -> None:
    cluster = a5_run(math.inf)
    f_workers, g_workers = cluster.workers_of("f"), cluster.workers_of("g")
    assert sorted(f_workers.values()) == [0, 2 * A5_STEPS], "f sticks to one worker"
    assert min(g_workers.values()) > 0, "g is spread over both workers"
    half = max_service_gap(cluster.samples[: A5_STEPS // 2]).value
    full = max_service_gap(cluster.samples).value
    assert both_backlogged(cluster.samples, "f", "g") >= 0.9 * A5_STEPS
    assert half > A5_BOUND
    assert full >= 1.8 * half, (half, full)
    # f is never backlogged on every worker: the premise of Theorem 5.1 fails.
    assert all("f" not in s.backlogged for s in cluster.samples_all)


def test_finite_worker_quantum_keeps_the_same_workload_within_the_bound() -> None:
    for worker_quantum in (256.0, 2048.0):
        cluster = a5_run(worker_quantum)
        assert min(cluster.workers_of("f").values()) >= 0.4 * 2 * A5_STEPS, "f spreads"
        assert both_backlogged(cluster.samples, "f", "g") >= 0.25 * A5_STEPS
        assert both_backlogged(cluster.samples_all, "f", "g") >= 0.2 * A5_STEPS
        half = max_service_gap(cluster.samples[: A5_STEPS // 2]).value
        full = max_service_gap(cluster.samples).value
        assert full <= A5_BOUND, (worker_quantum, full)
        assert full <= half + A5_BOUND / 4, "the gap does not keep growing"
        assert max_service_gap(cluster.samples_all).value <= A5_BOUND


# ---------------------------------------------------------------- the harness itself
def test_cluster_reports_finishes_and_accounts_service_exactly() -> None:
    cluster = doubleq_cluster(3, 256.0, 128.0, 256, cache_tokens=200)
    loads = [
        ClientLoad("f", 1, shared_tokens=32, unique_tokens=8, output_tokens=3),
        ClientLoad("g", 2, every=2, unique_tokens=20, output_tokens=5),
    ]
    arrivals = open_loop(loads, 40)
    cluster.run(arrivals, 400)
    assert cluster.idle()
    finished = [r for e in cluster.engines.values() for r in e.finished]
    assert len(finished) == sum(len(v) for v in arrivals.values())
    dispatcher = cluster.dispatcher
    assert set(dispatcher.outstanding.values()) == {0}, "every finish reached the dispatcher"
    expected: dict[str, float] = {}
    for r in finished:
        cost = W_E * (r.input_tokens - r.cached_tokens) + W_Q * r.output_tokens
        expected[r.client] = expected.get(r.client, 0.0) + cost
    assert cluster.samples[-1].cumulative == expected
    assert cluster.evictions_forwarded > 0


def test_forwarded_evictions_shrink_the_global_tree() -> None:
    def global_tokens(forward: bool) -> dict[str, int]:
        dispatcher = make_dispatcher("doubleq", worker_ids(2), worker_quantum=256)
        assert isinstance(dispatcher, DoubleQ)
        cluster = make_cluster(
            dispatcher,
            lambda: make_local_policy("dlpm", quantum=128),
            capacity_tokens=256,
            cache_tokens=150,
            forward_evictions=forward,
        )
        cluster.run(open_loop(A5_LOADS, 40), 400)
        return {w: dispatcher.prefixes.worker_tokens(w) for w in dispatcher.workers}

    kept, pruned = global_tokens(False), global_tokens(True)
    for worker in kept:
        assert pruned[worker] < kept[worker] / 4, (pruned, kept)
