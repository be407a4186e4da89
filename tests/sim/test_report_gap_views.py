"""The service gap in both views, each beside the bound of the theorem that applies
(issue 17, item 4): ``max_service_gap`` counts every prompt token (the client's view),
``max_service_gap_extend`` only computed ones (the system's view, what DLPM, DoubleQ and
fairserve's VTC charge and bound)."""

from __future__ import annotations

from typing import Any

import pytest

from fairserve.sim.profile import DEFAULT_PROFILE, resolve_profile
from fairserve.sim.report import service_gap_bound
from tests.sim.runs import profile_config, report_of


def run_report(workload: str, policy: str, dispatch: str, workers: int) -> dict[str, Any]:
    profile = resolve_profile(DEFAULT_PROFILE)
    config = profile_config(
        profile, policy=policy, dispatch=dispatch, workers=workers, duration_s=60.0
    )
    return report_of(workload, config)


@pytest.mark.parametrize(
    ("policy", "dispatch", "workers", "theorem"),
    [
        ("dlpm", "round-robin", 1, "DLPM Theorem 4.1"),
        ("dlpm", "doubleq", 2, "DoubleQ Theorem 5.1"),
        ("vtc", "round-robin", 1, "VTC Theorem 4.4"),
    ],
)
def test_extend_view_gap_within_the_bound_and_below_the_client_view(
    policy: str, dispatch: str, workers: int, theorem: str
) -> None:
    report = run_report("long-qa-s1", policy, dispatch, workers)
    bound = report["service_gap_bound"]
    assert bound["theorem"].startswith(theorem) and bound["view"] == "extend"
    assert 0 < report["max_service_gap_extend"] <= bound["value"]
    # cached document tokens count in the client's view only
    assert report["max_service_gap_extend"] < report["max_service_gap"]


BASE = {"w_e": 1.0, "w_q": 2.0, "kv_capacity_tokens": 1000, "longest_input_tokens": 300}


@pytest.mark.parametrize(
    ("inputs", "value"),
    [
        ({"policy": "vtc", "workers": 1}, 2 * max(300, 2 * 1000)),
        ({"policy": "dlpm", "workers": 1, "quantum": 512.0}, 2 * (300 + 2000 + 512)),
        (
            {"policy": "dlpm", "workers": 3, "quantum": 512.0, "dispatch": "doubleq"},
            2 * 3 * (300 + 2000 + 512),
        ),
    ],
)
def test_bound_values_follow_the_theorems(inputs: dict[str, Any], value: float) -> None:
    assert service_gap_bound({**BASE, **inputs})["value"] == value


@pytest.mark.parametrize(
    ("inputs", "reason"),
    [
        ({"policy": "vtc", "workers": 2}, "one worker"),
        ({"policy": "dlpm", "workers": 2, "dispatch": "round-robin"}, "premise"),
        ({"policy": "lcf", "workers": 1}, "no lift"),
        ({"policy": "justitia", "workers": 1}, "completion delay"),
        ({"policy": "lpm", "workers": 1}, "no fairness theorem"),
    ],
)
def test_no_bound_where_no_theorem_applies_and_the_reason_says_why(
    inputs: dict[str, Any], reason: str
) -> None:
    out = service_gap_bound({**BASE, **inputs})
    assert out["value"] is None and reason in out["reason"]


def test_charge_cached_vtc_is_bounded_in_the_client_view() -> None:
    out = service_gap_bound(
        {**BASE, "policy": "vtc", "workers": 1, "policy_params": {"charge_cached": True}}
    )
    assert out["view"] == "client"
