"""``fairserve bench``: run a workload against a live router over HTTP (placeholder)."""

from __future__ import annotations


def bench() -> None:
    """Run a workload against a live router (not built yet)."""
    raise NotImplementedError("fairserve bench is not built yet")
