"""``GET /fairserve/v1/state``: one JSON snapshot of the router for dashboards and scripts.

Keys: ``router`` (address, uptime, draining, dispatch, policy), ``quantum`` (Q^w, the
effective Q^u and where it comes from), ``fairness`` (Jain's index and the weighted service
gap over the last ``window_s`` seconds, with their unit and span; ``jain_index``,
``jain_window_s`` and ``max_service_gap`` repeat them), ``clients_total``/``clients_shown``,
``max_request_cost`` (the ``U`` of the service-gap bound, as seen), ``throughput``,
``clients.<name>`` (weight, requests and outcomes, queue depth, tokens, service and rates,
latency and TTFT percentiles, DoubleQ deficits per worker), ``workers[i]`` (url, health,
fairness ``inside``/``router``, outstanding, load, capacity, cache hit rate, the router-side
queue), and the raw ``dispatcher`` snapshot.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from itertools import chain
from operator import attrgetter
from typing import TYPE_CHECKING, Any, TypeVar

import fairserve
from fairserve.api.jsonsafe import json_safe as json_safe  # the one rule; handlers import it here
from fairserve.core.ledger import DEFAULT_WINDOW_S
from fairserve.core.ledger_view import SERVICE_UNIT, Steps, WindowView, finish, view_steps
from fairserve.router.accounting import ClientStats, client_figures
from fairserve.router.identity import auth_mode
from fairserve.router.upstream import Upstream

if TYPE_CHECKING:
    from fairserve.router.service import Router

T = TypeVar("T")

_IN_FLIGHT = attrgetter("in_flight")
_SERVICE = attrgetter("service")
DEFAULT_CLIENT_LIMIT = 100
"""Clients listed in one state read (the busiest first); ``limit`` asks for more or fewer."""
RANK_SLICE = 2048
"""Clients ranked per step when choosing which to list."""
VIEWS_SLICE = 25
"""Listed clients whose percentiles are computed per step."""
SETTLE_STEPS = 200
"""At most this many ``ledger.settle`` steps before a read (then it reads regardless)."""


def snapshot(
    router: Router,
    url: str | None = None,
    window_s: float = DEFAULT_WINDOW_S,
    limit: int = DEFAULT_CLIENT_LIMIT,
) -> dict[str, Any]:
    """The state document; fairness over the last ``window_s`` seconds, at most ``limit``
    clients (those with requests inside the router first, then by service). At once: a
    caller on the router's event loop uses :func:`read`."""
    return finish(snapshot_steps(router, url, window_s, limit))


async def read(
    router: Router,
    url: str | None = None,
    window_s: float = DEFAULT_WINDOW_S,
    limit: int = DEFAULT_CLIENT_LIMIT,
) -> dict[str, Any]:
    """:func:`snapshot` on the router's event loop, never holding it more than a step (a
    millisecond or two with 10,000 clients, issue 18): requests keep flowing meanwhile."""
    return await in_turns(snapshot_steps(router, url, window_s, limit))


async def in_turns(steps: Steps[T]) -> T:
    """Run ``steps``, letting the event loop run other work between two of them."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        await asyncio.sleep(0)


def snapshot_steps(
    router: Router, url: str | None, window_s: float, limit: int
) -> Steps[dict[str, Any]]:
    """The state document in steps. Every figure in it is read at one instant, in one step
    that only copies (the window's incremental read, the listed clients' counters and
    recent latencies, the workers); what is costly with many clients works on copies in
    the steps around it: ranking the clients to list (on their counters copied first, so
    the list is the busiest as the read began), bringing the window's figures up to date
    (``ledger.settle``, so that instant has little left to do), Jain's index and the
    gap, percentiles."""
    acc = router.accounting
    shown = yield from _busiest(list(acc.clients), list(acc.clients.values()), limit)
    for _ in range(SETTLE_STEPS):
        yield
        if not acc.clients or not acc.ledger.settle(window_s, time.monotonic()):
            break
    yield
    weights = acc.ledger.weights_copy(window_s)
    yield
    # ---- the instant: copies only
    now = time.monotonic()
    parts = acc.ledger.window_parts(window_s, now, weights=weights) if acc.clients else None
    copies = {name: acc.client_copy(name, now) for name in sorted(shown) if name in acc.clients}
    dispatch = router.dispatcher.snapshot(list(copies))  # only the clients shown: not 10,000
    head = _head(router, url, now)
    workers = [_worker(router, up, dispatch) for up in router.upstreams.values()]
    clients_total, max_request_cost = len(acc.clients), router.max_request_cost
    # ---- the rest from the copies
    view = None
    if parts is not None:
        yield
        view = yield from view_steps(parts)
    deficits = {
        name: view.get("deficits", {}) for name, view in dispatch.get("clients", {}).items()
    }
    clients = {}
    for at, (name, copy) in enumerate(copies.items()):
        if at % VIEWS_SLICE == 0:
            yield
        clients[name] = {**client_figures(copy), "deficits": deficits.get(name, {})}
    window = None if view is None else (view.start_s, view.end_s)
    return {
        **head,
        "fairness": _fairness(view, window_s),
        "jain_index": 1.0 if view is None else view.jain_index,
        "jain_window_s": None if window is None else [window[0] - router.started_s,
                                                      window[1] - router.started_s],
        "max_service_gap": 0.0 if view is None else view.service_gap.value,
        "max_request_cost": max_request_cost,
        "throughput": _throughput(clients),
        "clients_total": clients_total,
        "clients_shown": len(clients),
        "clients": clients,
        "workers": workers,
        "dispatcher": dispatch,
    }  # fmt: skip


def _busiest(names: list[str], stats: list[ClientStats], limit: int) -> Steps[list[str]]:
    """The ``limit`` clients with the most requests inside the router, then the most
    service (then the greatest name), ranked on (in_flight, service, name) tuples built
    and compared in C, ``RANK_SLICE`` clients per step (the largest of a union are the
    largest of one part's largest and the other part: the same answer as in one go).
    The clients are those tracked as the read began, their counters as each step reads
    them."""
    best: list[tuple[int, float, str]] = []
    for at in range(0, len(names), RANK_SLICE):
        yield
        end = at + RANK_SLICE
        some = stats[at:end]
        part = zip(map(_IN_FLIGHT, some), map(_SERVICE, some), names[at:end], strict=True)
        best = heapq.nlargest(limit, chain(best, part))
    return [name for _, _, name in best]


def _head(router: Router, url: str | None, now: float) -> dict[str, Any]:
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
            "settings": router.settings_view(),
            "auth_mode": auth_mode(router.config.clients, router.config.trust_identity_header),
            "slots": router.slots.view(),
        },
        "quantum": quantum_view(router),
    }


def _fairness(view: WindowView | None, window_s: float) -> dict[str, Any]:
    """Jain's index and the service gap with what they cover, so no figure goes unlabelled
    (before any client: fair, no gap)."""
    figures = view.to_json() if view is not None else {
        "window_s": window_s, "weighted": True, "span_s": None, "clients_judged": 0,
        "jain_index": 1.0, "service_gap": 0.0, "service_gap_clients": None,
        "service_gap_considered": 0, "unit": SERVICE_UNIT,
    }  # fmt: skip
    return {
        **figures,
        "live": "streamed requests are credited as tokens arrive; others when they end",
    }


def quantum_view(router: Router) -> dict[str, Any]:
    """Q^w and the *effective* Q^u: the one set through the router, else what the workers
    report, else the router queues', else the policy's default.

    ``quantum_source`` says which (``set``, ``workers``, ``router-queue``, ``default``; null
    for a policy without a quantum) and ``worker_quanta`` lists each worker's own report
    (null: not known yet)."""
    settings = router.settings
    queues = any(up.queue is not None for up in router.upstreams.values())
    quantum, source = settings.effective_quantum(router.routed_extension, queues)
    return {
        "dispatch": router.dispatcher.name,
        "worker_quantum": settings.worker_quantum,
        "policy": router.config.policy,
        "quantum": quantum,
        "quantum_source": source,
        "worker_quanta": {
            url: settings.worker_quanta.get(url)
            for url, up in router.upstreams.items()
            if up.extension
        },
    }


def weights_view(router: Router) -> dict[str, Any]:
    """Every client's weight (configured, changed live, or the default 1 of a client seen
    without one) and those changed through the admin API."""
    settings = router.settings
    names = set(settings.weights) | set(router.accounting.clients)
    return {
        "weights": {name: settings.weight(name) for name in sorted(names)},
        "changed": dict(sorted(settings.live_weights.items())),
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
