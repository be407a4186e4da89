"""Dispatch cost: microseconds per ``dispatch()`` with 8 workers and a ~10^6-token tree.

DESIGN §8 target: DoubleQ ≤ 20 µs median. ``dispatch`` = ``choose`` + ``on_dispatch``,
including the global tree match and insert. 16 clients send prompts on their favourite
shared documents; a window of 64 requests is in flight and the oldest finishes before each
new dispatch (``on_finish`` is not timed), so counters and loads move as in production.
The tree is first filled to ≥ 10^6 tokens with untimed dispatches.
"""

from __future__ import annotations

import gc
import time
from collections import deque
from dataclasses import replace
from typing import Any

from fairserve.core.types import Request
from fairserve.sched.dispatch.base import Dispatcher
from fairserve.sched.registry import make_dispatcher
from tests.perf.timing import Result, print_table, summarize
from tests.perf.workload import PromptSource

WORKERS = [f"w{i}" for i in range(8)]
CLIENTS = 16
IN_FLIGHT = 64
FILL_TREE_TOKENS = 1_000_000
MEASURED = 5_000


def _requests(source: PromptSource, count: int, start: int) -> list[Request]:
    return [source.request((start + i) % CLIENTS, arrival_s=float(start + i)) for i in range(count)]


def _step(dispatcher: Dispatcher, flight: deque[tuple[Request, str]], req: Request) -> int:
    """Retire the oldest in-flight request if the window is full, then time one dispatch."""
    if len(flight) >= IN_FLIGHT:
        done, worker = flight.popleft()
        dispatcher.on_finish(done, worker, done.expected_output_tokens)
    start = time.perf_counter_ns()
    worker = dispatcher.dispatch(req)
    elapsed = time.perf_counter_ns() - start
    flight.append((req, worker))
    return elapsed


def _tree_tokens(dispatcher: Dispatcher) -> int:
    prefixes = getattr(dispatcher, "prefixes", None)
    return int(prefixes.total_tokens) if prefixes is not None else 0


def bench(
    case: str, name: str, params: dict[str, Any], fill: list[Request], measured: list[Request]
) -> Result:
    dispatcher = make_dispatcher(name, WORKERS, **params)
    flight: deque[tuple[Request, str]] = deque()
    for req in fill:
        _step(dispatcher, flight, req)
    start_tokens = _tree_tokens(dispatcher)
    gc.collect()
    samples = [_step(dispatcher, flight, req) / 1e3 for req in measured]
    median, best, p99 = summarize(samples)
    end_tokens = _tree_tokens(dispatcher)
    note = f"tree {start_tokens:,} -> {end_tokens:,} tokens" if end_tokens else "no tree"
    target = "<= 20 us median" if name == "doubleq" else ""
    return Result("dispatch", case, median, best, p99, "us", target, note)


CASES: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("doubleq", "doubleq", {}),
    ("doubleq, tree bound 250k/worker", "doubleq", {"max_tree_tokens_per_worker": 250_000}),
    ("cache-aware", "cache-aware", {}),
    ("round-robin", "round-robin", {}),
)


def run() -> list[Result]:
    source = PromptSource(seed=2)
    # ~2,300-token prompts on ~120 favourite documents: 6,400 fill >= 10^6 distinct tokens.
    fill = _requests(source, 6_400, 0)
    measured = _requests(source, MEASURED, len(fill))
    results = [bench(case, name, params, fill, measured) for case, name, params in CASES]
    base = results[-1].median
    return [replace(r, note=f"{r.note}; x{r.median / base:.1f} round-robin") for r in results]


def test_dispatch_cost() -> None:
    print()
    print_table(run())
