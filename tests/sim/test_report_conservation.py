"""Every submitted call is accounted for at the end of a run (issue 17, item 5).

``finished + unfinished + rejected = submitted`` per client, whatever the policy, batching
or end of the run: a call that finished inside a step still in flight at the end (its
``STEP_DONE`` lies past the end) was finished by the engine but not yet seen by the clients,
so it is unfinished, not lost."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from fairserve.sched.registry import dispatchers, local_policies
from fairserve.sim.engine import BATCHING_DISCIPLINES
from fairserve.sim.profile import DEFAULT_PROFILE, resolve_profile
from tests.sim.runs import profile_config, report_of

RUNS = [
    ("vtc-poisson-short-long", "vtc", "round-robin", {}, 1, "sarathi", 37.3),
    ("long-qa-s1", "dlpm", "doubleq", {}, 2, "sarathi", 23.9),
    ("tot-s1", "lpm", "cache-aware", {}, 2, "orca", 31.7),
    ("vtc-constant", "rpm", "round-robin", {"limit_per_min": 20}, 1, "sarathi", 41.1),
    ("multi-turn-chat", "fcfs", "least-load", {}, 2, "vllm-v0", 29.5),
]


def run_report(
    workload: str,
    policy: str,
    dispatch: str,
    params: dict[str, Any],
    workers: int,
    batching: str,
    duration_s: float,
    drain: bool = False,
) -> dict[str, Any]:
    config = profile_config(
        resolve_profile(DEFAULT_PROFILE),
        batching=batching,
        policy=policy,
        dispatch=dispatch,
        workers=workers,
        policy_params=params,
        duration_s=duration_s,
        drain=drain,
    )
    return report_of(workload, config)


@pytest.mark.parametrize("run", RUNS, ids=[f"{r[0]}-{r[1]}" for r in RUNS])
def test_finished_unfinished_rejected_add_up_to_submitted(run: tuple[Any, ...]) -> None:
    report = run_report(*run)
    for name, client in report["clients"].items():
        accounted = client["requests"] + client["unfinished"] + client["rejected"]
        assert accounted == client["submitted"], name
    assert report["conservation"]["holds"] is True
    if run[1] == "rpm":  # the limit keeps the load light: rejections, nothing left open
        assert report["conservation"]["rejected"] > 0
    else:  # cut while busy: calls still open, some in a step that ends after the run
        assert report["conservation"]["unfinished"] > 0


FAST_WORKLOADS = ["vtc-poisson-short-long", "long-qa-s1", "tot-s1", "multi-turn-chat", "judge"]


# No shrinking: a failing run is printed as generated (shrinking simulations takes minutes).
@settings(max_examples=20, phases=[Phase.explicit, Phase.generate])
@given(
    workload=st.sampled_from(FAST_WORKLOADS),
    policy=st.sampled_from(local_policies()),
    dispatch=st.sampled_from(dispatchers()),
    batching=st.sampled_from(BATCHING_DISCIPLINES),
    workers=st.integers(1, 3),
    duration_s=st.floats(3.0, 25.0),
    drain=st.booleans(),
)
def test_conservation_in_every_report(
    workload: str,
    policy: str,
    dispatch: str,
    batching: str,
    workers: int,
    duration_s: float,
    drain: bool,
) -> None:
    params = {"limit_per_min": 30} if policy == "rpm" else {}
    report = run_report(workload, policy, dispatch, params, workers, batching, duration_s, drain)
    conservation = report["conservation"]
    assert conservation["holds"], conservation
    assert conservation["finished"] == sum(c["requests"] for c in report["clients"].values())
    if drain:
        assert conservation["unfinished"] == 0
