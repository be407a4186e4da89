"""The router's per-client accounting keeps the garbage collector's work small (issue 18).

A full collection walks every object the collector tracks, and every reference each one
holds, while the event loop waits. With 10,000 clients, per-client deques of floats and
one list per second of rate history made it ~120 ms. A client's numeric history now lives
in ``bytearray`` buffers (untracked, and the collector does not look inside them): the
client's :class:`ClientStats` is its only tracked object, and the ledger's history record
(its points and runs packed the same way) is the ledger's only one. The figures read off
it are the same as before (checked here against a plain model of the events).
"""

from __future__ import annotations

import gc
import math
import struct
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from fairserve.core.metrics import percentile
from fairserve.router.accounting import (
    RATE_WINDOW_S,
    RECENT_REQUESTS,
    Accounting,
    ClientStats,
    Totals,
    Usage,
)
from fairserve.router.client_stats import RECENT_SLACK

CLIENTS = 10_000
LEDGER_TRACKED_PER_CLIENT = 1
"""What the ledger (not this module) keeps tracked per client: its history record
(``core/ledger_window.ClientHistory``; its points and runs are packed in bytearrays)."""
ACCOUNTING_TRACKED_PER_CLIENT = 1
"""The client's :class:`ClientStats`, nothing else."""


def _drive(acc: Accounting, name: str, requests: int, start_s: float, step_s: float) -> float:
    """``requests`` requests of ``name``, one every ``step_s``, each streamed and answered;
    returns the time after the last."""
    now_s = start_s
    for k in range(requests):
        acc.arrived(name, 30.0, now_s)
        acc.delivered(name, "w", 10, 1, now_s)
        ttft_s = None if k % 3 == 0 else 0.01 * (k % 7)
        acc.finished(name, "w", 30.0, Usage(10, 2, 5), 0.1 * (k % 11), ttft_s, now_s + 0.05,
                     Usage(10, 0, 1))  # fmt: skip
        now_s += step_s
    return now_s


def _owned_tracked(stats: ClientStats) -> list[object]:
    """The tracked objects reachable from ``stats``, itself excluded, not entering the
    label's totals (shared by the clients of one label)."""
    seen: set[int] = {id(stats)}
    found: list[object] = []
    todo = list(gc.get_referents(stats))
    while todo:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, (Totals, type)):
            continue
        seen.add(id(obj))
        if gc.is_tracked(obj):
            found.append(obj)
        todo.extend(gc.get_referents(obj))
    return found


def test_a_client_with_long_history_owns_no_other_tracked_object() -> None:
    acc = Accounting({})
    _drive(acc, "a", RECENT_REQUESTS + 500, 1_000.0, 0.07)  # latencies full, 60 s of rates
    gc.collect()  # what survives a collection (tuples of atoms are untracked then)
    assert _owned_tracked(acc.clients["a"]) == []


def test_tracked_objects_per_client_with_10000_clients() -> None:
    gc.collect()
    before = len(gc.get_objects())
    acc = Accounting({}, max_clients=CLIENTS)
    for c in range(CLIENTS):
        _drive(acc, f"client-{c}", 3, 1_000.0 + c * 0.001, 1.5)
    acc.sample(1_010.0)
    gc.collect()
    per_client = (len(gc.get_objects()) - before) / CLIENTS
    assert per_client <= ACCOUNTING_TRACKED_PER_CLIENT + LEDGER_TRACKED_PER_CLIENT + 0.1
    assert len(acc.clients) == CLIENTS


Event = tuple[float, float, float | None, int, int, bool]
"""(gap to the previous event s, latency s, ttft s, prompt tokens, output tokens, read the
client's view after it)."""


def _events() -> st.SearchStrategy[list[Event]]:
    event = st.tuples(
        st.sampled_from([0.0, 0.3, 1.0, 2.5, 45.0, 70.0]),
        st.floats(0.0, 10.0),
        st.none() | st.floats(0.0, 2.0),
        st.integers(0, 50),
        st.integers(0, 20),
        st.booleans(),
    )
    return st.lists(event, max_size=60)


class Model:
    """What a client's view says, from the list of its answered requests."""

    def __init__(self) -> None:
        self.first_s: float | None = None
        self.finished: list[tuple[float, float, int]] = []
        """(time s, service, tokens) of each answered request."""
        self.latencies_s: list[float] = []
        self.ttfts_s: list[float] = []

    def check(self, view: dict[str, Any], read_s: float) -> None:
        span_s = min(RATE_WINDOW_S, max(1.0, read_s - (self.first_s or read_s)))
        kept = [f for f in self.finished if math.floor(f[0]) >= read_s - RATE_WINDOW_S]
        rates = {
            "service_rate": sum(f[1] for f in kept) / span_s,
            "requests_per_s": len(kept) / span_s,
            "tokens_per_s": sum(f[2] for f in kept) / span_s,
        }
        for name, rate in rates.items():
            assert math.isclose(view[name], rate, abs_tol=1e-9), (name, view[name], rate)
        for name, values in (("latency", self.latencies_s), ("ttft", self.ttfts_s)):
            ordered = sorted(values[-RECENT_REQUESTS:])
            for q in (50, 99):
                assert view[f"{name}_p{q}_s"] == (percentile(ordered, q) if ordered else None)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(_events(), st.floats(0.0, 100.0))
def test_figures_equal_a_plain_model(events: list[Event], read_after_s: float) -> None:
    acc = Accounting({}, w_e=1.0, w_q=2.0)
    model = Model()
    now_s = 500.0
    acc.client("a", now_s)
    for gap_s, latency_s, ttft_s, prompt, output, read in events:
        now_s += gap_s
        acc.arrived("a", 5.0, now_s)
        model.first_s = model.first_s or now_s
        acc.finished("a", "w", 5.0, Usage(prompt, 0, output), latency_s, ttft_s, now_s)
        model.finished.append((now_s, prompt + 2.0 * output, prompt + output))
        model.latencies_s.append(latency_s)
        if ttft_s is not None:
            model.ttfts_s.append(ttft_s)
        if read:
            model.check(acc.client_view("a", now_s), now_s)
    model.check(acc.client_view("a", now_s + read_after_s), now_s + read_after_s)


def test_percentiles_read_the_last_recent_requests_only() -> None:
    acc = Accounting({})
    total = 2 * RECENT_REQUESTS + 123
    for k in range(total):
        acc.arrived("a", 1.0, 10.0 + k)
        acc.finished("a", "w", 1.0, Usage(1, 0, 1), float(k), float(k) / 2, 10.0 + k)
        for kept in (acc.clients["a"].latencies_s, acc.clients["a"].ttfts_s):  # bounded
            assert len(kept) < (RECENT_REQUESTS + RECENT_SLACK) * struct.calcsize("d")
    view = acc.client_view("a", 10.0 + total)
    last = [float(k) for k in range(total - RECENT_REQUESTS, total)]
    assert view["latency_p50_s"] == percentile(last, 50)
    assert view["latency_p99_s"] == percentile(last, 99)
    assert view["ttft_p99_s"] == percentile([x / 2 for x in last], 99)
