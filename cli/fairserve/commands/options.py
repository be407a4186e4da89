"""Options shared by several commands: names validated against the scheduling registries.

Typer (which vendors click) takes no custom click types, and an ``Enum``/``Literal``
annotation would be built on every start, loading the registries (and numpy behind them)
for ``fairserve --version``. So the names reach shell completion (and the generated
completions and man pages) through ``autocompletion``, and validation through a callback
whose message lists them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

import typer

from fairserve.core.defaults import BATCHING_DISCIPLINES

# The one place the router's defaults live is its configuration (standard library only, so
# importing it costs the CLI nothing); the commands re-export them from here.
from fairserve.router.config import DEFAULT_DRAIN_TIMEOUT_S as DEFAULT_DRAIN_TIMEOUT_S
from fairserve.router.config import DEFAULT_FIRST_BYTE_TIMEOUT_S as DEFAULT_FIRST_BYTE_TIMEOUT_S
from fairserve.router.config import DEFAULT_MAX_BODY_BYTES as DEFAULT_MAX_BODY_BYTES
from fairserve.router.config import DEFAULT_MAX_OUTSTANDING as DEFAULT_MAX_OUTSTANDING
from fairserve.router.config import DEFAULT_METRICS_MAX_CLIENTS as DEFAULT_METRICS_MAX_CLIENTS
from fairserve.router.config import DEFAULT_OUTLIER_FAILURES as DEFAULT_OUTLIER_FAILURES
from fairserve.router.config import DEFAULT_QUEUE_CAP as DEFAULT_QUEUE_CAP
from fairserve.router.config import DEFAULT_QUEUE_TIMEOUT_S as DEFAULT_QUEUE_TIMEOUT_S
from fairserve.router.config import DEFAULT_REQUEST_TIMEOUT_S as DEFAULT_REQUEST_TIMEOUT_S
from fairserve.router.config import DEFAULT_STALL_TIMEOUT_S as DEFAULT_STALL_TIMEOUT_S
from fairserve.router.config import DEFAULT_TOTAL_CAP as DEFAULT_TOTAL_CAP
from fairserve.router.config import ROUTER_QUEUE_MODES as ROUTER_QUEUE_MODES


def complete_workload(incomplete: str) -> list[str]:
    """Built-in workload names (shell completion and the generated scripts)."""
    from fairserve.workloads.catalog import builtin_names

    return [name for name in builtin_names() if name.startswith(incomplete)]


def complete_profile(incomplete: str) -> list[str]:
    """The shipped profile names (the generated completions must not depend on what one
    machine has in its data directory)."""
    from fairserve.sim.profile import REPO_PROFILES_DIR

    names = sorted(path.stem for path in REPO_PROFILES_DIR.glob("*.toml"))
    return [name for name in names if name.startswith(incomplete)]


def workload_option(help_text: str) -> Any:
    """``--workload/-w NAME|FILE``: a built-in workload (completed by name) or a file; the
    commands that take one differ only in what they say it is for."""
    return typer.Option(
        "--workload",
        "-w",
        metavar="NAME|FILE",
        help=help_text,
        autocompletion=complete_workload,
        show_default=False,
    )


def profile_option(help_text: str) -> Any:
    """``--profile NAME|FILE``: a shipped batch-time profile (completed by name) or a file."""
    return typer.Option(
        "--profile", metavar="NAME|FILE", help=help_text, autocompletion=complete_profile
    )


ADMIN_TOKEN_ENV = "FAIRSERVE_ADMIN_TOKEN"
"""Where every command takes the admin token from when the flag is not given (launch hands
it to its router and workers the same way)."""


def admin_token_option(flag: str, help_text: str) -> Any:
    """``--admin-token`` (servers: the token they require) or ``--token`` (clients: the
    token they send), both also read from :data:`ADMIN_TOKEN_ENV`."""
    return typer.Option(flag, envvar=ADMIN_TOKEN_ENV, help=help_text)


def check_url(value: str | None) -> str | None:
    """``--url`` of the commands that talk to a router or worker: ``http(s)://HOST[:PORT]``
    (a path prefix is kept, for a router behind a proxy), checked while parsing so that a
    typo is a usage error (exit 2) naming the option, not an internal error from the HTTP
    client after the command started."""
    if value is None:
        return None
    try:
        parts = urlsplit(value.strip())
        port = parts.port
    except ValueError as exc:
        raise typer.BadParameter(f"expected http://HOST:PORT, got {value!r} ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise typer.BadParameter(f"expected http://HOST:PORT, got {value!r}")
    if port == 0:
        raise typer.BadParameter(f"expected a port in 1..65535, got {value!r}")
    return value.strip()


def url_option(help_text: str, **kwargs: Any) -> Any:
    """``--url URL``, checked by :func:`check_url`."""
    return typer.Option("--url", help=help_text, callback=check_url, **kwargs)


def plot_option(help_text: str) -> Any:
    """``--plot FILE``: a PNG to write (matplotlib, the plot extra); what it shows is the
    command's."""
    return typer.Option(help=help_text, dir_okay=False, show_default=False)


JsonOutput = Annotated[bool, typer.Option("--json", help="Print one JSON object.")]
"""``--json`` of the commands that print one JSON object (status, profile, tune)."""

ReportJson = Annotated[bool, typer.Option("--json", help="Print one JSON report object.")]
"""``--json`` of the commands that print a DESIGN §7 report (simulate, bench)."""

WorkloadSeed = Annotated[
    int | None, typer.Option(help="Workload seed (default: the workload's).", show_default=False)
]
"""``--seed`` of the commands that run a workload (simulate, bench)."""

ReportPlot = Annotated[
    Path | None,
    plot_option(
        "Write service rate and response time over time to this PNG (needs the plot extra)."
    ),
]
"""``--plot`` of the commands that print a DESIGN §7 report (simulate, bench)."""


def registry_option(kind: str, help_text: str) -> Any:
    """A ``typer.Option`` whose valid names (``kind``: "policy", "dispatcher" or "batching
    discipline") are read on first use."""

    def complete() -> list[str]:
        return list(registry_names(kind))

    def check(value: str) -> str:
        names = registry_names(kind)
        if value not in names:
            raise typer.BadParameter(
                f"unknown {kind} {value!r}; expected one of: {', '.join(names)}"
            )
        return value

    metavar = kind.split()[0].upper()
    return typer.Option(metavar=metavar, help=help_text, autocompletion=complete, callback=check)


def registry_names(kind: str) -> Sequence[str]:
    if kind == "batching discipline":
        return BATCHING_DISCIPLINES
    from fairserve.sched import registry

    return registry.local_policies() if kind == "policy" else registry.dispatchers()


# ------------------------------------------------------------------ router settings
# ``fairserve router`` and ``fairserve launch`` take the same router settings; their
# defaults and choices are ``fairserve.router.config``'s, imported above.


def _check_router_queue(value: str) -> str:
    if value not in ROUTER_QUEUE_MODES:
        raise typer.BadParameter(f"expected one of: {', '.join(ROUTER_QUEUE_MODES)}, got {value!r}")
    return value


WorkerQuantum = Annotated[
    float | None,
    typer.Option("--worker-quantum", help="Dispatcher quantum Q^w (doubleq; inf ok)."),
]
QueueCap = Annotated[
    int, typer.Option("--queue-cap", min=1, help="Requests one client may have in the router.")
]
TotalCap = Annotated[
    int,
    typer.Option(
        "--total-cap",
        min=1,
        help="Requests the router holds over all clients; at the cap a client holding its fair"
        " share (cap / clients with requests held) gets 429.",
    ),
]
MaxBodyBytes = Annotated[
    int, typer.Option("--max-body-bytes", min=1, help="Largest request body accepted.")
]
RouterQueue = Annotated[
    str,
    typer.Option(
        "--router-queue",
        metavar="MODE",
        help="Router-side fair queue: auto (workers without the fairserve extension), "
        "on (every worker), off.",
        callback=_check_router_queue,
        autocompletion=lambda: list(ROUTER_QUEUE_MODES),
    ),
]
MaxOutstandingPerWorker = Annotated[
    int,
    typer.Option(
        "--max-outstanding-per-worker",
        min=1,
        metavar="N",
        help="Router-side fair queue: requests in flight per worker; the excess waits in "
        "the router, released in the policy's order.",
    ),
]
MetricsMaxClients = Annotated[
    int,
    typer.Option(
        "--metrics-max-clients",
        min=0,
        metavar="N",
        help="Prometheus: client names with their own label besides the clients file's "
        "(first seen); the others are summed under 'other'.",
    ),
]
TrustIdentityHeader = Annotated[
    bool,
    typer.Option(
        "--trust-identity-header",
        help="With --clients: serve requests without an API key under their "
        "X-Fairserve-Client header or 'user' field (a gateway in front authenticates); "
        "such a name can never be a keyed client's (403). Without it a key is required.",
    ),
]
DrainTimeout = Annotated[
    float,
    typer.Option(
        "--drain-timeout", min=0, help="Seconds the router gives in-flight requests at stop."
    ),
]
RequestTimeout = Annotated[
    float,
    typer.Option(
        "--request-timeout",
        min=0.001,
        metavar="S",
        help="Seconds a proxied request may take in all (then it fails and its worker is ejected).",
    ),
]
FirstByteTimeout = Annotated[
    float,
    typer.Option(
        "--first-byte-timeout",
        min=0.001,
        metavar="S",
        help="Streams: seconds until the first byte of the answer (queueing included); "
        "past it the worker counts as stalled: ejected, the request retried elsewhere.",
    ),
]
StallTimeout = Annotated[
    float,
    typer.Option(
        "--stall-timeout",
        min=0.001,
        metavar="S",
        help="Streams: seconds without a byte once the answer began; past it the stream "
        "ends with an error event and the worker is ejected.",
    ),
]
QueueTimeout = Annotated[
    float,
    typer.Option(
        "--queue-timeout",
        min=0.001,
        metavar="S",
        help="Seconds a request may wait in the router for a worker slot (every worker's "
        "running batch full and its client at its fair share or more); past it, 503 with "
        "Retry-After.",
    ),
]
OutlierFailures = Annotated[
    int,
    typer.Option(
        "--outlier-failures",
        min=1,
        metavar="N",
        help="Failed answers in a row (5xx, invalid, broken or stalled) that eject a "
        "worker; it is held out 5 s, doubling per repeat, whatever its /health says.",
    ),
]
