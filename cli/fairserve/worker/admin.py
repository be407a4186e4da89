"""Everything but generation: health, server and model info, metrics, control, and the
fairserve extension (``/fairserve/worker/...``: state, live quantum, eviction feed).

SGLang serves its info endpoints under two names (``/get_server_info`` and the newer
``/server_info``; ``sglang-router`` asks for the new one first), so both are routed here.
"""

from __future__ import annotations

import hmac
import time
from typing import Any

from aiohttp import web

import fairserve
from fairserve.core.errors import ConfigError
from fairserve.core.openai_api import ApiError, bad_request, parse_json
from fairserve.worker import responses as r
from fairserve.worker.generation import RUNTIME
from fairserve.worker.metrics import CONTENT_TYPE, WorkerMetrics
from fairserve.worker.runtime import WorkerRuntime

METRICS: web.AppKey[WorkerMetrics] = web.AppKey("metrics", WorkerMetrics)

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
        "max_model_len": runtime.config.profile.kv_capacity_tokens,
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
    if not _runtime(request).flush_cache():
        raise bad_request("cache not flushed: requests are waiting or running")
    return json_response({"message": "cache flushed"})


# ------------------------------------------------------------------ fairserve extension
async def worker_state(request: web.Request) -> web.Response:
    runtime = _runtime(request)
    return json_response({"model_name": runtime.config.model_name, **runtime.state()})


async def get_quantum(request: web.Request) -> web.Response:
    policy = _runtime(request).engine.policy
    return json_response({"policy": policy.name, "quantum": policy.quantum})


async def put_quantum(request: web.Request) -> web.Response:
    """Set the local policy's Q^u; takes effect at the next batching step."""
    runtime = _runtime(request)
    _check_admin(request, runtime.config.admin_token)
    body = parse_json(await request.read())
    quantum = body.get("quantum")
    if isinstance(quantum, bool) or not isinstance(quantum, int | float):
        raise bad_request(f"quantum: expected a positive number, got {quantum!r}")
    policy = runtime.engine.policy
    try:
        policy.set_quantum(float(quantum))
    except ConfigError as exc:
        raise bad_request(str(exc)) from None
    return json_response({"policy": policy.name, "quantum": policy.quantum})


async def get_weights(request: web.Request) -> web.Response:
    policy = _runtime(request).engine.policy
    return json_response({"policy": policy.name, "weights": dict(policy.weights)})


async def put_weights(request: web.Request) -> web.Response:
    """Set one client's weight in the local policy (``fairserve tune weight`` pushes it here);
    like the quantum, it takes effect at the next batching step."""
    runtime = _runtime(request)
    _check_admin(request, runtime.config.admin_token)
    body = parse_json(await request.read())
    unknown = sorted(set(body) - {"client", "weight"})
    if unknown:
        raise bad_request(f"{unknown[0]}: unknown field; expected client and weight")
    client, weight = body.get("client"), body.get("weight")
    if not isinstance(client, str) or not client:
        raise bad_request(f"client: expected a non-empty string, got {client!r}")
    if isinstance(weight, bool) or not isinstance(weight, int | float):
        raise bad_request(f"weight: expected a positive number, got {weight!r}")
    policy = runtime.engine.policy
    try:
        policy.set_weight(client, float(weight))
    except ConfigError as exc:
        raise bad_request(str(exc)) from None
    return json_response({"policy": policy.name, "weights": dict(policy.weights)})


async def evictions(request: web.Request) -> web.Response:
    """Eviction events with ``seq >= since`` (encoding: see ``worker.evictions``)."""
    since = _query_int(request, "since", 0)
    limit = _query_int(request, "limit", 1000)
    if limit < 1:
        raise bad_request(f"limit: expected a positive integer, got {limit}")
    return json_response(_runtime(request).evictions.read(since, limit))


def _query_int(request: web.Request, name: str, default: int) -> int:
    text = request.query.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise bad_request(f"{name}: expected a non-negative integer, got {text!r}") from None
    if value < 0:
        raise bad_request(f"{name}: expected a non-negative integer, got {value}")
    return value


def _check_admin(request: web.Request, token: str | None) -> None:
    if token is None:
        return
    given = request.headers.get("Authorization", "")
    scheme, _, value = given.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(
        value.strip().encode(), token.encode()
    ):
        raise ApiError(401, "admin token required: send 'Authorization: Bearer TOKEN'")
