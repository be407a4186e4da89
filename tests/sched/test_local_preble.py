"""Preble's local scheduler: priority groups by cache-hit ratio, turns weighted by group,
first come first served within a group, no starvation (Preble §3.3, code ``fcfs-mpq``)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fairserve.core.types import Request
from fairserve.sched.local.base import EXHAUSTED
from fairserve.sched.local.preble import Preble
from fairserve.sched.registry import make_local_policy
from tests.fakes.factories import unique_request

INPUT_TOKENS = 100


def waiting_with(
    cached: dict[str, int], policy: Preble, arrivals: list[tuple[str, int]]
) -> list[Request]:
    """Requests of 100 prompt tokens, ``cached`` of them cached each, in arrival order."""
    reqs: list[Request] = []
    for rid, hit in arrivals:
        req = unique_request(rid, rid.split("-")[0], INPUT_TOKENS, 1)
        req.arrival_s = float(len(reqs))
        cached[rid] = hit
        policy.on_arrival(req, req.arrival_s)
        reqs.append(req)
    return reqs


def match_from(cached: dict[str, int]) -> Callable[[Request], int]:
    return lambda req: cached[req.id]


def fits_all(req: Request) -> bool:
    return True


@pytest.mark.parametrize(
    ("matched", "group"),
    [(0, 0), (1, 0), (10, 0), (11, 1), (30, 2), (31, 3), (99, 9), (100, 9), (150, 9)],
)
def test_group_is_the_hit_ratio_decile(matched: int, group: int) -> None:
    assert Preble().group_of(matched, INPUT_TOKENS) == group


def test_an_empty_prompt_is_a_miss() -> None:
    assert Preble().group_of(0, 0) == 0


def test_groups_take_turns_from_the_top_each_up_to_its_quota() -> None:
    policy = Preble(group_quota=2)
    cached: dict[str, int] = {}
    hits = [(f"hit-{i}", 100) for i in range(25)]
    waiting = waiting_with(cached, policy, hits + [(f"miss-{i}", 0) for i in range(5)])
    match = match_from(cached)
    first = policy.select(waiting, fits_all, match, 0.0)
    assert [r.id for r in first] == [f"hit-{i}" for i in range(20)]  # group 9: (9 + 1) * 2
    waiting = [r for r in waiting if r not in first]
    second = policy.select(waiting, fits_all, match, 1.0)
    assert [r.id for r in second] == ["miss-0", "miss-1"]  # group 0's turn: 1 * 2
    waiting = [r for r in waiting if r not in second]
    third = policy.select(waiting, fits_all, match, 2.0)
    assert [r.id for r in third] == [f"hit-{i}" for i in range(20, 25)]


def test_a_turn_that_admits_nothing_hands_over_in_the_same_decision() -> None:
    policy = Preble()
    cached: dict[str, int] = {}
    waiting = waiting_with(cached, policy, [("big-0", 100), ("small-0", 0)])

    def fits(req: Request) -> bool:
        return req.id != "big-0"

    admitted = policy.select(waiting, fits, match_from(cached), 0.0)
    assert [r.id for r in admitted] == ["small-0"]


def test_group_is_kept_while_waiting_and_redone_after_a_retraction() -> None:
    policy = Preble()
    cached: dict[str, int] = {}
    waiting = waiting_with(cached, policy, [("late-0", 0), ("hit-0", 100)])
    match = match_from(cached)
    none_fit = policy.select(waiting, lambda r: False, match, 0.0)
    assert none_fit == []  # group 9's step: the cycle moves on to group 8 and below
    cached["late-0"] = 100  # its document got cached meanwhile: Preble keeps it in group 0
    admitted = policy.select(waiting, fits_all, match, 1.0)
    assert [r.id for r in admitted] == ["late-0"]  # group 0's turn, alone (regrouped to 9,
    # it would have shared group 9's turn with hit-0)
    late, hit = waiting
    assert policy.select([hit], fits_all, match, 2.0) == [hit]
    policy.on_retract(late, 3.0)  # back in the queue: regrouped by its hit ratio now
    assert policy.snapshot()["grouped_waiting"] == 0
    assert policy.select([late], fits_all, match, 4.0) == [late]


def test_every_waiting_request_is_offered_before_a_decision_admits_nothing() -> None:
    policy = Preble()
    cached: dict[str, int] = {}
    waiting = waiting_with(cached, policy, [(f"c{g}-0", g * 10 + 5) for g in range(10)])
    offered: list[str] = []

    def refuse(req: Request) -> bool:
        offered.append(req.id)
        return False

    assert policy.select(waiting, refuse, match_from(cached), 0.0) == []
    assert sorted(offered) == sorted(r.id for r in waiting)


def test_exhausted_ends_the_decision() -> None:
    policy = Preble()
    cached: dict[str, int] = {}
    waiting = waiting_with(cached, policy, [("a-0", 100), ("b-0", 100), ("c-0", 0)])
    decision = policy.decide(waiting, match_from(cached), 0.0)
    assert next(decision).id == "a-0"
    with pytest.raises(StopIteration) as end:
        decision.send(EXHAUSTED)
    assert end.value.value == []


def test_parameters_are_declared_with_preble_defaults() -> None:
    policy = make_local_policy("preble")
    assert isinstance(policy, Preble)
    assert policy.config.priority_groups == 10 and policy.config.group_quota == 10
    assert policy.config.fill_other_groups is False


# ------------------------------------------------------------------ no starvation

arrival_batches = st.lists(
    st.tuples(
        st.lists(st.integers(0, INPUT_TOKENS), max_size=6),  # cached tokens of new arrivals
        st.integers(1, 4),  # the engine's room this decision (requests)
    ),
    min_size=1,
    max_size=40,
)


@pytest.mark.parametrize("fill", [False, True])
@given(batches=arrival_batches, groups=st.integers(1, 10), quota=st.integers(1, 3))
def test_no_request_waits_more_than_its_bound_while_requests_fit(
    fill: bool, batches: list[tuple[list[int], int]], groups: int, quota: int
) -> None:
    """A request with n requests ahead of it in its group (arrived earlier, same group) when
    it is first seen is admitted within P·(n + 1) decisions, whatever else arrives, as long
    as every decision has room for at least one request; and a decision never ends with
    room left while a request was never offered (work conservation)."""
    policy = Preble(priority_groups=groups, group_quota=quota, fill_other_groups=fill)
    cached: dict[str, int] = {}
    match = match_from(cached)
    waiting: list[Request] = []
    bound: dict[str, int] = {}
    seen: dict[str, int] = {}
    schedule = batches + [([], 1)] * (6 * 40)  # then drain, one request per step
    for step, (hits, room) in enumerate(schedule):
        for hit in hits:
            rid = f"r{len(cached)}-{hit}"
            req = unique_request(rid, "c", INPUT_TOKENS, 1)
            req.arrival_s = float(step)
            cached[rid] = hit
            policy.on_arrival(req, req.arrival_s)
            waiting.append(req)
        for req in waiting:
            if req.id not in seen:
                group = policy.group_of(cached[req.id], INPUT_TOKENS)
                ahead = [
                    r
                    for r in waiting
                    if r.id in seen and policy.group_of(cached[r.id], INPUT_TOKENS) == group
                ]
                seen[req.id] = step
                bound[req.id] = step + groups * (len(ahead) + 1)
        left = [room]
        offered: set[str] = set()

        def fits(req: Request, left: list[int] = left, offered: set[str] = offered) -> bool:
            offered.add(req.id)
            if left[0] <= 0:
                return False
            left[0] -= 1
            return True

        admitted = policy.select(waiting, fits, match, float(step))
        assert admitted or not waiting, "a decision with room admitted nothing"
        if fill and left[0] > 0:
            assert offered == {r.id for r in waiting}
        for req in admitted:
            assert step < bound[req.id], (req.id, seen[req.id], step, bound[req.id])
        waiting = [r for r in waiting if r not in admitted]
        for req in waiting:
            assert step + 1 < bound[req.id], (req.id, seen[req.id], bound[req.id])
        if not waiting and step >= len(batches):
            break
    assert not waiting
