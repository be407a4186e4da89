"""``GET /metrics``: the router's Prometheus text.

Per client: requests by outcome, service, tokens, latency and TTFT histograms, queue depth,
DoubleQ deficits; per worker: outstanding requests, router-side queue, health and cache hit
rate; and the Jain index. The registry is the router's own (never prometheus-client's
global one), so several routers in one process (tests, ``launch``) do not clash.

**Cost per request.** The per-client counters and histograms are plain Python numbers
updated when a request ends (a few additions and one ``bisect``: no lock, no label lookup)
and turned into metric families only when ``/metrics`` is scraped, by a custom collector.
Gauges are read from the router's state at scrape time.

**Label cardinality.** Client names come from requests (``X-Fairserve-Client``, the
OpenAI ``user`` field), so there may be any number of them; each name would be a series in
every per-client metric. Clients of the clients file always get their own label; of the
others, the first ``max_clients`` names seen do, and the rest are summed under the label
``other``. The assignment is sticky (never re-ranked), so every series stays monotonic, as
Prometheus counters must. The state endpoint still shows every client by name.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Collection, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from fairserve.router.accounting import Usage
from fairserve.router.config import DEFAULT_METRICS_MAX_CLIENTS

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_LATENCY_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 40, 60, 120, 300)
_TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)

PREFIX = "fairserve_router_"
OTHER = "other"
"""The label of the clients beyond the cap."""


class _Histogram:
    """Bucket counts (not cumulative; the last one is ``+Inf``) and the sum."""

    __slots__ = ("bounds", "counts", "les", "total_s")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.les = (*(repr(float(b)) for b in bounds), "+Inf")
        self.counts = [0] * (len(bounds) + 1)
        self.total_s = 0.0

    def observe(self, value_s: float) -> None:
        self.counts[bisect_left(self.bounds, value_s)] += 1
        self.total_s += value_s

    def buckets(self) -> list[tuple[str, float]]:
        out, running = [], 0
        for le, count in zip(self.les, self.counts, strict=True):
            running += count
            out.append((le, float(running)))
        return out


class _Series:
    """The counters of one client label."""

    __slots__ = ("cached", "completion", "latency", "outcomes", "prompt", "service", "ttft")

    def __init__(self) -> None:
        self.outcomes: dict[str, int] = {}
        self.service = 0.0
        self.prompt = 0
        self.cached = 0
        self.completion = 0
        self.latency = _Histogram(_LATENCY_BUCKETS_S)
        self.ttft = _Histogram(_TTFT_BUCKETS_S)


class RouterMetrics:
    """The metrics of one router."""

    def __init__(
        self, max_clients: int = DEFAULT_METRICS_MAX_CLIENTS, known_clients: Collection[str] = ()
    ) -> None:
        self.max_clients = max_clients
        self._known = frozenset(known_clients)
        self._series: dict[str, _Series] = {name: _Series() for name in self._known}
        self._others = 0
        """Names beyond the clients file that got their own label."""
        self._other = _Series()
        reg = self.registry = CollectorRegistry(auto_describe=True)
        reg.register(_ClientCollector(self))
        client, worker = ["client"], ["worker"]
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

    # ------------------------------------------------------------------ per request
    def finished(
        self, client: str, service: float, usage: Usage, latency_s: float, ttft_s: float | None
    ) -> None:
        series = self._series.get(client) or self._admit(client)
        outcomes = series.outcomes
        outcomes["finished"] = outcomes.get("finished", 0) + 1
        series.service += service
        series.prompt += usage.prompt_tokens
        series.cached += usage.cached_tokens
        series.completion += usage.completion_tokens
        series.latency.observe(latency_s)
        if ttft_s is not None:
            series.ttft.observe(ttft_s)

    def ended(self, client: str, outcome: str) -> None:
        series = self._series.get(client) or self._admit(client)
        series.outcomes[outcome] = series.outcomes.get(outcome, 0) + 1

    def label(self, client: str) -> str:
        """The label ``client`` is counted under (its name, or ``other``)."""
        return client if client in self._series else OTHER

    def _admit(self, client: str) -> _Series:
        """A client seen for the first time: its own series while the cap allows."""
        if self._others < self.max_clients and client != OTHER:
            self._others += 1
            series = self._series[client] = _Series()
            return series
        return self._other

    def labelled(self) -> Iterator[tuple[str, _Series]]:
        """(label, series) of every client label with data, ``other`` last."""
        yield from self._series.items()
        if self._other.outcomes:
            yield OTHER, self._other

    # ------------------------------------------------------------------ scrape
    def render(self, state: Mapping[str, Any]) -> bytes:
        """Refresh the gauges from a state snapshot, then the text exposition."""
        depth: dict[str, float] = {}
        for name, view in state["clients"].items():
            label = self.label(name)
            depth[label] = depth.get(label, 0.0) + view["queue_depth"]
            if label == name:
                for worker, value in (view.get("deficits") or {}).items():
                    self.deficit.labels(name, worker).set(_number(value))
        for label, value in depth.items():
            self.queue_depth.labels(label).set(value)
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


class _ClientCollector(Collector):
    """The per-client counters and histograms as metric families, built at scrape time."""

    def __init__(self, metrics: RouterMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            PREFIX + "requests", "Requests ended, by outcome.", labels=["client", "outcome"]
        )
        service = CounterMetricFamily(
            PREFIX + "client_service", "Service w_e*prompt + w_q*output.", labels=["client"]
        )
        tokens = CounterMetricFamily(
            PREFIX + "client_tokens", "Tokens by kind.", labels=["client", "kind"]
        )
        latency = HistogramMetricFamily(
            PREFIX + "request_latency_seconds",
            "End-to-end latency seen by the router.",
            labels=["client"],
        )
        ttft = HistogramMetricFamily(
            PREFIX + "time_to_first_token_seconds",
            "Time to the first output token (streams) or the answer (non-streamed).",
            labels=["client"],
        )
        for label, s in self.metrics.labelled():
            for outcome, count in s.outcomes.items():
                requests.add_metric([label, outcome], count)
            service.add_metric([label], s.service)
            for kind, count in (("prompt", s.prompt), ("cached", s.cached),
                                ("completion", s.completion)):  # fmt: skip
                tokens.add_metric([label, kind], count)
            latency.add_metric([label], s.latency.buckets(), s.latency.total_s)
            ttft.add_metric([label], s.ttft.buckets(), s.ttft.total_s)
        yield from (requests, service, tokens, latency, ttft)


def _number(value: Any) -> float:
    if isinstance(value, str):
        return float(value)  # "inf" / "-inf" from JSON-safe snapshots
    return float(value)
