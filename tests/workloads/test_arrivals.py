"""Arrival processes: rates, windows and phases come out as configured (loose statistics)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fairserve.workloads.arrivals import ArrivalSpec, arrival_times


def times(
    spec: ArrivalSpec, start_s: float = 0.0, stop_s: float = 200.0, seed: int = 1
) -> list[float]:
    return list(arrival_times(spec, np.random.default_rng(seed), start_s, stop_s))


@pytest.mark.parametrize(
    "spec",
    [
        ArrivalSpec("poisson", 50.0, "poisson"),
        ArrivalSpec("gamma", 50.0, "gamma", cv=2.0),
        ArrivalSpec("gamma", 50.0, "gamma", cv=0.3),
        ArrivalSpec("uniform", 50.0, "uniform"),
    ],
)
def test_rate_matches_over_a_long_window(spec: ArrivalSpec) -> None:
    got = times(spec, stop_s=400.0)
    assert len(got) == pytest.approx(50.0 * 400, rel=0.1)
    assert got == sorted(got)
    assert got[0] >= 0 and got[-1] < 400


@pytest.mark.parametrize("cv", [0.5, 1.0, 2.0])
def test_gamma_gaps_have_the_configured_variation(cv: float) -> None:
    gaps = np.diff(times(ArrivalSpec("gamma", 20.0, "gamma", cv=cv), stop_s=1000.0))
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.15)


def test_uniform_is_evenly_spaced_from_the_window_start() -> None:
    got = times(ArrivalSpec("uniform", 4.0, "uniform"), start_s=10.0, stop_s=12.0)
    assert got == [10.0, 10.25, 10.5, 10.75, 11.0, 11.25, 11.5, 11.75]


def test_on_off_sends_only_while_on_at_the_on_rate() -> None:
    spec = ArrivalSpec("on-off", 30.0, "poisson", on_s=10.0, off_s=20.0)
    got = np.array(times(spec, start_s=5.0, stop_s=905.0))
    phase = (got - 5.0) % 30.0
    assert (phase < 10.0).all()
    assert len(got) == pytest.approx(30.0 * 10 * 30, rel=0.1)  # 30 on phases of 10 s
    assert spec.mean_rate_per_s == pytest.approx(10.0)


def test_on_off_with_uniform_spacing_restarts_each_phase() -> None:
    spec = ArrivalSpec("on-off", 1.0, "uniform", on_s=2.0, off_s=3.0)
    assert times(spec, stop_s=11.0) == [0.0, 1.0, 5.0, 6.0, 10.0]


def test_ramp_rate_rises_linearly_then_stays() -> None:
    spec = ArrivalSpec("ramp", 10.0, "poisson", rate_end_per_s=50.0, ramp_s=200.0)
    got = np.array(times(spec, stop_s=300.0))
    first, second = (got < 100).sum(), ((got >= 100) & (got < 200)).sum()
    assert first == pytest.approx(100 * 20, rel=0.1)  # mean rate 20/s over [0, 100)
    assert second == pytest.approx(100 * 40, rel=0.1)  # mean rate 40/s over [100, 200)
    assert (got >= 200).sum() == pytest.approx(100 * 50, rel=0.1)


def test_ramp_from_zero_and_down_to_zero() -> None:
    up = np.array(times(ArrivalSpec("ramp", 0.0, "uniform", rate_end_per_s=2.0, ramp_s=100.0)))
    assert len(up[up < 100]) == pytest.approx(100, abs=2)  # integral of 2t/100 over 100 s
    assert (np.diff(up[up < 100]) > 0).all()
    down = times(ArrivalSpec("ramp", 2.0, "uniform", rate_end_per_s=0.0, ramp_s=100.0))
    assert len(down) == pytest.approx(100, abs=2)
    assert down[-1] <= 100  # no arrivals once the rate reaches zero


@given(
    kind=st.sampled_from(["poisson", "gamma", "uniform", "on-off", "ramp"]),
    rate=st.floats(0.1, 50.0),
    start_s=st.floats(0.0, 50.0),
    length_s=st.floats(0.0, 50.0),
    seed=st.integers(0, 2**32),
)
def test_times_are_increasing_and_inside_the_window(
    kind: str, rate: float, start_s: float, length_s: float, seed: int
) -> None:
    spacing = kind if kind in ("poisson", "gamma", "uniform") else "gamma"
    spec = ArrivalSpec(
        kind, rate, spacing, cv=1.5, on_s=1.0, off_s=2.0, rate_end_per_s=rate / 3, ramp_s=20.0
    )
    got = times(spec, start_s, start_s + length_s, seed)
    assert all(start_s <= t < start_s + length_s for t in got)
    assert all(a <= b for a, b in itertools.pairwise(got))
