"""The hooks inside a loop shaped like SGLang's: skip-and-continue, work conservation, and
the same decisions and counters as the core policy fed the same events directly."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from fairserve.core.types import Request, tokens_to_key
from fairserve.sglang.config import PluginConfig, build_policy
from tests.fakes.sglang import AddReqResult, Budget, FakeCache, FakeScheduler, Req
from tests.sglang.conftest import MakeHost

CONTINUE, NO_TOKEN, OTHER = AddReqResult.CONTINUE, AddReqResult.NO_TOKEN, AddReqResult.OTHER


def tokens(prefix: int, length: int, salt: int) -> list[int]:
    """``prefix`` tokens shared by everyone with the same salt, then unique ones."""
    return [salt * 1000 + i for i in range(prefix)] + [
        10**6 + salt * 10**4 + i for i in range(length - prefix)
    ]


def deficit(host_state: dict[str, object], client: str) -> float:
    clients = host_state["clients"]
    assert isinstance(clients, dict)
    value = clients[client]["deficit"]
    assert isinstance(value, float)
    return value


def test_a_client_without_credit_is_skipped_and_the_loop_goes_on(install: MakeHost) -> None:
    host = install("dlpm", quantum=50, work_conserving=False)
    sched = FakeScheduler(kv_tokens=1000)
    sched.add_request(Req("a0", tokens(0, 200, 1), 5, "a"))
    sched.add_request(Req("b0", tokens(0, 20, 2), 5, "b"))
    first = sched.prefill(budget_tokens=300)  # a0 takes a's quantum and more; b0 fits too
    assert first.admitted == ["a0", "b0"]
    assert deficit(host.state_json()["policy"], "a") < 0 < deficit(host.state_json()["policy"], "b")

    for rid, client, length in (("a1", "a", 10), ("a2", "a", 10), ("b1", "b", 10),
                                ("b2", "b", 10), ("b3", "b", 200)):  # fmt: skip
        sched.add_request(Req(rid, tokens(0, length, 3), 2, client))
    record = sched.prefill(budget_tokens=100)
    # a's requests come first in SGLang's queue, but a has no credit while b, which has,
    # still waits (b3 does not fit): the loop is offered b's requests, goes on past each
    # (b3 too: too large for what is left), and is told to stop when the policy is done.
    assert record.admitted == ["b1", "b2"]
    assert record.offered == [("b1", CONTINUE), ("b2", CONTINUE), ("b3", CONTINUE),
                              ("a1", OTHER)]  # fmt: skip
    assert sorted(r.rid for r in sched.waiting_queue) == ["a1", "a2", "b3"]


def test_the_fill_admits_what_still_fits_after_the_credit_passes(install: MakeHost) -> None:
    install("dlpm", quantum=50)  # work-conserving (the default)
    sched = FakeScheduler(kv_tokens=1000)
    sched.add_request(Req("a0", tokens(0, 200, 1), 5, "a"))
    sched.add_request(Req("b0", tokens(0, 20, 2), 5, "b"))
    sched.prefill(budget_tokens=300)
    for rid, client in (("a1", "a"), ("b1", "b")):
        sched.add_request(Req(rid, tokens(0, 10, 3), 2, client))
    record = sched.prefill()
    assert record.admitted == ["b1", "a1"]  # b (credit) first, then a in the fill


def test_too_large_for_what_is_left_is_skipped_not_a_stop(install: MakeHost) -> None:
    install("vtc")
    sched = FakeScheduler(kv_tokens=120)
    sched.add_request(Req("big", tokens(0, 200, 1), 5, "a"))
    sched.add_request(Req("small", tokens(0, 30, 2), 5, "b"))
    record = sched.prefill()
    assert record.offered == [("big", CONTINUE), ("small", CONTINUE)]
    assert record.admitted == ["small"]
    assert [r.rid for r in sched.waiting_queue] == ["big"]


def test_a_spent_budget_stops_the_loop(install: MakeHost) -> None:
    install("vtc")
    sched = FakeScheduler(kv_tokens=40)
    for i in range(3):
        sched.add_request(Req(f"r{i}", tokens(0, 35, i), 5, f"c{i}"))
    record = sched.prefill()
    assert record.offered == [("r0", NO_TOKEN)]
    assert record.admitted == ["r0"]


def test_a_request_the_loop_passes_over_waits_for_the_next_decision(install: MakeHost) -> None:
    passed = {"lora"}
    install("vtc")
    sched = FakeScheduler(kv_tokens=500, passes_over=lambda r: r.rid in passed)
    sched.add_request(Req("lora", tokens(0, 20, 1), 5, "a"))
    sched.add_request(Req("plain", tokens(0, 20, 2), 5, "b"))
    assert sched.prefill().admitted == ["plain"]
    passed.clear()
    assert sched.prefill().admitted == ["lora"]


def test_unknown_requests_arrive_at_the_decision_and_aborts_are_settled(
    install: MakeHost,
) -> None:
    host = install("vtc")
    sched = FakeScheduler(kv_tokens=500)
    sched.waiting_queue.append(Req("unhooked", tokens(0, 10, 1), 3, "a"))  # no arrival hook
    sched.add_request(Req("gone", tokens(0, 10, 2), 3, "b"))
    sched.abort_waiting("gone")
    assert sched.prefill().admitted == ["unhooked"]
    state = host.state_json()
    assert state["engine"]["aborted"] == 1 and state["engine"]["admitted"] == 1
    sched.abort_running("unhooked")
    sched.forward({"unhooked": 99})
    state = host.state_json()
    assert state["engine"]["aborted"] == 2 and state["running"] == 0 and state["waiting"] == 0


# ---------------------------------------------------------------- same events, same counters
@dataclass(frozen=True)
class Job:
    rid: str
    client: str
    tokens: tuple[int, ...]
    max_new: int
    output: int
    step: int
    host_hit: int


def workload(seed: int, steps: int) -> list[Job]:
    """A prefix-heavy misbehaving client ``a``, two well-behaved ones, some host-cache hits
    (the real prefix at admission is longer than the match the policy was told)."""
    rng = random.Random(seed)
    jobs: list[Job] = []
    plan = {"a": (0, 4, 120), "b": (0, 1, 40), "c": (0, 1, 0)}
    for step in range(steps):
        for client, (low, high, prefix) in plan.items():
            for _ in range(rng.randint(low, high)):
                n = len(jobs)
                length = prefix + rng.randint(5, 60)
                salt = ord(client)
                toks = tokens(prefix, length, salt)[:prefix] + [
                    2 * 10**6 + n * 100 + i for i in range(length - prefix)
                ]
                max_new = rng.randint(3, 12)
                hit = rng.choice([0, 0, 0, 3])
                jobs.append(
                    Job(f"r{n}", client, tuple(toks), max_new, rng.randint(1, max_new), step, hit)
                )
    return jobs


def match_len(match: dict[int, int]) -> Callable[[Request], int]:
    return lambda r: match[id(r)]


STEPS = 70
ARRIVAL_STEPS = 25
KV_TOKENS = 1200
CASES = [
    ("dlpm", 60.0, {}),
    ("dlpm", 30.0, {"work_conserving": False}),
    ("vtc", None, {}),
    ("lcf", None, {}),
    ("justitia", None, {"kv_capacity_tokens": 4000}),
    ("fcfs", None, {}),
]


def run_hooked(install: MakeHost, case: tuple[str, float | None, dict[str, object]], jobs: list[Job]
               ) -> tuple[list[list[str]], dict[str, object], int]:  # fmt: skip
    """Returns the decisions, the policy's final snapshot and the longest queue left
    behind by a decision (the scenario must be contended to mean anything)."""
    name, quantum, params = case
    host = install(name, quantum, **params)
    sched = FakeScheduler(KV_TOKENS)
    targets = {j.rid: j.output for j in jobs}
    decisions = []
    left = 0
    for step in range(STEPS):
        for job in (j for j in jobs if j.step == step):
            req = Req(job.rid, list(job.tokens), job.max_new, job.client)
            req.host_hit = job.host_hit
            sched.add_request(req)
        decisions.append(sched.prefill().admitted)
        left = max(left, len(sched.waiting_queue))
        sched.forward(targets)
    return decisions, host.policy.snapshot(), left


def run_reference(case: tuple[str, float | None, dict[str, object]], jobs: list[Job]
                  ) -> tuple[list[list[str]], dict[str, object]]:  # fmt: skip
    """The core policy fed the same events directly: arrivals, ``select`` with a ``can_fit``
    answering by the same budget rule, the real extend where it differs from the match,
    one decode charge per token, finishes."""
    name, quantum, params = case
    policy = build_policy(PluginConfig(policy=name, quantum=quantum, params=dict(params)))
    cache = FakeCache()
    by_id = {j.rid: j for j in jobs}
    waiting: list[Request] = []
    running: list[Request] = []
    decisions = []
    for step in range(STEPS):
        now = float(step)
        for job in (j for j in jobs if j.step == step):
            req = Request(job.rid, job.client, tokens_to_key(job.tokens), job.max_new, now)
            policy.on_arrival(req, now)
            waiting.append(req)
        admitted: list[Request] = []
        if waiting:
            match = {id(r): cache.match(by_id[r.id].tokens) for r in waiting}
            budget = Budget(KV_TOKENS - sum(r.input_tokens + r.max_output_tokens for r in running))

            def can_fit(r: Request, budget: Budget = budget, match: dict[int, int] = match) -> bool:
                extend = r.input_tokens - match[id(r)] - by_id[r.id].host_hit
                return budget.take(extend, r.max_output_tokens)

            admitted = policy.select(list(waiting), can_fit, match_len(match), now)
            for r in admitted:
                if by_id[r.id].host_hit:
                    policy.correct_extend(r, r.input_tokens - match[id(r)] - by_id[r.id].host_hit)
                cache.insert(by_id[r.id].tokens)
            waiting = [r for r in waiting if r not in admitted]
            running += admitted
        decisions.append([r.id for r in admitted])
        for r in running:
            r.output_tokens += 1
        if running:
            policy.on_decode_step(running, now + 1)
        for r in [r for r in running if r.output_tokens >= by_id[r.id].output]:
            policy.on_finish(r, now + 1)
        running = [r for r in running if r.output_tokens < by_id[r.id].output]
    return decisions, policy.snapshot()


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_same_decisions_and_counters_as_the_core_policy(
    install: MakeHost, case: tuple[str, float | None, dict[str, object]]
) -> None:
    jobs = workload(seed=7, steps=ARRIVAL_STEPS)
    hooked, hooked_state, left = run_hooked(install, case, jobs)
    reference, reference_state = run_reference(case, jobs)
    assert sum(map(len, hooked)) == len(jobs)  # everyone was served in the end
    assert left >= 5  # and requests queued behind others: the order mattered
    assert hooked == reference
    assert hooked_state == reference_state
