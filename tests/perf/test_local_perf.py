"""Batching-decision cost: ``policy.select`` over 1,000 waiting requests.

DESIGN §8 target: a DLPM decision over 1,000 waiting requests ≤ 1 ms (SGLang's own LPM
falls back to FCFS above 128 waiting requests because its matching is too slow).

Setup, not timed: a worker's prefix cache (a radix tree of ~0.5 M tokens built from earlier
prompts on the same shared documents), 1,064 requests of 20 clients on their favourite
documents, a fresh policy that saw them arrive, and two earlier decisions of 32
admissions each (so deficits and counters differ between clients). Timed: the third
decision over the 1,000 still waiting, whose ``can_fit`` admits 32 requests and refuses
the rest (a batching step admits a few and skips many). Two ways of answering
``match_len``: a precomputed dict lookup, and the radix ``match_len`` of every waiting
request against the cache (what a host without a match cache pays).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable

from fairserve.core.radix import RadixTree
from fairserve.core.types import Request
from fairserve.sched.local.base import LocalPolicy
from fairserve.sched.registry import make_local_policy
from tests.perf.timing import Result, print_table, summarize
from tests.perf.workload import PromptSource

WAITING = 1_000
BUDGET = 32
WARM_DECISIONS = 2
CLIENTS = 20
CACHE_PROMPTS = 1_500
REPEATS = 21
POLICIES = ("dlpm", "lpm", "vtc", "fcfs")

MatchLen = Callable[[Request], int]


def budget(admits: int) -> Callable[[Request], bool]:
    """``can_fit`` that admits the first ``admits`` requests asked about, then refuses."""
    left = [admits]

    def can_fit(req: Request) -> bool:
        if left[0] <= 0:
            return False
        left[0] -= 1
        return True

    return can_fit


def workload() -> tuple[RadixTree, list[Request]]:
    source = PromptSource(seed=3)
    cache = RadixTree()
    for i in range(CACHE_PROMPTS):
        cache.insert(source.request(i % CLIENTS).prompt_key)
    total = WAITING + WARM_DECISIONS * BUDGET
    requests = [source.request(i % CLIENTS, arrival_s=i * 1e-3) for i in range(total)]
    return cache, requests


def one_decision_ns(name: str, requests: list[Request], match_len: MatchLen) -> int:
    policy: LocalPolicy = make_local_policy(name)
    for req in requests:
        policy.on_arrival(req, req.arrival_s)
    waiting = list(requests)
    for _ in range(WARM_DECISIONS):
        admitted = {id(r) for r in policy.select(waiting, budget(BUDGET), match_len, 1.0)}
        waiting = [r for r in waiting if id(r) not in admitted]
    assert len(waiting) == WAITING
    can_fit = budget(BUDGET)
    gc.collect()
    start = time.perf_counter_ns()
    admitted_now = policy.select(waiting, can_fit, match_len, 2.0)
    elapsed = time.perf_counter_ns() - start
    assert len(admitted_now) == BUDGET
    return elapsed


def run() -> list[Result]:
    cache, requests = workload()
    lens = {req: cache.match_len(req.prompt_key) for req in requests}
    hit = sum(lens.values()) / sum(r.input_tokens for r in requests)
    variants: dict[str, MatchLen] = {
        "dict lookup": lens.__getitem__,
        "radix match_len": lambda r: cache.match_len(r.prompt_key),
    }
    results = []
    for name in POLICIES:
        for variant, match_len in variants.items():
            ms = [one_decision_ns(name, requests, match_len) / 1e6 for _ in range(REPEATS)]
            target = "<= 1 ms" if name == "dlpm" else ""
            note = f"cache {cache.total_tokens:,} tokens, {hit:.0%} of prompt tokens cached"
            median, best, p99 = summarize(ms)
            case = f"{name} / {variant}"
            results.append(Result("select 1000", case, median, best, p99, "ms", target, note))
    return results


def test_decision_cost() -> None:
    print()
    print_table(run())
