"""``fairserve profile``: batch-time profiling (placeholder until issue 8 lands)."""

from __future__ import annotations

import typer

from fairserve.core.errors import FairserveError

app = typer.Typer(help="Measure a worker's batch-time coefficients into profiles/.")


@app.command("show")
def show() -> None:
    """Print a profile."""
    raise FairserveError("fairserve profile show is not implemented yet")
