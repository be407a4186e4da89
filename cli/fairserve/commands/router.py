"""``fairserve router``: the fair router in front of workers started elsewhere.

Serves the OpenAI-compatible API (``/v1/chat/completions``, ``/v1/completions``,
``/v1/models``), SGLang's ``/generate``, ``/health``, ``/metrics`` and the fairserve admin
API (``/fairserve/v1/state``, ``/fairserve/v1/quantum``) until SIGINT or SIGTERM, then
drains: stops accepting, lets in-flight requests finish (up to ``--drain-timeout``), exits
0. Heavy imports (aiohttp, the scheduling core) happen inside the command, keeping
``fairserve --help`` fast.
"""

from __future__ import annotations

import asyncio
import signal
from typing import TYPE_CHECKING, Annotated

import typer

from fairserve.commands import options as opts
from fairserve.commands.options import registry_option

if TYPE_CHECKING:
    from fairserve.router.config import RouterConfig

GC_GEN0_THRESHOLD = 10_000
"""Allocations between young-generation collections (CPython's default is 700)."""


def router(
    worker_url: Annotated[
        list[str],
        typer.Option(
            "--worker-url",
            metavar="URL",
            help="A worker to route to, http://HOST:PORT (repeatable; at least one).",
            show_default=False,
        ),
    ],
    worker_extension: Annotated[
        list[str] | None,
        typer.Option(
            "--worker-extension",
            metavar="WORKER_URL=EXTENSION_URL",
            help="Where a worker serves the fairserve extension when it is on a side port "
            "(SGLang with the plugin: FAIRSERVE_EXTENSION_PORT); repeatable.",
            show_default=False,
        ),
    ] = None,
    host: Annotated[
        str, typer.Option("--host", help="Address to bind; 127.0.0.1 keeps it local.")
    ] = "127.0.0.1",
    port: Annotated[
        int,
        typer.Option("--port", min=0, max=65535, help="TCP port to listen on (0: any free port)."),
    ] = 8000,
    dispatch: Annotated[
        str, registry_option("dispatcher", "Dispatcher placing requests on workers.")
    ] = "doubleq",
    policy: Annotated[
        str,
        registry_option("policy", "Local policy of the router-side fair queue (stock workers)."),
    ] = "dlpm",
    quantum: Annotated[
        float | None,
        typer.Option(
            "--quantum",
            help="Local quantum Q^u: router-side queues, and forwarded to fairserve workers.",
        ),
    ] = None,
    worker_quantum: opts.WorkerQuantum = None,
    clients: Annotated[
        str | None,
        typer.Option(
            "--clients",
            metavar="FILE",
            # "\[" escapes rich markup, which would take "[clients]" for a style tag.
            help="Clients file (TOML \\[\\[clients]] name, api_key, weight): keys map to clients.",
        ),
    ] = None,
    admin_token: Annotated[
        str | None,
        opts.admin_token_option(
            "--admin-token",
            "Token for admin writes (PUT /fairserve/v1/quantum); without it they are off.",
        ),
    ] = None,
    trust_identity_header: opts.TrustIdentityHeader = False,
    strict_model_names: Annotated[
        bool,
        typer.Option(
            "--strict-model-names",
            help="Refuse (404) a model name no worker serves, even with one model (by "
            "default one model answers to any name, as SGLang does).",
        ),
    ] = False,
    queue_cap: opts.QueueCap = opts.DEFAULT_QUEUE_CAP,
    total_cap: opts.TotalCap = opts.DEFAULT_TOTAL_CAP,
    max_body_bytes: opts.MaxBodyBytes = opts.DEFAULT_MAX_BODY_BYTES,
    router_queue: opts.RouterQueue = "auto",
    max_outstanding_per_worker: opts.MaxOutstandingPerWorker = opts.DEFAULT_MAX_OUTSTANDING,
    metrics_max_clients: opts.MetricsMaxClients = opts.DEFAULT_METRICS_MAX_CLIENTS,
    record: Annotated[
        str | None,
        typer.Option(
            "--record",
            "--trace",
            metavar="TRACE",
            help="Record a request trace (JSON lines), as launch --record does (--trace: "
            "the older name).",
        ),
    ] = None,
    drain_timeout: opts.DrainTimeout = opts.DEFAULT_DRAIN_TIMEOUT_S,
    request_timeout: opts.RequestTimeout = opts.DEFAULT_REQUEST_TIMEOUT_S,
    first_byte_timeout: opts.FirstByteTimeout = opts.DEFAULT_FIRST_BYTE_TIMEOUT_S,
    stall_timeout: opts.StallTimeout = opts.DEFAULT_STALL_TIMEOUT_S,
    queue_timeout: opts.QueueTimeout = opts.DEFAULT_QUEUE_TIMEOUT_S,
    outlier_failures: opts.OutlierFailures = opts.DEFAULT_OUTLIER_FAILURES,
    settings: Annotated[
        str | None,
        typer.Option(
            "--settings",
            metavar="FILE",
            help="Keep weights and quanta changed live in FILE (JSON, mode 0600) and "
            "restore them at start; without it they last until the router stops.",
        ),
    ] = None,
) -> None:
    """Run the fair router in front of workers started elsewhere.

    With --clients an API key is required (--trust-identity-header: a gateway's
    X-Fairserve-Client header or the 'user' field also count, never as a keyed client);
    without, the X-Fairserve-Client header, the OpenAI 'user' field, else 'anonymous'.
    Prints one line to stderr when ready, with the URL it listens on and the identity
    mode. Workers that do not answer at start are reported and kept: they join when their
    health check passes.
    """
    from fairserve.router.config import RouterConfig, load_clients

    keys, weights = load_clients(clients) if clients else ({}, {})
    if record is not None:
        from fairserve.cluster.plan import check_record_path

        check_record_path(record)
    config = RouterConfig(
        worker_urls=tuple(u.rstrip("/") for u in worker_url),
        host=host,
        port=port,
        dispatch=dispatch,
        policy=policy,
        quantum=quantum,
        worker_quantum=worker_quantum,
        clients=keys,
        weights=weights,
        admin_token=admin_token,
        trust_identity_header=trust_identity_header,
        strict_model_names=strict_model_names,
        queue_cap=queue_cap,
        total_cap=total_cap,
        max_body_bytes=max_body_bytes,
        router_queue=router_queue,  # type: ignore[arg-type]  # checked by the callback
        max_outstanding_per_worker=max_outstanding_per_worker,
        metrics_max_clients=metrics_max_clients,
        trace_path=record,
        drain_timeout_s=drain_timeout,
        request_timeout_s=request_timeout,
        first_byte_timeout_s=first_byte_timeout,
        stall_timeout_s=stall_timeout,
        queue_timeout_s=queue_timeout,
        outlier_failures=outlier_failures,
        settings_path=settings,
        extension_urls=parse_extensions(worker_extension or []),
    )
    _use_uvloop()
    asyncio.run(_serve(config))


def parse_extensions(pairs: list[str]) -> dict[str, str]:
    """``WORKER_URL=EXTENSION_URL`` pairs as a mapping (the URLs are checked by the config)."""
    from fairserve.core.errors import ConfigError

    mapping: dict[str, str] = {}
    for pair in pairs:
        worker, sep, extension = pair.partition("=")
        if not sep or not worker or not extension:
            raise ConfigError(
                f"--worker-extension: expected WORKER_URL=EXTENSION_URL, got {pair!r}"
            )
        mapping[worker.rstrip("/")] = extension.rstrip("/")
    return mapping


def _settle_gc() -> None:
    """Move what startup built (modules, the scheduler, the tree) out of the collector's
    sight and let the young generation grow larger: per request the router allocates many
    short-lived containers, and full collections would walk every long-lived object."""
    import gc

    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_GEN0_THRESHOLD, *gc.get_threshold()[1:])


def _use_uvloop() -> None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency off Windows
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


async def _serve(config: RouterConfig) -> None:
    import logging

    from fairserve.commands import logs
    from fairserve.router.identity import auth_mode
    from fairserve.router.server import RouterServer

    logs.configure("fairserve router", logging.WARNING)  # ejections etc., timestamped
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    server = RouterServer(config)
    url = await server.start()
    _settle_gc()
    try:
        down = [up.url for up in server.router.upstreams.values() if not up.healthy]
        for worker in down:
            error = server.router.upstreams[worker].last_error
            _err(f"fairserve router: warning: worker {worker} is unreachable ({error}); "
                 "it joins when its health check passes")  # fmt: skip
        if (exposed := config.exposure_warning()) is not None:
            _err(f"fairserve router: warning: {exposed}")
        healthy = len(config.worker_urls) - len(down)
        _err(
            f"fairserve router listening on {url} ({healthy}/{len(config.worker_urls)} workers "
            f"healthy, dispatch {config.dispatch}, policy {config.policy}, "
            f"identity {auth_mode(config.clients, config.trust_identity_header)})"
        )
        await stop.wait()
        _err("fairserve router: draining")
    finally:
        drained = await server.stop()
    if not drained:
        _err("fairserve router: drain timeout: in-flight requests were cancelled")


def _err(message: str) -> None:
    from fairserve.commands import logs

    logs.line(message)
