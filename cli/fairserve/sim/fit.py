"""Fit the batch-time model ``t = K + a·max(0, b − b0) + attention·context`` to timings.

The throughput-optimal batching paper (DESIGN §1) models a forward step as memory-bound
(constant ``K``) up to ``b0`` tokens and compute-bound (``a`` seconds per extra token) above;
``fairserve profile`` adds attention's cost per context token read. The shipped profiles
(:func:`fit_piecewise_linear`, derived from published per-operator timings, no attention
term) and ``fairserve profile`` (:mod:`fairserve.profiling.fit`, runs of steps measured on a
live worker) both fit through :func:`fit_batch_time`, so there is one fitter, numpy only.

A regression row is a *run* of steps at known loads with its mean step time (and mean
context): ``mean_step = K + a·h(b0) + attention·x`` with ``h`` the run's mean hinge. A single
timed step is a run of one. For a fixed ``b0`` the model is linear in ``(K, a, attention)``,
so the fit is a grid search over ``b0`` with closed-form least squares at each candidate
(vectorised over the candidates), then an exhaustive integer search around the best one.

Coefficients are kept non-negative by also solving with ``a`` and/or ``attention`` pinned at
zero and keeping the best valid solution: a negative step time, or a step that gets faster
with more tokens, is not a profile. When the best has no slope (the times do not grow with
load) the knee is put at the largest load: flat all the way.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from numpy.typing import NDArray

from fairserve.core.errors import ConfigError

_MIN_POINTS = 3
# The search: coarse candidates spread evenly over the load range, on top of the observed
# loads; then every integer around the best coarse candidate, up to this many.
COARSE_STEPS = 256
FINE_MAX = 1024
# A slope that adds less than this fraction of K over the whole load range is rounding error.
_NEGLIGIBLE = 1e-9

FloatArray = NDArray[np.float64]
Run = Sequence[tuple[float, int]]
"""``(token_load, steps_at_that_load)`` pairs: one regression row."""


@dataclass(frozen=True)
class BatchTimeFit:
    """Fitted coefficients (seconds, tokens) and how well they explain the rows."""

    constant_s: float
    """``K``: what one step costs below ``b0`` with no context."""
    a_s_per_token: float
    b0_tokens: int
    attention_s_per_token: float
    r2: float
    points: int
    residuals_s: tuple[float, ...]
    """Measured minus fitted mean step time, one per row, in input order."""

    @property
    def rms_residual_s(self) -> float:
        values = np.asarray(self.residuals_s)
        return float(np.sqrt(np.mean(values**2))) if values.size else 0.0

    def step_s(self, load_tokens: float, context_tokens: float = 0.0) -> float:
        hinge = max(0.0, load_tokens - self.b0_tokens)
        return (
            self.constant_s
            + self.a_s_per_token * hinge
            + self.attention_s_per_token * context_tokens
        )


class PiecewiseLinearFit(NamedTuple):
    """Fitted coefficients, in the units of ``PiecewiseLinearBatchTime``, and fit quality."""

    c_s: float
    a_s_per_token: float
    b0_tokens: int
    r2: float
    points: int


def fit_piecewise_linear(
    loads: Sequence[float] | FloatArray, times: Sequence[float] | FloatArray
) -> PiecewiseLinearFit:
    """Least-squares fit of ``t = c + a·max(0, b − b0)`` over integer ``b0``.

    ``loads`` are token loads per step and ``times`` the measured step seconds, one pair
    per measurement (repeated loads are fine and weigh the fit like any other point).
    """
    x, y = _checked(loads, times)
    fit = fit_batch_time([((load, 1),) for load in x.tolist()], y)
    return PiecewiseLinearFit(fit.constant_s, fit.a_s_per_token, fit.b0_tokens, fit.r2, fit.points)


def fit_batch_time(
    runs: Sequence[Run],
    mean_step_s: FloatArray,
    mean_context_tokens: FloatArray | None = None,
    *,
    coarse_steps: int = COARSE_STEPS,
    fine_max: int = FINE_MAX,
) -> BatchTimeFit:
    """Least-squares fit over rows ``runs`` (see the module docstring); no attention term
    when ``mean_context_tokens`` is None. The caller has checked the input: finite,
    non-negative, and at least two distinct loads."""
    rows = _Rows.of(runs, mean_step_s, mean_context_tokens)
    coarse = _candidates(rows.distinct_loads, coarse_steps)
    best = rows.best(coarse)
    index = int(np.searchsorted(coarse, best.b0))
    low, high = coarse[max(0, index - 1)], coarse[min(len(coarse) - 1, index + 1)]
    fine = np.unique(np.floor(np.linspace(low, high, int(min(high - low, fine_max)) + 1)))
    refined = rows.best(fine)
    chosen = refined if refined.sse <= best.sse else best
    k, a, attention = chosen.coefficients
    top = float(rows.distinct_loads[-1])
    if a * (top - chosen.b0) <= _NEGLIGIBLE * k:
        a = 0.0  # a rounding-error slope: the data are flat
    b0 = chosen.b0 if a > 0 else top
    if a == 0.0:  # refit K and attention with the hinge gone
        k, _, attention = rows.best(np.array([top])).coefficients
    return rows.result(k, a, b0, attention)


@dataclass(frozen=True)
class _Candidate:
    b0: float
    coefficients: tuple[float, float, float]
    sse: float


@dataclass(frozen=True)
class _Rows:
    """The regression rows, flattened: entry ``e`` is ``counts[e]`` steps at ``loads[e]``
    in row ``row_of[e]``; ``starts`` is where each row's entries begin."""

    loads: FloatArray
    counts: FloatArray
    starts: NDArray[np.intp]
    steps: FloatArray
    y: FloatArray
    x: FloatArray
    distinct_loads: FloatArray

    @classmethod
    def of(cls, runs: Sequence[Run], y: FloatArray, x: FloatArray | None) -> _Rows:
        sizes = np.array([len(run) for run in runs], dtype=np.intp)
        loads = np.array([load for run in runs for load, _ in run], dtype=np.float64)
        counts = np.array([n for run in runs for _, n in run], dtype=np.float64)
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.intp)
        steps = np.add.reduceat(counts, starts)
        context = np.zeros(len(runs)) if x is None else np.asarray(x, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64)
        return cls(loads, counts, starts, steps, y, context, np.unique(loads))

    def hinge(self, b0s: FloatArray) -> FloatArray:
        """Mean hinge ``max(0, load − b0)`` of each row (columns) at each ``b0`` (rows)."""
        per_entry = self.counts * np.maximum(0.0, self.loads[None, :] - b0s[:, None])
        summed: FloatArray = np.add.reduceat(per_entry, self.starts, axis=1)
        return summed / self.steps

    def best(self, b0s: FloatArray) -> _Candidate:
        """The valid least-squares solution with the least squared error over ``b0s`` and
        the four ways of pinning ``a`` and ``attention`` (K alone is always valid)."""
        coefficients, sse = _solutions(self.hinge(b0s), self.x, self.y)
        valid = np.all(np.isfinite(coefficients) & (coefficients >= 0), axis=-1)
        flat = np.where(valid, sse, np.inf).ravel()  # b0-major: ties go to the lower b0
        i = int(np.argmin(flat))
        b0_index, subset = divmod(i, sse.shape[1])
        k, a, attention = (float(v) for v in coefficients[b0_index, subset])
        return _Candidate(float(b0s[b0_index]), (k, a, attention), float(flat[i]))

    def result(self, k: float, a: float, b0: float, attention: float) -> BatchTimeFit:
        hinge = self.hinge(np.array([b0]))[0]
        residuals = self.y - (k + a * hinge + attention * self.x)
        return BatchTimeFit(
            constant_s=k,
            a_s_per_token=a,
            b0_tokens=int(b0),
            attention_s_per_token=attention,
            r2=_r2(self.y, residuals),
            points=int(self.y.size),
            residuals_s=tuple(float(r) for r in residuals),
        )


def _solutions(hinge: FloatArray, x: FloatArray, y: FloatArray) -> tuple[FloatArray, FloatArray]:
    """``(K, a, attention)`` and the squared error for each ``b0`` (rows of ``hinge``) and
    each subset: both slopes free, ``attention`` pinned, ``a`` pinned, both pinned.

    Closed form on centred columns (the constant absorbs the means); a subset whose
    columns do not vary gives NaN, which the caller treats as invalid."""
    y_mean = float(y.mean())
    y_centred = y - y_mean
    h_mean = hinge.mean(axis=1)
    h_centred = hinge - h_mean[:, None]
    x_mean = float(x.mean())
    x_centred = x - x_mean
    hh = np.einsum("ij,ij->i", h_centred, h_centred)
    hy = h_centred @ y_centred
    hx = h_centred @ x_centred
    xx = float(x_centred @ x_centred)
    xy = float(x_centred @ y_centred)
    n = hinge.shape[0]
    with np.errstate(divide="ignore", invalid="ignore"):
        det = hh * xx - hx * hx
        both_a = np.where(det > 0, (xx * hy - hx * xy) / det, np.nan)
        both_x = np.where(det > 0, (hh * xy - hx * hy) / det, np.nan)
        only_a = np.where(hh > 0, hy / hh, np.nan)
        only_x = np.full(n, xy / xx if xx > 0 else np.nan)
    zero = np.zeros(n)
    slopes_a = np.stack([both_a, only_a, zero, zero], axis=1)
    slopes_x = np.stack([both_x, zero, only_x, zero], axis=1)
    intercept = y_mean - slopes_a * h_mean[:, None] - slopes_x * x_mean
    residual = (
        y[None, None, :]
        - intercept[:, :, None]
        - slopes_a[:, :, None] * hinge[:, None, :]
        - slopes_x[:, :, None] * x[None, None, :]
    )
    sse = np.einsum("ijk,ijk->ij", residual, residual)
    return np.stack([intercept, slopes_a, slopes_x], axis=-1), sse


def _checked(
    loads: Sequence[float] | FloatArray, times: Sequence[float] | FloatArray
) -> tuple[FloatArray, FloatArray]:
    x = np.asarray(loads, dtype=np.float64).ravel()
    y = np.asarray(times, dtype=np.float64).ravel()
    if x.size != y.size:
        raise ConfigError(f"fit: loads and times differ in length ({x.size} vs {y.size})")
    if x.size < _MIN_POINTS:
        raise ConfigError(f"fit: expected at least {_MIN_POINTS} points, got {x.size}")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        raise ConfigError("fit: loads and times must be finite numbers")
    if np.any(x < 0) or np.any(y < 0):
        raise ConfigError("fit: loads and times must be non-negative")
    if np.unique(x).size < 2:
        raise ConfigError("fit: expected at least two distinct loads")
    return x, y


def _candidates(distinct_loads: FloatArray, steps: int) -> FloatArray:
    """Integer ``b0`` values below the largest load (above it the slope is undetermined)."""
    top = float(distinct_loads[-1])
    grid = np.linspace(0.0, top, steps + 1)
    values = np.unique(np.floor(np.concatenate([grid, distinct_loads, [0.0]])))
    return values[values < top]


def _r2(y: FloatArray, residuals: FloatArray) -> float:
    sse = float(np.sum(residuals**2))
    sst = float(np.sum((y - y.mean()) ** 2))
    if sst == 0.0:
        return 1.0 if math.isclose(sse, 0.0, abs_tol=1e-30) else 0.0
    return min(1.0, max(0.0, 1.0 - sse / sst))
