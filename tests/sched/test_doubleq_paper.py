"""What docs/paper-table.md says about DoubleQ's long-QA rows, checked on the simulator.

At the default ``Q^w`` no long-QA client spends its quantum on its cached worker within the
300 s of arrivals, so DoubleQ's worker choices are exactly cache-aware's, and what differs
from the cache-aware baseline is the local policy (DLPM against LPM), not the dispatch: the
table's long-QA S2 row says why DLPM cannot beat LPM there. If a change to either dispatcher
breaks this, the table's explanation is stale and must be redone.

Long-QA S1 throughput, every call served (the table's measure: the same work over the time
it takes), is at least cache-aware's and twice VTC + client round robin's.
"""

from __future__ import annotations

from typing import Any

import pytest

from fairserve.sim.cluster import ClusterSim, SimConfig
from fairserve.sim.profile import resolve_profile
from fairserve.sim.recorder import SimResult
from fairserve.sim.report import build_report
from fairserve.workloads import load_builtin

PROFILE = "a10g-llama-3.2-3b"
WORKERS = 4


def result(workload: str, policy: str, dispatch: str, drain: bool = False) -> SimResult:
    profile = resolve_profile(PROFILE)
    config = SimConfig(
        engine=profile.engine_config("sarathi"),
        time_model=profile.batch_time(),
        policy=policy,
        dispatch=dispatch,
        workers=WORKERS,
        drain=drain,
    )
    return ClusterSim(load_builtin(workload), config).run()


def records(workload: str, policy: str, dispatch: str) -> list[Any]:
    return list(result(workload, policy, dispatch).records)


@pytest.mark.slow
@pytest.mark.parametrize(("workload", "policy"), [("long-qa-s1", "dlpm"), ("long-qa-s2", "lpm")])
def test_default_doubleq_dispatches_long_qa_as_cache_aware_does(workload: str, policy: str) -> None:
    doubleq = records(workload, policy, "doubleq")
    cache_aware = records(workload, policy, "cache-aware")
    assert len(doubleq) > 1000
    assert doubleq == cache_aware


@pytest.mark.slow
def test_default_doubleq_serves_long_qa_s1_at_least_as_fast_as_cache_aware() -> None:
    def service_per_s(policy: str, dispatch: str) -> float:
        report = build_report(result("long-qa-s1", policy, dispatch, drain=True))
        assert report["conservation"]["unfinished"] == 0
        return float(report["throughput"]["service_per_s"])

    doubleq = service_per_s("dlpm", "doubleq")
    assert doubleq >= service_per_s("lpm", "cache-aware")  # measured 1.010x
    assert doubleq >= 2 * service_per_s("vtc", "client-rr")  # measured 2.07x
