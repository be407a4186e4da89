"""Fit the batch-time model to a sweep: ``t = K + a·max(0, b − b0) + attention·context``.

``K`` is the constant part of a step: the memory-bound cost ``c`` plus the per-step overhead
(scheduling, sampling, launches). Step timings cannot tell the two apart (both are paid once
per step whatever its load), so the fit estimates ``K`` and the caller splits it with a
known overhead (``fairserve profile --step-overhead-s``); by default all of it is ``c``,
which gives the simulator exactly the same step times.

Each observation is a run of steps with known loads (:mod:`~fairserve.profiling.observations`);
dividing its totals by its step count gives one row ``mean_step = K + a·h(b0) + attention·x``
with ``h`` the mean hinge and ``x`` the mean context. For a fixed ``b0`` that is linear least
squares in ``(K, a, attention)``; ``b0`` is found by a coarse grid over the load range, then
every integer around the best coarse value (DESIGN §1: grid over b0 + least squares).
Coefficients are kept non-negative by also trying the fits with ``a`` and/or ``attention``
pinned at zero and keeping the best valid one: a step that gets faster with more tokens is
not a profile.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import product

import numpy as np
from numpy.typing import NDArray

from fairserve.core.errors import ConfigError
from fairserve.profiling.observations import Observation

FloatArray = NDArray[np.float64]
_COARSE_STEPS = 128
_FINE_MAX = 2048
_MIN_OBSERVATIONS = 4
_NEGLIGIBLE = 1e-9


@dataclass(frozen=True)
class BatchTimeFit:
    """Fitted coefficients (seconds, tokens) and how well they explain the sweep."""

    constant_s: float
    """``K = c + step overhead``: what one step costs below ``b0`` with no context."""
    a_s_per_token: float
    b0_tokens: int
    attention_s_per_token: float
    r2: float
    points: int
    residuals_s: tuple[float, ...]
    """Measured minus fitted mean step time, one per observation, in sweep order."""

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


def fit_observations(observations: Sequence[Observation]) -> BatchTimeFit:
    """Least-squares fit over ``observations`` (see the module docstring)."""
    if len(observations) < _MIN_OBSERVATIONS:
        raise ConfigError(
            f"fit: expected at least {_MIN_OBSERVATIONS} measurements, got {len(observations)}"
        )
    loads = sorted({load for o in observations for load, _ in o.loads})
    if len(loads) < 2:
        raise ConfigError("fit: expected measurements at two or more token loads")
    y = np.array([o.mean_step_s for o in observations], dtype=np.float64)
    x = np.array([o.mean_context_tokens for o in observations], dtype=np.float64)
    if not (np.all(np.isfinite(y)) and np.all(y >= 0)):
        raise ConfigError("fit: step times must be finite and non-negative")
    coarse = _coarse_candidates(loads)
    best = _best(observations, y, x, coarse)
    index = int(np.searchsorted(coarse, best.b0))
    low, high = coarse[max(0, index - 1)], coarse[min(len(coarse) - 1, index + 1)]
    count = int(min(high - low, _FINE_MAX)) + 1
    fine = np.unique(np.floor(np.linspace(low, high, count)))
    refined = _best(observations, y, x, fine)
    chosen = refined if refined.sse <= best.sse else best
    k, a, attention = chosen.coefficients
    if a * (loads[-1] - chosen.b0) <= _NEGLIGIBLE * k:
        a = 0.0  # a rounding-error slope: the data are flat
    b0 = int(chosen.b0) if a > 0 else int(loads[-1])
    if a == 0.0:  # refit K and attention with the hinge gone
        design = _design(observations, float(b0), x)
        (k, _, attention), _ = min(_nonnegative_fits(design, y), key=lambda f: f[1])
    predicted = _design(observations, float(b0), x) @ np.array([k, a, attention])
    residuals = y - predicted
    return BatchTimeFit(
        constant_s=float(k),
        a_s_per_token=float(a),
        b0_tokens=b0,
        attention_s_per_token=float(attention),
        r2=_r2(y, residuals),
        points=len(observations),
        residuals_s=tuple(float(r) for r in residuals),
    )


@dataclass(frozen=True)
class _Candidate:
    b0: float
    coefficients: tuple[float, float, float]
    sse: float


def _coarse_candidates(loads: list[int]) -> FloatArray:
    """Integer ``b0`` values from 0 to below the largest load (above it ``a`` is unknown)."""
    top = float(loads[-1])
    grid = np.linspace(0.0, top, _COARSE_STEPS + 1)
    values = np.unique(np.floor(np.concatenate([grid, np.asarray(loads, float), [0.0]])))
    return values[values < top]


def _design(observations: Sequence[Observation], b0: float, x: FloatArray) -> FloatArray:
    hinge = np.array(
        [sum(n * max(0.0, load - b0) for load, n in o.loads) / o.steps for o in observations]
    )
    return np.column_stack([np.ones(len(observations)), hinge, x])


def _best(
    observations: Sequence[Observation], y: FloatArray, x: FloatArray, b0s: FloatArray
) -> _Candidate:
    best = _Candidate(float(b0s[0]), (float(y.mean()), 0.0, 0.0), math.inf)
    for b0 in b0s:
        design = _design(observations, float(b0), x)
        for candidate in _nonnegative_fits(design, y):
            coefficients, sse = candidate
            if sse < best.sse:
                best = _Candidate(float(b0), coefficients, sse)
    return best


def _nonnegative_fits(
    design: FloatArray, y: FloatArray
) -> list[tuple[tuple[float, float, float], float]]:
    """Least squares with ``a`` and ``attention`` free or pinned at 0; only valid results."""
    fits = []
    for keep_a, keep_attention in product((True, False), repeat=2):
        columns = [0] + ([1] if keep_a else []) + ([2] if keep_attention else [])
        solution, *_ = np.linalg.lstsq(design[:, columns], y, rcond=None)
        full = np.zeros(3)
        full[columns] = solution
        if np.all(full >= 0):
            residual = y - design @ full
            coefficients = (float(full[0]), float(full[1]), float(full[2]))
            fits.append((coefficients, float(residual @ residual)))
    return fits


def _r2(y: FloatArray, residuals: FloatArray) -> float:
    sse = float(residuals @ residuals)
    centred = y - y.mean()
    sst = float(centred @ centred)
    if sst == 0.0:
        return 1.0 if sse <= 1e-30 else 0.0
    return min(1.0, max(0.0, 1.0 - sse / sst))
