"""DoubleQ at its defaults on long-context QA S1, the paper's testbed (4 workers, A10G, a 3B
model): throughput at least twice VTC + client round-robin's, and well-behaved clients' p99
below cache-aware's and RR+LPM's. The other misbehaving scenarios are rows of
docs/paper-table.md (scripts/paper_table.py), too slow for every test run."""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest

from fairserve.sim.cluster import SimConfig, simulate
from fairserve.sim.engine import EngineConfig
from fairserve.sim.profile import resolve_profile
from fairserve.sim.report import build_report
from fairserve.workloads import load_builtin

PROFILE = "a10g-llama-3.2-3b"


@cache
def run(policy: str, dispatch: str) -> dict[str, Any]:
    profile = resolve_profile(PROFILE)
    engine = EngineConfig(
        kv_capacity_tokens=profile.kv_capacity_tokens,
        max_batch_tokens=profile.max_batch_tokens,
        max_running_requests=profile.max_running_requests,
    )
    config = SimConfig(
        engine=engine, time_model=profile.batch_time(), policy=policy, dispatch=dispatch,
        workers=4,
    )  # fmt: skip
    return build_report(simulate(load_builtin("long-qa-s1"), config))


def good_p99_s(report: dict[str, Any]) -> float:
    return max(
        float(c["latency_p99_s"]) for n, c in report["clients"].items() if n.startswith("good")
    )


@pytest.mark.slow
def test_doubleq_defaults_double_vtc_throughput_on_long_qa_s1() -> None:
    doubleq, vtc = run("dlpm", "doubleq"), run("vtc", "client-rr")
    ratio = doubleq["throughput"]["service_per_s"] / vtc["throughput"]["service_per_s"]
    assert ratio >= 2.0, ratio  # measured 2.10 (paper: up to 2.87)
    cache_aware = run("lpm", "cache-aware")["throughput"]["service_per_s"]
    # within 1% of cache-aware's (the paper: at or above it; see docs/paper-table.md)
    assert doubleq["throughput"]["service_per_s"] >= 0.99 * cache_aware


@pytest.mark.slow
def test_doubleq_defaults_keep_good_clients_faster_than_locality_baselines() -> None:
    doubleq = good_p99_s(run("dlpm", "doubleq"))
    assert doubleq < good_p99_s(run("lpm", "cache-aware"))  # measured 1.3x lower
    assert 2 * doubleq < good_p99_s(run("lpm", "round-robin"))  # measured 4.7x lower
