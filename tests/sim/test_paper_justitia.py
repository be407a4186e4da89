"""Justitia (§V) reproduced by the simulator on the paper's application mix.

The paper (Llama-2-7B on one A100-40GB, 300 applications, 3x intensity): average completion
time 57.5% below VTC's, 92% of applications finish no later than under VTC, and Theorem 1's
worst-case delay ``f_j − f̄_j ≤ 2·c_max + C_max/M``. The built-in ``justitia-mix`` stands in
for the suite; one worker with a ~45,000-token KV pool (an A100-40GB's with Llama-2-7B),
run until every application finished. Justitia gets the simulator's oracle cost.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

import pytest

from fairserve.sim.cluster import ClusterSim
from fairserve.sim.profile import resolve_profile
from fairserve.workloads import load_builtin
from tests.sim.runs import profile_config

KV_TOKENS = 45_000
"""(40 GiB x 0.9 - 13.5 GB of fp16 weights) / 0.5 MiB per token: Llama-2-7B on A100-40GB."""


@dataclass(frozen=True)
class Outcome:
    completion_s: dict[str, float]
    """Per application (program id): start to the end of its last call."""
    policy: dict[str, Any]
    """The worker's policy snapshot at the end."""
    programs: int


@cache
def outcome(policy: str, **params: Any) -> Outcome:
    config = profile_config(
        resolve_profile("a100-llama-2-7b"),
        kv_capacity_tokens=KV_TOKENS,
        policy=policy,
        dispatch="round-robin",
        workers=1,
        drain=True,
        policy_params=params,
    )
    sim = ClusterSim(load_builtin("justitia-mix"), config)
    result = sim.run()
    assert sum(result.programs_unfinished.values()) == 0
    return Outcome(
        {r.app: r.completion_s for r in result.programs},
        sim.engines[0].policy.snapshot(),
        len(result.programs),
    )


@pytest.mark.slow
def test_average_completion_time_well_below_vtc() -> None:
    justitia, vtc = outcome("justitia"), outcome("vtc")
    assert justitia.completion_s.keys() == vtc.completion_s.keys()
    mean_j = sum(justitia.completion_s.values()) / len(justitia.completion_s)
    mean_v = sum(vtc.completion_s.values()) / len(vtc.completion_s)
    assert mean_j < 0.5 * mean_v  # paper: -57.5%; measured -61%


@pytest.mark.slow
def test_most_applications_finish_no_later_than_under_vtc() -> None:
    justitia, vtc = outcome("justitia"), outcome("vtc")
    apps = justitia.completion_s
    no_later = sum(1 for a, t in apps.items() if t <= vtc.completion_s[a])
    assert no_later / len(apps) >= 0.85  # paper: 92%; measured 97%


@pytest.mark.slow
def test_worst_case_delay_within_theorem_1() -> None:
    delay = outcome("justitia").policy["delay"]
    assert delay["apps"] == outcome("justitia").programs
    assert delay["late_apps"] > 0  # the bound is exercised, not vacuous
    assert delay["max_delay_iterations"] <= delay["bound_iterations"]
    # Tighter than the paper's (which counts c_max, a KV token-time, as a duration):
    # measured, the delay stays within the largest application's C_max / M alone.
    assert delay["max_delay_iterations"] <= delay["max_app_cost"] / KV_TOKENS


@pytest.mark.slow
def test_an_application_is_one_over_all_its_calls() -> None:
    """Each program opens exactly one application (the defect: 300 programs became 975
    applications, reopened whenever their calls momentarily all finished)."""
    justitia = outcome("justitia")
    assert justitia.policy["apps_opened"] == justitia.programs
    assert justitia.policy["apps_total"] == 0  # all ended with their programs


@pytest.mark.slow
def test_online_predictor_measured_against_the_oracle() -> None:
    oracle = outcome("justitia")
    online = outcome("justitia", predictor="moving-average")
    assert oracle.policy["prediction"]["mean_relative_error"] == pytest.approx(0.0, abs=1e-9)
    error = online.policy["prediction"]["mean_relative_error"]
    assert online.policy["prediction"]["apps"] == online.programs
    assert 0.0 < error < 5.0  # a per-type moving average (measured 1.78); the paper's MLP: 0.53
