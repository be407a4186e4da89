"""Radix tree insert and match rates on realistic prompts (a tree of about 10^6 tokens).

5,000 prompts of ~2,300 tokens (shared 2k-token documents + private 50-200-token tails)
build a tree of ~1.0 M distinct tokens; 5,000 fresh prompts are then matched against it.
Rates count every prompt token walked (a matched prefix costs memcmp work too).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from functools import partial

from fairserve.core.radix import RadixTree
from fairserve.core.types import TOKEN_BYTES
from tests.perf.timing import Result, print_table, summarize
from tests.perf.workload import PromptSource

PROMPTS = 5_000
REPEATS = 5
WORKERS = 8


def _pass_s(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _per_op_ns(fn: Callable[[bytes], object], keys: list[bytes]) -> list[int]:
    clock = time.perf_counter_ns
    samples = []
    for key in keys:
        start = clock()
        fn(key)
        samples.append(clock() - start)
    return samples


def _build(prompts: list[bytes], owned: bool) -> RadixTree:
    tree = RadixTree()
    if owned:
        for i, key in enumerate(prompts):
            tree.insert(key, f"w{i % WORKERS}")
    else:
        for key in prompts:
            tree.insert(key)
    return tree


def _rates(name: str, case: str, seconds: list[float], ops: int, tokens: int) -> list[Result]:
    """Rates from whole passes: the median pass, and the fastest pass as ``best``."""
    median, fastest = statistics.median(seconds), min(seconds)
    return [
        Result(name, f"{case} ops/s", ops / median, ops / fastest, None, "ops/s"),
        Result(name, f"{case} tokens/s", tokens / median, tokens / fastest, None, "tokens/s"),
    ]


def run() -> list[Result]:
    """Insert and match figures; medians over ``REPEATS`` full passes."""
    source = PromptSource(seed=1)
    prompts = [source.prompt() for _ in range(PROMPTS)]
    queries = [source.prompt() for _ in range(PROMPTS)]
    tokens = sum(len(k) for k in prompts) // TOKEN_BYTES
    query_tokens = sum(len(k) for k in queries) // TOKEN_BYTES
    results: list[Result] = []
    for owned in (False, True):
        case = "insert (owners w0-w7)" if owned else "insert"
        seconds = [_pass_s(partial(_build, prompts, owned)) for _ in range(REPEATS)]
        results += _rates("radix", case, seconds, PROMPTS, tokens)
        tree = _build(prompts, owned)
        ops: dict[str, Callable[[bytes], object]] = (
            {"match_owners": tree.match_owners}
            if owned
            else {"match_len (walk)": tree.match_len_walk, "match_len (kept)": tree.match_len}
        )
        for name, op in ops.items():  # "kept": asked again, as a waiting request at every step
            seconds = [_pass_s(partial(_match_all, op, queries)) for _ in range(REPEATS)]
            results += _rates("radix", name, seconds, PROMPTS, query_tokens)
            median, best, p99 = summarize([ns / 1e3 for ns in _per_op_ns(op, queries)])
            note = f"tree {tree.total_tokens:,} tokens, {tree.node_count():,} nodes"
            results.append(Result("radix", f"{name} per op", median, best, p99, "us", "", note))
    return results


def _match_all(op: Callable[[bytes], object], queries: list[bytes]) -> None:
    for query in queries:
        op(query)


def test_radix_rates() -> None:
    print()
    print_table(run())
