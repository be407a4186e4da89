"""What a router runs with: its workers, policies, limits and the clients file.

Built once by ``fairserve router`` (or ``launch``) and validated here, so a bad value fails
at startup with a message that names the option or the file and field, never on the first
request.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from fairserve.core.errors import ConfigError

RouterQueueMode = Literal["auto", "on", "off"]
ROUTER_QUEUE_MODES: tuple[RouterQueueMode, ...] = ("auto", "on", "off")

DEFAULT_PORT = 8000
DEFAULT_QUEUE_CAP = 1024
DEFAULT_TOTAL_CAP = 4096
"""Requests the router holds at once over all clients. Each held request costs about 13 KiB
and two sockets; under sustained overload a router without this bound holds everything each
client's cap allows (50 clients x 1024), and its memory grows with the backlog."""
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
DEFAULT_MAX_OUTSTANDING = 32
"""Requests the router-side fair queue keeps in flight per stock worker: enough to fill a
typical engine's batch, few enough that the order of admission is still the router's."""
DEFAULT_METRICS_MAX_CLIENTS = 100
"""Client names (besides the clients file's) with their own Prometheus label; the others
are summed under ``other`` (see ``router.metrics``)."""
DEFAULT_DRAIN_TIMEOUT_S = 10.0
DEFAULT_REQUEST_TIMEOUT_S = 600.0
DEFAULT_FIRST_BYTE_TIMEOUT_S = 300.0
"""Sized for a request that waits in a full engine's queue, not for a hung worker: those are
found by the health check, whose ejection fails the worker's unanswered requests at once."""
DEFAULT_STALL_TIMEOUT_S = 30.0
DEFAULT_QUEUE_TIMEOUT_S = 60.0
"""How long a request may wait in the router for a worker slot (``router.slots``) before it
gets 503 with ``Retry-After``: sglang-router's ``--queue-timeout-secs`` default."""
DEFAULT_OUTLIER_FAILURES = 3
DEFAULT_OUTLIER_COOLDOWN_S = 5.0


@dataclass(frozen=True, slots=True)
class ClientEntry:
    """A client known by API key: its name and fair-share weight."""

    name: str
    weight: float = 1.0


@dataclass(frozen=True)
class RouterConfig:
    """Everything a router needs besides its event loop."""

    worker_urls: tuple[str, ...]
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    dispatch: str = "doubleq"
    policy: str = "dlpm"
    quantum: float | None = None
    """Local quantum Q^u: the router-side queues' and, forwarded, the workers'."""
    worker_quantum: float | None = None
    """Dispatcher quantum Q^w (DoubleQ)."""
    dispatch_params: Mapping[str, Any] = field(default_factory=dict)
    policy_params: Mapping[str, Any] = field(default_factory=dict)
    clients: Mapping[str, ClientEntry] = field(default_factory=dict)
    """API key → client."""
    weights: Mapping[str, float] = field(default_factory=dict)
    """Client name → weight for clients without a key (and the keyed ones, from the file)."""
    admin_token: str | None = None
    trust_identity_header: bool = False
    """With a clients file: honour ``X-Fairserve-Client`` / ``user`` from requests without
    an API key (a gateway in front authenticates); never for a keyed client's name."""
    strict_model_names: bool = False
    """404 for a model name no worker serves even when only one model is served (by
    default one model answers to any name, as SGLang does)."""
    queue_cap: int = DEFAULT_QUEUE_CAP
    total_cap: int = DEFAULT_TOTAL_CAP
    """At this many requests held, a client holding its fair share (``total_cap`` / clients
    with requests held) gets 429; one below its share is still admitted, so the router holds
    at most about twice this and a flood cannot lock the others out."""
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    router_queue: RouterQueueMode = "auto"
    max_outstanding_per_worker: int = DEFAULT_MAX_OUTSTANDING
    metrics_max_clients: int = DEFAULT_METRICS_MAX_CLIENTS
    lean_front: bool = True
    """Serve the generation routes' common case with the lean front (``router.front``);
    False: everything through aiohttp (the tests compare the two)."""
    trace_path: str | None = None
    w_e: float = 1.0
    w_q: float = 2.0
    health_interval_s: float = 2.0
    health_timeout_s: float = 2.0
    eviction_interval_s: float = 0.5
    sample_interval_s: float = 1.0
    connect_timeout_s: float = 2.0
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
    first_byte_timeout_s: float = DEFAULT_FIRST_BYTE_TIMEOUT_S
    """A streamed answer's first byte of body must arrive within this (queueing included)."""
    queue_timeout_s: float = DEFAULT_QUEUE_TIMEOUT_S
    """A request waiting in the router for a worker slot this long gets 503 (``router.slots``)."""
    stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S
    """A streamed answer that sent nothing for this long has stalled (decode steps are ms)."""
    outlier_failures: int = DEFAULT_OUTLIER_FAILURES
    """Consecutive failed answers (5xx, invalid, reset, stalled) that eject a worker."""
    outlier_cooldown_s: float = DEFAULT_OUTLIER_COOLDOWN_S
    """A worker ejected for failures is not reinstated before this (doubled per repeat)."""
    drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S
    settings_path: str | None = None
    """Where weights and quanta changed live are saved and read back at start (``launch``:
    beside the run file; ``router --settings FILE``); None: not kept across restarts."""
    extension_urls: Mapping[str, str] = field(default_factory=dict)
    """Worker URL -> base URL of its fairserve extension, for engines that serve it on a
    side port (SGLang with the plugin); other workers serve it at their own URL."""

    def __post_init__(self) -> None:
        if not self.worker_urls:
            raise ConfigError("--worker-url: at least one worker URL is required")
        for url in self.worker_urls:
            check_url(url)
        if len(set(self.worker_urls)) != len(self.worker_urls):
            raise ConfigError("--worker-url: the same URL is given twice")
        for worker, extension in self.extension_urls.items():
            if worker not in self.worker_urls:
                raise ConfigError(f"--worker-extension: {worker} is not one of the --worker-url")
            check_url(extension)
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"--port: expected 0..65535, got {self.port}")
        _positive_int("--queue-cap", self.queue_cap)
        _positive_int("--total-cap", self.total_cap)
        _positive_int("--max-body-bytes", self.max_body_bytes)
        _positive_int("--max-outstanding-per-worker", self.max_outstanding_per_worker)
        _positive_int("--outlier-failures", self.outlier_failures)
        if (
            isinstance(self.metrics_max_clients, bool)
            or not isinstance(self.metrics_max_clients, int)
            or self.metrics_max_clients < 0
        ):
            raise ConfigError(
                f"--metrics-max-clients: expected an integer >= 0, got {self.metrics_max_clients!r}"
            )
        if self.router_queue not in ROUTER_QUEUE_MODES:
            raise ConfigError(
                f"--router-queue: expected one of {', '.join(ROUTER_QUEUE_MODES)}, "
                f"got {self.router_queue!r}"
            )
        if self.trust_identity_header and not self.clients:
            raise ConfigError(
                "--trust-identity-header: needs --clients (without a clients file every "
                "identity header is honoured already)"
            )
        if self.admin_token is not None and not self.admin_token.strip():
            raise ConfigError("--admin-token: expected a non-empty token")
        if not (math.isfinite(self.queue_timeout_s) and self.queue_timeout_s > 0):
            raise ConfigError(
                f"--queue-timeout: expected a positive number of seconds,"
                f" got {self.queue_timeout_s}"
            )
        for name in ("quantum", "worker_quantum"):
            value = getattr(self, name)
            if value is not None and not (value > 0 and not math.isnan(value)):
                raise ConfigError(f"--{name.replace('_', '-')}: expected a positive number")
        for name in (
            "health_interval_s",
            "health_timeout_s",
            "eviction_interval_s",
            "sample_interval_s",
            "connect_timeout_s",
            "request_timeout_s",
            "first_byte_timeout_s",
            "stall_timeout_s",
            "outlier_cooldown_s",
        ):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ConfigError(f"{name}: expected a positive number, got {value}")

    def exposure_warning(self) -> str | None:
        """A warning when the router listens beyond loopback (``--host 0.0.0.0``): an
        operator must not open a fleet to the network without knowing what that admits."""
        from fairserve.api.auth import is_loopback_host  # lazily: the CLI imports this module

        if is_loopback_host(self.host):
            return None
        who = (
            "any client may claim any name (no --clients file)"
            if not self.clients
            else "requests need an API key from the clients file"
        )
        admin = "admin writes need the admin token" if self.admin_token else "admin writes are off"
        return (
            f"listening on {self.host}, beyond loopback: anyone who can reach it can send "
            f"requests; {who}; {admin}"
        )

    def weight_of(self, client: str) -> float:
        return self.weights.get(client, 1.0)


def check_url(url: str) -> str:
    """A worker URL must be ``http://host:port`` (no trailing path): the router appends
    the API paths itself."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"--worker-url {url!r}: expected http://HOST:PORT")
    if parts.path not in ("", "/") or parts.query:
        raise ConfigError(f"--worker-url {url!r}: expected no path or query (http://HOST:PORT)")
    try:
        parts.port  # noqa: B018 - validates the port number
    except ValueError:
        raise ConfigError(f"--worker-url {url!r}: invalid port") from None
    return url.rstrip("/")


def _positive_int(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name}: expected a positive integer, got {value!r}")


# ------------------------------------------------------------------ clients file
def load_clients(path: str | Path) -> tuple[dict[str, ClientEntry], dict[str, float]]:
    """Read a clients file: API key → client, and client name → weight.

    Format::

        [[clients]]
        name = "alice"
        api_key = "sk-alice-..."     # or api_keys = ["...", "..."]
        weight = 2.0                 # optional, default 1
    """
    where = str(path)
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{where}: clients file not found") from None
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read the clients file: {exc.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{where}: not valid TOML: {exc}") from None
    return parse_clients(data, where)


def parse_clients(
    data: Mapping[str, Any], where: str
) -> tuple[dict[str, ClientEntry], dict[str, float]]:
    entries = data.get("clients")
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ConfigError(f"{where}: clients: expected a list of tables ([[clients]])")
    keys: dict[str, ClientEntry] = {}
    weights: dict[str, float] = {}
    for i, entry in enumerate(entries):
        field_of = f"{where}: clients[{i}]"
        client = _client_entry(entry, field_of)
        if client.name in weights:
            raise ConfigError(f"{field_of}.name: client {client.name!r} appears twice")
        weights[client.name] = client.weight
        for key in _api_keys(entry, field_of):
            if key in keys:
                raise ConfigError(f"{field_of}.api_key: the key is already used by another client")
            keys[key] = client
    return keys, weights


def _client_entry(entry: Mapping[str, Any], where: str) -> ClientEntry:
    unknown = sorted(set(entry) - {"name", "api_key", "api_keys", "weight"})
    if unknown:
        raise ConfigError(
            f"{where}: unknown field {unknown[0]!r}; expected name, api_key, api_keys, weight"
        )
    name = entry.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"{where}.name: expected a non-empty string, got {name!r}")
    weight = entry.get("weight", 1.0)
    if (
        isinstance(weight, bool)
        or not isinstance(weight, int | float)
        or not (math.isfinite(weight) and weight > 0)
    ):
        raise ConfigError(f"{where}.weight: expected a positive number, got {weight!r}")
    return ClientEntry(name, float(weight))


def _api_keys(entry: Mapping[str, Any], where: str) -> list[str]:
    single, many = entry.get("api_key"), entry.get("api_keys")
    keys: list[Any] = ([] if single is None else [single]) + (
        many if isinstance(many, list) else []
    )
    if many is not None and not isinstance(many, list):
        raise ConfigError(f"{where}.api_keys: expected a list of strings, got {many!r}")
    if not keys:
        raise ConfigError(f"{where}: expected an api_key (or api_keys) for the client")
    for key in keys:
        if not isinstance(key, str) or not key.strip():
            raise ConfigError(f"{where}.api_key: expected a non-empty string, got {key!r}")
    return [str(k) for k in keys]
