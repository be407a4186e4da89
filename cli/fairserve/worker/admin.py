"""Everything but generation: health, server and model info, metrics, control, and the
fairserve extension (``/fairserve/worker/...``: state, live quantum and weights, eviction
feed), served from the table of :mod:`fairserve.api.worker_extension` that the SGLang plugin
serves too. Admin rule (``api.auth``): writes need the admin token when one is set; without
one they are open only while the worker listens on loopback; ``/abort_request`` and
``/flush_cache`` need the token when the worker listens beyond loopback.

SGLang serves its info endpoints under two names (``/get_server_info`` and the newer
``/server_info``; ``sglang-router`` asks for the new one first), so both are routed here.
"""

from __future__ import annotations

import time
from typing import Any, cast

from aiohttp import web

import fairserve
from fairserve.api import worker_extension as api
from fairserve.api.auth import is_loopback_host, require_admin
from fairserve.core.json_body import parse_json
from fairserve.core.openai_api import ApiError, bad_request
from fairserve.worker import responses as r
from fairserve.worker.generation import RUNTIME
from fairserve.worker.metrics import CONTENT_TYPE, WorkerMetrics
from fairserve.worker.runtime import WorkerRuntime

METRICS: web.AppKey[WorkerMetrics] = web.AppKey("metrics", WorkerMetrics)
LISTEN_HOST: web.AppKey[str] = web.AppKey("listen_host", str)
"""The address the worker listens on: the admin rule of ``api.auth`` depends on it."""
ENABLE_HINT = "start the worker with --admin-token"

STALL_LIMIT_S = 5.0
"""``/health_generate`` fails when work is pending and no step ended for this long."""


def json_response(payload: Any, status: int = 200) -> web.Response:
    return web.json_response(payload, status=status, dumps=r.dumps)


def _runtime(request: web.Request) -> WorkerRuntime:
    return request.app[RUNTIME]


# ------------------------------------------------------------------ health and info
async def health(request: web.Request) -> web.Response:
    """200 while the engine loop runs (SGLang's router polls this)."""
    if not _runtime(request).running:
        raise ApiError(503, "engine loop is not running")
    return json_response({"status": "ok"})


async def health_generate(request: web.Request) -> web.Response:
    """Like ``/health``, and the engine is making progress when it has work."""
    runtime = _runtime(request)
    if not runtime.running:
        raise ApiError(503, "engine loop is not running")
    stalled_s = time.monotonic() - runtime.last_step_wall_s
    if runtime.engine.has_work and stalled_s > STALL_LIMIT_S:
        raise ApiError(503, f"engine has work but no step ended for {stalled_s:.1f} s")
    return json_response({"status": "ok"})


def server_info(runtime: WorkerRuntime) -> dict[str, Any]:
    config, profile = runtime.config, runtime.config.profile
    engine_config = runtime.engine.config
    return {
        "model_path": config.model_name,
        "served_model_name": config.model_name,
        "tokenizer_path": None,
        "max_total_num_tokens": profile.kv_capacity_tokens,
        "context_length": config.context_length,
        "chunked_prefill_size": profile.max_batch_tokens,
        "max_prefill_tokens": profile.max_batch_tokens,
        # Unlimited in the profile: every running request holds >= 2 tokens of KV.
        "max_running_requests": engine_config.max_running_requests
        or profile.kv_capacity_tokens // 2,
        "tp_size": 1,
        "dp_size": 1,
        "version": f"fairserve-{fairserve.__version__}",
        "fairserve": {
            "engine": "sim",
            "policy": runtime.engine.policy.name,
            "quantum": runtime.engine.policy.quantum,
            "profile": profile.name,
            "gpu": profile.gpu,
            "model": profile.model,
            # Load versus capacity (dashboard) and bounds in seconds (tuner) need this.
            "capacity_tokens_per_s": profile.capacity_tokens_per_s,
            "speed": config.speed,
            "batching": config.batching,
        },
    }


async def get_server_info(request: web.Request) -> web.Response:
    return json_response(server_info(_runtime(request)))


async def get_model_info(request: web.Request) -> web.Response:
    name = _runtime(request).config.model_name
    return json_response({"model_path": name, "tokenizer_path": None, "is_generation": True})


async def list_models(request: web.Request) -> web.Response:
    runtime = _runtime(request)
    name = runtime.config.model_name
    model = {
        "id": name,
        "object": "model",
        "created": 0,
        "owned_by": "fairserve",
        "root": name,
        "max_model_len": runtime.config.context_length,
    }
    return json_response({"object": "list", "data": [model]})


async def get_load(request: web.Request) -> web.Response:
    """SGLang's per-rank load (``sglang-router``'s power-of-two policy reads it)."""
    engine = _runtime(request).engine
    load = {
        "dp_rank": 0,
        "num_reqs": len(engine.running) + len(engine.waiting),
        "num_waiting_reqs": len(engine.waiting),
        "num_tokens": engine.pool.used_tokens,
    }
    return json_response([load])


async def metrics(request: web.Request) -> web.Response:
    body = request.app[METRICS].render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


# ------------------------------------------------------------------ control
async def abort_request(request: web.Request) -> web.Response:
    """``{"rid": ...}`` or ``{"abort_all": true}``; unknown ids are not an error (SGLang)."""
    _check_control(request)
    body = parse_json(await request.read())
    runtime = _runtime(request)
    if body.get("abort_all") is True:
        return json_response({"aborted": runtime.abort_all("aborted by /abort_request")})
    rid = body.get("rid")
    if not isinstance(rid, str) or not rid:
        raise bad_request(f"rid: expected a non-empty string, got {rid!r}")
    found = runtime.abort(rid, "aborted by /abort_request")
    return json_response({"aborted": int(found)})


async def flush_cache(request: web.Request) -> web.Response:
    _check_control(request)
    if not _runtime(request).flush_cache():
        raise bad_request("cache not flushed: requests are waiting or running")
    return json_response({"message": "cache flushed"})


def _check_control(request: web.Request) -> None:
    """``/abort_request`` and ``/flush_cache`` end other tenants' work: beyond loopback they
    need the admin token (the rule of ``api.auth``); on loopback they stay open, as in
    SGLang, for the local router that aborts the requests of clients gone."""
    if _loopback_only(request):
        return
    token = _runtime(request).config.admin_token
    require_admin(request.headers, token, open_when_unset=False, enable_hint=ENABLE_HINT)


# ------------------------------------------------------------------ fairserve extension
async def extension(request: web.Request) -> web.Response:
    """Every ``/fairserve/worker/...`` route: the shared table of ``api.worker_extension``."""
    runtime = _runtime(request)
    query = {name: request.query.getall(name)[-1] for name in request.query}
    length = request.content_length
    if length is not None and length > api.MAX_BODY_BYTES:
        raise api.body_too_large(length)
    body = await request.read() if request.method != "GET" else b""
    call = api.ExtensionRequest(request.method, request.path, query, request.headers, body)
    rule = api.AdminRule(runtime.config.admin_token, _loopback_only(request), ENABLE_HINT)
    status, payload = api.handle(call, SimulatedHost(runtime), rule)
    return json_response(payload, status)


def extension_routes() -> list[web.RouteDef]:
    """Every route of the shared table, each served by :func:`extension`."""
    return [web.route(method, path, extension) for method, path in api.ROUTES]


class SimulatedHost:
    """The simulated engine as an :class:`~fairserve.api.worker_extension.ExtensionHost`;
    changes apply to the policy at once and take effect at the next batching step."""

    def __init__(self, runtime: WorkerRuntime) -> None:
        self.runtime = runtime
        self.policy = runtime.engine.policy

    def state(self) -> dict[str, Any]:
        return {"model_name": self.runtime.config.model_name, **self.runtime.state()}

    def quantum(self) -> api.QuantumView:
        return {"policy": self.policy.name, "quantum": self.policy.quantum}

    def set_quantum(self, quantum: float) -> api.QuantumView:
        self.policy.set_quantum(quantum)
        return self.quantum()

    def weights(self) -> api.WeightsView:
        return {"policy": self.policy.name, "weights": dict(self.policy.weights)}

    def set_weight(self, client: str, weight: float) -> api.WeightsView:
        self.policy.set_weight(client, weight)
        return self.weights()

    def evictions(self, since: int, limit: int) -> api.EvictionPage:
        return cast(api.EvictionPage, self.runtime.evictions.read(since, limit))


def _loopback_only(request: web.Request) -> bool:
    """Whether the worker listens on loopback only (``LISTEN_HOST``, set by the server;
    unknown counts as beyond loopback, the safe side)."""
    host = request.app.get(LISTEN_HOST)
    return host is not None and is_loopback_host(host)
