"""DLPM's incremental LPM order makes exactly the decisions of the full sort (issue 23).

The decision keeps its LPM order and per-client queued counts across decisions, fed by the
events a host already sends (arrival, admission, retraction, abort) and by the match
lengths it reads; it re-keys only the requests whose match moved. Here a model host (its
waiting queue kept like the simulator's: arrivals at the back, retracted requests at the
front, or at the back for a host that does so) drives two policies step by step through
random arrivals (some at the same instant), decisions (answered by a token budget, some
ending with ``EXHAUSTED``, some abandoned part-way as a pull-style host may), matches that
move, retractions, aborts, finishes and decode steps: one policy sorts the whole queue at
every decision (the reference), the other keeps its order. Every question asked, every
admission and every piece of policy state must be the same.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import pairwise
from random import Random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairserve.core.types import Request
from fairserve.sched.local.base import EXHAUSTED, FIT, NO_FIT, Answer
from fairserve.sched.local.dlpm import DLPM
from fairserve.sched.local.lpm import lpm_sorted
from fairserve.sched.local.lpm_index import LPMIndex
from tests.fakes.factories import prefix_request

QUANTUM = 60.0


@dataclass
class Host:
    """A worker's waiting queue (ordered like the simulator's), its running requests and
    the prefix match each request would get now."""

    queue: dict[Request, None] = field(default_factory=dict)
    running: list[Request] = field(default_factory=list)
    match: dict[str, int] = field(default_factory=dict)
    clock_s: float = 0.0
    made: int = 0
    feed: bool = False
    """Whether ``match_len`` says which matches moved (its ``moved`` attribute)."""
    moved: dict[Request, None] = field(default_factory=dict)
    reads: int = 0

    def __post_init__(self) -> None:
        def match_len(req: Request) -> int:
            self.reads += 1
            return self.match[req.id]

        if self.feed:
            match_len.moved = self.drain_moved  # type: ignore[attr-defined]
        self.match_len = match_len

    def drain_moved(self) -> list[Request]:
        moved, self.moved = list(self.moved), {}
        return moved

    def move(self, req: Request, match: int) -> None:
        self.match[req.id] = match
        self.moved[req] = None


def policies(fill_patience: int, work_conserving: bool) -> tuple[DLPM, DLPM]:
    """(reference, incremental): the reference sorts the whole queue at every decision."""
    reference = DLPM(quantum=QUANTUM, fill_patience=fill_patience, work_conserving=work_conserving)
    reference.incremental = False
    fast = DLPM(quantum=QUANTUM, fill_patience=fill_patience, work_conserving=work_conserving)
    fast.index_min_waiting = 2  # the kept order for every queue (a queue of one: shortcut)
    return reference, fast


def state(policy: DLPM) -> tuple[object, ...]:
    return (
        dict(policy.deficits),
        policy.refills,
        policy.blocked_decisions,
        dict(policy.service),
        {c: n for c, n in policy.waiting.items() if n},
    )


def decide(
    policy: DLPM,
    host: Host,
    budget_tokens: int,
    exhaust_at: int,
    stop_at: int,
    waiting: list[Request] | None = None,
) -> tuple[list[str], list[str]]:
    """One decision answered by a token budget; the ``exhaust_at``-th question is answered
    ``EXHAUSTED`` and after ``stop_at`` questions the host abandons the decision (closes
    it: what was admitted stays admitted). Returns (questions asked, admitted) ids.
    ``waiting``: the list the host passes (default: its queue)."""
    left = [budget_tokens]
    asked: list[str] = []
    admitted: list[str] = []
    queue = list(host.queue) if waiting is None else waiting
    decision = policy.decide(queue, host.match_len, host.clock_s)

    def answer(req: Request) -> Answer:
        asked.append(req.id)
        if len(asked) == exhaust_at:
            return EXHAUSTED
        need = max(1, req.input_tokens - host.match[req.id])
        if need > left[0]:
            return NO_FIT
        left[0] -= need
        admitted.append(req.id)
        return FIT

    try:
        req = next(decision)
        while len(asked) < stop_at:
            req = decision.send(answer(req))
        decision.close()
    except StopIteration as end:
        assert [r.id for r in end.value] == admitted
    return asked, admitted


OPS = ("arrive", "arrive", "arrive", "decide", "decide", "move", "retract", "abort", "finish")
OPS_WEIGHTS = (30, 0, 0, 12, 0, 10, 3, 3, 5)


def run_ops(rnd: Random, steps: int, reference: DLPM, fast: DLPM, feed: bool = False) -> None:
    """``steps`` random host events, the same for both policies; after each the states
    (and at each decision the questions and admissions) must be equal. ``feed``: the host
    says which matches moved."""
    host = Host(feed=feed)
    both = (reference, fast)
    for _ in range(steps):
        op = rnd.choices(OPS, OPS_WEIGHTS)[0]
        if op == "arrive":
            for _ in range(rnd.randint(1, 12)):
                host.clock_s += rnd.choice((0.0, 0.0, 1.0))  # often the same instant
                host.made += 1
                rid = f"r{host.made}"
                size = rnd.randint(1, 90)
                req = prefix_request(rid, rnd.choice("abcd"), "doc", 8, size, 4)
                req.arrival_s = host.clock_s
                host.match[rid] = min(size, rnd.choice((0, 0, 8, 16)))
                for policy in both:
                    policy.on_arrival(req, host.clock_s)
                host.queue[req] = None
        elif op == "decide":
            budget = rnd.choice((0, rnd.randint(1, 120), rnd.randint(100, 600)))
            exhaust_at = rnd.choice((0, 0, rnd.randint(1, 30)))
            stop_at = rnd.choice((10**6, 10**6, rnd.randint(1, 30)))
            got = [decide(p, host, budget, exhaust_at, stop_at) for p in both]
            assert got[0] == got[1]
            gone = set(got[0][1])
            for req in [r for r in host.queue if r.id in gone]:
                del host.queue[req]
                host.running.append(req)
        elif op == "move" and host.queue:
            for req in rnd.sample(list(host.queue), min(len(host.queue), rnd.randint(1, 4))):
                host.move(req, min(req.input_tokens, rnd.choice((0, 8, 16, 24))))
        elif op == "retract" and host.running:
            req = host.running.pop(rnd.randrange(len(host.running)))
            if rnd.random() < 0.7:
                host.queue = {req: None, **host.queue}  # the simulator's push_front
            else:
                host.queue[req] = None  # a host that puts it back at the end
            for policy in both:
                policy.on_retract(req, host.clock_s)
        elif op == "abort" and host.queue:
            req = rnd.choice(list(host.queue))
            del host.queue[req]
            for policy in both:
                policy.on_abort(req, host.clock_s, was_waiting=True)
        elif op == "finish" and host.running:
            if rnd.random() < 0.5:
                decoded = rnd.randint(1, 20)
                for policy in both:
                    policy.on_decode_steps(host.running, decoded, host.clock_s)
            req = host.running.pop(rnd.randrange(len(host.running)))
            for policy in both:
                policy.on_finish(req, host.clock_s)
        assert state(reference) == state(fast)


@settings(max_examples=100)
@given(
    rnd=st.randoms(use_true_random=False),
    steps=st.integers(1, 200),
    fill_patience=st.integers(0, 3),
    work_conserving=st.booleans(),
    feed=st.booleans(),
)
def test_incremental_decisions_equal_the_full_sort(
    rnd: Random, steps: int, fill_patience: int, work_conserving: bool, feed: bool
) -> None:
    reference, fast = policies(fill_patience, work_conserving)
    run_ops(rnd, steps, reference, fast, feed)


@pytest.mark.parametrize("feed", [False, True])
def test_a_steady_queue_is_sorted_once_and_rekeys_only_moved_matches(feed: bool) -> None:
    """Decisions over a queue the events describe re-key only the new arrivals and the
    requests whose match moved; the full sort runs once (the first decision). A host that
    says which matches moved is asked only about those."""
    host = Host(feed=feed)
    fast = DLPM(quantum=QUANTUM)
    fast.index_min_waiting = 2
    for i in range(200):
        host.clock_s = float(i)
        req = prefix_request(
            f"r{i}", "abcd"[i % 4], f"doc{i % 7}", 16, 40, 4, arrival_s=host.clock_s
        )
        host.match[req.id] = 16 * (i % 3 == 0)
        fast.on_arrival(req, host.clock_s)
        host.queue[req] = None
    rekeyed = [fast.lpm_index.rekeyed]
    for step in range(5):
        moved = list(host.queue)[step * 10 : step * 10 + 3]
        for req in moved:
            host.move(req, host.match[req.id] + 1)
        reads = host.reads
        _, admitted = decide(fast, host, 200, 0, 10**6)
        if feed and step:
            assert host.reads - reads == len(moved)
        for req in [r for r in host.queue if r.id in set(admitted)]:
            del host.queue[req]
        rekeyed.append(fast.lpm_index.rekeyed)
    assert fast.lpm_index.rebuilds == 1
    assert all(after - before <= 3 for before, after in pairwise(rekeyed[1:]))


def test_lists_the_events_do_not_describe_are_decided_like_the_full_sort() -> None:
    """A caller may pass any list: a part of the queue, the queue in another order, a
    request twice. The index then sorts that list (or leaves it to the full sort) and the
    decisions stay the reference's."""
    reference, fast = policies(fill_patience=1, work_conserving=True)
    host = Host()
    reqs = []
    for i in range(12):
        req = prefix_request(f"r{i}", "ab"[i % 2], "doc", 8, 10 + i, 4, arrival_s=float(i // 3))
        host.match[req.id] = 8 * (i % 2)
        reqs.append(req)
        for policy in (reference, fast):
            policy.on_arrival(req, 0.0)
    lists = [reqs[:5], reqs[5:][::-1], [reqs[5], reqs[5], reqs[6]], reqs[7:], reqs[7:]]
    for step, waiting in enumerate(lists):
        got = []
        for policy in (reference, fast):
            asked, admitted = decide(policy, host, 25, 0, 10**6, waiting)
            decision = policy.decide(waiting, host.match_len, float(step))
            decision.close()  # a decision never started changes nothing
            got.append((asked, admitted, state(policy)))
        assert got[0] == got[1]
    assert fast.lpm_index.rebuilds == 4  # each list but the one with a request twice


def test_moved_reports_of_a_list_the_events_do_not_describe_are_not_lost() -> None:
    """A host reports a moved match at a decision whose list the index does not describe.
    That decision and the next one, over a described list, must both see the new match,
    although the host, having reported it once, does not report it again (the index
    answered None there before: the caller sorted without it and the kept match stayed
    stale)."""
    index = LPMIndex()
    reqs = [prefix_request(f"r{i}", "a", "doc", 8, 10, 4, arrival_s=float(i)) for i in range(3)]
    match = dict.fromkeys(reqs, 0)
    for req in reqs:
        index.joined(req)
    assert index.order_moved(reqs, match.__getitem__, []) is not None
    match[reqs[2]] = 8
    for waiting, moved in ((reqs[::-1], [reqs[2]]), (reqs, [])):
        kept = index.order_moved(waiting, match.__getitem__, moved)
        assert kept is not None
        order, matched = kept
        assert order == lpm_sorted(waiting, [match[r] for r in waiting], match)
        assert matched[reqs[2]] == 8
