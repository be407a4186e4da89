"""``fairserve worker`` (placeholder, being written)."""

from __future__ import annotations


def worker() -> None:
    """Run a simulated GPU worker behind an SGLang-compatible HTTP API."""
