"""Arrival processes: when a client starts its programs.

Every process is built the same way: a *unit-rate* point process (``spacing``: exponential
gaps for poisson, gamma gaps with a coefficient of variation for gamma, gaps of exactly 1
for uniform) is drawn in "operational time" and then mapped to wall time:

- poisson, gamma, uniform: divide by ``rate_per_s``;
- on-off: divide by the rate while on, then skip an ``off_s`` gap after every ``on_s`` of
  on-time (the client starts in its on phase);
- ramp: invert the cumulative rate of a rate rising (or falling) linearly from
  ``rate_per_s`` to ``rate_end_per_s`` over ``ramp_s`` and constant after it.

This time change keeps one code path for all of them and lets on-off and ramp use any
spacing (VTC's on-off and ramp experiments use evenly spaced arrivals). Gaps are drawn in
chunks, so an hour of arrivals never sits in memory.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from fairserve.workloads.dists import FloatArray

ARRIVALS = ("poisson", "gamma", "uniform", "on-off", "ramp")
SPACINGS = ("poisson", "gamma", "uniform")
_CHUNK = 256


@dataclass(frozen=True, slots=True)
class ArrivalSpec:
    """How a client's programs arrive (field names as in the workload file)."""

    kind: str = "poisson"
    rate_per_s: float = 1.0
    spacing: str = "poisson"
    """The unit process: ``kind`` itself for poisson/gamma/uniform, chosen for on-off/ramp."""
    cv: float = 1.0
    """Coefficient of variation of gamma gaps (1 = poisson, < 1 regular, > 1 bursty)."""
    on_s: float = 0.0
    off_s: float = 0.0
    rate_end_per_s: float = 0.0
    ramp_s: float = 0.0
    """How long the ramp lasts (the client's active window in the file)."""

    @property
    def mean_rate_per_s(self) -> float:
        """Long-run programs per second (over the ramp for ramp, over a cycle for on-off)."""
        if self.kind == "on-off":
            return self.rate_per_s * self.on_s / (self.on_s + self.off_s)
        if self.kind == "ramp":
            return (self.rate_per_s + self.rate_end_per_s) / 2
        return self.rate_per_s


def arrival_times(
    spec: ArrivalSpec, rng: np.random.Generator, start_s: float, stop_s: float
) -> Iterator[float]:
    """Arrival times in ``[start_s, stop_s)``, increasing, lazily."""
    if stop_s <= start_s:
        return
    offset_u = 0.0
    index = 0
    while True:
        unit = _unit_times(spec, rng, index, offset_u)
        offset_u = float(unit[-1])
        index += _CHUNK
        wall = start_s + _to_wall(spec, unit)
        for t in wall.tolist():
            if t >= stop_s:
                return
            yield t


def _unit_times(
    spec: ArrivalSpec, rng: np.random.Generator, index: int, offset_u: float
) -> FloatArray:
    """The next chunk of operational times of the unit-rate process."""
    if spec.spacing == "uniform":
        return np.arange(index, index + _CHUNK, dtype=np.float64)
    if spec.spacing == "gamma":
        shape = 1.0 / (spec.cv * spec.cv)
        gaps = rng.gamma(shape, 1.0 / shape, size=_CHUNK)
    else:
        gaps = rng.exponential(1.0, size=_CHUNK)
    return offset_u + np.cumsum(gaps)


def _to_wall(spec: ArrivalSpec, unit: FloatArray) -> FloatArray:
    """Seconds since the window start for operational times ``unit``."""
    if spec.kind == "ramp":
        return _invert_ramp(spec, unit)
    on_time = unit / spec.rate_per_s
    if spec.kind != "on-off":
        return on_time
    cycles = np.floor(on_time / spec.on_s)
    return on_time + cycles * spec.off_s


def _invert_ramp(spec: ArrivalSpec, unit: FloatArray) -> FloatArray:
    """Solve Λ(t) = u for the linear ramp's cumulative rate Λ (then constant rate)."""
    r0, r1, span = spec.rate_per_s, spec.rate_end_per_s, spec.ramp_s
    slope_half = (r1 - r0) / (2 * span) if span > 0 else 0.0
    ramp_total = r0 * span + slope_half * span * span
    within = unit <= ramp_total
    out = np.empty_like(unit)
    u_in = unit[within]
    # Stable root of slope_half·t² + r0·t − u = 0 (also right for slope 0 or r0 = 0).
    disc = np.sqrt(np.maximum(r0 * r0 + 4 * slope_half * u_in, 0.0))
    denom = r0 + disc
    out[within] = np.divide(2 * u_in, denom, out=np.zeros_like(u_in), where=denom > 0)
    beyond = unit[~within] - ramp_total
    out[~within] = span + (beyond / r1 if r1 > 0 else math.inf)
    return out
