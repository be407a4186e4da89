"""``fairserve top``: the live dashboard (placeholder until issue 6 lands)."""

from __future__ import annotations

from fairserve.core.errors import FairserveError


def top() -> None:
    """Live dashboard of clients, deficits, workers and cache hit rates."""
    raise FairserveError("fairserve top is not implemented yet")
