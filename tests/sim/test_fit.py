"""The piecewise-linear fit: recovers known coefficients, survives noise, rejects bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fairserve.core.errors import ConfigError
from fairserve.sim.fit import PiecewiseLinearFit, fit_batch_time, fit_piecewise_linear

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


def test_constant_times_are_flat_up_to_the_largest_load() -> None:
    """No slope, no knee: like falling times, the profile is flat over the whole range."""
    fit = fit_piecewise_linear([1, 2, 3, 4], [0.2, 0.2, 0.2, 0.2])

    assert (fit.a_s_per_token, fit.b0_tokens) == (0.0, 4)


def test_single_step_runs_are_the_piecewise_fit() -> None:
    rng = np.random.default_rng(11)
    times = np.array(hinge(VIDUR_LIKE_LOADS, 0.01, 6.5e-5, 300)) * rng.normal(1, 0.01, 187)

    runs = [((float(load), 1),) for load in VIDUR_LIKE_LOADS]
    general = fit_batch_time(runs, times)
    piecewise = fit_piecewise_linear(VIDUR_LIKE_LOADS, times)

    assert general.attention_s_per_token == 0.0
    assert (general.constant_s, general.a_s_per_token, general.b0_tokens, general.r2) == (
        piecewise.c_s,
        piecewise.a_s_per_token,
        piecewise.b0_tokens,
        piecewise.r2,
    )


def _run_rows(
    runs: list[tuple[tuple[float, int], ...]], contexts: list[float], attention_s: float
) -> tuple[np.ndarray, np.ndarray]:
    """Mean step time and mean context of each run under c=0.01, a=4e-5, b0=256."""
    means, mean_contexts = [], []
    for run, context in zip(runs, contexts, strict=True):
        steps = sum(n for _, n in run)
        total = sum(n * (0.01 + 4e-5 * max(0.0, load - 256)) for load, n in run)
        means.append(total / steps + attention_s * context / steps)
        mean_contexts.append(context / steps)
    return np.array(means), np.array(mean_contexts)


RUNS: list[tuple[tuple[float, int], ...]] = [
    *(((float(load), 1),) for load in (8, 64, 128, 256, 512, 1024, 2048, 4096)),
    ((32.0, 20),),
    ((300.0, 10),),
    ((16.0, 3), (1040.0, 1)),
]
CONTEXTS = [0.0] * 8 + [20 * 5000.0, 10 * 60_000.0, 4 * 2000.0]


def test_runs_with_context_recover_the_attention_term() -> None:
    y, x = _run_rows(RUNS, CONTEXTS, 2e-7)

    fit = fit_batch_time(RUNS, y, x)

    assert fit.b0_tokens == 256
    assert fit.constant_s == pytest.approx(0.01, rel=1e-9)
    assert fit.a_s_per_token == pytest.approx(4e-5, rel=1e-9)
    assert fit.attention_s_per_token == pytest.approx(2e-7, rel=1e-6)
    assert max(abs(r) for r in fit.residuals_s) < 1e-12


def test_times_falling_with_context_pin_attention_at_zero() -> None:
    y, x = _run_rows(RUNS, CONTEXTS, -1e-8)

    fit = fit_batch_time(RUNS, y, x)

    assert fit.attention_s_per_token == 0.0
    assert fit.a_s_per_token > 0 and fit.constant_s > 0
