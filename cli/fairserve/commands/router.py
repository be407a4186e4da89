"""``fairserve router``: run the fair router in front of workers started elsewhere (placeholder)."""

from __future__ import annotations


def router() -> None:
    """Run the fair router (not built yet)."""
    raise NotImplementedError("fairserve router is not built yet")
