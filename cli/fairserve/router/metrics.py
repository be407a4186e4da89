"""``GET /metrics``: the router's Prometheus text.

Per client: requests by outcome, service, tokens, latency and TTFT histograms, queue depth,
DoubleQ deficits; per worker: outstanding requests, router-side queue, health and cache hit
rate; and the Jain index. The registry is the router's own (never prometheus-client's
global one), so several routers in one process (tests, ``launch``) do not clash. Counters
and histograms are fed when a request ends; gauges are read from the router at scrape
time, so they cost nothing per request.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from fairserve.router.accounting import Usage

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_LATENCY_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 40, 60, 120, 300)
_TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)

PREFIX = "fairserve_router_"


class RouterMetrics:
    """The metric objects of one router."""

    def __init__(self) -> None:
        reg = self.registry = CollectorRegistry(auto_describe=True)
        client, worker = ["client"], ["worker"]
        self.requests = Counter(
            PREFIX + "requests", "Requests ended, by outcome.", ["client", "outcome"], registry=reg
        )
        self.service = Counter(
            PREFIX + "client_service", "Service w_e*prompt + w_q*output.", client, registry=reg
        )
        self.tokens = Counter(
            PREFIX + "client_tokens", "Tokens by kind.", ["client", "kind"], registry=reg
        )
        self.latency = Histogram(
            PREFIX + "request_latency_seconds",
            "End-to-end latency seen by the router.",
            client,
            buckets=_LATENCY_BUCKETS_S,
            registry=reg,
        )
        self.ttft = Histogram(
            PREFIX + "time_to_first_token_seconds",
            "Time to the first output token (streams) or the answer (non-streamed).",
            client,
            buckets=_TTFT_BUCKETS_S,
            registry=reg,
        )
        self.queue_depth = Gauge(
            PREFIX + "client_queue_depth", "Requests inside the router.", client, registry=reg
        )
        self.deficit = Gauge(
            PREFIX + "client_deficit",
            "DoubleQ per-client per-worker deficit counter.",
            ["client", "worker"],
            registry=reg,
        )
        self.outstanding = Gauge(
            PREFIX + "worker_outstanding", "Requests in flight at the worker.", worker, registry=reg
        )
        self.waiting = Gauge(
            PREFIX + "worker_router_queue", "Requests held by the router-side fair queue.",
            worker, registry=reg,
        )  # fmt: skip
        self.healthy = Gauge(
            PREFIX + "worker_healthy", "1 when the worker is in rotation.", worker, registry=reg
        )
        self.cache_hit_rate = Gauge(
            PREFIX + "worker_cache_hit_rate", "Cached / prompt tokens.", worker, registry=reg
        )
        self.jain = Gauge(PREFIX + "jain_index", "Jain index of weighted service.", registry=reg)
        self._children: dict[str, tuple[Any, ...]] = {}

    def finished(
        self, client: str, service: float, usage: Usage, latency_s: float, ttft_s: float | None
    ) -> None:
        children = self._children.get(client)
        if children is None:
            children = self._children[client] = self._bind(client)
        finished, served, prompt, cached, completion, latency, ttft = children
        finished.inc()
        served.inc(service)
        prompt.inc(usage.prompt_tokens)
        cached.inc(usage.cached_tokens)
        completion.inc(usage.completion_tokens)
        latency.observe(latency_s)
        if ttft_s is not None:
            ttft.observe(ttft_s)

    def _bind(self, client: str) -> tuple[Any, ...]:
        """The labelled children of one client, looked up once (``labels`` is the costly
        part of an update, and ``finished`` runs for every request)."""
        return (
            self.requests.labels(client, "finished"),
            self.service.labels(client),
            self.tokens.labels(client, "prompt"),
            self.tokens.labels(client, "cached"),
            self.tokens.labels(client, "completion"),
            self.latency.labels(client),
            self.ttft.labels(client),
        )

    def ended(self, client: str, outcome: str) -> None:
        self.requests.labels(client, outcome).inc()

    def render(self, state: Mapping[str, Any]) -> bytes:
        """Refresh the gauges from a state snapshot, then the text exposition."""
        for name, view in state["clients"].items():
            self.queue_depth.labels(name).set(view["queue_depth"])
            for worker, value in (view.get("deficits") or {}).items():
                self.deficit.labels(name, worker).set(_number(value))
        for view in state["workers"]:
            url = view["url"]
            self.outstanding.labels(url).set(view["outstanding"])
            self.waiting.labels(url).set(
                view["router_queue"]["waiting"] if view["router_queue"] else 0
            )
            self.healthy.labels(url).set(1 if view["healthy"] else 0)
            self.cache_hit_rate.labels(url).set(view["cache_hit_rate"])
        self.jain.set(state["jain_index"])
        return generate_latest(self.registry)


def _number(value: Any) -> float:
    if isinstance(value, str):
        return float(value)  # "inf" / "-inf" from JSON-safe snapshots
    return float(value)
