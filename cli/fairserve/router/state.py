"""``GET /fairserve/v1/state``: one JSON snapshot of the router for dashboards and scripts.

Keys: ``router`` (address, uptime, draining, dispatch, policy), ``quantum`` (Q^w, Q^u),
``jain_index`` (+ its window), ``max_service_gap``, ``throughput``, ``clients.<name>``
(weight, requests and outcomes, queue depth, tokens, service and rates, latency and TTFT
percentiles, DoubleQ deficits per worker), ``workers[i]`` (url, health, fairness
``inside``/``router``, outstanding, load, cache hit rate, the router-side queue), and the
raw ``dispatcher`` snapshot.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

import fairserve
from fairserve.router.upstream import Upstream

if TYPE_CHECKING:
    from fairserve.router.service import Router


def snapshot(router: Router, url: str | None = None) -> dict[str, Any]:
    now = time.monotonic()
    acc = router.accounting
    dispatch = router.dispatcher.snapshot()
    deficits = {
        name: view.get("deficits", {}) for name, view in dispatch.get("clients", {}).items()
    }
    clients = {}
    for name in sorted(acc.clients):
        clients[name] = {**acc.client_view(name, now), "deficits": deficits.get(name, {})}
    jain, window = acc.jain_index(now)
    return {
        "router": {
            "url": url,
            "version": fairserve.__version__,
            "uptime_s": now - router.started_s,
            "draining": router.draining,
            "active_requests": router.active,
            "dispatch": router.config.dispatch,
            "policy": router.config.policy,
            "router_queue": router.config.router_queue,
        },
        "quantum": router.quantum_view(),
        "jain_index": jain,
        "jain_window_s": None if window is None else [window[0] - router.started_s,
                                                      window[1] - router.started_s],
        "max_service_gap": acc.max_service_gap(now),
        "throughput": _throughput(clients),
        "clients": clients,
        "workers": [_worker(router, up, dispatch) for up in router.upstreams.values()],
        "dispatcher": dispatch,
    }  # fmt: skip


def _throughput(clients: dict[str, dict[str, Any]]) -> dict[str, float]:
    return {
        "requests_per_s": sum(c["requests_per_s"] for c in clients.values()),
        "tokens_per_s": sum(c["tokens_per_s"] for c in clients.values()),
        "service_per_s": sum(c["service_rate"] for c in clients.values()),
    }


def _worker(router: Router, up: Upstream, dispatch: dict[str, Any]) -> dict[str, Any]:
    stats = router.accounting.worker(up.url)
    info = dispatch.get("workers", {}).get(up.url, {})
    return {
        "url": up.url,
        "healthy": up.healthy,
        "probed": up.probed,
        "fairness": up.fairness,
        "extension": up.extension,
        "models": list(up.models),
        "max_total_tokens": up.max_total_tokens,
        "capacity_tokens_per_s": up.capacity_tokens_per_s,
        "outstanding": info.get("outstanding", 0),
        "outstanding_tokens": info.get("outstanding_tokens", 0),
        "in_flight": up.in_flight,
        "dispatched": info.get("dispatched", 0),
        "tree_tokens": info.get("tree_tokens"),
        "requests": stats.requests,
        "finished": stats.finished,
        "failures": stats.failures,
        "retried": stats.retried,
        "prompt_tokens": stats.prompt_tokens,
        "cached_tokens": stats.cached_tokens,
        "output_tokens": stats.output_tokens,
        "cache_hit_rate": stats.cache_hit_rate,
        "ejections": up.ejections,
        "reinstatements": up.reinstatements,
        "last_error": up.last_error,
        "router_queue": up.queue.snapshot() if up.queue is not None else None,
    }


def json_safe(value: Any) -> Any:
    """NaN and infinities as null / ``"inf"`` (JSON has neither)."""
    if isinstance(value, float):
        if math.isnan(value):
            return None
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return value
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value
