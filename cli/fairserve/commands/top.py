"""``fairserve top``: the live dashboard of clients, deficits, workers and cache hit rates.

Reads the run file written by ``launch`` (router URL and admin token) unless ``--url`` is
given. Textual and aiohttp are imported inside the function so that ``--help`` stays fast.
A router that stops answering shows a banner and is retried; it never ends the dashboard.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from fairserve.commands import options as opts
from fairserve.commands.errors import ExitCode


def _positive(value: float) -> float:
    if not value > 0:
        raise typer.BadParameter(f"expected a positive number of seconds, got {value:g}")
    return value


def _window(value: float) -> float:
    if not 0 < value <= 600:
        raise typer.BadParameter(f"expected seconds within (0, 600], got {value:g}")
    return value


def top(
    url: Annotated[
        str | None,
        opts.url_option("A router to watch instead of the one in the run file."),
    ] = None,
    token: Annotated[
        str | None,
        opts.admin_token_option(
            "--token", "The router's admin token (needed by the quantum keys)."
        ),
    ] = None,
    interval: Annotated[
        float,
        typer.Option("--interval", metavar="S", help="Seconds between polls.", callback=_positive),
    ] = 1.0,
    window: Annotated[
        float,
        typer.Option(
            "--window",
            metavar="S",
            help="Seconds of traffic Jain's index and the service gap cover (at most 600).",
            callback=_window,
        ),
    ] = 60.0,
) -> None:
    """Live dashboard of clients, deficits, workers and cache hit rates.

    Shows the router's policy, dispatch and quanta; per client its queue, service rate and
    share, DoubleQ deficits per worker, latency and TTFT; per worker its load, cache hit
    rate, KV usage and local GPU readings; and charts of service and cache hit rates.
    Keys: +/- Q^u, W/w Q^w, p pause, s sort, ? help, q quit. Exits 3 when nothing runs.
    """
    from fairserve.cluster.errors import NotRunning
    from fairserve.cluster.inspect import target

    try:
        router_url, router_token, _ = target(url, token)
    except NotRunning as exc:
        sys.stderr.write(f"fairserve: {exc}\n")
        raise typer.Exit(ExitCode.UNAVAILABLE) from None
    if not sys.stdout.isatty():
        from fairserve.api.paths import ROUTER_STATE

        state_url = router_url + ROUTER_STATE
        sys.stderr.write(f"fairserve: top needs a terminal; the same data as JSON: {state_url}\n")
        raise typer.Exit(ExitCode.USAGE)

    from fairserve.tui.app import TopApp
    from fairserve.tui.source import HttpStateSource, nvml_reader

    source = HttpStateSource(
        router_url,
        router_token,
        timeout_s=max(1.0, min(5.0, interval * 2)),
        gpu_reader=nvml_reader(),
        window_s=window,
    )
    TopApp(source, interval_s=interval).run()
