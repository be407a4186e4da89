"""DoubleQ's SELECTWORKER, deficit accounting, evictions, live quantum and snapshots."""

from __future__ import annotations

import itertools
import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairserve.core.errors import ConfigError
from fairserve.core.radix import RadixTree
from fairserve.core.types import Request, make_request, tokens_to_key
from fairserve.sched import registry
from fairserve.sched.base import MAX_CLIENTS
from fairserve.sched.dispatch.doubleq import DoubleQ
from tests.fakes.cluster import prompt_tokens

_SERIAL = itertools.count()
PREFIX_TOKENS = 40


def req(client: str = "a", prefix: int = 7, unique: int = 10, output: int = 5) -> Request:
    """``PREFIX_TOKENS`` tokens shared by every request of ``prefix`` + a unique tail."""
    serial = next(_SERIAL)
    tokens = prompt_tokens(prefix, PREFIX_TOKENS, serial, unique)
    return make_request(f"r{serial}", client, tokens, output, output_len=output)


def prefix_key(prefix: int = 7) -> bytes:
    return tokens_to_key(prompt_tokens(prefix, PREFIX_TOKENS, 0, 0))


def doubleq(workers: int = 2, **params: Any) -> DoubleQ:
    d = registry.make_dispatcher("doubleq", [f"w{i}" for i in range(workers)], **params)
    assert isinstance(d, DoubleQ)
    return d


def test_client_sticks_to_cached_worker_then_leaves_when_its_credit_is_spent() -> None:
    d = doubleq(worker_quantum=100)  # requests cost 50 at dispatch (w_e·50 input tokens)
    assert d.dispatch(req()) == "w0"  # empty tree; refill to {100, 100}; tie → w0
    assert d.deficits["a"] == {"w0": 50.0, "w1": 100.0}
    # w0 holds the prefix and has credit: stick, although w1 is less loaded (1 vs 0).
    assert d.dispatch(req()) == "w0"
    assert d.deficits["a"] == {"w0": 0.0, "w1": 100.0}
    # w0's credit is spent (0 is not > 0) and w1 still has some: leave w0.
    assert d.dispatch(req()) == "w1"
    assert d.refills["a"] == 1, "no refill while some worker had positive credit"
    # both workers now hold the prefix; w1 is the only one with credit.
    assert d.dispatch(req()) == "w1"
    assert d.deficits["a"] == {"w0": 0.0, "w1": 0.0}
    assert d.refills["a"] == 1
    # nobody has credit: refill once, then the least loaded cached worker (2 vs 2 → w0).
    assert d.dispatch(req()) == "w0"
    assert d.refills["a"] == 2
    assert d.deficits["a"] == {"w0": 50.0, "w1": 100.0}


def test_cached_workers_are_preferred_only_among_those_with_credit() -> None:
    d = doubleq(3, worker_quantum=1000)
    d.on_dispatch(req(prefix=1), "w2")  # w2 caches prefix 1 (refills a's counters too)
    d.choose(req())  # creates a's counters; refill to 1000 each
    d.deficits["a"]["w2"] = -5.0
    d.on_dispatch(req(client="b", prefix=9), "w0")
    # G = {w2} but w2 has no credit: the least loaded of those with credit (w1).
    assert d.choose(req(prefix=1)) == "w1"


def test_counters_follow_input_at_dispatch_and_output_at_finish_exactly() -> None:
    d = doubleq(worker_quantum=1000, w_e=1.5, w_q=3.0)
    d.set_weight("heavy", 2.0)
    light, heavy = req("light", unique=20), req("heavy", unique=20)  # 60 input tokens
    assert d.dispatch(light) == "w0"
    assert d.dispatch(heavy) == "w0"  # different client, its own counters
    assert d.deficits["light"]["w0"] == 1000 - 1.5 * 60
    assert d.deficits["heavy"]["w0"] == 1000 - 1.5 * 60 / 2
    d.on_finish(light, "w0", 7)
    d.on_finish(heavy, "w0", 7)
    assert d.deficits["light"]["w0"] == 1000 - 1.5 * 60 - 3.0 * 7
    assert d.deficits["heavy"]["w0"] == 1000 - (1.5 * 60 + 3.0 * 7) / 2
    assert d.deficits["light"]["w1"] == 1000.0
    assert d.outstanding == {"w0": 0, "w1": 0}


def test_abort_charges_the_tokens_decoded_so_far() -> None:
    d = doubleq(worker_quantum=1000)
    r = req()
    worker = d.dispatch(r)
    r.output_tokens = 3
    d.on_abort(r, worker)
    assert d.deficits["a"][worker] == 1000 - 50 - 2 * 3
    assert d.outstanding[worker] == 0


def test_refill_adds_as_many_quanta_as_needed_in_one_go() -> None:
    d = doubleq(worker_quantum=10)
    d.dispatch(req(unique=960))  # 1000 input tokens: w0 = 10 − 1000 = −990
    assert d.deficits["a"] == {"w0": -990.0, "w1": 10.0}
    assert d.dispatch(req(prefix=3)) == "w1"  # w1 still has credit: no refill
    assert d.deficits["a"]["w1"] == 10 - 50
    assert d.refills["a"] == 1
    # Best counter −40 needs 5 quanta to turn positive; every counter gets the same 5.
    assert d.dispatch(req(prefix=4)) == "w1"
    assert d.refills["a"] == 6
    assert d.deficits["a"] == {"w0": -940.0, "w1": 10.0 - 50}


def test_refill_only_touches_available_workers() -> None:
    d = doubleq(worker_quantum=100)
    d.dispatch(req())  # w0: 50, w1: 100
    d.dispatch(req(), available=["w1"])  # w1 has credit: 50
    d.dispatch(req(), available=["w1"])  # w1: 0
    assert d.dispatch(req(), available=["w1"]) == "w1"  # refill w1 only
    assert d.deficits["a"] == {"w0": 50.0, "w1": 50.0}


def test_eviction_prunes_the_tree_so_the_client_no_longer_prefers_that_worker() -> None:
    kept, evicted = doubleq(worker_quantum=1000), doubleq(worker_quantum=1000)
    for d in (kept, evicted):
        assert d.dispatch(req()) == "w0"
        assert d.dispatch(req()) == "w0"  # sticky: w0 holds the prefix
    evicted.on_evict("w0", prefix_key())
    assert evicted.prefixes.worker_tokens("w0") == 0
    assert kept.dispatch(req()) == "w0"
    assert evicted.dispatch(req()) == "w1"  # G = ∅ → least loaded


def test_eviction_of_a_tail_keeps_the_shared_prefix() -> None:
    d = doubleq(worker_quantum=1000)
    first = req()
    d.dispatch(first)
    d.dispatch(req())
    d.on_evict("w0", first.prompt_key)  # only first's own tail leaves the cache
    match = d.prefixes.match(req().prompt_key)
    assert match.tokens == PREFIX_TOKENS and match.owners == {"w0"}


def test_infinite_worker_quantum_is_sticky_and_snapshots_as_strict_json() -> None:
    d = doubleq(worker_quantum=math.inf)
    placed = [d.dispatch(req()) for _ in range(20)]
    assert placed == ["w0"] * 20  # Preble-like: the cached worker forever
    assert d.dispatch(req(client="b", prefix=2)) == "w1"  # no match → least loaded
    snap = d.snapshot()
    text = json.dumps(snap, allow_nan=False)
    assert snap["quantum"] == "inf" and snap["worker_quantum"] == "inf"
    assert snap["params"]["worker_quantum"] == "inf"
    assert snap["clients"]["a"]["deficits"] == {"w0": "inf", "w1": "inf"}
    assert "Infinity" not in text


def test_set_quantum_live_and_leaving_infinity_restores_deficits() -> None:
    d = doubleq(worker_quantum=math.inf)
    for _ in range(3):
        d.dispatch(req())
    d.set_quantum(100)
    assert d.quantum == 100.0
    assert d.deficits["a"] == {"w0": 0.0, "w1": 0.0}
    assert d.dispatch(req()) == "w0"  # refill to 100 each; sticky while w0 has credit
    assert d.dispatch(req()) == "w0"
    assert d.dispatch(req()) == "w1"  # w0's quantum is spent: the client spreads again
    for bad in (0, -1.0, math.nan, -math.inf):
        with pytest.raises(ConfigError, match="worker_quantum"):
            d.set_quantum(bad)
    assert d.quantum == 100.0


def test_removing_a_worker_forgets_its_prefixes_and_counters() -> None:
    d = doubleq(3, worker_quantum=1000)
    d.dispatch(req())
    assert d.prefixes.worker_tokens("w0") == 50
    d.remove_worker("w0")
    assert d.prefixes.total_tokens == 0
    assert set(d.deficits["a"]) == {"w1", "w2"}
    assert d.dispatch(req()) == "w1"
    d.add_worker("w9")
    assert d.deficits["a"]["w9"] == 0.0
    json.dumps(d.snapshot(), allow_nan=False)


def test_tree_bound_per_worker_is_approximately_lru() -> None:
    d = doubleq(worker_quantum=1000, max_tree_tokens_per_worker=120)
    sent = [req(prefix=p) for p in range(6)]  # 50 distinct tokens each
    for r in sent:
        d.on_dispatch(r, "w0")
        assert d.prefixes.worker_tokens("w0") <= 120
    assert d.prefixes.match(sent[-1].prompt_key).owners == {"w0"}
    assert d.prefixes.match(sent[0].prompt_key).tokens == 0


def test_snapshot_shows_per_client_per_worker_deficits() -> None:
    d = doubleq(worker_quantum=300)
    d.dispatch(req("a"))
    d.dispatch(req("b", prefix=3))
    snap = d.snapshot()
    json.dumps(snap, allow_nan=False)
    assert snap["worker_quantum"] == 300.0
    assert snap["clients"]["a"]["deficits"] == {"w0": 250.0, "w1": 300.0}
    assert snap["clients"]["b"]["refills"] == 1
    assert snap["tree_tokens"] == 100
    assert snap["workers"]["w0"]["tree_tokens"] == 50


# ---------------------------------------------------------------- Algorithm 2, literally
class LiteralAlgorithm2:
    """Algorithm 2 as the paper's text reads it, one refill per loop iteration: the oracle
    the fast implementation (refills computed at once, lists in worker order) must match."""

    def __init__(self, workers: list[str], quantum: float, w_e: float, w_q: float) -> None:
        self.workers, self.quantum, self.w_e, self.w_q = workers, quantum, w_e, w_q
        self.q: dict[str, dict[str, float]] = {}
        self.s = dict.fromkeys(workers, 0)
        self.tree = RadixTree()

    def dispatch(self, r: Request, available: list[str]) -> str:
        qi = self.q.setdefault(r.client, dict.fromkeys(self.workers, 0.0))
        g = {str(w) for w in self.tree.match_owners(r.prompt_key).owners} & set(available)
        g_avail = {w for w in available if qi[w] > 0}
        while not g_avail:
            for w in available:
                qi[w] += self.quantum
            g_avail = {w for w in available if qi[w] > 0}
        pool = (g & g_avail) or g_avail
        worker = min(pool, key=lambda w: (self.s[w], self.workers.index(w)))
        qi[worker] -= self.w_e * r.input_tokens
        self.s[worker] += 1
        self.tree.insert(r.prompt_key, worker)
        return worker

    def finish(self, r: Request, worker: str, output_tokens: int) -> None:
        self.q[r.client][worker] -= self.w_q * output_tokens
        self.s[worker] -= 1

    def evict(self, worker: str, key: bytes) -> None:
        self.tree.remove_owner(key, worker)


arrive_op = st.tuples(
    st.just("arrive"),
    st.sampled_from(["a", "b", "c"]),
    st.integers(0, 3),  # prefix group
    st.integers(0, 40),  # shared tokens
    st.integers(1, 30),  # unique tokens
    st.integers(0, 12),  # output tokens
    st.sets(st.integers(0, 2), min_size=1),  # available workers
)
finish_op = st.tuples(st.just("finish"), st.integers(0, 1000))
evict_op = st.tuples(st.just("evict"), st.integers(0, 2), st.integers(0, 3), st.integers(1, 40))


@settings(max_examples=100, derandomize=True, deadline=None)
@given(
    ops=st.lists(st.one_of(arrive_op, arrive_op, finish_op, evict_op), max_size=60),
    quantum=st.sampled_from([8.0, 50.0, 300.0, math.inf]),
)
def test_matches_the_literal_algorithm_2(ops: list[tuple[Any, ...]], quantum: float) -> None:
    workers = ["w0", "w1", "w2"]
    fast = doubleq(3, worker_quantum=quantum, w_e=1.0, w_q=2.0)
    oracle = LiteralAlgorithm2(workers, quantum, 1.0, 2.0)
    running: list[tuple[Request, str]] = []
    for op in ops:
        if op[0] == "arrive":
            _, client, group, shared, unique, output, avail = op
            tokens = prompt_tokens(group, shared, next(_SERIAL), unique)
            r = make_request(f"x{len(running)}", client, tokens, output, output_len=output)
            available = [workers[i] for i in sorted(avail)]
            expected = oracle.dispatch(r, available)
            assert fast.dispatch(r, available) == expected
            running.append((r, expected))
        elif op[0] == "finish" and running:
            r, worker = running.pop(op[1] % len(running))
            fast.on_finish(r, worker, r.expected_output_tokens)
            oracle.finish(r, worker, r.expected_output_tokens)
        elif op[0] == "evict":
            _, w, group, length = op
            key = tokens_to_key(prompt_tokens(group, length, 0, 0))
            fast.on_evict(workers[w], key)
            oracle.evict(workers[w], key)
        assert fast.deficits == oracle.q
        assert fast.outstanding == oracle.s


def test_idle_clients_beyond_the_cap_are_forgotten_busy_ones_never() -> None:
    """Names come from requests: the counters kept stay bounded (DRR's reset of an empty
    flow's deficit), and a client with requests in flight keeps its counters."""
    from fairserve.core.types import Request, tokens_to_key
    from fairserve.sched.dispatch import doubleq
    from fairserve.sched.registry import make_dispatcher

    dq = make_dispatcher("doubleq", ["w0", "w1"])
    assert isinstance(dq, doubleq.DoubleQ)
    busy = Request("busy-1", "busy", tokens_to_key([1, 2, 3]), 8, 0.0)
    dq.on_dispatch(busy, dq.choose(busy))
    cap = MAX_CLIENTS
    for i in range(cap + 50):
        req = Request(f"r{i}", f"name-{i}", tokens_to_key([i]), 4, float(i))
        worker = dq.choose(req)
        dq.on_dispatch(req, worker)
        dq.on_finish(req, worker, 4)
    assert len(dq.deficits) <= cap
    assert "busy" in dq.deficits and dq.forgotten >= 50
    assert f"name-{cap + 49}" in dq.deficits
