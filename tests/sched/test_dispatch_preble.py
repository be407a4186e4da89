"""Preble's E2 global scheduler (``preble-e2``): exploit the worker holding more than half
of the prompt whatever its load, else explore by the lowest windowed load cost (recent
prefill time plus running requests' decode time)."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fairserve.core.errors import ConfigError
from fairserve.core.types import Request, make_request
from fairserve.sched import registry
from fairserve.sched.dispatch.preble import PrebleE2
from tests.fakes.cluster import prompt_tokens

W3 = ["w0", "w1", "w2"]
SIMPLE = {"prefill_ms_per_token": 1.0, "prefill_base_ms": 0.0, "prefill_floor_ms": 0.0}
"""A prefill estimate of 1 ms per uncached token, so that costs are easy to add up."""

_SERIAL = itertools.count()


def req(
    rid: str,
    *,
    prefix: int = 0,
    shared: int = 0,
    unique: int = 8,
    output: int = 4,
    at_s: float = 0.0,
) -> Request:
    """A request whose first ``shared`` tokens are common to its ``prefix`` group."""
    tokens = prompt_tokens(prefix, shared, next(_SERIAL), unique)
    return make_request(rid, "a", tokens, output, arrival_s=at_s, output_len=output)


def preble(**params: Any) -> PrebleE2:
    dispatcher = registry.make_dispatcher("preble-e2", W3, **params)
    assert isinstance(dispatcher, PrebleE2)
    return dispatcher


# ---------------------------------------------------------------- exploit
def test_exploits_the_cached_worker_however_loaded() -> None:
    """More than half the prompt cached on w0: it goes to w0 with 40 requests waiting there
    and none elsewhere. Cache-aware dispatch leaves for the idle workers (sglang-router's
    balance escape), which is the difference the DoubleQ paper's §7.1 is about."""
    for name, expected in (("preble-e2", "w0"), ("cache-aware", "w1")):
        d = registry.make_dispatcher(name, W3)
        d.on_dispatch(req("doc", prefix=1, shared=64), "w0")
        for i in range(40):
            d.on_dispatch(req(f"busy{i}", output=500), "w0")
        assert d.choose(req("hit", prefix=1, shared=64, unique=8)) == expected, name


def test_half_the_prompt_cached_is_not_enough() -> None:
    """Preble exploits when the matched tokens outnumber the new ones (strictly)."""
    d = preble()
    d.on_dispatch(req("doc", prefix=1, shared=32), "w0")
    d.on_dispatch(req("busy", output=10), "w0")
    assert d.choose(req("half", prefix=1, shared=32, unique=32)) == "w1"
    assert d.choose(req("more", prefix=1, shared=32, unique=31)) == "w0"


def test_among_several_holders_the_lowest_load_cost_wins() -> None:
    d = preble(**SIMPLE)
    d.on_dispatch(req("doc0", prefix=1, shared=64), "w0")
    d.on_dispatch(req("doc2", prefix=1, shared=64), "w2")
    d.on_dispatch(req("busy", output=100), "w0")  # w0: 15 s of decode more than w2
    assert d.choose(req("hit", prefix=1, shared=64)) == "w2"
    assert d.decisions == {"exploit": 1, "explore": 0}


def test_an_unavailable_holder_means_explore() -> None:
    d = preble(**SIMPLE)
    d.on_dispatch(req("doc", prefix=1, shared=64, unique=900), "w0")
    d.on_dispatch(req("w1-work", unique=500), "w1")
    assert d.choose(req("hit", prefix=1, shared=64), available=["w1", "w2"]) == "w2"
    assert d.decisions == {"exploit": 0, "explore": 1}


def test_a_placement_outlives_the_workers_eviction() -> None:
    """Preble routes by where a prefix was placed (``gpu_allocations``), which evictions do
    not change; the fleet's cache model, read by the prefill estimate and fair queues,
    does forget."""
    d = preble(**SIMPLE)
    d.on_dispatch(req("doc", prefix=1, shared=64), "w0")
    d.on_dispatch(req("busy", unique=500), "w0")
    d.on_evict("w0", b"")
    hit = req("hit", prefix=1, shared=64)
    assert d.prefixes.match(hit.prompt_key).tokens == 0
    assert d.choose(hit) == "w0"
    d.on_dispatch(hit, "w0")
    assert d.window_prefill_s["w0"] == pytest.approx(0.072 + 0.500 + 0.072)  # all missing


def test_placements_are_bounded_least_recently_used_first() -> None:
    d = preble(placement_tokens_per_worker=100)
    d.on_dispatch(req("old", prefix=1, shared=64), "w0")
    d.on_dispatch(req("new", prefix=2, shared=64), "w0")
    assert d.placed.worker_tokens("w0") <= 100
    assert d.choose(req("hit-new", prefix=2, shared=64)) == "w0"
    assert d.choose(req("hit-old", prefix=1, shared=64)) == "w1"


# ---------------------------------------------------------------- explore
def test_explore_picks_the_lowest_load_cost_not_the_fewest_requests() -> None:
    """1 ms per uncached token, 10 ms per output token:
    w0: one 1,000-token prefill (1.0 s) + 1 output (0.01 s)     = 1.01 s, 1 request;
    w1: ten 10-token prefills (0.1 s) + 10 x 20 outputs (2.0 s) = 2.1 s, 10 requests;
    w2: one 500-token prefill (0.5 s) + 10 outputs (0.1 s)      = 0.6 s, 1 request.
    Fewest outstanding requests would pick w0 (tied with w2, first in order)."""
    d = preble(**SIMPLE, tpot_s=0.01)
    d.on_dispatch(req("big", unique=1000, output=1), "w0")
    for i in range(10):
        d.on_dispatch(req(f"chat{i}", unique=10, output=20), "w1")
    d.on_dispatch(req("mid", unique=500, output=10), "w2")
    costs = [d.load_cost_s(w) for w in W3]
    assert costs == pytest.approx([1.01, 2.1, 0.6])
    assert d.least_outstanding(W3) == "w0"
    assert d.choose(req("new")) == "w2"


def test_only_the_uncached_tokens_count_as_prefill() -> None:
    d = preble(**SIMPLE, tpot_s=0.0)
    d.on_dispatch(req("doc", prefix=1, shared=600, unique=10), "w0")
    d.on_dispatch(req("hit", prefix=1, shared=600, unique=10), "w0")
    assert d.window_prefill_s["w0"] == pytest.approx(0.610 + 0.010)


def test_prefill_leaves_the_window_and_decode_leaves_at_finish() -> None:
    d = preble(**SIMPLE, tpot_s=0.01, window_s=180.0)
    old = req("old", unique=1000, output=50, at_s=0.0)
    d.on_dispatch(old, "w0")
    d.on_dispatch(req("w1", unique=100, output=1, at_s=10.0), "w1")
    assert d.choose(req("a", at_s=100.0)) == "w2"  # w0: 1.5 s, w1: 0.11 s, w2: 0
    assert d.choose(req("b", at_s=100.0), available=["w0", "w1"]) == "w1"
    assert d.choose(req("c", at_s=181.0), available=["w0", "w1"]) == "w1"
    assert d.load_cost_s("w0") == pytest.approx(0.5)  # the prefill left the window
    d.on_finish(old, "w0", 50)
    assert d.load_cost_s("w0") == 0.0
    assert d.choose(req("d", at_s=181.0), available=["w0", "w1"]) == "w0"


def test_tpot_is_the_median_of_the_measured_requests() -> None:
    d = preble(tpot_s=0.15, tpot_samples=3)
    for i, tpot_s in enumerate([0.02, 0.04, 0.03, 0.05]):
        r = req(f"r{i}", output=11)
        d.on_dispatch(r, "w0")
        r.first_token_s, r.finish_s = 1.0, 1.0 + 10 * tpot_s
        d.on_finish(r, "w0", 11)
    # The seed 0.15 and 0.02 fell out of the last 3; median of 0.04, 0.03, 0.05.
    assert d.tpot_median_s["w0"] == pytest.approx(0.04)
    assert d.tpot_median_s["w1"] == 0.15  # nothing measured: the seed


def test_parameters_are_checked() -> None:
    for params in ({"exploit_ratio": 1.5}, {"window_s": 0}, {"tpot_samples": 0}):
        with pytest.raises(ConfigError):
            registry.make_dispatcher("preble-e2", W3, **params)


def test_a_removed_worker_leaves_the_window() -> None:
    d = preble(**SIMPLE)
    d.on_dispatch(req("x", unique=100, at_s=0.0), "w0")
    d.on_dispatch(req("y", unique=100, at_s=1.0), "w1")
    d.remove_worker("w0")
    d.choose(req("z", at_s=500.0))  # expiring the window skips the removed worker
    assert d.window_prefill_s == {"w1": 0.0, "w2": 0.0}


# ---------------------------------------------------------------- property
@dataclass
class Sent:
    at_s: float
    worker: str
    missing_tokens: int
    req: Request


EVENTS = st.lists(
    st.tuples(
        st.sampled_from(["dispatch", "dispatch", "finish", "abort"]),
        st.integers(0, 3),  # prefix group (0: none shared)
        st.integers(0, 48),  # shared tokens
        st.integers(1, 40),  # unique tokens
        st.integers(1, 30),  # output tokens
        st.floats(0.0, 60.0),  # seconds since the previous event
        st.lists(st.sampled_from(W3), max_size=3, unique=True),  # unavailable workers
    ),
    min_size=1,
    max_size=60,
)


@given(events=EVENTS, window_s=st.sampled_from([30.0, 180.0]))
def test_every_choice_is_e2s_rule_over_a_reference_load_cost(
    events: list[tuple[str, int, int, int, int, float, list[str]]], window_s: float
) -> None:
    """Replays random dispatches and finishes; each choice must be the reference's: a
    holder of the longest match of lowest cost when it covers more than half the prompt,
    else the candidate of lowest cost, the cost recomputed from scratch from what is in
    flight and what was sent within the window."""
    d = preble(**SIMPLE, tpot_s=0.01, window_s=window_s)
    sent: list[Sent] = []
    running: list[Sent] = []
    now_s = 0.0

    def reference_cost(worker: str) -> float:
        prefill_ms = sum(
            s.missing_tokens for s in sent if s.worker == worker and s.at_s >= now_s - window_s
        )
        decode = sum(s.req.max_output_tokens for s in running if s.worker == worker)
        return prefill_ms / 1000 + decode * 0.01

    for kind, prefix, shared, unique, output, gap_s, down in events:
        now_s += gap_s
        if kind != "dispatch":
            if running:
                done = running.pop(0)
                if kind == "finish":
                    d.on_finish(done.req, done.worker, output)
                else:
                    d.on_abort(done.req, done.worker)
            continue
        r = req(f"r{len(sent)}", prefix=prefix, shared=shared if prefix else 0, unique=unique,
                output=output, at_s=now_s)  # fmt: skip
        candidates = [w for w in W3 if w not in down] or W3
        match = d.placed.match(r.prompt_key)
        holders = [w for w in candidates if w in match.owners]
        pool = holders if holders and match.tokens > r.input_tokens / 2 else candidates
        worker = d.choose(r, candidates)
        costs = {w: reference_cost(w) for w in pool}
        assert worker in pool
        assert costs[worker] == pytest.approx(min(costs.values()), abs=1e-9)
        for w in W3:
            assert d.load_cost_s(w) == pytest.approx(reference_cost(w), abs=1e-9)
            assert d.load_cost_s(w) >= 0
        missing = r.input_tokens - d.prefixes.walk_len(r.prompt_key, worker)
        d.on_dispatch(r, worker)
        sent.append(Sent(now_s, worker, missing, r))
        running.append(sent[-1])
    assert all(math.isfinite(d.load_cost_s(w)) for w in W3)
