"""The plugin's host presents its waiting requests the way DLPM's kept LPM order predicts
them, so a decision re-keys only what changed (issue 23).

DLPM keeps its LPM order across decisions (:mod:`fairserve.sched.local.lpm_index`) by
predicting the host's waiting list from the events it gets: an arrival joins at the back, a
retracted request at the front, an admission or an abort leaves. A list the events do not
describe is sorted again whole, which at 10,000 waiting requests cost more than the rest of
the decision. Here the host is driven inside a loop shaped like SGLang's (the hooks on the
fake scheduler): a retraction must not bring the full sort back, and the admissions, the
offers and the policy's state must be exactly those of a policy that sorts the whole queue
at every decision, through random arrivals, decisions, decode steps, finishes,
retractions and aborts (a derandomised Hypothesis comparison).
"""

from __future__ import annotations

from random import Random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairserve.sched.local.dlpm import DLPM
from fairserve.sglang import hooks
from fairserve.sglang.host import PolicyHost
from tests.fakes.sglang import FakeScheduler, Req, apply_hooks_locally
from tests.sglang.conftest import MakeHost, make_host

QUANTUM = 40.0
KV_TOKENS = 600


def dlpm_of(host: PolicyHost) -> DLPM:
    policy = host.policy
    assert isinstance(policy, DLPM)
    return policy


def prompt(client: str, n: int, shared: int, own: int) -> list[int]:
    """``shared`` tokens common to the client's prompts, then ``own`` unique ones."""
    return [ord(client) * 1000 + i for i in range(shared)] + [
        10**6 + n * 100 + i for i in range(own)
    ]


def retract(sched: FakeScheduler, rid: str) -> None:
    """SGLang's ``retract_decode``: a running request goes back to the waiting queue."""
    req = next(r for r in sched.running if r.rid == rid)
    sched.running.remove(req)
    sched._add_request_to_queue(req, is_retracted=True)


def test_a_retraction_does_not_sort_the_queue_again(install: MakeHost) -> None:
    """Once the clients' shared prefixes are in the cache, each step's admissions, finishes,
    arrival and retraction are re-keyed one by one: the kept order is not sorted again."""
    host = install("dlpm", QUANTUM)
    policy = dlpm_of(host)
    policy.index_min_waiting = 2
    sched = FakeScheduler(kv_tokens=KV_TOKENS)
    targets = {}

    def arrive(n: int) -> None:
        client = "abc"[n % 3]
        sched.add_request(Req(f"r{n}", prompt(client, n, 20, 10), 30, client))
        targets[f"r{n}"] = 30

    for n in range(300):
        arrive(n)
    for _ in range(2):  # the first sorts everything; the second sees every match move
        sched.prefill()
        sched.forward(targets)
    rebuilds = policy.lpm_index.rebuilds
    for step in range(8):
        retract(sched, sched.running[-1].rid)
        arrive(1000 + step)
        sched.prefill()
        sched.forward(targets)
    assert host.counters.retracted == 8
    assert policy.lpm_index.rebuilds == rebuilds


def test_the_match_feed_asks_only_about_what_moved(install: MakeHost) -> None:
    """The host's ``match_len`` says which matches moved (``moved()``): the policy re-keys
    only those, the arrivals and the retracted requests."""
    host = install("dlpm", QUANTUM)
    policy = dlpm_of(host)
    sched = FakeScheduler(kv_tokens=KV_TOKENS)
    targets = {}
    for n in range(40):
        client = "ab"[n % 2]
        sched.add_request(Req(f"r{n}", prompt(client, n, 0, 20), 2, client))
        targets[f"r{n}"] = 2
    sched.prefill(budget_tokens=0)  # nothing admitted, nothing in the cache moves
    rekeyed = policy.lpm_index.rekeyed
    rebuilds = policy.lpm_index.rebuilds
    sched.add_request(Req("late", prompt("a", 99, 0, 20), 2, "a"))
    sched.prefill(budget_tokens=0)
    assert policy.lpm_index.rebuilds == rebuilds
    assert policy.lpm_index.rekeyed - rekeyed == 1  # only the arrival


# ---------------------------------------------------------------- same as the full sort
OPS = ("arrive", "decide", "forward", "retract", "abort_waiting", "abort_running")
OPS_WEIGHTS = (6, 5, 5, 2, 1, 1)


class Side:
    """One host (its policy sorting everything, or keeping its order) with its scheduler."""

    def __init__(self, incremental: bool, fill_patience: int, work_conserving: bool) -> None:
        self.host = make_host(
            "dlpm", QUANTUM, fill_patience=fill_patience, work_conserving=work_conserving
        )
        policy = dlpm_of(self.host)
        policy.incremental = incremental
        policy.index_min_waiting = 2  # the kept order for every queue
        self.sched = FakeScheduler(kv_tokens=KV_TOKENS)

    def __enter__(self) -> FakeScheduler:
        hooks.install_host(self.host)
        return self.sched

    def __exit__(self, *exc: object) -> None:
        hooks.install_host(None)


def run_ops(rnd: Random, steps: int, sides: tuple[Side, Side]) -> None:
    """The same random SGLang events on both sides; every loop's offers and admissions,
    and the policies' state after every event, must be equal."""
    targets: dict[str, int] = {}
    made = 0
    for _ in range(steps):
        op = rnd.choices(OPS, OPS_WEIGHTS)[0]
        sched = sides[0].sched
        if op == "arrive":
            jobs = []
            for _ in range(rnd.randint(1, 10)):
                client = rnd.choice("abcd")
                rid = f"r{made}"
                shared = rnd.choice((0, 8, 16))
                targets[rid] = rnd.randint(1, 6)
                max_new = targets[rid] + rnd.randint(0, 3)
                jobs.append(
                    (rid, prompt(client, made, shared, rnd.randint(1, 40)), max_new, client)
                )
                made += 1
            for side in sides:
                with side as s:
                    for rid, tokens, max_new, client in jobs:
                        s.add_request(Req(rid, tokens, max_new, client))
        elif op == "decide":
            budget = rnd.choice((None, None, 0, rnd.randint(1, 200)))
            got = []
            for side in sides:
                with side as s:
                    record = s.prefill(budget)
                    got.append((record.offered, record.admitted))
            assert got[0] == got[1]
        elif op == "forward":
            for side in sides:
                with side as s:
                    s.forward(targets)
        elif op == "retract" and sched.running:
            rid = rnd.choice(sched.running).rid
            for side in sides:
                with side as s:
                    retract(s, rid)
        elif op == "abort_waiting" and sched.waiting_queue:
            rid = rnd.choice(sched.waiting_queue).rid
            for side in sides:
                with side as s:
                    s.abort_waiting(rid)
        elif op == "abort_running" and sched.running:
            rid = rnd.choice(sched.running).rid
            for side in sides:
                with side as s:
                    s.abort_running(rid)
                    s.forward(targets)
        assert sides[0].host.policy.snapshot() == sides[1].host.policy.snapshot()
        assert [r.rid for r in sides[0].sched.waiting_queue] == [
            r.rid for r in sides[1].sched.waiting_queue
        ]


@settings(max_examples=60)
@given(
    rnd=st.randoms(use_true_random=False),
    steps=st.integers(1, 120),
    fill_patience=st.integers(0, 3),
    work_conserving=st.booleans(),
)
def test_admissions_equal_the_full_sort(
    rnd: Random, steps: int, fill_patience: int, work_conserving: bool
) -> None:
    with pytest.MonkeyPatch.context() as patch:
        apply_hooks_locally(patch.setattr)
        reference = Side(False, fill_patience, work_conserving)
        fast = Side(True, fill_patience, work_conserving)
        try:
            run_ops(rnd, steps, (reference, fast))
        finally:
            hooks.install_host(None)
