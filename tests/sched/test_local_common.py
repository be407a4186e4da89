"""Properties every local policy keeps: work conservation, honest accounting, no starvation,
and loud errors for bad settings."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given

from fairserve.core.cost import kv_token_time
from fairserve.core.errors import ConfigError
from fairserve.core.types import Request
from fairserve.sched.local.base import LocalPolicy
from fairserve.sched.registry import make_local_policy
from tests.fakes.factories import prefix_request
from tests.sched.local_workloads import run_workload, workloads

POLICIES: dict[str, dict[str, Any]] = {
    "fcfs": {},
    "lpm": {},
    # The memory (fill) patience trades strict work conservation for no starvation of
    # large requests (tested in test_local_memory_bound and test_local_dlpm); unlimited
    # patience is the strict setting.
    "vtc": {"memory_patience": 10**9},
    "lcf": {"memory_patience": 10**9},
    "dlpm": {"fill_patience": 10**9},
    "rpm": {"limit_per_min": 100_000},
    "justitia": {"memory_patience": 10**9},  # the paper's vLLM admission waits (0)
    # Preble admits from one priority group per step; filling from the others is the
    # strict setting (its no-starvation bound: test_local_preble)
    "preble": {"fill_other_groups": True},
}
WITH_QUANTUM = {"dlpm"}


def build(name: str, **extra: Any) -> LocalPolicy:
    return make_local_policy(name, **{**POLICIES[name], **extra})


def expected_service(name: str, finished: list[Request], extend: int, decoded: int) -> float:
    """What the policy must have charged: KV token-time for Justitia, tokens otherwise."""
    if name == "justitia":
        return sum(kv_token_time(r.input_tokens, r.output_tokens) for r in finished)
    return 1.0 * extend + 2.0 * decoded


@pytest.mark.parametrize("name", sorted(POLICIES))
@given(arrivals=workloads())
def test_work_conserving_conserving_and_starvation_free(
    name: str, arrivals: list[tuple[int, Request]]
) -> None:
    engine = run_workload(build(name), arrivals)
    # never idle with work that fits (the engine checks after every select)
    assert engine.idle_with_fitting_work == 0
    # every request finished, within a bound once arrivals stopped: work conservation runs
    # at least one request while any waits, so the tail is at most all outputs in series
    assert len(engine.finished) == len(arrivals)
    last_arrival = max(step for step, _ in arrivals)
    serial_steps = sum(req.expected_output_tokens for _, req in arrivals) + len(arrivals)
    assert engine.now - last_arrival <= serial_steps
    # the policy charged exactly the service the engine processed
    charged = sum(engine.policy.service.values())
    want = expected_service(name, engine.finished, engine.extend_total, engine.decoded_total)
    assert math.isclose(charged, want, rel_tol=1e-9)
    # per client too, against the engine's independent record
    if name != "justitia":
        for client, served in engine.served.items():
            assert math.isclose(engine.policy.service[client], served, rel_tol=1e-9)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_unknown_parameter_is_an_error(name: str) -> None:
    with pytest.raises(ConfigError, match="unknown parameter"):
        build(name, quantm=5)


@pytest.mark.parametrize("name", sorted(POLICIES))
@pytest.mark.parametrize("weight", [0, -1.0, math.nan, math.inf])
def test_bad_weights_are_refused(name: str, weight: float) -> None:
    with pytest.raises(ConfigError, match="weight"):
        build(name, weights={"a": weight})
    policy = build(name)
    with pytest.raises(ConfigError, match="weight"):
        policy.set_weight("a", weight)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_quantum_only_where_there_is_one(name: str) -> None:
    policy = build(name)
    if name in WITH_QUANTUM:
        policy.set_quantum(100.0)
        assert policy.quantum == 100.0
        for bad in (0, -5.0, math.nan):
            with pytest.raises(ConfigError, match="quantum"):
                policy.set_quantum(bad)
        assert policy.quantum == 100.0  # a refused value changes nothing
    else:
        assert policy.quantum is None
        with pytest.raises(ConfigError, match="no quantum"):
            policy.set_quantum(100.0)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_snapshot_is_json_after_traffic(name: str) -> None:
    reqs = [
        (s, prefix_request(f"r{s}", f"c{s % 3}", s % 2, 32, 8, 4, app=f"a{s % 4}"))
        for s in range(12)
    ]
    engine = run_workload(build(name), reqs)
    snap = engine.policy.snapshot()
    json.dumps(snap)
    assert snap["policy"] == name
    assert set(snap["clients"]) == {"c0", "c1", "c2"}
