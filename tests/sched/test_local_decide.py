"""The generator decision (``decide``) and its ``EXHAUSTED`` answer.

``select`` drives ``decide`` with ``can_fit``; pull-style hosts (SGLang's admission loop)
answer each candidate themselves and say ``EXHAUSTED`` once the engine's budget is spent.
That answer must mean exactly "this and every later candidate does not fit": the same
admissions and the same policy state (counters, deficits, refills, memory patience) as
``select`` with a ``can_fit`` that says False from then on, with no question asked after it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fairserve.core.types import Request
from fairserve.sched.local.base import EXHAUSTED, FIT, NO_FIT, LocalPolicy, drive
from fairserve.sched.registry import make_local_policy
from tests.fakes.factories import unique_request

POLICIES: dict[str, dict[str, Any]] = {
    "fcfs": {},
    "lpm": {},
    "vtc": {"memory_patience": 1},
    "vtc-skip": {"memory_patience": 10**9},
    "lcf": {"memory_patience": 0},
    "dlpm": {"quantum": 60.0, "fill_patience": 1},
    "dlpm-strict": {"quantum": 60.0, "work_conserving": False},
    "rpm": {"limit_per_min": 100_000},
    "justitia": {},
    "preble": {"group_quota": 1},
    "preble-fill": {"group_quota": 1, "fill_other_groups": True},
}


def build(variant: str) -> LocalPolicy:
    return make_local_policy(variant.split("-")[0], **POLICIES[variant])


@dataclass(frozen=True)
class Spec:
    """One request of a decision: client, prompt tokens, cached tokens."""

    client: str
    tokens: int
    cached: int


specs = st.builds(Spec, st.sampled_from("abc"), st.integers(1, 120), st.sampled_from([0, 0, 8, 40]))
decisions = st.lists(
    st.tuples(
        st.lists(specs, min_size=1, max_size=10),  # arrivals before the decision
        st.integers(0, 400),  # the engine's token budget
        st.integers(0, 12),  # the question answered EXHAUSTED
    ),
    min_size=1,
    max_size=5,
)


class Run:
    """One policy fed a sequence of decisions, its requests and what it was asked."""

    def __init__(self, variant: str) -> None:
        self.policy = build(variant)
        self.waiting: list[Request] = []
        self.cached: dict[str, int] = {}
        self.asked: list[list[str]] = []

    def arrive(self, rid: str, spec: Spec, now_s: float) -> None:
        req = unique_request(rid, spec.client, spec.tokens, 4, arrival_s=now_s)
        self.cached[rid] = min(spec.cached, spec.tokens)
        self.policy.on_arrival(req, now_s)
        self.waiting.append(req)

    def match_len(self, req: Request) -> int:
        return self.cached[req.id]

    def settle(self, admitted: list[Request], now_s: float) -> None:
        """Admitted requests decode one token and finish; the rest wait for the next."""
        for req in admitted:
            req.output_tokens = 1
        self.policy.on_decode_step(admitted, now_s)
        for req in admitted:
            self.policy.on_finish(req, now_s)
        self.waiting = [r for r in self.waiting if r not in admitted]

    def state(self) -> str:
        return json.dumps(self.policy.snapshot(), sort_keys=True, default=str)


def answer_by_budget(budget: list[int], req: Request) -> bool:
    if req.input_tokens > budget[0]:
        return False
    budget[0] -= req.input_tokens
    return True


def with_select(run: Run, budget_tokens: int, cut: int, now_s: float) -> list[Request]:
    """The reference: ``select`` whose ``can_fit`` says False from question ``cut`` on."""
    budget, asked = [budget_tokens], []

    def can_fit(req: Request) -> bool:
        asked.append(req.id)
        return len(asked) <= cut and answer_by_budget(budget, req)

    admitted = run.policy.select(list(run.waiting), can_fit, run.match_len, now_s)
    run.asked.append(asked[: cut + 1])
    return admitted


def with_exhausted(run: Run, budget_tokens: int, cut: int, now_s: float) -> list[Request]:
    """``decide`` answered by the budget, then ``EXHAUSTED`` at question ``cut``."""
    budget, asked = [budget_tokens], []
    decision = run.policy.decide(list(run.waiting), run.match_len, now_s)
    try:
        req = next(decision)
        while True:
            asked.append(req.id)
            assert len(asked) <= cut + 1, "asked again after EXHAUSTED"
            if len(asked) > cut:
                answer = EXHAUSTED
            else:
                answer = FIT if answer_by_budget(budget, req) else NO_FIT
            req = decision.send(answer)
    except StopIteration as end:
        admitted: list[Request] = end.value
    run.asked.append(asked)
    return admitted


@pytest.mark.parametrize("variant", sorted(POLICIES))
@given(steps=decisions)
def test_exhausted_is_no_fit_for_everything_left(
    variant: str, steps: list[tuple[list[Spec], int, int]]
) -> None:
    reference, exhausted = Run(variant), Run(variant)
    serial = 0
    for step, (arrivals, budget_tokens, cut) in enumerate(steps):
        now_s = float(step)
        for spec in arrivals:
            for run in (reference, exhausted):
                run.arrive(f"r{serial}", spec, now_s)
            serial += 1
        want = with_select(reference, budget_tokens, cut, now_s)
        got = with_exhausted(exhausted, budget_tokens, cut, now_s)
        assert [r.id for r in got] == [r.id for r in want]
        assert exhausted.asked[-1] == reference.asked[-1]
        assert exhausted.state() == reference.state()
        for run, admitted in ((reference, want), (exhausted, got)):
            run.settle(admitted, now_s)


@pytest.mark.parametrize("variant", sorted(POLICIES))
def test_select_is_decide_driven_by_can_fit(variant: str) -> None:
    """``select`` and :func:`drive` over ``decide`` are the same decision."""
    runs = [Run(variant), Run(variant)]
    for run in runs:
        for i in range(8):
            run.arrive(f"r{i}", Spec("abc"[i % 3], 10 + 7 * i, 8 * (i % 2)), 0.0)
    budget_a, budget_b = [150], [150]
    first = runs[0].policy.select(
        list(runs[0].waiting), lambda r: answer_by_budget(budget_a, r), runs[0].match_len, 1.0
    )
    second = drive(
        runs[1].policy.decide(list(runs[1].waiting), runs[1].match_len, 1.0),
        lambda r: answer_by_budget(budget_b, r),
    )
    assert [r.id for r in first] == [r.id for r in second]
    assert first, "the budget admits some"
    assert runs[0].state() == runs[1].state()
