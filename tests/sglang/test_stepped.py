"""``select`` run one question at a time gives what ``select`` run at once gives."""

from __future__ import annotations

import threading

import pytest

from fairserve.core.types import Request, make_request
from fairserve.sglang.stepped import CanFit, SteppedSelect


def requests(n: int) -> list[Request]:
    return [make_request(f"r{i}", f"c{i % 2}", [i, i + 1], 4, arrival_s=i) for i in range(n)]


def first_fit(waiting: list[Request]) -> object:
    def select(can_fit: CanFit) -> list[Request]:
        return [r for r in waiting if can_fit(r)]

    return select


def test_questions_come_one_at_a_time_in_the_policy_order() -> None:
    waiting = requests(4)
    step = SteppedSelect(first_fit(waiting))  # type: ignore[arg-type]
    asked = []
    while step.question is not None:
        asked.append(step.question.id)
        step.answer(step.question.id != "r1")
    assert asked == ["r0", "r1", "r2", "r3"]
    assert [r.id for r in step.close()] == ["r0", "r2", "r3"]
    assert step.asked == 4


def test_close_answers_no_to_everything_left() -> None:
    step = SteppedSelect(first_fit(requests(5)))  # type: ignore[arg-type]
    step.answer(True)
    assert [r.id for r in step.close()] == ["r0"]
    assert step.done and step.question is None and step.asked == 2


def test_only_one_thread_runs_the_policy_at_a_time() -> None:
    inside = threading.Lock()

    def select(can_fit: CanFit) -> list[Request]:
        admitted = []
        for req in requests(50):
            assert inside.acquire(blocking=False), "the scheduler thread is inside too"
            inside.release()
            if can_fit(req):
                admitted.append(req)
        return admitted

    step = SteppedSelect(select)
    while step.question is not None:
        assert inside.acquire(blocking=False)
        inside.release()
        step.answer(True)
    assert len(step.close()) == 50


def test_an_error_in_select_reaches_the_scheduler_thread() -> None:
    def select(can_fit: CanFit) -> list[Request]:
        can_fit(requests(1)[0])
        raise ValueError("policy bug")

    step = SteppedSelect(select)
    with pytest.raises(ValueError, match="policy bug"):
        step.answer(True)
    with pytest.raises(RuntimeError, match="no question"):
        step.answer(True)
