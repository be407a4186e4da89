"""Router and worker JSON (and SGLang's Prometheus text) into :mod:`fairserve.tui.model`.

The dashboard must never crash on what a router sends: an older router lacks keys, a newer
one adds some, JSON has no infinity (the router writes ``"inf"``) and a worker may answer
with garbage. So every field is read through a tolerant accessor with a default. The
router's documents are read as their schema types (:mod:`fairserve.api.router_schema`): the
keys read here are the ones that schema names.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, cast

from fairserve.api.router_schema import RouterQuantum, RouterState
from fairserve.tui.model import (
    ClientLoad,
    ClientView,
    Quanta,
    RouterInfo,
    Snapshot,
    Throughput,
    WorkerProbe,
    WorkerView,
)


# ---------------------------------------------------------------- tolerant accessors
def as_float(value: object, default: float | None = None) -> float | None:
    """A JSON number (``"inf"``/``"-inf"`` too) as a float; anything else is ``default``."""
    if isinstance(value, bool):
        return default
    if isinstance(value, int | float):
        number = float(value)
        return default if math.isnan(number) else number
    if value == "inf":
        return math.inf
    if value == "-inf":
        return -math.inf
    return default


def as_int(value: object, default: int = 0) -> int:
    number = as_float(value)
    if number is None or math.isinf(number):
        return default
    return int(number)


def as_str(value: object, default: str = "") -> str:
    return value if isinstance(value, str) else default


def as_dict(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def as_list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _num(data: Mapping[str, Any], key: str, default: float = 0.0) -> float:
    value = as_float(data.get(key), default)
    return default if value is None else value


def _opt(data: Mapping[str, Any], key: str) -> float | None:
    return as_float(data.get(key))


# ---------------------------------------------------------------- parsing
def parse_state(data: object, url: str = "") -> Snapshot:
    """The router's ``/fairserve/v1/state`` JSON as a :class:`Snapshot` (never raises)."""
    state = cast(RouterState, as_dict(data))  # values are still read tolerantly
    window = as_list(state.get("jain_window_s"))
    start, end = (as_float(v) for v in window[:2]) if len(window) >= 2 else (None, None)
    throughput = as_dict(state.get("throughput"))
    return Snapshot(
        router=_router(as_dict(state.get("router")), url),
        quanta=parse_quanta(state.get("quantum")),
        jain_index=_judged_jain(state),
        jain_window_s=None if start is None or end is None else (start, end),
        max_service_gap=as_float(state.get("max_service_gap")),
        fairness_window_s=as_float(as_dict(state.get("fairness")).get("window_s")),
        throughput=Throughput(
            _num(throughput, "tokens_per_s"),
            _num(throughput, "service_per_s"),
            _num(throughput, "requests_per_s"),
        ),
        clients=tuple(
            _client(str(name), as_dict(view))
            for name, view in sorted(as_dict(state.get("clients")).items())
        ),
        workers=tuple(_worker(as_dict(w)) for w in as_list(state.get("workers")) if w),
    )


def _judged_jain(state: Mapping[str, Any]) -> float | None:
    """Jain's index, None when the router judged fewer than two clients in its window: it
    then reports 1.0, which says nothing about fairness and would read as perfect."""
    judged = as_float(as_dict(state.get("fairness")).get("clients_judged"))
    if judged is not None and judged < 2:
        return None
    return as_float(state.get("jain_index"))


def parse_quanta(data: object) -> Quanta:
    view = cast(RouterQuantum, as_dict(data))
    return Quanta(as_float(view.get("quantum")), as_float(view.get("worker_quantum")))


def _router(data: Mapping[str, Any], url: str) -> RouterInfo:
    return RouterInfo(
        url=as_str(data.get("url")) or url,
        version=as_str(data.get("version")),
        uptime_s=_num(data, "uptime_s"),
        draining=data.get("draining") is True,
        active_requests=as_int(data.get("active_requests")),
        dispatch=as_str(data.get("dispatch"), "?"),
        policy=as_str(data.get("policy"), "?"),
        router_queue=as_str(data.get("router_queue")),
    )


def _client(name: str, data: Mapping[str, Any]) -> ClientView:
    deficits = as_dict(data.get("deficits"))
    return ClientView(
        name=name,
        weight=_num(data, "weight", 1.0),
        requests=as_int(data.get("requests")),
        finished=as_int(data.get("finished")),
        failed=as_int(data.get("failed")),
        rejected=as_int(data.get("rejected")),
        in_flight=as_int(data.get("in_flight")),
        queued=as_int(data.get("queued")),
        service=_num(data, "service"),
        service_rate=_num(data, "service_rate"),
        tokens_per_s=_num(data, "tokens_per_s"),
        prompt_tokens=as_int(data.get("prompt_tokens")),
        cached_tokens=as_int(data.get("cached_tokens")),
        latency_p50_s=_opt(data, "latency_p50_s"),
        latency_p99_s=_opt(data, "latency_p99_s"),
        ttft_p50_s=_opt(data, "ttft_p50_s"),
        ttft_p99_s=_opt(data, "ttft_p99_s"),
        deficits=tuple(
            (str(w), value) for w, v in deficits.items() if (value := as_float(v)) is not None
        ),
    )


def _worker(data: Mapping[str, Any]) -> WorkerView:
    capacity = as_float(data.get("capacity_tokens_per_s"))
    max_total = as_int(data.get("max_total_tokens"), 0)
    error = data.get("last_error")
    return WorkerView(
        url=as_str(data.get("url"), "?"),
        healthy=data.get("healthy") is True,
        extension_url=as_str(data.get("extension_url")),
        fairness=as_str(data.get("fairness")),
        extension=data.get("extension") is True,
        outstanding=as_int(data.get("outstanding")),
        in_flight=as_int(data.get("in_flight")),
        requests=as_int(data.get("requests")),
        finished=as_int(data.get("finished")),
        failures=as_int(data.get("failures")),
        prompt_tokens=as_int(data.get("prompt_tokens")),
        cached_tokens=as_int(data.get("cached_tokens")),
        output_tokens=as_int(data.get("output_tokens")),
        cache_hit_rate=_num(data, "cache_hit_rate"),
        capacity_tokens_per_s=capacity if capacity is not None and capacity > 0 else None,
        max_total_tokens=max_total or None,
        last_error=error if isinstance(error, str) and error else None,
    )


def parse_worker_state(data: object) -> WorkerProbe:
    """A worker's ``/fairserve/worker/state`` (simulated worker or the SGLang plugin)."""
    state = as_dict(data)
    kv = as_dict(state.get("kv"))
    policy = as_dict(state.get("policy"))
    gpu = as_dict(state.get("gpu"))
    clients = tuple(
        ClientLoad(str(name), as_int(as_dict(v).get("waiting")), as_int(as_dict(v).get("running")))
        for name, v in sorted(as_dict(state.get("clients")).items())
    )
    index = as_float(gpu.get("index"))
    return WorkerProbe(
        running=as_int(state.get("running")) if "running" in state else None,
        waiting=as_int(state.get("waiting")) if "waiting" in state else None,
        kv_used_tokens=as_float(kv.get("used_tokens")),
        kv_capacity_tokens=as_float(kv.get("capacity_tokens")),
        quantum=as_float(policy.get("quantum")),
        speed=_num(state, "speed", 1.0) or 1.0,
        gpu_index=None if index is None or math.isinf(index) else int(index),
        gpu_uuid=as_str(gpu.get("uuid")) or None,
        clients=clients,
        per_client="clients" in state,
    )


def parse_sglang_metrics(text: str) -> WorkerProbe:
    """The gauges an SGLang worker without the fairserve extension exports on ``/metrics``:
    ``num_running_reqs``, ``num_queue_reqs`` and ``token_usage`` (summed over label sets,
    e.g. data-parallel ranks; usage averaged)."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for line in text.splitlines():
        if not line.startswith("sglang:"):
            continue
        head, _, value_text = line.rpartition(" ")
        value = _parse_number(value_text)
        if value is None or math.isnan(value):
            continue
        key = head.split("{", 1)[0].removeprefix("sglang:").strip()
        sums[key] = sums.get(key, 0.0) + value
        counts[key] = counts.get(key, 0) + 1
    usage = sums.get("token_usage")
    return WorkerProbe(
        running=int(sums["num_running_reqs"]) if "num_running_reqs" in sums else None,
        waiting=int(sums["num_queue_reqs"]) if "num_queue_reqs" in sums else None,
        kv_usage=None if usage is None else usage / counts["token_usage"],
    )


def _parse_number(text: str) -> float | None:
    try:
        return float(text.strip())
    except ValueError:
        return None
