"""Length and duration distributions: clamped whole tokens, configured means."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fairserve.workloads.dists import Constant, LogNormal, Uniform, draw_floats, draw_ints


@given(
    mean=st.floats(1.0, 1e5),
    cv=st.floats(0.0, 3.0),
    low=st.integers(0, 50),
    span=st.integers(0, 10_000),
    floor=st.integers(0, 5),
    seed=st.integers(0, 2**32),
)
def test_lognormal_draws_stay_within_clamps(
    mean: float, cv: float, low: int, span: int, floor: int, seed: int
) -> None:
    dist = LogNormal(mean, cv, low, low + span)
    got = draw_ints(dist, np.random.default_rng(seed), 200, floor)
    assert got.dtype == np.int64
    assert got.min() >= max(low, floor)
    assert got.max() <= max(low + span, floor)


@given(low=st.integers(0, 100), span=st.integers(0, 100), seed=st.integers(0, 2**32))
def test_uniform_integers_cover_both_ends(low: int, span: int, seed: int) -> None:
    got = draw_ints(Uniform(low, low + span), np.random.default_rng(seed), 5000, 0)
    assert got.min() >= low and got.max() <= low + span
    if span <= 10:
        assert set(got.tolist()) == set(range(low, low + span + 1))


@pytest.mark.parametrize(("mean", "cv"), [(256.0, 0.5), (56.0, 1.0), (8000.0, 0.3)])
def test_lognormal_mean_and_cv(mean: float, cv: float) -> None:
    got = LogNormal(mean, cv).sample(np.random.default_rng(3), 200_000)
    assert got.mean() == pytest.approx(mean, rel=0.03)
    assert got.std() / got.mean() == pytest.approx(cv, rel=0.1)


def test_constant_and_floor() -> None:
    rng = np.random.default_rng(0)
    assert draw_ints(Constant(7), rng, 3, 1).tolist() == [7, 7, 7]
    assert draw_ints(Constant(0), rng, 2, 1).tolist() == [1, 1]
    assert draw_ints(Constant(0), rng, 2, 0).tolist() == [0, 0]


def test_real_uniform_and_non_negative_durations() -> None:
    got = draw_floats(Uniform(0.5, 2.5, integer=False), np.random.default_rng(1), 1000)
    assert got.min() >= 0.5 and got.max() <= 2.5
    assert len(set(got.tolist())) > 900
    assert draw_floats(LogNormal(5.0, 1.0, 0.0, math.inf), np.random.default_rng(1), 99).min() >= 0
