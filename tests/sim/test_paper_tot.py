"""Paper result (c), measured part: tree-of-thought S2 on 4 workers (DoubleQ paper, Fig. 9
testbed: 4 A10G GPUs, a 3B model, one client with 10x longer questions).

DoubleQ+DLPM keeps each tree on the worker that caches it while the per-worker deficits
keep clients apart; client-rr+VTC scatters a tree's calls over every worker and recomputes
their long shared contexts. The issue asks for >= 1.5x throughput: over tot-s2's own 300 s
this measures 1.535x. Shorter runs understate it, because both start with cold caches and
the warm-up weighs more (1.44x over 120 s). DoubleQ at its default ``Q^w`` (2^23; the old
default 2048 spread a tree after two calls and gave ~1.05x here).
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from fairserve.sim.cluster import SimConfig, simulate
from fairserve.sim.engine import EngineConfig
from fairserve.sim.profile import resolve_profile
from fairserve.sim.report import build_report
from fairserve.workloads.catalog import builtin_text
from fairserve.workloads.synthetic import loads_workload

PROFILE = "a10g-llama-3.2-3b"
WORKERS = 4
DURATION_S = 300  # tot-s2's own duration


def tot_s2_for_4_workers() -> str:
    """tot-s2 (sized for 2 workers) with every client's tree rate doubled."""

    def double(match: re.Match[str]) -> str:
        return f"rate_per_s = {float(match.group(1)) * 2}"

    return re.sub(r"(?m)^rate_per_s = ([0-9.]+)$", double, builtin_text("tot-s2"))


def run(policy: str, dispatch: str, **extra: Any) -> dict[str, Any]:
    profile = resolve_profile(PROFILE)
    engine = EngineConfig(
        kv_capacity_tokens=profile.kv_capacity_tokens, max_batch_tokens=profile.max_batch_tokens
    )
    config = SimConfig(
        engine=engine,
        time_model=profile.batch_time(),
        workers=WORKERS,
        policy=policy,
        dispatch=dispatch,
        duration_s=DURATION_S,
        seed=1,
        **extra,
    )
    workload = loads_workload(tot_s2_for_4_workers(), "<test>/tot-s2-4w.toml")
    return build_report(simulate(workload, config))


def good_p99_s(report: dict[str, Any]) -> float:
    return float(
        max(c["latency_p99_s"] for n, c in report["clients"].items() if n.startswith("good"))
    )


@pytest.mark.slow
@pytest.mark.timeout(900)  # two 300 s runs of 4 workers: ~100 s alone, ~260 s on a busy box
def test_c_doubleq_dlpm_beats_scattering_and_keeps_good_clients_fast() -> None:
    doubleq = run("dlpm", "doubleq")  # at its defaults
    vtc_rr = run("vtc", "client-rr")
    cache_aware = run("lpm", "cache-aware")
    rr_lpm = run("lpm", "round-robin")
    ratio = doubleq["throughput"]["service_per_s"] / vtc_rr["throughput"]["service_per_s"]
    assert ratio >= 1.5, ratio
    assert doubleq["cache_hit_rate"] > vtc_rr["cache_hit_rate"] + 0.2
    assert doubleq["jain_index"] >= 0.95
    assert good_p99_s(doubleq) < good_p99_s(cache_aware)
    assert good_p99_s(doubleq) < good_p99_s(rr_lpm)
