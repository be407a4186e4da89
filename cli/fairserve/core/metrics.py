"""Fairness and latency metrics shared by the simulator, the router, bench and tests.

* :func:`jain_index` — Jain's fairness index over per-client (weighted) service rates.
* :func:`max_service_gap` — the largest ``|W_f(t1,t2) − W_g(t1,t2)|`` between two clients
  that are *continuously backlogged* over ``[t1, t2]`` (VTC Def. 4.2, DLPM Thm 4.1),
  computed from a sampled service history in O(samples × pairs).
* :func:`backlogged_vs_other_gap` — ``W_g − W_f`` where ``f`` is continuously backlogged and
  ``g`` is anyone (DLPM Thm 4.2).
* :func:`windowed_service_rates` — service per second per client over sliding windows.
* :func:`percentile` — linear-interpolated percentiles without numpy.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from fairserve.core.errors import ConfigError


def jain_index(values: Iterable[float]) -> float:
    """``(Σx)² / (n·Σx²)``: 1 when all equal, 1/n when one client gets everything.

    An empty input or all zeros is perfectly fair (1.0): nobody got anything."""
    xs = [float(v) for v in values]
    if any(x < 0 or not math.isfinite(x) for x in xs):
        raise ConfigError("jain_index needs finite non-negative numbers")
    squares = sum(x * x for x in xs)
    if not xs or squares == 0:
        return 1.0
    return sum(xs) ** 2 / (len(xs) * squares)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) with linear interpolation; NaN for no values."""
    if not 0 <= q <= 100:
        raise ConfigError(f"percentile must be within 0..100, got {q}")
    if not values:
        return math.nan
    xs = sorted(values)
    rank = (len(xs) - 1) * q / 100
    lo = math.floor(rank)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (rank - lo)


@dataclass(frozen=True, slots=True, init=False)
class ServiceSample:
    """Cumulative service per client at time ``t_s`` and who was backlogged then.

    A client is backlogged at a sample when it had a request waiting in the queue; a pair
    is continuously backlogged over ``[t_i, t_j]`` when both were backlogged at every sample
    from ``i`` to ``j``.

    The names are kept as a sorted tuple (:attr:`names`), not a set: a router keeps ~600
    samples of hundreds of names, and a frozenset is a container the garbage collector
    tracks and walks in every full collection, while a tuple of strings is untracked by
    the first collection that sees it (issue 18). :attr:`backlogged` is the set view for
    membership tests; loops over the names read :attr:`names` (no set built)."""

    t_s: float
    cumulative: Mapping[str, float]
    names: tuple[str, ...]
    """The backlogged clients, sorted, each once."""

    def __init__(self, t_s: float, cumulative: Mapping[str, float], backlogged: Iterable[str]):
        object.__setattr__(self, "t_s", t_s)
        object.__setattr__(self, "cumulative", cumulative)
        unique = backlogged if isinstance(backlogged, (set, frozenset)) else set(backlogged)
        object.__setattr__(self, "names", tuple(sorted(unique)))

    @property
    def backlogged(self) -> frozenset[str]:
        """The backlogged clients as a set (built on each call: for membership tests)."""
        return frozenset(self.names)


@dataclass(frozen=True, slots=True)
class ServiceGap:
    """The largest service difference found and where (``clients`` None when none)."""

    value: float
    clients: tuple[str, str] | None = None
    t1_s: float | None = None
    t2_s: float | None = None


def max_service_gap(samples: Sequence[ServiceSample]) -> ServiceGap:
    """Largest ``|ΔW_f − ΔW_g|`` over intervals where ``f`` and ``g`` stay backlogged.

    For a pair, ``D(t) = W_f(t) − W_g(t)``; over a run of samples where both are backlogged
    the worst interval is ``max D − min D`` within the run, found in one pass."""
    _check_ordered(samples)
    best = ServiceGap(0.0)
    open_runs: dict[tuple[str, str], tuple[float, float, float, float]] = {}
    for sample in samples:
        active = sample.names
        still_open: dict[tuple[str, str], tuple[float, float, float, float]] = {}
        for i, f in enumerate(active):
            for g in active[i + 1 :]:
                d = sample.cumulative.get(f, 0.0) - sample.cumulative.get(g, 0.0)
                lo, lo_t, hi, hi_t = open_runs.get((f, g), (d, sample.t_s, d, sample.t_s))
                if d < lo:
                    lo, lo_t = d, sample.t_s
                if d > hi:
                    hi, hi_t = d, sample.t_s
                still_open[(f, g)] = (lo, lo_t, hi, hi_t)
                if hi - lo > best.value:
                    best = ServiceGap(hi - lo, (f, g), min(lo_t, hi_t), max(lo_t, hi_t))
        open_runs = still_open
    return best


def backlogged_vs_other_gap(samples: Sequence[ServiceSample]) -> ServiceGap:
    """Largest ``W_g(t1,t2) − W_f(t1,t2)`` with ``f`` continuously backlogged, ``g`` any client.

    DLPM Theorem 4.2 bounds it by ``2·(U + Q^u)``: a backlogged client never falls behind a
    non-backlogged one by more than that."""
    _check_ordered(samples)
    clients = sorted({c for s in samples for c in s.cumulative})
    best = ServiceGap(0.0)
    # For each f, runs where f is backlogged; within a run track min over t1 of D_g(t1) where
    # D_g(t) = W_g(t) − W_f(t), and maximise D_g(t2) − min D_g(t1).
    mins: dict[tuple[str, str], tuple[float, float]] = {}
    for sample in samples:
        next_mins: dict[tuple[str, str], tuple[float, float]] = {}
        for f in sample.names:
            wf = sample.cumulative.get(f, 0.0)
            for g in clients:
                if g == f:
                    continue
                d = sample.cumulative.get(g, 0.0) - wf
                low, low_t = mins.get((f, g), (d, sample.t_s))
                if d - low > best.value:
                    best = ServiceGap(d - low, (g, f), low_t, sample.t_s)
                next_mins[(f, g)] = (d, sample.t_s) if d < low else (low, low_t)
        mins = next_mins
    return best


def windowed_service_rates(
    events: Iterable[tuple[float, str, float]], window_s: float, end_s: float | None = None
) -> dict[str, list[float]]:
    """Service per second per client in consecutive windows of ``window_s`` seconds.

    ``events`` are ``(t_s, client, service)``; windows start at 0. Returns one list per
    client, all of the same length (windows with no service are 0)."""
    if window_s <= 0 or not math.isfinite(window_s):
        raise ConfigError(f"window_s must be a positive number, got {window_s}")
    if end_s is not None and (end_s < 0 or not math.isfinite(end_s)):
        raise ConfigError(f"end_s must be a non-negative number, got {end_s}")
    items = list(events)
    if not items and end_s is None:
        return {}
    horizon = max([t for t, _, _ in items] + [end_s or 0.0])
    count = max(1, math.ceil(horizon / window_s) if horizon > 0 else 1)
    if end_s is None and horizon > 0 and horizon % window_s == 0:
        count += 1
    rates: dict[str, list[float]] = {}
    for t_s, client, service in items:
        if t_s < 0:
            raise ConfigError(f"event time must be >= 0, got {t_s}")
        row = rates.setdefault(client, [0.0] * count)
        index = min(int(t_s // window_s), count - 1)
        row[index] += service / window_s
    return rates


def sample_at(samples: Sequence[ServiceSample], t_s: float) -> ServiceSample:
    """The last sample at or before ``t_s`` (the first one if none); ``samples`` ordered."""
    lo, hi = 0, len(samples) - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if samples[mid].t_s <= t_s:
            lo = mid
        else:
            hi = mid - 1
    return samples[lo]


def _check_ordered(samples: Sequence[ServiceSample]) -> None:
    for a, b in itertools.pairwise(samples):
        if b.t_s < a.t_s:
            raise ConfigError("service samples must be in time order")
