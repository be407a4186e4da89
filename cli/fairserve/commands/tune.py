"""``fairserve tune``: quantum and weight control (placeholder until issue 7 lands)."""

from __future__ import annotations

import typer

from fairserve.core.errors import FairserveError

app = typer.Typer(no_args_is_help=True, help="Tune the fairness quantum and client weights.")


@app.command("quantum")
def quantum() -> None:
    """Show or set the quantum."""
    raise FairserveError("fairserve tune quantum is not implemented yet")
