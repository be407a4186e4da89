"""DLPM and DoubleQ bounds in extend tokens when clients share a prefix (issue 17).

The theorems bound the service *charged*, ``w_e`` per extend (uncached) prompt token plus
``w_q`` per output token: the system's view, which the fakes record as processed service.
Here every client's prompts start with one system prompt shared by all clients (teams on
one product), so a client's requests hit the cache on prefixes other clients computed: the
client's view (all prompt tokens) and the system's view differ, and only the latter is
bounded: ``2·(U + Q^u)`` per worker (DLPM Theorem 4.1), ``2·|W|·(U + Q^u)`` over a cluster
whose backlogged clients are backlogged everywhere (DoubleQ Theorem 5.1), with
``U = w_e·L_input + w_q·M``.
"""

from __future__ import annotations

from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from fairserve.core.metrics import backlogged_vs_other_gap, max_service_gap
from fairserve.core.types import Request
from fairserve.sched.registry import make_dispatcher, make_local_policy
from tests.fakes.cluster import make_cluster, worker_ids
from tests.fakes.factories import prefix_request
from tests.sched.local_workloads import UNIFORM_NEED_TOKENS, max_input_tokens, run_workload

W_E, W_Q = 1.0, 2.0
SYSTEM = "system"
"""The prefix id every client's prompts start with."""


@st.composite
def shared_prefix_arrivals(
    draw: st.DrawFn, need_tokens: int | None = None, max_step: int = 40
) -> list[tuple[int, Request]]:
    """2-4 clients whose prompts all start with the same system prompt; each request holds
    ``need_tokens`` of memory when given (the proofs' no-fragmentation setting)."""
    clients = draw(st.integers(2, 4))
    system_tokens = draw(st.sampled_from([32, 64, 160]))
    arrivals: list[tuple[int, Request]] = []
    for c in range(clients):
        for i in range(draw(st.integers(8, 30))):
            suffix = draw(st.integers(1, 60))
            output = draw(st.integers(1, 20))
            if need_tokens is not None:
                suffix = min(suffix, need_tokens - 1 - system_tokens)
                output = need_tokens - system_tokens - suffix
            req = prefix_request(f"c{c}-{i}", f"c{c}", SYSTEM, system_tokens, suffix, output)
            arrivals.append((draw(st.integers(0, max_step)), req))
    return arrivals


@settings(max_examples=40)
@given(
    arrivals=shared_prefix_arrivals(UNIFORM_NEED_TOKENS),
    quantum=st.sampled_from([16.0, 128.0, 512.0]),
)
def test_dlpm_bound_in_extend_tokens_with_a_prefix_shared_by_all_clients(
    arrivals: list[tuple[int, Request]], quantum: float
) -> None:
    engine = run_workload(make_local_policy("dlpm", quantum=quantum), arrivals)
    assert len(engine.finished) == len(arrivals)
    cached = sum(r.cached_tokens for r in engine.finished)
    assert cached > 0  # clients reused prefixes others computed
    u = W_E * max_input_tokens(arrivals) + W_Q * engine.capacity_tokens
    bound = 2 * (u + quantum)
    assert max_service_gap(engine.samples).value <= bound
    assert backlogged_vs_other_gap(engine.samples).value <= bound


# No shrinking: a failing cluster run is printed as generated, shrinking it takes minutes.
@settings(max_examples=30, phases=[Phase.explicit, Phase.generate])
@given(
    arrivals=shared_prefix_arrivals(max_step=60),
    workers=st.integers(2, 3),
    worker_quantum=st.sampled_from([64.0, 256.0, 2048.0]),
    quantum=st.sampled_from([32.0, 128.0, 512.0]),
    capacity_tokens=st.sampled_from([256, 512]),
)
def test_doubleq_bound_in_extend_tokens_with_a_prefix_shared_by_all_clients(
    arrivals: list[tuple[int, Request]],
    workers: int,
    worker_quantum: float,
    quantum: float,
    capacity_tokens: int,
) -> None:
    dispatcher = make_dispatcher("doubleq", worker_ids(workers), worker_quantum=worker_quantum)
    cluster = make_cluster(
        dispatcher,
        lambda: make_local_policy("dlpm", quantum=quantum),
        capacity_tokens=capacity_tokens,
    )
    by_step: dict[int, list[Request]] = {}
    for step, req in arrivals:
        by_step.setdefault(step, []).append(req)
    cluster.run(by_step, 4000)
    u = W_E * max_input_tokens(arrivals) + W_Q * capacity_tokens
    gap = max_service_gap(cluster.samples_all)
    assert gap.value <= 2 * workers * (u + quantum), gap
