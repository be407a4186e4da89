"""``GET /fairserve/v1/state``: one JSON snapshot of the router for dashboards and scripts.

Keys: ``router`` (address, uptime, draining, dispatch, policy), ``quantum`` (Q^w, the
effective Q^u and where it comes from), ``jain_index`` (+ its window), ``max_service_gap``,
``max_request_cost`` (the ``U`` of the service-gap bound, as seen), ``throughput``,
``clients.<name>`` (weight, requests and outcomes, queue depth, tokens, service and rates,
latency and TTFT percentiles, DoubleQ deficits per worker), ``workers[i]`` (url, health,
fairness ``inside``/``router``, outstanding, load, capacity, cache hit rate, the router-side
queue), and the raw ``dispatcher`` snapshot.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import fairserve
from fairserve.api.jsonsafe import json_safe as json_safe  # the one rule; handlers import it here
from fairserve.router.upstream import Upstream
from fairserve.sched.local.base import local_policy_class
from fairserve.sched.registry import load_all

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
        "quantum": quantum_view(router),
        "jain_index": jain,
        "jain_window_s": None if window is None else [window[0] - router.started_s,
                                                      window[1] - router.started_s],
        "max_service_gap": acc.max_service_gap(now),
        "max_request_cost": router.max_request_cost,
        "throughput": _throughput(clients),
        "clients": clients,
        "workers": [_worker(router, up, dispatch) for up in router.upstreams.values()],
        "dispatcher": dispatch,
    }  # fmt: skip


def quantum_view(router: Router) -> dict[str, Any]:
    """Q^w and the *effective* Q^u: the one set through the router, else what the workers
    report, else the router queues', else the policy's default.

    ``quantum_source`` says which (``set``, ``workers``, ``router-queue``, ``default``; null
    for a policy without a quantum) and ``worker_quanta`` lists each worker's own report
    (null: not known yet)."""
    quantum, source = _effective_quantum(router)
    return {
        "dispatch": router.dispatcher.name,
        "worker_quantum": router.dispatcher.quantum,
        "policy": router.config.policy,
        "quantum": quantum,
        "quantum_source": source,
        "worker_quanta": {
            url: router.worker_quanta.get(url)
            for url, up in router.upstreams.items()
            if up.extension
        },
    }


def _effective_quantum(router: Router) -> tuple[float | None, str | None]:
    if router.local_quantum is not None:
        return router.local_quantum, "set"
    for url, quantum in router.worker_quanta.items():
        if quantum is not None and router.routed_extension(url):
            return quantum, "workers"
    for up in router.upstreams.values():
        if up.queue is not None and up.queue.policy.quantum is not None:
            return up.queue.policy.quantum, "router-queue"
    default = default_quantum(router.config.policy)
    return default, None if default is None else "default"


def default_quantum(policy: str) -> float | None:
    """The declared default ``Q^u`` of ``policy`` (None: it has no quantum)."""
    load_all()
    for param in local_policy_class(policy).params:
        if param.name == "quantum":
            return float(param.default)
    return None


def weights_view(router: Router) -> dict[str, Any]:
    """Every client's weight (configured, changed live, or the default 1 of a client seen
    without one) and those changed through the admin API."""
    names = set(router.weights) | set(router.accounting.clients)
    return {
        "weights": {name: router.weights.get(name, 1.0) for name in sorted(names)},
        "changed": dict(sorted(router.live_weights.items())),
    }


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
        "extension_url": up.extension_base,
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
