"""The lazy decode clock equals the straightforward per-request decode.

A decoding request's output tokens, KV and reservation advance with the pool's decode
clock and are brought up to date only when read; finishes come from a heap; the policy is
charged per client from groups kept as requests join and leave. An engine whose host asks
for per-request tokens (``track_decoded``) takes the straightforward path instead: every
running request is brought up to date and grouped at every step. The two must give the
same steps, the same requests and, in a cluster, the same records.
"""

from __future__ import annotations

import dataclasses
import gc
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairserve.sim.cluster import GC_YOUNG_THRESHOLD, ClusterSim, SimConfig
from fairserve.sim.engine import BATCHING_DISCIPLINES, Engine, EngineConfig, StepResult
from fairserve.sim.profile import resolve_profile
from fairserve.sim.recorder import SimResult
from fairserve.workloads.catalog import resolve_workload
from tests.sim.test_engine import make_engine, random_requests


def assert_decode_state(engine: Engine) -> None:
    """The clock's aggregates equal what the running requests, brought up to date, say."""
    pool = engine.pool
    slots = engine.running  # brings every slot up to date
    decoding = [s for s in slots if s.decoding]
    assert pool.decoding == len(decoding)
    assert [s for s in slots if not s.decoding] == engine.running_batch.prefilling
    assert pool.private_tokens == sum(s.private_tokens for s in slots)
    assert pool.reserved_tokens == sum(s.reserved_tokens for s in slots)
    context = sum(s.prompt_tokens + s.req.output_tokens for s in decoding)
    assert engine.running_batch.context_base + len(decoding) * pool.clock == context
    groups: dict[str, set[int]] = {}
    for slot in decoding:
        groups.setdefault(slot.req.client, set()).add(id(slot.req))
    assert {c: {id(r) for r in g} for c, g in engine.running_batch.groups.items()} == groups
    assert all(s.req.output_tokens < s.target_tokens for s in decoding)  # no finish missed


def step_summary(result: StepResult) -> tuple[Any, ...]:
    return (
        result.start_s,
        result.end_s,
        result.steps,
        result.prefill_tokens,
        result.decode_tokens,
        [r.id for r in result.admitted],
        [r.id for r in result.prefilled],
        sorted(result.decoded_by_client.items()),
        [r.id for r in result.finished],
        [r.id for r in result.retracted],
    )


def run_engine(
    engine: Engine, seed: int, fuse: bool, check_every: int = 0
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Drive ``engine`` like the cluster does; checks the decode state every
    ``check_every`` steps (never with 0: reading the state brings requests up to date)."""
    arrivals = random_requests(seed, 60, clients=3)
    steps: list[tuple[Any, ...]] = []
    now, i = 0.0, 0
    while i < len(arrivals) or engine.has_work:
        while i < len(arrivals) and arrivals[i][0] <= now:
            engine.submit(arrivals[i][1], arrivals[i][0])
            i += 1
        horizon = arrivals[i][0] if i < len(arrivals) else float("inf")
        result = engine.step(now, horizon if fuse else None)
        if result is None:
            now = horizon
            continue
        steps.append(step_summary(result))
        if check_every and len(steps) % check_every == 0:
            assert_decode_state(engine)
        now = result.end_s
    requests = [
        (r.id, r.output_tokens, r.cached_tokens, r.admit_s, r.first_token_s, r.finish_s)
        for _, r in arrivals
    ]
    return steps, requests


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    batching=st.sampled_from(BATCHING_DISCIPLINES),
    policy=st.sampled_from(["vtc", "dlpm", "fcfs", "lpm"]),
    ratio=st.sampled_from([0.0, 0.3, 1.0]),
    fuse=st.booleans(),
)
def test_lazy_engine_equals_straightforward_engine(
    seed: int, batching: str, policy: str, ratio: float, fuse: bool
) -> None:
    config: dict[str, Any] = {
        "batching": batching,
        "kv_capacity_tokens": 6000,
        "reserve_output_ratio": ratio,
    }
    lazy = make_engine(policy, **config)
    lazy.track_decoded = False
    straight = make_engine(policy, **config)
    lazy_run = run_engine(lazy, seed, fuse, check_every=5)
    assert lazy_run == run_engine(straight, seed, fuse)
    assert dataclasses.astuple(lazy.stats) == dataclasses.astuple(straight.stats)
    assert lazy.policy.snapshot() == straight.policy.snapshot()
    assert_decode_state(lazy)
    assert lazy.pool.private_tokens == lazy.pool.reserved_tokens == 0


def test_reading_running_mid_decode_brings_requests_up_to_date() -> None:
    engine = make_engine("vtc")
    engine.track_decoded = False
    arrivals = random_requests(1, 10)
    for _, req in arrivals:
        engine.submit(req, 0.0)
    engine.step(0.0)  # prefill
    for _ in range(5):
        engine.step(1.0)  # decode steps, applied lazily
    produced = sum(s.req.output_tokens for s in engine.running)
    assert produced == engine.stats.decode_tokens > 0
    assert_decode_state(engine)


# --------------------------------------------------------------------------- cluster
def cluster_result(config: SimConfig, workload: str, straight: bool) -> SimResult:
    sim = ClusterSim(resolve_workload(workload), config)
    for engine in sim.engines:
        engine.track_decoded = straight
    return sim.run()


CASES = [  # (workload, policy, dispatch, batching, reserve ratio); ratio 0 retracts
    ("tot-s1", "dlpm", "doubleq", "sarathi", 1.0),
    ("vtc-constant", "vtc", "client-rr", "sarathi", 0.0),
    ("multi-turn-chat", "lpm", "cache-aware", "orca", 0.0),
    ("vtc-constant", "fcfs", "least-load", "vllm-v0", 1.0),
    ("tot-s1", "lcf", "round-robin", "fastertransformer", 1.0),
]


@pytest.mark.parametrize(("workload", "policy", "dispatch", "batching", "ratio"), CASES)
def test_lazy_cluster_equals_straightforward_cluster(
    workload: str, policy: str, dispatch: str, batching: str, ratio: float
) -> None:
    profile = resolve_profile("a100-llama-3-8b")
    engine = EngineConfig(
        kv_capacity_tokens=10_000 if ratio < 1 else 60_000,
        max_batch_tokens=profile.max_batch_tokens,
        batching=batching,
        reserve_output_ratio=ratio,
    )
    config = SimConfig(
        engine=engine,
        time_model=profile.batch_time(),
        workers=3,
        policy=policy,
        dispatch=dispatch,
        duration_s=12,
        seed=5,
    )
    lazy = cluster_result(config, workload, straight=False)
    straight = cluster_result(config, workload, straight=True)
    assert len(lazy.records) > 20
    assert lazy.records == straight.records
    assert lazy.samples == straight.samples
    assert lazy.service == straight.service
    assert lazy.worker_stats == straight.worker_stats
    assert lazy.unfinished == straight.unfinished
    if ratio < 1:
        assert sum(s.retracted for s in lazy.worker_stats) > 0


def test_simulation_collects_cycles_rarely_and_restores_the_collector() -> None:
    """The event loop raises the young-generation threshold (it makes no cycles but keeps
    many objects) and puts the host's thresholds back afterwards."""
    profile = resolve_profile("a100-llama-3-8b")
    engine = EngineConfig(kv_capacity_tokens=60_000, max_batch_tokens=profile.max_batch_tokens)
    config = SimConfig(engine=engine, time_model=profile.batch_time(), workers=2, duration_s=5)
    before = gc.get_threshold()
    during: list[int] = []
    ClusterSim(resolve_workload("vtc-constant"), config).run(
        lambda _done_s, _total_s: during.append(gc.get_threshold()[0])
    )
    assert during and min(during) >= GC_YOUNG_THRESHOLD > before[0]
    assert gc.get_threshold() == before
