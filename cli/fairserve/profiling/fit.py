"""Fit the batch-time model to a sweep: ``t = K + a·max(0, b − b0) + attention·context``.

``K`` is the constant part of a step: the memory-bound cost ``c`` plus the per-step overhead
(scheduling, sampling, launches). Step timings cannot tell the two apart (both are paid once
per step whatever its load), so the fit estimates ``K`` and the caller splits it with a
known overhead (``fairserve profile --step-overhead-s``); by default all of it is ``c``,
which gives the simulator exactly the same step times.

Each observation is a run of steps with known loads (:mod:`~fairserve.profiling.observations`);
dividing its totals by its step count gives one row ``mean_step = K + a·h(b0) + attention·x``
with ``h`` the mean hinge and ``x`` the mean context. The fit itself (grid over ``b0`` +
least squares, coefficients kept non-negative) is the simulator's one fitter,
:func:`fairserve.sim.fit.fit_batch_time`; this module turns a sweep into its rows.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fairserve.core.errors import ConfigError
from fairserve.profiling.observations import Observation
from fairserve.sim.fit import BatchTimeFit, fit_batch_time

__all__ = ["BatchTimeFit", "fit_observations"]

# A sweep's grid: coarser over the load range than the shipped profiles' fit, finer around
# the best coarse knee (a sweep has few loads, far apart).
_COARSE_STEPS = 128
_FINE_MAX = 2048
_MIN_OBSERVATIONS = 4


def fit_observations(observations: Sequence[Observation]) -> BatchTimeFit:
    """Least-squares fit over ``observations`` (see the module docstring)."""
    if len(observations) < _MIN_OBSERVATIONS:
        raise ConfigError(
            f"fit: expected at least {_MIN_OBSERVATIONS} measurements, got {len(observations)}"
        )
    if len({load for o in observations for load, _ in o.loads}) < 2:
        raise ConfigError("fit: expected measurements at two or more token loads")
    y = np.array([o.mean_step_s for o in observations], dtype=np.float64)
    if not (np.all(np.isfinite(y)) and np.all(y >= 0)):
        raise ConfigError("fit: step times must be finite and non-negative")
    return fit_batch_time(
        [o.loads for o in observations],
        y,
        np.array([o.mean_context_tokens for o in observations], dtype=np.float64),
        coarse_steps=_COARSE_STEPS,
        fine_max=_FINE_MAX,
    )
