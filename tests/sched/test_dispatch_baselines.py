"""The baseline dispatchers: round robin, least load, cache-aware, per-client round robin,
and the errors every dispatcher shares (no worker, unknown worker, bad parameters)."""

from __future__ import annotations

import itertools
import json
import math
from typing import Any

import pytest

from fairserve.core.errors import ConfigError, UnknownNameError
from fairserve.core.types import Request, make_request
from fairserve.sched import registry
from fairserve.sched.dispatch.base import Dispatcher, NoWorkerAvailable
from fairserve.sched.dispatch.cache_aware import CacheAware
from fairserve.sched.dispatch.client_rr import ClientRoundRobin
from fairserve.sched.dispatch.least_load import LeastLoad
from fairserve.sched.dispatch.round_robin import RoundRobin
from tests.fakes.cluster import prompt_tokens

W3 = ["w0", "w1", "w2"]
ALL = ["round-robin", "least-load", "cache-aware", "client-rr", "doubleq", "preble-e2"]


_SERIAL = itertools.count()


def req(
    rid: str, client: str = "a", prefix: int = 0, shared: int = 0, unique: int = 8, output: int = 4
) -> Request:
    """A request whose first ``shared`` tokens are common to its ``prefix`` group; the rest
    is unique to it."""
    tokens = prompt_tokens(prefix, shared, next(_SERIAL), unique)
    return make_request(rid, client, tokens, output, output_len=output)


# ---------------------------------------------------------------- round robin
def test_round_robin_cycles_over_workers() -> None:
    d = RoundRobin(W3)
    assert [d.dispatch(req(f"r{i}")) for i in range(7)] == ["w0", "w1", "w2"] * 2 + ["w0"]


def test_round_robin_skips_unavailable_workers_and_keeps_its_place() -> None:
    d = RoundRobin(W3)
    assert d.dispatch(req("r0")) == "w0"
    assert d.dispatch(req("r1"), available=["w0", "w2"]) == "w2"
    assert d.dispatch(req("r2"), available=["w0", "w2"]) == "w0"
    assert d.dispatch(req("r3")) == "w1"


def test_round_robin_survives_worker_removal() -> None:
    d = RoundRobin(W3)
    d.dispatch(req("r0"))  # next: w1
    d.remove_worker("w0")
    assert d.dispatch(req("r1")) == "w1"
    assert d.dispatch(req("r2")) == "w2"
    d.add_worker("w3")
    assert [d.dispatch(req(f"r{i}")) for i in range(3, 6)] == ["w3", "w1", "w2"]


# ---------------------------------------------------------------- least load
def test_least_load_picks_fewest_outstanding_tokens() -> None:
    d = LeastLoad(W3)
    big = req("r0", unique=100)  # 104 tokens on w0
    d.on_dispatch(big, "w0")
    d.on_dispatch(req("r1", unique=10), "w1")  # 14 tokens
    d.on_dispatch(req("r2", unique=10), "w1")  # 28 tokens
    d.on_dispatch(req("r3", unique=50), "w2")  # 54 tokens
    assert d.choose(req("r4")) == "w1"  # 28 < 54 < 104, although w1 has 2 requests
    d.on_finish(big, "w0", 4)
    assert d.choose(req("r5")) == "w0"


def test_least_load_ties_go_to_fewer_requests_then_worker_order() -> None:
    d = LeastLoad(W3)
    d.on_dispatch(req("r0", unique=16), "w0")  # 20 tokens, 1 request
    d.on_dispatch(req("r1", unique=6), "w1")  # 10 tokens
    d.on_dispatch(req("r2", unique=6), "w1")  # 20 tokens, 2 requests
    d.on_dispatch(req("r3", unique=16), "w2")  # 20 tokens, 1 request
    assert d.choose(req("r4")) == "w0"
    assert d.choose(req("r5"), available=["w1", "w2"]) == "w2"


# ---------------------------------------------------------------- cache-aware
def _cache_aware(**params: Any) -> CacheAware:
    d = registry.make_dispatcher("cache-aware", W3, **params)
    assert isinstance(d, CacheAware)
    return d


def test_cache_aware_exploits_the_worker_holding_the_prefix_when_balanced() -> None:
    d = _cache_aware(balance_abs_threshold=2, balance_rel_threshold=1.5)
    first = req("r0", prefix=7, shared=48, unique=8)
    assert d.dispatch(first) == "w0"  # empty tree: least loaded, worker order
    # w0 is now the busiest worker (1 vs 0), but the load is within bounds: exploit.
    for i in range(1, 3):
        assert d.dispatch(req(f"r{i}", prefix=7, shared=48, unique=8)) == "w0"
    # A prompt sharing too little (8 of 56 tokens < 0.5) goes to the least loaded.
    assert d.dispatch(req("r3", prefix=8, shared=48, unique=8)) == "w1"
    assert d.decisions == {"cache": 2, "balance": 2}


def test_cache_aware_escapes_to_least_loaded_beyond_both_thresholds() -> None:
    d = _cache_aware(balance_abs_threshold=2, balance_rel_threshold=1.5)
    for i in range(3):
        assert d.dispatch(req(f"r{i}", prefix=7, shared=48, unique=8)) == "w0"
    # w0 has 3, others 0: 3 - 0 > 2 and 3 > 1.5·0 → imbalanced → least loaded.
    assert d.dispatch(req("r3", prefix=7, shared=48, unique=8)) == "w1"


def test_cache_aware_needs_both_thresholds_to_call_it_imbalanced() -> None:
    ratio_blocks = _cache_aware(balance_abs_threshold=2, balance_rel_threshold=10.0)
    spread_blocks = _cache_aware(balance_abs_threshold=100, balance_rel_threshold=1.5)
    for d in (ratio_blocks, spread_blocks):
        for i in range(4):
            d.on_dispatch(req(f"c{i}", prefix=7, shared=48), "w0")
        d.on_dispatch(req("x1", prefix=1), "w1")
        d.on_dispatch(req("x2", prefix=2), "w2")
        # loads 4,1,1: the spread 3 > 2 but 4 < 10·1, or 4 > 1.5·1 but 3 < 100: balanced,
        # so the cached worker wins although it is the busiest.
        assert d.choose(req("r", prefix=7, shared=48)) == "w0"
    strict = _cache_aware(balance_abs_threshold=2, balance_rel_threshold=3.0)
    for i in range(4):
        strict.on_dispatch(req(f"c{i}", prefix=7, shared=48), "w0")
    strict.on_dispatch(req("x1", prefix=1), "w1")
    strict.on_dispatch(req("x2", prefix=2), "w2")
    assert strict.choose(req("r", prefix=7, shared=48)) == "w1"


def test_cache_aware_forgets_evicted_prefixes_and_removed_workers() -> None:
    d = _cache_aware()
    first = req("r0", prefix=7, shared=48, unique=8)
    d.on_dispatch(first, "w2")
    assert d.choose(req("r1", prefix=7, shared=48, unique=8)) == "w2"
    d.on_evict("w2", first.prompt_key)
    assert d.choose(req("r2", prefix=7, shared=48, unique=8)) == "w0"
    d.on_dispatch(req("r3", prefix=7, shared=48, unique=8), "w1")
    d.remove_worker("w1")
    assert d.prefixes.total_tokens == 0
    assert d.choose(req("r4", prefix=7, shared=48, unique=8)) == "w0"


def test_cache_aware_bounds_tree_tokens_per_worker() -> None:
    d = _cache_aware(max_tree_tokens_per_worker=100)
    sent = [req(f"r{i}", prefix=i, unique=40) for i in range(10)]
    for r in sent:
        d.on_dispatch(r, "w0")
        assert d.prefixes.worker_tokens("w0") <= 100
    # LRU: the newest prompt is still recorded, the oldest is gone.
    assert d.prefixes.match(sent[-1].prompt_key).owners == {"w0"}
    assert d.prefixes.match(sent[0].prompt_key).tokens == 0


def test_cache_aware_rejects_threshold_above_one() -> None:
    with pytest.raises(ConfigError, match="cache_threshold"):
        _cache_aware(cache_threshold=1.5)


# ---------------------------------------------------------------- per-client round robin
def test_client_rr_spreads_each_clients_requests_over_all_workers() -> None:
    d = ClientRoundRobin(W3)
    placed: dict[str, list[str]] = {"a": [], "b": []}
    for _ in range(6):
        for client in ("a", "a", "b"):
            rid = f"r{len(placed['a']) + len(placed['b'])}"
            placed[client].append(d.dispatch(req(rid, client=client)))
    for client, workers in placed.items():
        counts = {w: workers.count(w) for w in W3}
        assert max(counts.values()) - min(counts.values()) <= 1, (client, counts)
        # consecutive requests of a client never land on the same worker
        assert all(x != y for x, y in itertools.pairwise(workers)), client


def test_client_rr_cursors_are_independent() -> None:
    d = ClientRoundRobin(W3)
    assert [d.dispatch(req(f"r{i}", client="a")) for i in range(2)] == ["w0", "w1"]
    # a new client starts where the global cycle stands, then has its own cursor
    assert d.dispatch(req("r2", client="b")) == "w2"
    assert d.dispatch(req("r3", client="a")) == "w2"
    assert d.dispatch(req("r4", client="b")) == "w0"
    assert d.dispatch(req("r5", client="a"), available=["w1"]) == "w1"


# ---------------------------------------------------------------- shared errors
@pytest.mark.parametrize("name", ALL)
def test_no_available_worker_raises(name: str) -> None:
    d = registry.make_dispatcher(name, W3)
    with pytest.raises(NoWorkerAvailable):
        d.dispatch(req("r0"), available=[])
    with pytest.raises(NoWorkerAvailable):
        registry.make_dispatcher(name, []).dispatch(req("r1"))


@pytest.mark.parametrize("name", ALL)
def test_unknown_worker_ids_are_errors(name: str) -> None:
    d = registry.make_dispatcher(name, W3)
    with pytest.raises(UnknownNameError, match="w9"):
        d.choose(req("r0"), available=["w0", "w9"])
    with pytest.raises(UnknownNameError):
        d.on_dispatch(req("r1"), "w9")
    with pytest.raises(ConfigError):
        d.add_worker("w0")


@pytest.mark.parametrize("name", ALL)
def test_every_dispatcher_round_trips_a_request_and_snapshots_strict_json(name: str) -> None:
    d = registry.make_dispatcher(name, W3)
    r = req("r0", prefix=3, shared=16)
    worker = d.dispatch(r)
    assert worker in W3 and d.outstanding[worker] == 1
    d.on_finish(r, worker, 4)
    assert d.outstanding[worker] == 0 and d.outstanding_tokens[worker] == 0
    snap = d.snapshot()
    json.dumps(snap, allow_nan=False)
    assert snap["dispatch"] == name and set(snap["workers"]) == set(W3)


def test_unknown_dispatcher_name_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="doubleq"):
        registry.make_dispatcher("double-q", W3)


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("doubleq", {"worker_quantum": 0}),
        ("doubleq", {"worker_quantum": -5}),
        ("doubleq", {"worker_quantum": math.nan}),
        ("doubleq", {"worker_quantum": -math.inf}),
        ("doubleq", {"max_tree_tokens_per_worker": -1}),
        ("doubleq", {"w_e": -1}),
        ("cache-aware", {"cache_threshold": math.nan}),
        ("cache-aware", {"balance_rel_threshold": 0.5}),
        ("cache-aware", {"balance_abs_threshold": -1}),
        ("round-robin", {"quantum": 1}),
        ("least-load", {"worker_quantum": 1}),
    ],
)
def test_bad_parameters_are_config_errors(name: str, params: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        registry.make_dispatcher(name, W3, **params)


@pytest.mark.parametrize("name", ["round-robin", "least-load", "cache-aware", "client-rr"])
def test_baselines_have_no_quantum(name: str) -> None:
    d: Dispatcher = registry.make_dispatcher(name, W3)
    assert d.quantum is None
    with pytest.raises(ConfigError):
        d.set_quantum(100)
