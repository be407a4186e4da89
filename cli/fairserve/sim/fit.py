"""Fit the piecewise-linear batch-time model ``t(b) = c + a·max(0, b − b0)`` to timings.

The throughput-optimal batching paper (DESIGN §1) models a forward step as memory-bound
(constant ``c``) up to ``b0`` tokens and compute-bound (``a`` seconds per extra token) above.
Both the shipped profiles (derived from published per-operator timings) and ``fairserve
profile`` (timings measured on a live worker) need the same fit, so it lives here, numpy only.

For a fixed ``b0`` the model is linear in ``(c, a)``, so the fit is a grid search over
``b0`` with closed-form least squares at each candidate, then an exhaustive integer search
around the best candidate. Candidates whose least-squares ``c`` or ``a`` is negative are
skipped: a negative step time or a batch that gets faster with more tokens is not a profile.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
from numpy.typing import NDArray

from fairserve.core.errors import ConfigError

# Coarse candidates spread evenly over the load range, on top of the observed loads.
_COARSE_STEPS = 256
_MIN_POINTS = 3
# Around the best coarse candidate every integer is tried, up to this many.
_FINE_MAX = 1024

FloatArray = NDArray[np.float64]


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
    candidates = _coarse_candidates(x)
    best = _best(x, y, candidates)
    if best is None:
        return _flat(x, y)
    index = int(np.searchsorted(candidates, best[2]))
    low = candidates[max(0, index - 1)]
    high = candidates[min(len(candidates) - 1, index + 1)]
    fine = np.unique(np.floor(np.linspace(low, high, int(min(high - low, _FINE_MAX)) + 1)))
    refined = _best(x, y, fine)
    c_s, a_s, b0 = refined if refined is not None else best
    return PiecewiseLinearFit(c_s, a_s, int(b0), _r2(x, y, c_s, a_s, b0), int(x.size))


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


def _coarse_candidates(x: FloatArray) -> FloatArray:
    """Integer ``b0`` values below the largest load (above it the slope is undetermined)."""
    top = float(x.max())
    grid = np.linspace(0.0, top, _COARSE_STEPS + 1)
    values = np.unique(np.floor(np.concatenate([grid, x, [0.0]])))
    return values[values < top]


def _best(x: FloatArray, y: FloatArray, b0s: FloatArray) -> tuple[float, float, float] | None:
    """``(c, a, b0)`` with the least squared error among ``b0s``, or None if none is valid."""
    hinge = np.maximum(0.0, x[None, :] - b0s[:, None])
    h_mean = hinge.mean(axis=1)
    y_mean = float(y.mean())
    h_centred = hinge - h_mean[:, None]
    h_var = np.einsum("ij,ij->i", h_centred, h_centred)
    covariance = h_centred @ (y - y_mean)
    with np.errstate(divide="ignore", invalid="ignore"):
        slope = np.where(h_var > 0, covariance / h_var, np.nan)
    intercept = y_mean - slope * h_mean
    residual = y[None, :] - intercept[:, None] - slope[:, None] * hinge
    sse = np.einsum("ij,ij->i", residual, residual)
    valid = np.isfinite(slope) & (slope >= 0) & (intercept >= 0)
    if not np.any(valid):
        return None
    i = int(np.argmin(np.where(valid, sse, np.inf)))
    return float(intercept[i]), float(slope[i]), float(b0s[i])


def _flat(x: FloatArray, y: FloatArray) -> PiecewiseLinearFit:
    """Times that do not grow with load: a constant step time, flat up to the largest load."""
    c_s = float(y.mean())
    b0 = float(x.max())
    return PiecewiseLinearFit(c_s, 0.0, int(b0), _r2(x, y, c_s, 0.0, b0), int(x.size))


def _r2(x: FloatArray, y: FloatArray, c_s: float, a_s: float, b0: float) -> float:
    predicted = c_s + a_s * np.maximum(0.0, x - b0)
    sse = float(np.sum((y - predicted) ** 2))
    sst = float(np.sum((y - y.mean()) ** 2))
    if sst == 0.0:
        return 1.0 if math.isclose(sse, 0.0, abs_tol=1e-30) else 0.0
    return max(0.0, 1.0 - sse / sst)
