"""``GET /metrics``: the router's Prometheus text, read from the ledger at scrape time.

Per client: requests by outcome, service, tokens, latency and TTFT histograms, queue depth,
DoubleQ deficits; per worker: outstanding requests, router-side queue, health and cache hit
rate; and the Jain index. The registry is the router's own (never prometheus-client's
global one), so several routers in one process (tests, ``launch``) do not clash.

**No second copy of the counts.** The per-client counters and histograms are the
accounting's label totals (:class:`~fairserve.router.accounting.Totals`, updated where the
accounting hears each request end), turned into metric families only when ``/metrics`` is
scraped, by a custom collector; gauges are read from the router's state snapshot then.

**Label cardinality.** Client names come from requests (``X-Fairserve-Client``, the
OpenAI ``user`` field), so there may be any number of them; each name would be a series in
every per-client metric. Clients of the clients file always get their own label; of the
others, the first ``max_clients`` names seen do, and the rest are summed under the label
``other``. The assignment is sticky (never re-ranked) and a label's totals outlive the
accounting's forgetting of idle clients, so every series stays monotonic, as Prometheus
counters must. The state endpoint still shows every client by name.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from functools import cache
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from fairserve.router.accounting import OTHER as OTHER
from fairserve.router.accounting import Accounting, Histogram

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

PREFIX = "fairserve_router_"


class RouterMetrics:
    """The metrics of one router, over its accounting."""

    def __init__(self, accounting: Accounting) -> None:
        self.accounting = accounting
        reg = self.registry = CollectorRegistry(auto_describe=True)
        reg.register(_ClientCollector(accounting))
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

    def label(self, client: str) -> str:
        """The label ``client`` is counted under (its name, or ``other``)."""
        return self.accounting.label_of(client)

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
    """The accounting's label totals as metric families, built at scrape time."""

    def __init__(self, accounting: Accounting) -> None:
        self.accounting = accounting

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
        for label, t in self.accounting.labelled():
            for outcome, count in t.outcomes.items():
                requests.add_metric([label, outcome], count)
            service.add_metric([label], t.service)
            for kind, count in (("prompt", t.prompt), ("cached", t.cached),
                                ("completion", t.completion)):  # fmt: skip
                tokens.add_metric([label, kind], count)
            latency.add_metric([label], _buckets(t.latency), t.latency.total_s)
            ttft.add_metric([label], _buckets(t.ttft), t.ttft.total_s)
        yield from (requests, service, tokens, latency, ttft)


@cache
def _les(bounds: tuple[float, ...]) -> tuple[str, ...]:
    return (*(repr(float(b)) for b in bounds), "+Inf")


def _buckets(histogram: Histogram) -> list[tuple[str, float]]:
    """Cumulative (le, count) pairs, as Prometheus histograms are exposed."""
    out, running = [], 0
    for le, count in zip(_les(histogram.bounds), histogram.counts, strict=True):
        running += count
        out.append((le, float(running)))
    return out


def _number(value: Any) -> float:
    if isinstance(value, str):
        return float(value)  # "inf" / "-inf" from JSON-safe snapshots
    return float(value)
