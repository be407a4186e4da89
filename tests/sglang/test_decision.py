"""The policy's ``decide`` driven from SGLang's admission loop: one question at a time on the
scheduler thread, answered FIT / NO_FIT / EXHAUSTED, with no helper thread."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import pytest

from fairserve.core.types import Request, make_request
from fairserve.sched.local.base import EXHAUSTED, FIT, NO_FIT, Answer, Decision, MatchLen
from fairserve.sched.local.fcfs import FCFS
from fairserve.sglang import hooks
from fairserve.sglang.config import PluginConfig
from fairserve.sglang.decision import Decision as LoopDecision
from fairserve.sglang.host import PolicyHost
from tests.fakes.sglang import AddReqResult, FakeScheduler, Req
from tests.sglang.conftest import MakeHost


def requests(n: int) -> list[Request]:
    return [make_request(f"r{i}", f"c{i % 2}", [i, i + 1], 4, arrival_s=i) for i in range(n)]


class Recording(FCFS):
    """FCFS that records every answer it receives, and the thread it decides on."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.answers: list[tuple[str, Answer]] = []
        self.threads: set[int] = set()

    def decide(self, waiting: Sequence[Request], match_len: MatchLen, now_s: float) -> Decision:
        inner = super().decide(waiting, match_len, now_s)
        try:
            req = next(inner)
            while True:
                self.threads.add(threading.get_ident())
                answer = yield req
                self.answers.append((req.id, answer))
                req = inner.send(answer)
        except StopIteration as end:
            admitted: list[Request] = end.value
            return admitted


def loop_decision(policy: FCFS, waiting: list[Request]) -> LoopDecision:
    for req in waiting:
        policy.on_arrival(req, 0.0)
    origin = {r: r for r in waiting}
    decide = policy.decide(waiting, lambda r: 0, 0.0)
    return LoopDecision(list(waiting), origin, {r: 0 for r in waiting}, decide)


def test_questions_come_one_at_a_time_in_the_policy_order() -> None:
    decision = loop_decision(FCFS(), requests(4))
    asked = []
    while decision.question is not None:
        asked.append(decision.question.id)
        decision.answer(NO_FIT if decision.question.id == "r1" else FIT)
    assert asked == ["r0", "r1", "r2", "r3"]
    assert [r.id for r in decision.close()] == ["r0", "r2", "r3"]
    assert decision.asked == 4


def test_close_says_exhausted_and_the_policy_asks_nothing_more() -> None:
    policy = Recording()
    decision = loop_decision(policy, requests(5))
    decision.answer(FIT)
    assert [r.id for r in decision.close()] == ["r0"]
    assert policy.answers == [("r0", FIT), ("r1", EXHAUSTED)]
    assert decision.question is None and decision.asked == 2
    with pytest.raises(RuntimeError, match="finished"):
        decision.answer(FIT)


def test_close_answers_a_policy_that_asks_again_until_it_ends() -> None:
    def stubborn() -> Decision:
        admitted = []
        for req in requests(3):
            if (yield req) is FIT:
                admitted.append(req)
        return admitted

    decision = LoopDecision([], {}, {}, stubborn())
    assert decision.close() == [] and decision.asked == 3


def test_an_error_in_the_policy_reaches_the_scheduler_thread() -> None:
    def broken() -> Decision:
        yield requests(1)[0]
        raise ValueError("policy bug")

    decision = LoopDecision([], {}, {}, broken())
    with pytest.raises(ValueError, match="policy bug"):
        decision.answer(FIT)


def test_the_asked_request_is_brought_right_after_the_current_slot() -> None:
    waiting = requests(4)
    policy = FCFS()
    for req in waiting:
        policy.on_arrival(req, 0.0)
    sglang_order = [waiting[3], waiting[2], waiting[1], waiting[0]]
    origin = {r: r for r in waiting}
    decision = LoopDecision(sglang_order, origin, {}, policy.decide(waiting, lambda r: 0, 0.0))
    decision.bring_forward(-1)
    assert [r.id for r in sglang_order] == ["r0", "r3", "r2", "r1"]
    decision.answer(FIT)
    decision.bring_forward(0)
    assert [r.id for r in sglang_order] == ["r0", "r1", "r3", "r2"]
    assert sorted(r.id for r in sglang_order) == ["r0", "r1", "r2", "r3"]


def install_recording(policy: Recording) -> PolicyHost:
    host = PolicyHost(PluginConfig(policy="fcfs"), policy, AddReqResult)
    hooks.install_host(host)
    return host


def test_a_spent_budget_answers_exhausted_on_the_scheduler_thread(install: MakeHost) -> None:
    """The loop stops after r0 (NO_TOKEN: the budget is spent): the policy hears FIT for
    r0 and EXHAUSTED for the next, is asked nothing else, and no thread was started."""
    install("fcfs")  # hooks the fake classes; replaced by the recording host below
    policy = Recording()
    install_recording(policy)
    threads_before = threading.active_count()
    sched = FakeScheduler(kv_tokens=40)
    for i in range(3):
        sched.add_request(Req(f"r{i}", [i * 100 + t for t in range(35)], 5, f"c{i}"))
    record = sched.prefill()
    assert record.admitted == ["r0"]
    assert policy.answers == [("r0", FIT), ("r1", EXHAUSTED)]
    assert policy.threads == {threading.get_ident()}
    assert threading.active_count() == threads_before


def test_too_large_for_what_is_left_answers_no_fit(install: MakeHost) -> None:
    install("fcfs")
    policy = Recording()
    install_recording(policy)
    sched = FakeScheduler(kv_tokens=120)
    sched.add_request(Req("big", list(range(200)), 5, "a"))
    sched.add_request(Req("small", list(range(1000, 1030)), 5, "b"))
    assert sched.prefill().admitted == ["small"]
    assert policy.answers == [("big", NO_FIT), ("small", FIT)]


class Equal:
    """An SGLang-side request whose ``__eq__`` matches every other one."""

    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = object.__hash__


def test_requests_are_found_by_identity_not_equality() -> None:
    waiting = requests(3)
    policy = FCFS()
    for req in waiting:
        policy.on_arrival(req, 0.0)
    sglang = [Equal(), Equal(), Equal()]
    origin = {r: s for r, s in zip(waiting, reversed(sglang), strict=True)}
    order = list(sglang)
    decision = LoopDecision(order, origin, {}, policy.decide(waiting, lambda r: 0, 0.0))
    decision.bring_forward(-1)
    assert order[0] is sglang[2]
    assert decision.locate(sglang[2]) == 0 and decision.locate(sglang[1]) == 2
