"""DLPM skips the questions whose answer the host predicts, and decides exactly the same
(issue 23: under overload nearly every question of a decision was a refusal the simulator
could tell from one number).

A model host answers each candidate by memory: a request claims its tokens plus a
"fresh" part only a lock would show (so a claim below a refused one may still be
refused), refuses every claim at or above the smallest refused so far without looking
further, and ends the decision (``EXHAUSTED``) once its token budget is spent. One policy
is driven by that host as is; the other's ``match_len`` also carries the host's
:class:`~fairserve.sched.local.dlpm_pass.Refusals`. Same admissions in the same order,
same policy state, the questions asked a subsequence of the reference's, and every
question skipped one the reference asked and had refused without looking.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fairserve.core.types import Request
from fairserve.sched.local.base import EXHAUSTED, FIT, NO_FIT, Answer, Decision
from fairserve.sched.local.dlpm import DLPM
from tests.fakes.factories import unique_request

NEVER = 1 << 62


@dataclass(frozen=True)
class Spec:
    """One request: client, claim without a lock, what its lock would add."""

    client: str
    claim: int
    fresh: int


@dataclass
class Memory:
    """One decision's host: free tokens, a token budget, and the refusal limit."""

    free: int
    budget: int
    claims: dict[Request, int]
    fresh: dict[Request, int]
    by_headroom: bool = False
    """Also predict the refusal of any claim above the free tokens (a host that refuses
    those without a lock, as SGLang does): the limit then often falls to the smallest
    claim, and the decision ends without asking about the rest."""
    refused_claim: int = NEVER
    asked: list[str] = field(default_factory=list)
    refused_ids: set[str] = field(default_factory=set)
    predicted: int = 0
    admitted: set[Request] = field(default_factory=set)

    # ------------------------------------------------------------ Refusals
    @property
    def needs(self) -> dict[Request, int]:
        return self.claims

    @property
    def limit(self) -> int:
        if self.budget <= 0:
            return NEVER
        return min(self.refused_claim, self.free + 1) if self.by_headroom else self.refused_claim

    @property
    def floor(self) -> int:
        left = [c for r, c in self.claims.items() if r not in self.admitted]
        return min(left, default=-1)

    def refused(self, count: int) -> None:
        self.predicted += count

    # ------------------------------------------------------------ answers
    def answer(self, req: Request) -> Answer:
        self.asked.append(req.id)
        if self.budget <= 0:
            return EXHAUSTED
        claim = self.claims[req]
        if claim >= self.refused_claim:
            self.refused_ids.add(req.id)
            return NO_FIT  # refused without looking: what the limit predicts
        if claim + self.fresh[req] > self.free:
            self.refused_claim = min(self.refused_claim, claim + self.fresh[req])
            self.refused_ids.add(req.id)
            return NO_FIT
        self.free -= claim
        self.budget -= claim
        self.admitted.add(req)
        return FIT


def run_decision(decision: Decision, memory: Memory) -> list[Request]:
    try:
        req = next(decision)
        while True:
            req = decision.send(memory.answer(req))
    except StopIteration as end:
        admitted: list[Request] = end.value
        return admitted


class Run:
    """A DLPM policy with its waiting queue, fed decisions."""

    def __init__(self, predicted: bool, fill_patience: int, by_headroom: bool = False) -> None:
        self.policy = DLPM(quantum=80.0, fill_patience=fill_patience)
        self.policy.index_min_waiting = 1  # the kept order from the first decision
        self.predicted = predicted
        self.by_headroom = by_headroom
        self.waiting: list[Request] = []
        self.claims: dict[Request, int] = {}
        self.fresh: dict[Request, int] = {}

    def arrive(self, rid: str, spec: Spec, now_s: float) -> None:
        req = unique_request(rid, spec.client, spec.claim, 4, arrival_s=now_s)
        self.claims[req] = spec.claim
        self.fresh[req] = spec.fresh
        self.policy.on_arrival(req, now_s)
        self.waiting.append(req)

    def decide(self, free: int, budget: int, now_s: float) -> tuple[list[str], Memory]:
        memory = Memory(free, budget, dict(self.claims), self.fresh, self.by_headroom)

        def match_len(req: Request) -> int:
            return 0

        if self.predicted:
            match_len.refusals = memory  # type: ignore[attr-defined]
        admitted = run_decision(self.policy.decide(list(self.waiting), match_len, now_s), memory)
        for req in admitted:  # each finishes at once, charged one decoded token
            req.output_tokens = 1
            self.waiting.remove(req)
            del self.claims[req]
        self.policy.on_decode_step(admitted, now_s)
        for req in admitted:
            self.policy.on_finish(req, now_s)
        return [r.id for r in admitted], memory

    def state(self) -> str:
        return json.dumps(self.policy.snapshot(), sort_keys=True, default=str)


specs = st.builds(Spec, st.sampled_from("abcd"), st.integers(1, 60), st.sampled_from([0, 0, 5, 30]))
decisions = st.lists(
    st.tuples(
        st.lists(specs, max_size=12),  # arrivals before the decision
        st.integers(0, 150),  # free tokens
        st.integers(0, 200),  # token budget
    ),
    min_size=1,
    max_size=6,
)


def is_subsequence(short: list[str], long: list[str]) -> bool:
    it = iter(long)
    return all(x in it for x in short)


@pytest.mark.parametrize("by_headroom", [False, True])
@pytest.mark.parametrize("fill_patience", [0, 1, 8])
@given(steps=decisions)
def test_predicted_refusals_decide_the_same(
    fill_patience: int, by_headroom: bool, steps: list[tuple[list[Spec], int, int]]
) -> None:
    reference = Run(False, fill_patience)
    predicted = Run(True, fill_patience, by_headroom)
    serial = 0
    for step, (arrivals, free, budget) in enumerate(steps):
        now_s = float(step)
        for spec in arrivals:
            for run in (reference, predicted):
                run.arrive(f"r{serial}", spec, now_s)
            serial += 1
        want, asked = reference.decide(free, budget, now_s)
        got, skipping = predicted.decide(free, budget, now_s)
        assert got == want
        assert predicted.state() == reference.state()
        assert is_subsequence(skipping.asked, asked.asked)
        skipped = set(asked.asked) - set(skipping.asked)
        assert len(skipped) == skipping.predicted
        assert skipped <= asked.refused_ids, "only refusals are skipped"
        assert skipping.refused_ids | skipped == asked.refused_ids


def test_a_decision_skips_the_refusals_it_can_predict() -> None:
    """The case the simulator's overload is made of: one claim refused, then a queue of
    larger claims that are all refused without a question."""
    run = Run(True, fill_patience=8)
    run.arrive("small", Spec("a", 10, 5), 0.0)  # claims 15 with its lock: over 12
    for i in range(20):
        run.arrive(f"big{i}", Spec("a", 15 + i, 0), 0.0)
    admitted, memory = run.decide(free=12, budget=1_000, now_s=1.0)
    assert admitted == []
    assert memory.asked == ["small"]
    assert memory.predicted == 20


def test_a_decision_ends_once_nothing_left_could_fit() -> None:
    """Once the limit is at or below every waiting claim, the rest is refused unasked."""
    run = Run(True, fill_patience=8, by_headroom=True)
    run.arrive("fits", Spec("a", 10, 0), 0.0)
    run.arrive("other", Spec("b", 30, 0), 0.0)
    for i in range(20):
        run.arrive(f"big{i}", Spec("a" if i % 2 else "b", 15 + i, 0), 0.0)
    admitted, memory = run.decide(free=20, budget=1_000, now_s=1.0)
    assert admitted == ["fits"]
    assert memory.asked == ["fits"]  # then 10 free: below every claim left
    assert memory.predicted == 21
