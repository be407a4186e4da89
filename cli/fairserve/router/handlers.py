"""The router's HTTP handlers (DESIGN §5) and its error middleware.

Every error leaves in the OpenAI shape ``{"error": {"message", "type", "code"}}`` with the
status that says what happened: 400 bad input (the message names the field), 401 unknown
API key or missing admin token, 403 wrong admin token, 404 unknown path or model, 413 body
too large, 429 over a client's queue cap, 503 no healthy worker or draining.

Admin API: ``GET|PUT /fairserve/v1/quantum`` (Q^w, Q^u) and ``GET|PUT /fairserve/v1/weights``
(a client's weight); writes need the admin token.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web

from fairserve.api import paths
from fairserve.api.auth import require_admin
from fairserve.core.errors import ConfigError
from fairserve.core.json_body import parse_json
from fairserve.core.ledger import DEFAULT_WINDOW_S, MAX_WINDOW_S
from fairserve.core.openai_api import (
    ApiError,
    GenerationSpec,
    Route,
    bad_request,
    check_context,
    error_body,
    internal_error,
    parse_chat,
    parse_completion,
    parse_generate,
)
from fairserve.core.types import Request
from fairserve.router import proxy
from fairserve.router.identity import (
    application,
    authenticate,
    check_client_name,
    claimed_client,
    upstream_rid,
)
from fairserve.router.lifecycle import Call
from fairserve.router.metrics import CONTENT_TYPE
from fairserve.router.service import Router
from fairserve.router.state import (
    DEFAULT_CLIENT_LIMIT,
    in_turns,
    json_safe,
    quantum_view,
    read,
    weights_view,
)

log = logging.getLogger("fairserve.router")

ROUTER: web.AppKey[Router] = web.AppKey("router", Router)
URL: web.AppKey[list[str]] = web.AppKey("url", list)

Parser = Callable[[Mapping[str, Any], Mapping[str, str]], GenerationSpec]
PARSERS: dict[Route, Parser] = {
    "chat": parse_chat,
    "completions": parse_completion,
    "generate": parse_generate,
}


def json_response(payload: Any, status: int = 200) -> web.Response:
    text = json.dumps(json_safe(payload), allow_nan=False)
    return web.Response(text=text, status=status, content_type="application/json")


def error_response(exc: ApiError) -> web.Response:
    response = json_response(error_body(exc), exc.status)
    response.headers.update(exc.headers)
    return response


@web.middleware
async def errors(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        response: web.StreamResponse = await handler(request)
        return response
    except ApiError as exc:
        return error_response(exc)
    except web.HTTPRequestEntityTooLarge:
        limit = request.app[ROUTER].config.max_body_bytes
        return error_response(
            ApiError(413, f"request body is too large: the limit is {limit} bytes")
        )
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error_response(
            ApiError(exc.status, f"{exc.reason}: {request.method} {request.path}")
        )
    except Exception as exc:  # never a traceback or an exception's text to the client
        return error_response(internal_error(log, exc, f"{request.method} {request.path}"))


# ------------------------------------------------------------------ generation
def _generation(route: Route) -> Callable[[web.Request], Any]:
    async def handle(request: web.Request) -> web.StreamResponse:
        router = request.app[ROUTER]
        check_open(router)
        call = prepare_call(router, route, request.headers, await request.read())
        return await proxy.forward(router, call, request)

    return handle


def context_tokens(router: Router) -> int | None:
    """The smallest context length among healthy workers (None: none known): a request
    must fit wherever it may be sent, and is refused here without asking a worker."""
    least: int | None = None
    for up in router.upstreams.values():  # the hot path: no list built per request
        limit = up.context_tokens
        if up.healthy and limit is not None and (least is None or limit < least):
            least = limit
    return least


def check_open(router: Router) -> None:
    """Refuse new generation requests while the router drains (before reading the body)."""
    if router.draining:
        raise ApiError(503, "the router is shutting down", headers={"Retry-After": "1"})


def check_caps(router: Router, client: str, in_flight: int) -> None:
    """429 for a client at its own cap, or holding its fair share while the router holds
    ``total_cap`` requests (load shedding that keeps the router's memory flat under
    sustained overload and falls on the clients holding the most)."""
    config, acc = router.config, router.accounting
    cap = config.queue_cap
    if in_flight >= cap:
        message = f"client {client!r} has {in_flight} requests in the router (the cap is {cap})"
    elif acc.held >= config.total_cap and in_flight >= acc.fair_share(config.total_cap):
        message = (
            f"the router holds {acc.held} requests (the cap is {config.total_cap}) and client"
            f" {client!r} has {in_flight}, its fair share or more"
        )
    else:
        return
    router.lifecycle.refuse(client)
    raise ApiError(429, message + "; retry later", headers={"Retry-After": "1"})


def prepare_call(router: Router, route: Route, headers: Mapping[str, str], raw: bytes) -> Call:
    """A generation request, validated, identified and counted, ready to queue and dispatch.

    Shared by the aiohttp handlers and the lean front (``front.py``), so both refuse,
    identify and account alike. Raises :class:`ApiError` for what the client must fix."""
    config = router.config
    keyed = authenticate(headers, config.clients, config.trust_identity_header)
    body = parse_json(raw)
    client = keyed if keyed is not None else claimed_client(headers, body, config.clients)
    app = application(headers)
    spec = PARSERS[route](body, headers)
    router.check_model(spec.model)
    check_context(spec, context_tokens(router))
    acc = router.accounting
    stats = acc.clients.get(client)  # a client not seen yet has nothing in the router
    if stats is not None and stats.in_flight:
        check_caps(router, client, stats.in_flight)
    now = time.monotonic()
    rid = upstream_rid(client, body.get("rid"))
    req = Request(
        id=rid,
        client=client,
        prompt_key=spec.prompt_key,
        max_output_tokens=spec.max_new_tokens,
        arrival_s=now,
        app=app,
    )
    call = Call(
        route=route,
        client=client,
        req=req,
        payload=upstream_payload(raw, body, route, spec.stream, client, rid),
        stream=spec.stream,
        want_usage=spec.include_usage,
        estimate=acc.estimate(req.input_tokens, req.max_output_tokens),
        start_s=now,
        app=app,
    )
    router.lifecycle.arrive(call, now)
    return call


def upstream_payload(
    raw: bytes, body: dict[str, Any], route: Route, stream: bool, client: str, rid: str
) -> bytes:
    """The body sent upstream: the client's, plus ``routing_key`` and ``rid`` (and
    ``stream_options.include_usage`` for OpenAI streams).

    When only the two keys are new, they are spliced into the original bytes before the
    closing brace: no second ``json.dumps`` of the whole body on the hot path."""
    simple = not (stream and route != "generate") and "routing_key" not in body
    text = raw.strip()
    if simple and "rid" not in body and body and text[:1] == b"{" and text[-1:] == b"}":
        extra = f',"routing_key":{json.dumps(client)},"rid":"{rid}"}}'  # rid: hex digits
        return text[:-1] + extra.encode()
    upstream = dict(body)
    upstream["routing_key"] = client
    upstream["rid"] = rid
    if stream and route != "generate":
        options = dict(body.get("stream_options") or {})
        options["include_usage"] = True
        upstream["stream_options"] = options
    return json.dumps(upstream).encode()


chat_completions = _generation("chat")
completions = _generation("completions")
generate = _generation("generate")


# ------------------------------------------------------------------ read-only
async def list_models(request: web.Request) -> web.Response:
    models = [
        {"id": name, "object": "model", "created": 0, "owned_by": "fairserve"}
        for name in request.app[ROUTER].models()
    ]
    return json_response({"object": "list", "data": models})


async def health(request: web.Request) -> web.Response:
    router = request.app[ROUTER]
    healthy = router.healthy()
    body = {"status": "ok" if healthy else "no healthy worker", "healthy_workers": len(healthy)}
    if router.draining:
        body["status"] = "draining"
        return json_response(body, 503)
    return json_response(body, 200 if healthy else 503)


async def state(request: web.Request) -> web.Response:
    """``?window_s=`` (fairness window, default 60) and ``?limit=`` (clients listed)."""
    window_s = _query_number(request, "window_s", DEFAULT_WINDOW_S, 0.0, MAX_WINDOW_S)
    limit = int(_query_number(request, "limit", DEFAULT_CLIENT_LIMIT, 0.0, 100_000.0))
    return json_response(await read(request.app[ROUTER], request.app[URL][0], window_s, limit))


def _query_number(
    request: web.Request, name: str, default: float, low: float, high: float
) -> float:
    """A number from the query string within ``(low, high]``; 400 naming it otherwise."""
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (low < value <= high):
        raise bad_request(f"{name} must be a number within ({low:g}, {high:g}], got {raw!r}")
    return value


async def metrics(request: web.Request) -> web.Response:
    """The Prometheus text, built in turns of the event loop like the state (issue 18)."""
    router = request.app[ROUTER]
    state = json_safe(await read(router))
    body = await in_turns(router.metrics.render_steps(state))
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


# ------------------------------------------------------------------ admin
async def get_quantum(request: web.Request) -> web.Response:
    """Q^w and the effective Q^u (see ``state.quantum_view``)."""
    router = request.app[ROUTER]
    await router.refresh_worker_quanta()
    return json_response(quantum_view(router))


async def put_quantum(request: web.Request) -> web.Response:
    """``{"worker_quantum": Q^w, "quantum": Q^u}`` (either or both)."""
    router = request.app[ROUTER]
    check_admin(request, router.config.admin_token)
    body = parse_json(await request.read())
    unknown = sorted(set(body) - {"worker_quantum", "quantum"})
    if unknown:
        raise bad_request(f"{unknown[0]}: unknown field; expected worker_quantum and/or quantum")
    worker_q = _quantum(body.get("worker_quantum"), "worker_quantum", allow_inf=True)
    local_q = _quantum(body.get("quantum"), "quantum", allow_inf=False)
    if worker_q is None and local_q is None:
        raise bad_request("expected worker_quantum and/or quantum")
    try:
        errors = await router.set_quanta(worker_q, local_q)
    except ConfigError as exc:
        raise bad_request(str(exc)) from None
    return json_response({**quantum_view(router), "worker_errors": errors})


async def get_weights(request: web.Request) -> web.Response:
    return json_response(weights_view(request.app[ROUTER]))


async def put_weight(request: web.Request) -> web.Response:
    """``{"client": NAME, "weight": W}``: a client's fair-share weight, live."""
    router = request.app[ROUTER]
    check_admin(request, router.config.admin_token)
    body = parse_json(await request.read())
    unknown = sorted(set(body) - {"client", "weight"})
    if unknown:
        raise bad_request(f"{unknown[0]}: unknown field; expected client and weight")
    client, weight = body.get("client"), body.get("weight")
    if not isinstance(client, str) or not client.strip():
        raise bad_request(f"client: expected a non-empty client name, got {client!r}")
    if client not in router.config.weights:  # a clients file may name its clients freely
        check_client_name(client, "client")
    if isinstance(weight, bool) or not isinstance(weight, int | float):
        raise bad_request(f"weight: expected a positive number, got {weight!r}")
    try:
        view = await router.set_weight(client, float(weight))
    except ConfigError as exc:
        raise bad_request(f"weight: {exc}") from None
    return json_response(view)


def _quantum(value: object, field: str, allow_inf: bool) -> float | None:
    if value is None:
        return None
    if allow_inf and value == "inf":
        return math.inf
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise bad_request(f"{field}: expected a positive number, got {value!r}")
    number = float(value)
    if not number > 0 or math.isnan(number) or (math.isinf(number) and not allow_inf):
        raise bad_request(f"{field}: expected a positive number, got {value!r}")
    return number


ENABLE_WRITES = "start the router with --admin-token"


def check_admin(request: web.Request, token: str | None) -> None:
    """401 without a bearer token, 403 with a wrong one (or when no token is configured):
    the admin rule every fairserve server shares (``api.auth``)."""
    require_admin(request.headers, token, open_when_unset=False, enable_hint=ENABLE_WRITES)


def routes() -> list[web.RouteDef]:
    return [
        web.post("/v1/chat/completions", chat_completions),
        web.post("/v1/completions", completions),
        web.post("/generate", generate),
        web.get("/v1/models", list_models),
        web.get("/health", health),
        web.get("/metrics", metrics),
        web.get(paths.ROUTER_STATE, state),
        web.get(paths.ROUTER_QUANTUM, get_quantum),
        web.put(paths.ROUTER_QUANTUM, put_quantum),
        web.get(paths.ROUTER_WEIGHTS, get_weights),
        web.put(paths.ROUTER_WEIGHTS, put_weight),
    ]
