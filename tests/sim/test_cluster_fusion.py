"""Deferred fused decode in the cluster: an arrival cuts only its own worker's planned steps.

Without fusion every decode step is simulated one by one; with it, runs of identical
decode steps are planned at once and cut when a call reaches that worker. Where no
admission is ever refused (no prefix cache refresh by refused admissions, the one effect
fused steps skip) the two must give identical records; on a cache-heavy closed-loop
workload the aggregate must agree closely.
"""

from __future__ import annotations

import dataclasses

import pytest

from fairserve.sim.cluster import SimConfig, simulate
from fairserve.sim.engine import EngineConfig
from fairserve.sim.profile import resolve_profile
from fairserve.sim.report import build_report
from fairserve.workloads.catalog import resolve_workload

PAIRS = [("dlpm", "doubleq"), ("vtc", "client-rr"), ("lpm", "round-robin"), ("fcfs", "least-load")]


def _config(policy: str, dispatch: str, kv_tokens: int, duration_s: float) -> SimConfig:
    profile = resolve_profile("a100-llama-3-8b")
    engine = EngineConfig(kv_capacity_tokens=kv_tokens, max_batch_tokens=profile.max_batch_tokens)
    return SimConfig(
        engine=engine,
        time_model=profile.batch_time(),
        workers=3,
        policy=policy,
        dispatch=dispatch,
        duration_s=duration_s,
    )


@pytest.mark.parametrize(("policy", "dispatch"), PAIRS)
def test_fused_cluster_equals_step_by_step(policy: str, dispatch: str) -> None:
    workload = resolve_workload("vtc-constant")
    fused = _config(policy, dispatch, kv_tokens=60_000, duration_s=20)
    stepwise = dataclasses.replace(fused, fuse_decode=False)
    a, b = simulate(workload, fused), simulate(workload, stepwise)
    assert a.records == b.records
    assert len(a.records) > 100
    steps = [sum(w.steps for w in r.worker_stats) for r in (a, b)]
    assert steps[0] == steps[1]


def test_fused_cluster_matches_step_by_step_on_closed_loop_trees() -> None:
    workload = resolve_workload("tot-s1")
    fused = _config("dlpm", "doubleq", kv_tokens=60_000, duration_s=20)
    a = build_report(simulate(workload, fused))
    b = build_report(simulate(workload, dataclasses.replace(fused, fuse_decode=False)))
    for key in ("tokens_per_s", "requests_per_s"):
        assert a["throughput"][key] == pytest.approx(b["throughput"][key], rel=0.02)
    assert a["cache_hit_rate"] == pytest.approx(b["cache_hit_rate"], abs=0.01)
