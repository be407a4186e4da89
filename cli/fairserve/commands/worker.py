"""``fairserve worker``: one simulated GPU worker behind an SGLang-compatible HTTP API.

The worker runs the simulator's engine in real time (``--speed`` times faster than the
wall clock) with a local fairness policy, so routers, benchmarks and the dashboard can run
against it exactly as against an SGLang server. It serves until SIGINT or SIGTERM, then
stops accepting, lets in-flight requests finish for a few seconds, aborts the rest and
exits 0. Heavy imports (aiohttp, the simulator) happen inside the command, keeping
``fairserve --help`` fast.
"""

from __future__ import annotations

import asyncio
import signal
from typing import TYPE_CHECKING, Annotated

import typer

from fairserve.commands import options as opts
from fairserve.core.defaults import BATCHING_DISCIPLINES, DEFAULT_BATCHING, DEFAULT_PROFILE

if TYPE_CHECKING:
    from fairserve.worker.config import WorkerConfig


def worker(
    port: Annotated[
        int,
        typer.Option("--port", min=0, max=65535, help="TCP port to listen on (0: any free port)."),
    ] = 30000,
    host: Annotated[
        str, typer.Option("--host", help="Address to bind; 127.0.0.1 keeps it local.")
    ] = "127.0.0.1",
    policy: Annotated[
        str, typer.Option("--policy", help="Local scheduling policy (see fairserve policies).")
    ] = "dlpm",
    quantum: Annotated[
        float | None,
        typer.Option("--quantum", help="The policy's deficit quantum Q^u (policies with one)."),
    ] = None,
    param: Annotated[
        list[str] | None,
        typer.Option(
            "--param",
            metavar="KEY=VALUE",
            help="A policy parameter (repeatable), e.g. --param w_q=3.",
        ),
    ] = None,
    profile: Annotated[
        str,
        opts.profile_option("Batch-time profile: a shipped name or a TOML file."),
    ] = DEFAULT_PROFILE,
    batching: Annotated[
        str,
        typer.Option(
            "--batching",
            help=f"Batching discipline: {', '.join(BATCHING_DISCIPLINES)}.",
        ),
    ] = DEFAULT_BATCHING,
    speed: Annotated[
        float,
        typer.Option("--speed", help="Simulated seconds per wall-clock second."),
    ] = 1.0,
    model_name: Annotated[
        str, typer.Option("--model-name", help="Model name reported to clients.")
    ] = "fairserve-sim",
    max_running_requests: Annotated[
        int | None,
        typer.Option(
            "--max-running-requests",
            min=1,
            help="Most requests running at once; the rest wait (default: the profile's "
            "max_running_requests, else the largest batch whose full step takes at most 2 "
            "one-token steps, 32 to 1024).",
            show_default=False,
        ),
    ] = None,
    admin_token: Annotated[
        str | None,
        opts.admin_token_option(
            "--admin-token",
            "Require 'Authorization: Bearer TOKEN' for writes (quantum, weights; "
            "/abort_request and /flush_cache beyond loopback). Without a token, writes "
            "are accepted only while --host is a loopback address.",
        ),
    ] = None,
) -> None:
    """Run a simulated GPU worker behind an SGLang-compatible HTTP API.

    Serves /generate, /v1/completions, /v1/chat/completions, /health, /metrics and the
    fairserve extension (/fairserve/worker/state, /quantum, /evictions) until SIGINT or
    SIGTERM. Prints one line to stderr when ready, with the URL it listens on.
    """
    from fairserve.sim.profile import resolve_profile
    from fairserve.worker.config import WorkerConfig, parse_params

    config = WorkerConfig(
        profile=resolve_profile(profile),
        policy=policy,
        quantum=quantum,
        policy_params=parse_params(param or []),
        batching=batching,
        speed=speed,
        model_name=model_name,
        admin_token=admin_token,
        max_running_requests=max_running_requests,
    )
    asyncio.run(_serve(config, host, port))


async def _serve(config: WorkerConfig, host: str, port: int) -> None:
    from fairserve.commands import logs
    from fairserve.worker.server import WorkerServer, configure_logging

    logs.configure("fairserve worker")  # timestamped lines; configure_logging adds filters
    configure_logging()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    server = WorkerServer(config, host, port)
    url = await server.start()
    try:
        logs.line(
            f"fairserve worker listening on {url} (policy {config.policy}, profile "
            f"{config.profile.name}, speed {config.speed:g}x, model {config.model_name})"
        )
        await stop.wait()
        logs.line("fairserve worker: shutting down")
    finally:
        await server.stop()
