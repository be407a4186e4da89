"""``fairserve stop``: stop what ``fairserve launch`` started.

Sends SIGTERM to the supervisor (which drains the router, then stops its workers), kills
whatever is left after ``--timeout``, and checks with psutil that no process of the launch
survives. Exits 3 when nothing is running.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from fairserve.commands.errors import ExitCode
from fairserve.commands.output import Output


def stop(
    timeout: Annotated[
        float,
        typer.Option("--timeout", min=0, help="Seconds to stop gracefully before killing."),
    ] = 20.0,
    json_output: Annotated[
        bool, typer.Option("--json", help="Print the stopped pids as JSON.")
    ] = False,
) -> None:
    """Stop the service started by fairserve launch (graceful, then kill after --timeout).

    Exits 3 when nothing is running.
    """
    from fairserve.cluster.errors import NotRunning
    from fairserve.cluster.terminate import stop_run

    try:
        result = stop_run(timeout)
    except NotRunning as exc:
        sys.stderr.write(f"fairserve: {exc}\n")
        raise typer.Exit(ExitCode.UNAVAILABLE) from None
    out = Output(json_mode=json_output)
    out.data({"router_url": result.router_url, "stopped": result.pids, "killed": result.killed})
    killed = f", killed {len(result.killed)} after {timeout:g} s" if result.killed else ""
    out.note(f"stopped {result.router_url} ({len(result.pids)} processes{killed})")
