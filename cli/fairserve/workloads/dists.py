"""Value distributions for lengths (tokens) and durations (think time).

A workload file gives a length as a plain number or as a table
``{ dist = "constant" | "uniform" | "lognormal", ... }``. Sampling is vectorised: a program
draws all its calls' lengths in one numpy call, because per-call Python overhead is what
limits how fast the simulator can replay an hour of tree-of-thought traffic.

Lognormal is parameterised by its ``mean`` and coefficient of variation ``cv`` (standard
deviation / mean) rather than by the underlying normal's mu and sigma: operators know their
average prompt length and roughly how spread it is, not the log-space parameters.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

IntArray = NDArray[np.int64]
FloatArray = NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class Constant:
    """Always ``value``."""

    value: float

    @property
    def mean(self) -> float:
        return self.value

    def sample(self, rng: np.random.Generator, n: int) -> FloatArray:
        return np.full(n, self.value, dtype=np.float64)


@dataclass(frozen=True, slots=True)
class Uniform:
    """Uniform on ``[low, high]``; over the integers (both ends included) when ``integer``."""

    low: float
    high: float
    integer: bool = True

    @property
    def mean(self) -> float:
        return (self.low + self.high) / 2

    def sample(self, rng: np.random.Generator, n: int) -> FloatArray:
        if self.integer:
            ints = rng.integers(int(self.low), int(self.high) + 1, size=n)
            return ints.astype(np.float64)
        return rng.uniform(self.low, self.high, size=n)


@dataclass(frozen=True, slots=True)
class LogNormal:
    """Lognormal with the given ``mean`` and ``cv``, clamped to ``[low, high]``.

    The clamps change the realised mean slightly; ``mean`` is the unclamped one.
    """

    mean: float
    cv: float
    low: float = 0.0
    high: float = math.inf

    @property
    def sigma(self) -> float:
        return math.sqrt(math.log1p(self.cv * self.cv))

    @property
    def mu(self) -> float:
        return math.log(self.mean) - self.sigma * self.sigma / 2

    def sample(self, rng: np.random.Generator, n: int) -> FloatArray:
        values = rng.lognormal(self.mu, self.sigma, size=n)
        return np.clip(values, self.low, self.high)


Dist = Constant | Uniform | LogNormal


def draw_ints(dist: Dist, rng: np.random.Generator, n: int, floor: int) -> IntArray:
    """``n`` integer draws, rounded and never below ``floor`` (lengths are whole tokens)."""
    if isinstance(dist, Constant):
        return np.full(n, max(floor, round(dist.value)), dtype=np.int64)
    rounded = np.rint(dist.sample(rng, n)).astype(np.int64)
    return np.maximum(rounded, floor)


def draw_int(dist: Dist, rng: np.random.Generator, floor: int) -> int:
    """One integer draw (see ``draw_ints``)."""
    return int(draw_ints(dist, rng, 1, floor)[0])


def draw_floats(dist: Dist, rng: np.random.Generator, n: int) -> FloatArray:
    """``n`` non-negative real draws (durations)."""
    return np.maximum(dist.sample(rng, n), 0.0)
