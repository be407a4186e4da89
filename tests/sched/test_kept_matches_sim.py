"""Kept match lengths change no decision: simulated records with the tree's kept matches
equal those of a tree that walks for every match (issue 23: the simulator's records stay
identical). Small KV capacities so that evictions, splits and refused admissions happen."""

from __future__ import annotations

import pytest

from fairserve.core.radix import RadixTree
from fairserve.sim.cluster import SimConfig, simulate
from fairserve.sim.engine import EngineConfig
from fairserve.sim.profile import resolve_profile
from fairserve.sim.recorder import SimResult
from fairserve.workloads.catalog import resolve_workload

CASES = [
    ("tot-s1", "dlpm", "doubleq", 20_000),
    ("vtc-constant", "lpm", "cache-aware", 30_000),
    ("vtc-constant", "vtc", "round-robin", 30_000),
]


def _run(workload: str, policy: str, dispatch: str, kv_tokens: int) -> SimResult:
    profile = resolve_profile("a100-llama-3-8b")
    engine = EngineConfig(kv_capacity_tokens=kv_tokens, max_batch_tokens=profile.max_batch_tokens)
    config = SimConfig(
        engine=engine,
        time_model=profile.batch_time(),
        workers=2,
        policy=policy,
        dispatch=dispatch,
        duration_s=15,
    )
    return simulate(resolve_workload(workload), config)


@pytest.mark.parametrize(("workload", "policy", "dispatch", "kv_tokens"), CASES)
def test_records_equal_a_tree_that_walks_every_match(
    workload: str, policy: str, dispatch: str, kv_tokens: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    kept = _run(workload, policy, dispatch, kv_tokens)
    monkeypatch.setattr(RadixTree, "match_len", RadixTree.match_len_walk)
    walked = _run(workload, policy, dispatch, kv_tokens)
    assert len(kept.records) > 50
    assert kept.records == walked.records
