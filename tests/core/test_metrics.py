"""Fairness metrics against numpy and brute-force references over every interval."""

from __future__ import annotations

import gc
import math
from collections.abc import Callable, Sequence
from itertools import combinations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairserve.core.errors import ConfigError
from fairserve.core.metrics import (
    ServiceGap,
    ServiceSample,
    backlogged_vs_other_gap,
    jain_index,
    max_service_gap,
    percentile,
    windowed_service_rates,
)

PROPERTY = settings(max_examples=80, derandomize=True, deadline=None)
CLIENTS = ("a", "b", "c", "d")


# --------------------------------------------------------------------------- jain
def test_jain_index_extremes() -> None:
    assert jain_index([3.0, 3.0, 3.0, 3.0]) == pytest.approx(1.0)
    assert jain_index([0.0, 7.0, 0.0, 0.0]) == pytest.approx(1 / 4)
    assert jain_index([1.0, 3.0]) == pytest.approx(16 / 20)
    assert jain_index([]) == 1.0
    assert jain_index([0.0, 0.0]) == 1.0  # nobody got anything: nobody was treated worse


@PROPERTY
@given(
    values=st.lists(st.floats(0, 1e6), min_size=1, max_size=20),
    scale=st.floats(1e-3, 1e3),
)
def test_jain_index_is_scale_invariant_and_bounded(values: list[float], scale: float) -> None:
    index = jain_index(values)
    assert 1 / len(values) - 1e-12 <= index <= 1 + 1e-12
    assert jain_index([v * scale for v in values]) == pytest.approx(index, rel=1e-9)


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf])
def test_jain_index_rejects_bad_values(bad: float) -> None:
    with pytest.raises(ConfigError, match="jain_index"):
        jain_index([1.0, bad])


# --------------------------------------------------------------------------- percentile
@PROPERTY
@given(
    values=st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=40),
    q=st.floats(0, 100),
)
def test_percentile_matches_numpy_linear(values: list[float], q: float) -> None:
    expected = float(np.percentile(values, q, method="linear"))
    assert percentile(values, q) == pytest.approx(expected, rel=1e-9, abs=1e-6)


def test_percentile_edges() -> None:
    assert math.isnan(percentile([], 50))
    assert percentile([5.0], 99) == 5.0
    assert percentile([4.0, 1.0, 3.0, 2.0], 0) == 1.0
    assert percentile([4.0, 1.0, 3.0, 2.0], 100) == 4.0
    assert percentile([1.0, 2.0], 50) == 1.5


@pytest.mark.parametrize("q", [-0.1, 100.1, math.nan])
def test_percentile_rejects_q_outside_0_100(q: float) -> None:
    with pytest.raises(ConfigError, match="percentile"):
        percentile([1.0], q)


# --------------------------------------------------------------------------- service gaps
@st.composite
def histories(draw: st.DrawFn) -> list[ServiceSample]:
    """Sample histories: cumulative service never decreases, backlog sets come and go."""
    count = draw(st.integers(0, 12))
    totals = dict.fromkeys(CLIENTS, 0.0)
    samples = []
    for i in range(count):
        for client in CLIENTS:
            totals[client] += draw(st.integers(0, 20))
        present = draw(st.sets(st.sampled_from(CLIENTS)))
        backlogged = draw(st.sets(st.sampled_from(CLIENTS)))
        cumulative = {c: totals[c] for c in CLIENTS if c in present or totals[c] == 0}
        samples.append(ServiceSample(float(i), cumulative, frozenset(backlogged)))
    return samples


def served(sample: ServiceSample, client: str) -> float:
    return sample.cumulative.get(client, 0.0)


def brute_pair_gap(samples: list[ServiceSample]) -> float:
    """max |ΔW_f − ΔW_g| over every interval [i, j] where f and g are backlogged throughout."""
    best = 0.0
    for f, g in combinations(CLIENTS, 2):
        for i in range(len(samples)):
            for j in range(i, len(samples)):
                if not all({f, g} <= s.backlogged for s in samples[i : j + 1]):
                    break
                df = served(samples[j], f) - served(samples[i], f)
                dg = served(samples[j], g) - served(samples[i], g)
                best = max(best, abs(df - dg))
    return best


def brute_backlogged_gap(samples: list[ServiceSample]) -> float:
    """max ΔW_g − ΔW_f over every interval where f alone is backlogged throughout."""
    best = 0.0
    for f in CLIENTS:
        for g in CLIENTS:
            if f == g:
                continue
            for i in range(len(samples)):
                for j in range(i, len(samples)):
                    if not all(f in s.backlogged for s in samples[i : j + 1]):
                        break
                    gained = served(samples[j], g) - served(samples[i], g)
                    best = max(best, gained - (served(samples[j], f) - served(samples[i], f)))
    return best


def interval(samples: list[ServiceSample], t1: float | None, t2: float | None) -> tuple[int, int]:
    assert t1 is not None and t2 is not None
    times = [s.t_s for s in samples]
    i, j = times.index(t1), times.index(t2)
    assert i <= j
    return i, j


# Note on "present": a client missing from ``cumulative`` counts as 0 service, so the
# generator only drops clients that have not been served yet (a real history never forgets).


@PROPERTY
@given(samples=histories())
def test_max_service_gap_matches_brute_force(samples: list[ServiceSample]) -> None:
    gap = max_service_gap(samples)
    assert gap.value == brute_pair_gap(samples)
    if gap.value == 0:
        return
    assert gap.clients is not None
    f, g = gap.clients
    i, j = interval(samples, gap.t1_s, gap.t2_s)
    assert all({f, g} <= s.backlogged for s in samples[i : j + 1])
    df = served(samples[j], f) - served(samples[i], f)
    dg = served(samples[j], g) - served(samples[i], g)
    assert abs(df - dg) == gap.value


@PROPERTY
@given(samples=histories())
def test_backlogged_vs_other_gap_matches_brute_force(samples: list[ServiceSample]) -> None:
    gap = backlogged_vs_other_gap(samples)
    assert gap.value == brute_backlogged_gap(samples)
    if gap.value == 0:
        return
    assert gap.clients is not None
    g, f = gap.clients  # (ahead, backlogged)
    i, j = interval(samples, gap.t1_s, gap.t2_s)
    assert all(f in s.backlogged for s in samples[i : j + 1])
    dg = served(samples[j], g) - served(samples[i], g)
    df = served(samples[j], f) - served(samples[i], f)
    assert dg - df == gap.value


def test_gap_only_counts_while_both_are_backlogged() -> None:
    """b is not backlogged at t=2, so no interval of the pair spans it."""
    ab, a = frozenset({"a", "b"}), frozenset({"a"})
    samples = [
        ServiceSample(0.0, {"a": 0, "b": 0}, ab),
        ServiceSample(1.0, {"a": 5, "b": 0}, ab),
        ServiceSample(2.0, {"a": 50, "b": 0}, a),
        ServiceSample(3.0, {"a": 52, "b": 10}, ab),
    ]
    gap = max_service_gap(samples)  # a got 5 more over [0, 1]; from t=3 on a new run
    assert (gap.value, gap.clients, gap.t1_s, gap.t2_s) == (5.0, ("a", "b"), 0.0, 1.0)
    # a stays backlogged throughout: b gains 10 vs a's 2 over [2, 3]
    other = backlogged_vs_other_gap(samples)
    assert (other.value, other.clients, other.t1_s, other.t2_s) == (8.0, ("b", "a"), 2.0, 3.0)


def test_a_sample_owns_no_tracked_object_after_a_collection() -> None:
    """The router keeps ~600 samples of ~400 backlogged names each: a frozenset per sample
    is a tracked container the collector walks in every full collection (issue 18); a
    tuple of names is untracked by the first collection that sees it. The set view stays."""
    sample = ServiceSample(0.0, {"b": 1.0, "a": 2.0}, frozenset({"b", "a"}))
    gc.collect()
    owned = [o for o in gc.get_referents(sample) if not isinstance(o, type)]
    assert [o for o in owned if gc.is_tracked(o)] == []
    assert sample.backlogged == frozenset({"a", "b"})
    assert sample == ServiceSample(0.0, {"a": 2.0, "b": 1.0}, ["a", "b", "a"])


@pytest.mark.parametrize("gap", [max_service_gap, backlogged_vs_other_gap])
def test_gaps_reject_unordered_samples(
    gap: Callable[[Sequence[ServiceSample]], ServiceGap],
) -> None:
    samples = [ServiceSample(1.0, {}, frozenset()), ServiceSample(0.5, {}, frozenset())]
    with pytest.raises(ConfigError, match="time order"):
        gap(samples)


# --------------------------------------------------------------------------- windowed rates
events_strategy = st.lists(
    st.tuples(st.floats(0, 100), st.sampled_from(CLIENTS), st.floats(0, 1000)), max_size=40
)


@PROPERTY
@given(events=events_strategy, window_s=st.floats(0.05, 30), end_s=st.none() | st.floats(0, 200))
def test_windowed_rates_preserve_total_service(
    events: list[tuple[float, str, float]], window_s: float, end_s: float | None
) -> None:
    rates = windowed_service_rates(events, window_s, end_s)
    assert len({len(row) for row in rates.values()}) <= 1  # one row length for everyone
    for client in CLIENTS:
        total = sum(service for _, c, service in events if c == client)
        row = rates.get(client, [])
        assert sum(rate * window_s for rate in row) == pytest.approx(total, rel=1e-9, abs=1e-9)
        assert (client in rates) == any(c == client for _, c, _ in events)


def test_windowed_rates_put_events_in_their_window() -> None:
    events = [(0.0, "a", 10.0), (0.9, "a", 10.0), (1.0, "b", 4.0), (2.5, "a", 1.0)]
    rates = windowed_service_rates(events, window_s=1.0, end_s=4.0)
    assert rates == {"a": [20.0, 0.0, 1.0, 0.0], "b": [0.0, 4.0, 0.0, 0.0]}
    assert windowed_service_rates([], 1.0) == {}


@pytest.mark.parametrize("window_s", [0.0, -1.0, math.nan, math.inf])
def test_windowed_rates_reject_bad_window(window_s: float) -> None:
    with pytest.raises(ConfigError, match="window_s"):
        windowed_service_rates([(0.0, "a", 1.0)], window_s)


def test_windowed_rates_reject_negative_times() -> None:
    with pytest.raises(ConfigError, match="event time"):
        windowed_service_rates([(-0.5, "a", 1.0)], 1.0)
    with pytest.raises(ConfigError, match="end_s"):
        windowed_service_rates([(0.5, "a", 1.0)], 1.0, end_s=-1.0)
