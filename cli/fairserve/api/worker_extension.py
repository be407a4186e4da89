"""The worker extension (``/fairserve/worker/...``), once, for every host that serves it.

The simulated worker (aiohttp) and the SGLang plugin (a standard-library server inside
SGLang's scheduler process) both serve this table: each adapts its transport to an
:class:`ExtensionRequest` and its engine to an :class:`ExtensionHost`, and writes back the
``(status, payload)`` that :func:`handle` returns. Routes, JSON shapes, validation messages
and the admin rule (:mod:`fairserve.api.auth`) therefore cannot drift between hosts.

* ``GET state`` — policy snapshot, engine counters, per-client queues (host-specific keys
  beyond :class:`WorkerState`'s are allowed);
* ``GET quantum`` / ``PUT {"quantum": Q}`` — the local policy's ``Q^u``;
* ``GET weights`` / ``PUT {"client": C, "weight": W}`` — the local policy's weights;
* ``GET evictions?since=N&limit=M`` — the eviction feed (``worker.evictions`` encoding).

Writes need the admin token (:func:`fairserve.api.auth.require_admin`); errors are the
OpenAI error shape with the status that says what happened (400, 401, 403, 404, 405, 503).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypedDict

from fairserve.api import paths
from fairserve.api.auth import require_admin
from fairserve.core.errors import ConfigError
from fairserve.core.openai_api import ApiError, bad_request, error_body

DEFAULT_PAGE_EVENTS = 1000
"""Eviction events per page when the reader gives no ``limit``."""
MAX_BODY_BYTES = 1 << 16
"""The largest request body a host reads (a write is a few dozen bytes): 413 beyond."""


def body_too_large(length: int) -> ApiError:
    """The 413 both hosts answer for a body over :data:`MAX_BODY_BYTES`."""
    return ApiError(413, f"body larger than {MAX_BODY_BYTES} bytes (got {length})")


# ------------------------------------------------------------------ payloads
class QuantumView(TypedDict):
    """``GET``/``PUT /fairserve/worker/quantum``; ``quantum`` is null for a policy without."""

    policy: str
    quantum: float | None


class WeightsView(TypedDict):
    """``GET``/``PUT /fairserve/worker/weights``: the weights set on this worker (a client
    not listed has weight 1)."""

    policy: str
    weights: dict[str, float]


class WeightChange(TypedDict):
    """The body of ``PUT /fairserve/worker/weights``."""

    client: str
    weight: float


class EvictionEvent(TypedDict):
    seq: int
    tokens: list[int]


class EvictionPage(TypedDict):
    """``GET /fairserve/worker/evictions``: events with ``seq >= since``; ``next`` is the
    cursor of the following page; ``dropped``: events the reader missed were discarded."""

    next: int
    events: list[EvictionEvent]
    dropped: bool


class WorkerState(TypedDict, total=False):
    """The keys of ``GET /fairserve/worker/state`` every host provides (readers:
    ``tui.parse.parse_worker_state``, ``profiling.client``, ``router``)."""

    model_name: str | None
    policy: dict[str, Any]
    engine: dict[str, Any]
    waiting: int
    running: int
    clients: dict[str, dict[str, int]]
    kv: dict[str, int | None]
    evictions_next: int


# ------------------------------------------------------------------ the two sides
class ExtensionHost(Protocol):
    """What a host's engine offers the extension. Setters get values already checked for
    type; they raise ``ConfigError`` (answered 400) for values the policy refuses and may
    raise ``ApiError`` themselves (the SGLang plugin: 503 when the scheduler does not apply
    a change in time)."""

    def state(self) -> Mapping[str, Any]: ...

    def quantum(self) -> QuantumView: ...

    def set_quantum(self, quantum: float) -> QuantumView: ...

    def weights(self) -> WeightsView: ...

    def set_weight(self, client: str, weight: float) -> WeightsView: ...

    def evictions(self, since: int, limit: int) -> EvictionPage: ...


@dataclass(frozen=True, slots=True)
class ExtensionRequest:
    """One request, whatever the transport: ``query`` holds the last value of each name."""

    method: str
    path: str
    query: Mapping[str, str] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""


@dataclass(frozen=True, slots=True)
class AdminRule:
    """The admin token and whether writes are open without one (loopback-only listeners);
    see :mod:`fairserve.api.auth`."""

    token: str | None
    open_when_unset: bool
    enable_hint: str = "start the worker with --admin-token"

    def check(self, headers: Mapping[str, str]) -> None:
        require_admin(
            headers, self.token, open_when_unset=self.open_when_unset, enable_hint=self.enable_hint
        )


Handler = Callable[[ExtensionRequest, ExtensionHost], Mapping[str, Any]]


# ------------------------------------------------------------------ handlers
def _state(request: ExtensionRequest, host: ExtensionHost) -> Mapping[str, Any]:
    return host.state()


def _get_quantum(request: ExtensionRequest, host: ExtensionHost) -> QuantumView:
    return host.quantum()


def _put_quantum(request: ExtensionRequest, host: ExtensionHost) -> QuantumView:
    """Set ``Q^u``; it takes effect at the next batching step."""
    body = _json_object(request.body, '{"quantum": 256}')
    quantum = body.get("quantum")
    return host.set_quantum(_positive_number("quantum", quantum))


def _get_weights(request: ExtensionRequest, host: ExtensionHost) -> WeightsView:
    return host.weights()


def _put_weights(request: ExtensionRequest, host: ExtensionHost) -> WeightsView:
    """Set one client's weight (``fairserve tune weight`` pushes it here); it takes effect at
    the next batching step."""
    change = parse_weight_change(request.body)
    return host.set_weight(change["client"], change["weight"])


def _evictions(request: ExtensionRequest, host: ExtensionHost) -> EvictionPage:
    since = _query_int(request.query, "since", 0)
    limit = _query_int(request.query, "limit", DEFAULT_PAGE_EVENTS)
    if limit < 1:
        raise bad_request(f"limit: expected a positive integer, got {limit}")
    return host.evictions(since, limit)


ROUTES: dict[tuple[str, str], Handler] = {
    ("GET", paths.WORKER_STATE): _state,
    ("GET", paths.WORKER_QUANTUM): _get_quantum,
    ("PUT", paths.WORKER_QUANTUM): _put_quantum,
    ("GET", paths.WORKER_WEIGHTS): _get_weights,
    ("PUT", paths.WORKER_WEIGHTS): _put_weights,
    ("GET", paths.WORKER_EVICTIONS): _evictions,
}
"""(method, path) -> handler; every method but GET is a write and needs the admin rule."""

PATHS = frozenset(path for _, path in ROUTES)

PRIVATE_READS = frozenset({("GET", paths.WORKER_EVICTIONS)})
"""Reads under the admin rule too: the eviction feed carries the prefixes of every tenant's
prompts (text blocks or token ids), which only the router, holding the token, may follow."""


def handle(request: ExtensionRequest, host: ExtensionHost, rule: AdminRule) -> tuple[int, Any]:
    """``(status, JSON payload)`` for one request; client errors come back in the OpenAI
    error shape (never raised), so an adapter only serialises (with ``jsonsafe.dumps``)."""
    try:
        return 200, dispatch(request, host, rule)
    except ApiError as exc:
        return exc.status, error_body(exc)


def dispatch(request: ExtensionRequest, host: ExtensionHost, rule: AdminRule) -> Any:
    """The payload of one request; raises ``ApiError`` (404, 405, 401/403, 400...)."""
    if len(request.body) > MAX_BODY_BYTES:  # a host that could not check before reading
        raise body_too_large(len(request.body))
    path = request.path
    handler = ROUTES.get((request.method, path))
    if handler is None:
        if path in PATHS:
            raise ApiError(405, f"{request.method} is not allowed on {path}")
        raise ApiError(404, f"no such endpoint: {path}")
    if request.method != "GET" or (request.method, path) in PRIVATE_READS:
        rule.check(request.headers)
    try:
        return handler(request, host)
    except ConfigError as exc:
        raise bad_request(str(exc)) from None


# ------------------------------------------------------------------ parsing
def parse_weight_change(raw: bytes) -> WeightChange:
    """The body of a weight PUT, checked: a non-empty client name and a positive number."""
    body = _json_object(raw, '{"client": "team-a", "weight": 2}')
    unknown = sorted(set(body) - {"client", "weight"})
    if unknown:
        raise bad_request(f"{unknown[0]}: unknown field; expected client and weight")
    client = body.get("client")
    if not isinstance(client, str) or not client:
        raise bad_request(f"client: expected a non-empty string, got {client!r}")
    return {"client": client, "weight": _positive_number("weight", body.get("weight"))}


def _json_object(raw: bytes, example: str) -> dict[str, Any]:
    try:
        body = json.loads(raw or b"{}")
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad_request(f"body: expected a JSON object like {example} ({exc})") from None
    if not isinstance(body, dict):
        raise bad_request(f"body: expected a JSON object like {example}")
    return body


def _positive_number(name: str, value: object) -> float:
    """A JSON number (not a boolean) as a float; the policy checks its range (400 there)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise bad_request(f"{name}: expected a positive number, got {value!r}")
    try:
        return float(value)
    except OverflowError:  # an integer beyond any float
        raise bad_request(f"{name}: expected a positive number, got {value!r}") from None


def _query_int(query: Mapping[str, str], name: str, default: int) -> int:
    text = query.get(name)
    if text is None:
        return default
    if not (text.isascii() and text.isdigit()):
        raise bad_request(f"{name}: expected a non-negative integer, got {text!r}")
    return int(text)
