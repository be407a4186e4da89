"""The piecewise-linear fit: recovers known coefficients, survives noise, rejects bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fairserve.core.errors import ConfigError
from fairserve.sim.fit import PiecewiseLinearFit, fit_piecewise_linear

# Token loads spaced like published profiling sweeps: dense at the bottom, sparse at the top.
VIDUR_LIKE_LOADS = [1, 2, 4, 8, *range(16, 512, 8), *range(512, 8193, 64)]


def hinge(loads: list[int], c_s: float, a_s: float, b0: int) -> list[float]:
    return [c_s + a_s * max(0, b - b0) for b in loads]


def test_recovers_exact_coefficients_on_a_data_point() -> None:
    times = hinge(VIDUR_LIKE_LOADS, 0.01, 6.5e-5, 64)

    fit = fit_piecewise_linear(VIDUR_LIKE_LOADS, times)

    assert fit.b0_tokens == 64
    assert fit.c_s == pytest.approx(0.01, rel=1e-9)
    assert fit.a_s_per_token == pytest.approx(6.5e-5, rel=1e-9)
    assert fit.r2 == pytest.approx(1.0)
    assert fit.points == len(VIDUR_LIKE_LOADS)


def test_recovers_a_knee_between_data_points() -> None:
    loads = list(range(0, 4097, 256))  # the knee at 1000 is between 768 and 1024
    fit = fit_piecewise_linear(loads, hinge(loads, 0.02, 1e-4, 1000))

    assert fit.b0_tokens == 1000
    assert fit.c_s == pytest.approx(0.02, rel=1e-9)
    assert fit.a_s_per_token == pytest.approx(1e-4, rel=1e-9)


def test_unpacks_like_a_tuple() -> None:
    c_s, a_s, b0, r2, points = fit_piecewise_linear([0, 10, 20, 30], [1.0, 1.0, 2.0, 3.0])

    assert (c_s, a_s, b0, points) == pytest.approx((1.0, 0.1, 10, 4))
    assert r2 == pytest.approx(1.0)


def test_noisy_timings_fit_closely() -> None:
    rng = np.random.default_rng(7)
    clean = np.array(hinge(VIDUR_LIKE_LOADS, 0.01, 6.5e-5, 128))
    noisy = clean * rng.normal(1.0, 0.01, clean.size)

    fit = fit_piecewise_linear(VIDUR_LIKE_LOADS, noisy)

    assert fit.a_s_per_token == pytest.approx(6.5e-5, rel=0.02)
    assert fit.c_s == pytest.approx(0.01, rel=0.1)
    assert abs(fit.b0_tokens - 128) < 64
    assert fit.r2 > 0.99


def test_repeated_loads_count_as_points() -> None:
    loads = [1, 1, 100, 100, 150, 150, 200, 200]
    fit = fit_piecewise_linear(loads, hinge(loads, 1.0, 0.01, 100))

    assert fit.points == 8
    assert fit.b0_tokens == 100


def test_linear_from_zero_puts_the_knee_at_zero() -> None:
    loads = [0, 100, 200, 400]
    fit = fit_piecewise_linear(loads, hinge(loads, 0.5, 0.001, 0))

    assert fit == pytest.approx(PiecewiseLinearFit(0.5, 0.001, 0, 1.0, 4))


def test_constant_times_give_zero_slope() -> None:
    fit = fit_piecewise_linear([1, 2, 3, 4], [0.2, 0.2, 0.2, 0.2])

    assert fit.a_s_per_token == 0.0
    assert fit.c_s == pytest.approx(0.2)


def test_times_falling_with_load_give_a_flat_profile_not_a_negative_slope() -> None:
    fit = fit_piecewise_linear([1, 2, 3, 4], [0.4, 0.3, 0.2, 0.1])

    assert fit.a_s_per_token == 0.0
    assert fit.c_s == pytest.approx(0.25)
    assert fit.r2 == 0.0


@given(
    c_s=st.floats(1e-4, 1.0),
    a_s=st.floats(1e-7, 1e-2),
    b0=st.integers(8, 4000),
    extra=st.lists(st.integers(0, 8192), max_size=30),
)
def test_recovers_any_hinge_without_noise(
    c_s: float, a_s: float, b0: int, extra: list[int]
) -> None:
    # Two loads on each side of the knee pin down both pieces.
    loads = sorted({0, b0 // 2, b0, b0 + 100, b0 + 2000, *extra})
    fit = fit_piecewise_linear(loads, hinge(loads, c_s, a_s, b0))

    assert fit.c_s == pytest.approx(c_s, rel=1e-6)
    assert fit.a_s_per_token == pytest.approx(a_s, rel=1e-6)
    assert fit.b0_tokens == b0
    assert fit.r2 == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("loads", "times", "expected"),
    [
        ([1, 2, 3], [0.1, 0.2], "length"),
        ([1, 2], [0.1, 0.2], "at least 3 points"),
        ([1, 2, math.nan], [0.1, 0.2, 0.3], "finite"),
        ([1, 2, 3], [0.1, math.inf, 0.3], "finite"),
        ([-1, 2, 3], [0.1, 0.2, 0.3], "non-negative"),
        ([1, 2, 3], [0.1, -0.2, 0.3], "non-negative"),
        ([5, 5, 5], [0.1, 0.2, 0.3], "two distinct loads"),
    ],
)
def test_rejects_unusable_input(loads: list[float], times: list[float], expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        fit_piecewise_linear(loads, times)
