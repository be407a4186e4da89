"""Cluster-level conditions the commands map to exit codes."""

from __future__ import annotations

from fairserve.core.errors import FairserveError


class NotRunning(FairserveError):
    """Nothing launched is running: ``status`` and ``stop`` exit 3 (unavailable)."""
