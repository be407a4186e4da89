"""The engine model: batching disciplines, chunked prefill, the KV pool and its prefix cache,
retraction, and fused decode being exactly step-by-step decode."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairserve.core.cost import PiecewiseLinearBatchTime
from fairserve.core.errors import ConfigError
from fairserve.core.types import Request, make_request, tokens_to_key
from fairserve.sched.registry import make_local_policy
from fairserve.sim.engine import BATCHING_DISCIPLINES, Engine, EngineConfig, StepResult

TIME = PiecewiseLinearBatchTime(
    c_s=0.02, a_s_per_token=1e-4, b0_tokens=256, attention_s_per_token=1e-8, step_overhead_s=0.002
)


def make_engine(policy: str = "vtc", strict: bool = False, **config: object) -> Engine:
    """An engine with ``policy``; ``strict`` gives DLPM unlimited fill patience and VTC/LCF
    unlimited memory patience (their strictly work-conserving settings)."""
    settings_ = {"kv_capacity_tokens": 20_000, "max_batch_tokens": 2048, **config}
    patience = {"dlpm": "fill_patience", "vtc": "memory_patience", "lcf": "memory_patience"}
    params: dict[str, Any] = {patience[policy]: 10**9} if strict and policy in patience else {}
    policy_ = make_local_policy(policy, **params)
    return Engine(policy_, TIME, EngineConfig(**settings_))  # type: ignore[arg-type]


def random_requests(seed: int, count: int, clients: int = 2) -> list[tuple[float, Request]]:
    rng = random.Random(seed)
    out = []
    for i in range(count):
        prefix = [rng.randrange(3)] * rng.randrange(0, 200)
        tokens = prefix + [rng.randrange(32000) for _ in range(rng.randrange(1, 600))]
        out_len = rng.randrange(1, 120)
        req = make_request(f"r{i}", f"c{i % clients}", tokens, 128, output_len=out_len)
        out.append((i * rng.uniform(0.0, 0.03), req))
    return out


def drive(
    engine: Engine,
    arrivals: list[tuple[float, Request]],
    fuse: bool,
    check: bool = True,
    max_steps: int = 100_000,
) -> list[StepResult]:
    """Run arrivals through ``engine`` like the cluster does; check invariants each step."""
    results: list[StepResult] = []
    now, i = 0.0, 0
    for _ in range(max_steps):
        while i < len(arrivals) and arrivals[i][0] <= now:
            engine.submit(arrivals[i][1], arrivals[i][0])
            i += 1
        if i >= len(arrivals) and not engine.has_work:
            return results
        horizon = arrivals[i][0] if i < len(arrivals) else float("inf")
        result = engine.step(now, horizon if fuse else None)
        if result is None:
            now = horizon
            continue
        if check:
            assert_pool_invariants(engine)
        results.append(result)
        now = result.end_s
    raise AssertionError("engine did not drain")


def assert_pool_invariants(engine: Engine) -> None:
    pool = engine.pool
    assert pool.used_tokens <= pool.capacity_tokens
    assert pool.private_tokens == sum(s.private_tokens for s in engine.running)
    assert pool.reserved_tokens == sum(s.reserved_tokens for s in engine.running)
    assert pool.tree.protected_tokens <= pool.tree.total_tokens


# --------------------------------------------------------------------------- one request
def test_one_request_prefills_then_decodes_to_its_output_length() -> None:
    engine = make_engine()
    req = make_request("r", "a", list(range(100)), 10, output_len=4)
    results = drive(engine, [(0.0, req)], fuse=False)
    assert [r.prefill_tokens for r in results] == [100, 0, 0, 0]
    assert [r.decode_tokens for r in results] == [1, 1, 1, 1]
    assert req.output_tokens == 4 and req.finish_s == results[-1].end_s
    assert req.first_token_s == results[0].end_s == pytest.approx(TIME.batch_time_s(100, 0))
    assert engine.stats.finished == 1 and not engine.running and engine.pool.private_tokens == 0


def test_a_repeated_prompt_is_served_from_cache_but_one_token_is_computed() -> None:
    engine = make_engine()
    first = make_request("a", "x", list(range(300)), 5, output_len=2)
    second = make_request("b", "x", list(range(300)), 5, output_len=2)
    drive(engine, [(0.0, first), (1.0, second)], fuse=False)
    assert first.cached_tokens == 0
    assert second.cached_tokens == 299
    assert engine.stats.cache_hit_rate == pytest.approx(299 / 600)


def test_output_key_is_cached_so_a_follow_up_call_hits_prompt_and_output() -> None:
    engine = make_engine()
    parent = make_request("p", "x", list(range(200)), 50, output_len=50)
    answer = list(range(1000, 1050))
    engine.submit(parent, 0.0, output_key=tokens_to_key(answer))
    drive(engine, [], fuse=True)
    child = make_request("c", "x", list(range(200)) + answer + [7, 8, 9], 5, output_len=1)
    drive(engine, [(parent.finish_s or 0.0, child)], fuse=False)
    assert child.cached_tokens == 250


def test_chunked_prefill_spreads_a_long_prompt_over_steps_under_sarathi_only() -> None:
    sarathi = make_engine(max_batch_tokens=512)
    req = make_request("r", "a", list(range(1500)), 4, output_len=1)
    results = drive(sarathi, [(0.0, req)], fuse=False)
    assert [r.prefill_tokens for r in results] == [512, 512, 476]
    orca = make_engine(max_batch_tokens=512, batching="orca")
    req = make_request("r", "a", list(range(1500)), 4, output_len=1)
    assert [r.prefill_tokens for r in drive(orca, [(0.0, req)], fuse=False)] == [1500]


def test_a_request_that_can_never_fit_is_refused_at_submission() -> None:
    engine = make_engine(kv_capacity_tokens=1000)
    with pytest.raises(ConfigError, match="needs 1100 tokens"):
        engine.submit(make_request("r", "a", list(range(1000)), 100), 0.0)
    assert not engine.has_work


def test_unknown_batching_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match=r"unknown batching 'vllm'.*sarathi"):
        EngineConfig(kv_capacity_tokens=10, max_batch_tokens=10, batching="vllm")


# --------------------------------------------------------------------------- memory
def test_requests_wait_when_memory_is_full_and_start_when_it_frees() -> None:
    engine = make_engine(kv_capacity_tokens=1100)
    a = make_request("a", "x", list(range(500)), 100, output_len=100)
    b = make_request("b", "y", list(range(1000, 1500)), 100, output_len=100)
    results = drive(engine, [(0.0, a), (0.0, b)], fuse=False)
    assert b.admit_s is not None and a.finish_s is not None and b.admit_s >= a.finish_s
    assert max(len(r.admitted) for r in results) == 1


def test_cache_is_evicted_lru_and_reported_but_running_prefixes_are_not() -> None:
    engine = make_engine(kv_capacity_tokens=2000)
    arrivals = [
        (float(i), make_request(f"r{i}", "x", list(range(i * 1000, i * 1000 + 800)), 8))
        for i in range(4)
    ]
    drive(engine, arrivals, fuse=False)
    events = engine.pool.drain_evictions()
    assert events and events[0][:4] == tokens_to_key([0])
    assert engine.pool.tree.match_len(arrivals[-1][1].prompt_key) == 800


def test_retraction_when_reservation_is_optimistic_loses_nothing() -> None:
    engine = make_engine(kv_capacity_tokens=3000, reserve_output_ratio=0.0)
    arrivals = [
        (0.0, make_request(f"r{i}", f"c{i % 2}", list(range(i * 500, i * 500 + 400)), 400))
        for i in range(6)
    ]
    results = drive(engine, arrivals, fuse=False)
    assert engine.stats.retracted > 0
    assert sum(len(r.retracted) for r in results) == engine.stats.retracted
    assert all(req.finish_s is not None and req.output_tokens == 400 for _, req in arrivals)


def test_abort_frees_a_running_request_and_tells_the_policy() -> None:
    engine = make_engine()
    req = make_request("r", "a", list(range(100)), 50, output_len=50)
    engine.submit(req, 0.0)
    engine.step(0.0)
    assert engine.abort("r", 1.0) is req
    assert engine.pool.private_tokens == 0 and engine.pool.tree.protected_tokens == 0
    assert engine.policy.snapshot()["clients"]["a"]["waiting"] == 0
    assert engine.abort("r", 1.0) is None and not engine.has_work


def test_flush_is_refused_while_requests_run() -> None:
    engine = make_engine()
    engine.submit(make_request("r", "a", list(range(100)), 50), 0.0)
    engine.step(0.0)
    assert engine.flush_cache() is False
    drive(engine, [], fuse=True)
    assert engine.flush_cache() is True and engine.pool.tree.total_tokens == 0
    assert engine.pool.drain_evictions()[-1] == b""


# --------------------------------------------------------------------------- disciplines
def test_vllm_v0_never_mixes_prefill_and_decode() -> None:
    engine = make_engine(batching="vllm-v0")
    for r in drive(engine, random_requests(3, 60), fuse=False):
        assert r.prefill_tokens == 0 or r.decode_tokens == len(r.prefilled)


def test_fastertransformer_admits_only_into_an_empty_engine() -> None:
    engine = make_engine(batching="fastertransformer")
    running_before: list[int] = []
    arrivals = random_requests(4, 60)
    now, i = 0.0, 0
    while i < len(arrivals) or engine.has_work:
        while i < len(arrivals) and arrivals[i][0] <= now:
            engine.submit(arrivals[i][1], arrivals[i][0])
            i += 1
        before = len(engine.running)
        result = engine.step(now)
        if result is None:
            now = arrivals[i][0]
            continue
        if result.admitted:
            running_before.append(before)
        now = result.end_s
    assert running_before and set(running_before) == {0}


# --------------------------------------------------------------------------- properties
@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    batching=st.sampled_from(BATCHING_DISCIPLINES),
    policy=st.sampled_from(["fcfs", "vtc", "dlpm", "lpm"]),
    capacity=st.sampled_from([4000, 20_000]),
)
def test_fused_decode_equals_step_by_step(
    seed: int, batching: str, policy: str, capacity: int
) -> None:
    finishes = []
    for fuse in (False, True):
        engine = make_engine(policy, batching=batching, kv_capacity_tokens=capacity)
        arrivals = random_requests(seed, 40)
        drive(engine, arrivals, fuse=fuse)
        finishes.append([(req.id, req.admit_s, req.finish_s) for _, req in arrivals])
    for (rid, admit_a, fin_a), (_, admit_b, fin_b) in zip(*finishes, strict=True):
        assert admit_a == pytest.approx(admit_b, abs=1e-9), rid
        assert fin_a == pytest.approx(fin_b, abs=1e-9), rid


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    batching=st.sampled_from(BATCHING_DISCIPLINES),
    ratio=st.sampled_from([0.0, 0.5, 1.0]),
)
def test_every_request_finishes_with_its_tokens(seed: int, batching: str, ratio: float) -> None:
    """Token conservation: no request is lost, each produced exactly its output length,
    and the KV pool returns to holding only the cache."""
    engine = make_engine(
        "dlpm", batching=batching, kv_capacity_tokens=3000, reserve_output_ratio=ratio
    )
    arrivals = random_requests(seed, 30)
    results = drive(engine, arrivals, fuse=True)
    assert all(req.output_tokens == req.output_len for _, req in arrivals)
    produced = sum(tokens for r in results for _, tokens in r.decoded)
    assert produced == sum(req.output_len or 0 for _, req in arrivals)
    assert engine.pool.private_tokens == engine.pool.reserved_tokens == 0
    assert engine.pool.tree.protected_tokens == 0


def admission_claim(engine: Engine, req: Request) -> int:
    """KV tokens admitting ``req`` now would claim: extend, reservation and the newly
    locked part of its cached prefix."""
    tree = engine.pool.tree
    before = tree.protected_tokens
    tree.lock(req.prompt_key)
    newly_locked = tree.protected_tokens - before
    tree.unlock(req.prompt_key)
    extend = req.input_tokens - engine.pool.cached_prefix(req)
    return extend + engine.pool.reservation(req) + newly_locked


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), policy=st.sampled_from(["vtc", "dlpm", "lpm", "fcfs"]))
def test_sarathi_is_work_conserving(seed: int, policy: str) -> None:
    """Whenever a step leaves requests waiting with token budget to spare, none of them
    would have fit in memory (the policy may reorder, never idle). DLPM runs with
    unlimited fill patience here: its default pauses the fill briefly so a blocked large
    request is not starved (tests/sched/test_local_dlpm.py)."""
    engine = make_engine(policy, strict=True, kv_capacity_tokens=6000)
    arrivals = random_requests(seed, 40)
    now, i = 0.0, 0
    while i < len(arrivals) or engine.has_work:
        while i < len(arrivals) and arrivals[i][0] <= now:
            engine.submit(arrivals[i][1], arrivals[i][0])
            i += 1
        decoding = sum(1 for s in engine.running if not s.prefilling)
        headroom = engine.pool.admission_headroom()
        needs = {id(r): admission_claim(engine, r) for r in engine.waiting}
        result = engine.step(now)
        if result is None:
            assert not engine.has_work
            now = arrivals[i][0]
            continue
        headroom -= sum(needs[id(r)] for r in result.admitted)
        spare = engine.config.max_batch_tokens - decoding - result.prefill_tokens
        if spare > 0:
            assert all(needs[id(r)] > headroom for r in engine.waiting if id(r) in needs)
        now = result.end_s
