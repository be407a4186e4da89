"""``fairserve simulate`` (placeholder, being written)."""

from __future__ import annotations


def simulate() -> None:
    """Run a workload through the simulator with a chosen policy and dispatcher."""
