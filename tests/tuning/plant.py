"""A synthetic cluster for the controller's tests: fairness as a function of the quantum.

``jain_at(q)`` falls as the quantum grows past ``knee`` (the DLPM trade-off in one line);
observations are built from it, so the controller's search can be checked against a known
answer: the largest quantum whose Jain's index meets the target.
"""

from __future__ import annotations

import math

from fairserve.tuning.observe import Observation


def jain_at(quantum: float, knee: float = 5000.0) -> float:
    """1 up to ``knee``, then down towards 0.5 (two clients, one served)."""
    if quantum <= knee:
        return 1.0
    return 0.5 + 0.5 / (1.0 + math.log2(quantum / knee))


def observation(jain: float | None, gap: float = 1000.0) -> Observation:
    backlogged = ("a", "b") if jain is not None else ("a",)
    return Observation(
        window_s=5.0,
        backlogged=backlogged,
        jain_index=jain,
        service_gap=None if jain is None else gap,
        cache_hit_rate=0.5,
        tokens_per_s=1000.0,
        service_per_s=1200.0,
    )


def largest_meeting(target: float, knee: float = 5000.0) -> float:
    """The quantum where ``jain_at`` crosses ``target`` (bisection in log space)."""
    lo, hi = knee, knee * 2.0**40
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if jain_at(mid, knee) >= target else (lo, mid)
    return lo
