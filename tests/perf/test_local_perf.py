"""Batching-decision cost: ``policy.select`` over 1,000 and 10,000 waiting requests.

DESIGN §8 and issue 23 targets: a DLPM decision over 1,000 waiting requests, matching
included, ≤ 1 ms; over 10,000 ≤ 10 ms (SGLang's own LPM falls back to FCFS above 128
waiting requests because its matching is too slow).

Setup, not timed: a worker's prefix cache (a radix tree of ~0.5 M tokens built from earlier
prompts on the same shared documents), requests of 20 clients on their favourite
documents, a fresh policy that saw them arrive, and two earlier decisions of 32 admissions
each (so deficits and counters differ between clients). Every timed decision's ``can_fit``
admits 32 requests and refuses the rest (a batching step admits a few and skips many).

Two ways of timing it:

* **one decision** over 1,000 waiting, ``match_len`` answered by a precomputed dict
  (the decision alone), by walking the radix tree for every waiting request (what every
  batching step cost before matches were kept), or by the tree's ``match_len`` with its
  kept matches;
* **steady state**, matching included, at 1,000 and 10,000 waiting: the queue stays that
  long, and between decisions the host does what a worker does (untimed): it inserts the
  admitted prompts into the cache tree, evicting LRU past the cache's bound, and new
  requests arrive. Each decision then asks the tree's ``match_len`` for every waiting
  request: kept matches answer at once, and only the new arrivals and the requests whose
  match an insert or eviction moved are walked again.

* **steady state with a moved-match feed** (DLPM, as the simulator's and the SGLang
  plugin's hosts feed it): the host's ``match_len`` also says which waiting requests' kept
  match was revoked since it last answered (the tree's own list,
  ``RadixTree.drain_revoked``, as ``sim/match_feed.py`` reads it), so the decision asks
  only about those and the new arrivals (``sched.local.lpm_index.MovedMatches``).

Times are the CPU time of the deciding thread (``time.thread_time_ns``): on a shared
2-core machine wall time mostly measures the other processes.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable

from fairserve.core.radix import RadixTree
from fairserve.core.radix_node import Ticket
from fairserve.core.types import Request
from fairserve.sched.local.base import EXHAUSTED, FIT, Answer, LocalPolicy, answer_all
from fairserve.sched.registry import make_local_policy
from tests.perf.timing import Result, print_table, summarize
from tests.perf.workload import PromptSource

WAITING = 1_000
BUDGET = 32
WARM_DECISIONS = 2
CLIENTS = 20
CACHE_PROMPTS = 1_500
CACHE_BOUND_TOKENS = 600_000
REPEATS = 21
POLICIES = ("dlpm", "lpm", "vtc", "fcfs")
STEADY = ((1_000, 40), (10_000, 12))
"""(waiting requests, timed decisions) of the steady-state cases."""

MatchLen = Callable[[Request], int]


class MatchFeed:
    """``match_len`` from the tree's kept matches that also says which requests' match may
    have moved: those whose last answer came from a ticket the tree revoked since
    (``RadixTree.drain_revoked``, as the simulator's ``sim/match_feed.py`` reads it)."""

    def __init__(self, cache: RadixTree) -> None:
        self.cache = cache
        self.holders: dict[Ticket, list[Request]] = {}
        cache.track_revoked()
        cache.drain_revoked()

    def __call__(self, req: Request) -> int:
        tokens = self.cache.match_len(req.prompt_key)
        ticket = self.cache.kept_matches.get(req.prompt_key)
        if ticket is not None:
            self.holders.setdefault(ticket, []).append(req)
        return tokens

    def moved(self) -> list[Request] | None:
        revoked = self.cache.drain_revoked()
        if revoked is None:  # too many to list: any match may have moved
            self.holders.clear()
            return None
        holders = self.holders
        return [req for ticket in revoked for req in holders.pop(ticket, ())]


def budget(admits: int) -> Callable[[Request], Answer]:
    """A host's answers: the first ``admits`` requests asked about fit, then ``EXHAUSTED``
    (its budget is spent), as every host says it (the simulator's batch formation, the
    router's fair queue once its worker is full, the SGLang plugin). A host that could only
    answer "no" would be asked about every waiting request: about 0.5 ms more per decision
    over 1,000 waiting on this machine, before the fair queue learnt to say so."""
    left = [admits]

    def answer(req: Request) -> Answer:
        if left[0] <= 0:
            return EXHAUSTED
        left[0] -= 1
        return FIT

    return answer


def cache_tree(source: PromptSource) -> RadixTree:
    cache = RadixTree()
    for i in range(CACHE_PROMPTS):
        cache.insert(source.request(i % CLIENTS).prompt_key)
    return cache


def workload() -> tuple[RadixTree, list[Request]]:
    source = PromptSource(seed=3)
    cache = cache_tree(source)
    total = WAITING + WARM_DECISIONS * BUDGET
    requests = [source.request(i % CLIENTS, arrival_s=i * 1e-3) for i in range(total)]
    return cache, requests


def one_decision_ns(name: str, requests: list[Request], match_len: MatchLen) -> int:
    policy: LocalPolicy = make_local_policy(name)
    for req in requests:
        policy.on_arrival(req, req.arrival_s)
    waiting = list(requests)
    for _ in range(WARM_DECISIONS):
        decision = policy.decide(waiting, match_len, 1.0)
        admitted = {id(r) for r in answer_all(decision, budget(BUDGET))}
        waiting = [r for r in waiting if id(r) not in admitted]
    assert len(waiting) == WAITING
    answers = budget(BUDGET)
    gc.collect()
    start = time.thread_time_ns()
    admitted_now = answer_all(policy.decide(waiting, match_len, 2.0), answers)
    elapsed = time.thread_time_ns() - start
    assert len(admitted_now) == BUDGET
    return elapsed


def steady_decisions_ms(
    name: str, waiting_count: int, decisions: int, feed: bool = False
) -> tuple[list[float], str]:
    """CPU ms of ``decisions`` consecutive decisions over a queue kept ``waiting_count``
    long, matching included (see the module docstring); and a note on what was walked.
    ``feed``: the host's ``match_len`` says which matches moved (:class:`MatchFeed`)."""
    source = PromptSource(seed=5)
    cache = cache_tree(source)
    steps = WARM_DECISIONS + decisions
    stream = iter(
        source.request(i % CLIENTS, arrival_s=i * 1e-3)
        for i in range(waiting_count + steps * BUDGET)
    )
    policy: LocalPolicy = make_local_policy(name)
    waiting: list[Request] = []

    def arrive(count: int) -> None:
        for _ in range(count):
            req = next(stream)
            policy.on_arrival(req, req.arrival_s)
            waiting.append(req)

    def read_match(req: Request) -> int:
        return cache.match_len(req.prompt_key)

    match_len: MatchLen = MatchFeed(cache) if feed else read_match
    arrive(waiting_count)
    samples: list[float] = []
    walked = 0
    for step in range(steps):
        kept_before = sum(1 for r in waiting if cache._trie.matches.get(r.prompt_key) is not None)
        gc.collect()
        start = time.thread_time_ns()
        admitted = answer_all(policy.decide(waiting, match_len, float(step)), budget(BUDGET))
        elapsed = time.thread_time_ns() - start
        assert len(admitted) == BUDGET
        if step >= WARM_DECISIONS:
            samples.append(elapsed / 1e6)
            walked += len(waiting) - kept_before
        gone = {id(r) for r in admitted}
        waiting[:] = [r for r in waiting if id(r) not in gone]
        for req in admitted:  # the host caches the admitted prompts, bounded LRU
            cache.insert(req.prompt_key)
        if cache.total_tokens > CACHE_BOUND_TOKENS:
            cache.evict(cache.total_tokens - CACHE_BOUND_TOKENS)
        arrive(BUDGET)
    note = f"walked {walked / decisions:.0f} of {waiting_count:,} per decision"
    return samples, note


def run() -> list[Result]:
    cache, requests = workload()
    lens = {req: cache.match_len_walk(req.prompt_key) for req in requests}
    hit = sum(lens.values()) / sum(r.input_tokens for r in requests)
    note = f"cache {cache.total_tokens:,} tokens, {hit:.0%} of prompt tokens cached"
    variants: dict[str, MatchLen] = {
        "dict lookup": lens.__getitem__,
        "radix walk per request": lambda r: cache.match_len_walk(r.prompt_key),
        "radix match_len (kept)": lambda r: cache.match_len(r.prompt_key),
    }
    results = []
    for name in POLICIES:
        for variant, match_len in variants.items():
            ms = [one_decision_ns(name, requests, match_len) / 1e6 for _ in range(REPEATS)]
            target = "<= 1 ms" if name == "dlpm" and variant != "dict lookup" else ""
            median, best, p99 = summarize(ms)
            case = f"{name} / {variant}"
            results.append(Result("select 1000", case, median, best, p99, "ms", target, note))
    for waiting_count, decisions in STEADY:
        for name, feed in (("dlpm", False), ("dlpm", True), ("lpm", False)):
            ms, steady_note = steady_decisions_ms(name, waiting_count, decisions, feed)
            target = ""
            if name == "dlpm":
                target = "<= 1 ms" if waiting_count <= 1_000 else "<= 10 ms"
            median, best, p99 = summarize(ms)
            how = "moved-match feed" if feed else "matching included"
            results.append(
                Result(
                    f"select {waiting_count}",
                    f"{name} / steady state, {how}",
                    median,
                    best,
                    p99,
                    "ms",
                    target,
                    steady_note,
                )
            )
    return results


def test_decision_cost() -> None:
    print()
    print_table(run())
