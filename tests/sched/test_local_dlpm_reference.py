"""The fast DLPM decision equals a literal transcription of Algorithm 1.

``DecisionState`` replays the passes of Algorithm 1 with incremental bookkeeping. This test
runs, on random queues, deficits and memory budgets, a slow and obviously-literal version:
walk the whole LPM-ordered queue again and again; at a request whose client has ``q <= 0``
run CHECKREFILL by scanning the queue; stop when a walk changes nothing. Two documented
readings are shared by both versions: consecutive refills are done at once (until a queued
client has credit), and a request that failed ``can_fit`` is not asked again in the same
decision (memory only shrinks while admitting) though it stays queued.
"""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from fairserve.core.types import Request
from fairserve.sched.local.dlpm import DLPM
from fairserve.sched.local.lpm import lpm_sorted
from tests.fakes.factories import unique_request

QUANTUM = 50.0


def literal_refill(deficits: dict[str, float], queued: set[str], quantum: float) -> None:
    """Lines 6-7 repeated until a queued client has ``q > 0``."""
    while not any(deficits[c] > 0 for c in queued):
        for client, q in deficits.items():
            if q <= 0:
                deficits[client] = q + quantum


def literal_decision(
    order: list[Request],
    deficits: dict[str, float],
    free_tokens: int,
    fill: bool,
) -> list[str]:
    """Algorithm 1, lines 16-25, the slow way; returns admitted request ids in order."""
    queue = list(order)
    failed: set[int] = set()
    admitted: list[str] = []
    free = [free_tokens]

    def try_admit(req: Request) -> bool:
        if id(req) in failed:
            return False
        if req.input_tokens > free[0]:
            failed.add(id(req))
            return False
        free[0] -= req.input_tokens
        deficits[req.client] -= req.input_tokens  # w_e = 1, weight 1, nothing cached
        admitted.append(req.id)
        queue.remove(req)
        return True

    changed = True
    while queue and changed:
        changed = False
        for req in list(queue):
            if id(req) in failed:
                continue
            if deficits[req.client] <= 0 and not any(deficits[r.client] > 0 for r in queue):
                literal_refill(deficits, {r.client for r in queue}, QUANTUM)
                changed = True
            if deficits[req.client] > 0:
                try_admit(req)
                changed = True
    if fill:
        for req in list(queue):
            try_admit(req)
    return admitted


queues = st.lists(st.tuples(st.sampled_from("abcd"), st.integers(1, 60)), min_size=1, max_size=40)


@settings(max_examples=300)
@given(
    specs=queues,
    start=st.dictionaries(st.sampled_from("abcd"), st.integers(-200, 60), max_size=4),
    free_tokens=st.integers(0, 600),
    fill=st.booleans(),
)
def test_fast_decision_matches_the_literal_algorithm(
    specs: list[tuple[str, int]], start: dict[str, int], free_tokens: int, fill: bool
) -> None:
    waiting = [
        unique_request(f"r{i}", client, size, 4, arrival_s=float(i))
        for i, (client, size) in enumerate(specs)
    ]
    policy = DLPM(quantum=QUANTUM, work_conserving=fill)
    for req in waiting:
        policy.on_arrival(req, req.arrival_s)
    for client, q in start.items():
        policy.deficits[client] = float(q)
    expected_deficits = {c: policy.deficits.get(c, 0.0) for c in "abcd"}
    expected_deficits = {c: q for c, q in expected_deficits.items() if c in policy.deficits}
    order = lpm_sorted(waiting, [0] * len(waiting))
    expected = literal_decision(order, expected_deficits, free_tokens, fill)

    free = [free_tokens]

    def can_fit(req: Request) -> bool:
        if req.input_tokens > free[0]:
            return False
        free[0] -= req.input_tokens
        return True

    got = [r.id for r in policy.select(waiting, can_fit, lambda r: 0, 0.0)]
    assert got == expected
    for client, deficit in expected_deficits.items():
        assert math.isclose(policy.deficits[client], deficit), client


@settings(max_examples=200)
@given(
    steps=st.lists(
        st.tuples(st.sampled_from("abc"), st.integers(1, 80), st.booleans(), st.integers(0, 40)),
        min_size=1,
        max_size=30,
    ),
    start=st.dictionaries(st.sampled_from("abc"), st.integers(-200, 60), max_size=3),
    patience=st.integers(0, 3),
)
def test_one_request_shortcut_equals_the_general_decision(
    steps: list[tuple[str, int, bool, int]], start: dict[str, int], patience: int
) -> None:
    """A queue of one takes a shortcut; over a run of such decisions (fitting or blocked on
    memory, partly cached) deficits, refills, fill patience and charges match the passes."""
    fast = DLPM(quantum=QUANTUM, fill_patience=patience)
    general = DLPM(quantum=QUANTUM, fill_patience=patience)
    for policy in (fast, general):
        policy.deficits.update({c: float(q) for c, q in start.items()})
    for i, (client, size, fits, cached) in enumerate(steps):
        decisions: list[tuple[object, ...]] = []

        def can_fit(req: Request, ok: bool = fits) -> bool:
            return ok

        def match_len(req: Request, tokens: int = cached) -> int:
            return tokens

        for policy, select in ((fast, fast.select), (general, general._select_passes)):
            req = unique_request(f"r{i}", client, size, 4, arrival_s=float(i))
            policy.on_arrival(req, req.arrival_s)
            admitted = select([req], can_fit, match_len, float(i))
            if not admitted:
                policy.on_abort(req, float(i), was_waiting=True)
            decisions.append(([r.id for r in admitted], dict(policy.deficits), policy.refills))
            decisions.append((policy.blocked_decisions, dict(policy.service)))
        assert decisions[0] == decisions[2]
        assert decisions[1] == decisions[3]
