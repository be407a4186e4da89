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

from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import cache
from operator import attrgetter
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from fairserve.core.ledger_view import Steps, finish
from fairserve.router.accounting import OTHER as OTHER
from fairserve.router.accounting import Accounting, Histogram, Totals

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

PREFIX = "fairserve_router_"
COPY_SLICE = 100
"""Labels whose totals are copied per step of a scrape."""
BUILD_SLICE = 14
"""Labels of one family built and written per step of a scrape (a histogram's 14 labels:
~250 sample lines, ~1.5 ms); each slice is dropped once written, so a scrape's many small
objects die young instead of filling the collector's oldest generation."""
SAMPLE_SLICE = 250
"""Sample lines prometheus-client writes per step of a scrape (~1.5 ms)."""


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
        """Refresh the gauges from a state snapshot, then the text exposition (at once: a
        caller on the router's event loop runs :meth:`render_steps` in turns)."""
        return finish(self.render_steps(state))

    def render_steps(self, state: Mapping[str, Any]) -> Steps[bytes]:
        """:meth:`render` in steps of a millisecond or two (issue 18): the gauges are set
        and copied at once, the label totals copied ``COPY_SLICE`` labels per step (each
        label's own counts at one instant, so every series stays monotonic and every
        histogram whole), then prometheus-client writes the families from the copies,
        ``BUILD_SLICE`` labels (gauges: ``SAMPLE_SLICE`` samples) per step. The text is
        :func:`generate_latest`'s of the registry, byte for byte
        (``tests/router/test_read_stalls.py``)."""
        self._set_gauges(state)
        gauges = [metric for gauge in self._gauges() for metric in gauge.collect()]
        rows = self.accounting.labelled()
        copies: list[tuple[str, Totals]] = []
        for at in range(0, len(rows), COPY_SLICE):
            yield
            copies += [(label, totals.copy()) for label, totals in rows[at : at + COPY_SLICE]]
        out: list[bytes] = []
        for family in CLIENT_FAMILIES:  # built and written a slice at a time: short-lived
            for at in range(0, max(1, len(copies)), BUILD_SLICE):
                yield
                text = generate_latest(_Metrics([family(copies[at : at + BUILD_SLICE])]))
                out.append(text if at == 0 else _body(text))
        for metric in gauges:
            yield from _write(metric, out)
        return b"".join(out)

    def _set_gauges(self, state: Mapping[str, Any]) -> None:
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

    def _gauges(self) -> list[Gauge]:
        """The gauges in the registry's order (the order they were made)."""
        return [self.queue_depth, self.deficit, self.outstanding, self.waiting, self.healthy,
                self.cache_hit_rate, self.jain]  # fmt: skip


class _Metrics(Collector):
    """Metric families already built, for :func:`generate_latest` to write."""

    def __init__(self, metrics: list[Metric]) -> None:
        self.metrics = metrics

    def collect(self) -> Iterable[Metric]:
        return self.metrics


def _write(metric: Metric, out: list[bytes]) -> Steps[None]:
    """Append ``metric``'s exposition text to ``out``, ``SAMPLE_SLICE`` samples per step:
    each slice is written by prometheus-client as a family of its own, and the HELP and
    TYPE lines of every slice but the first are left out (one sample is one line, so the
    slices add up to the family's text)."""
    samples = metric.samples
    for at in range(0, max(1, len(samples)), SAMPLE_SLICE):
        yield
        part = Metric(metric.name, metric.documentation, metric.type, metric.unit)
        part.samples = samples[at : at + SAMPLE_SLICE]
        text = generate_latest(_Metrics([part]))
        out.append(text if at == 0 else _body(text))


def _body(text: bytes) -> bytes:
    """A family's text without its HELP and TYPE lines (a slice after the first)."""
    return text.split(b"\n", 2)[2]


class _ClientCollector(Collector):
    """The accounting's label totals as metric families, built at scrape time."""

    def __init__(self, accounting: Accounting) -> None:
        self.accounting = accounting

    def collect(self) -> Iterator[Metric]:
        rows = self.accounting.labelled()
        return (family(rows) for family in CLIENT_FAMILIES)


Rows = list[tuple[str, Totals]]


def _requests(rows: Rows) -> Metric:
    family = CounterMetricFamily(
        PREFIX + "requests", "Requests ended, by outcome.", labels=["client", "outcome"]
    )
    for label, t in rows:
        for outcome, count in t.outcomes.items():
            family.add_metric([label, outcome], count)
    return family


def _service(rows: Rows) -> Metric:
    family = CounterMetricFamily(
        PREFIX + "client_service", "Service w_e*prompt + w_q*output.", labels=["client"]
    )
    for label, t in rows:
        family.add_metric([label], t.service)
    return family


def _tokens(rows: Rows) -> Metric:
    family = CounterMetricFamily(
        PREFIX + "client_tokens", "Tokens by kind.", labels=["client", "kind"]
    )
    for label, t in rows:
        for kind, count in (("prompt", t.prompt), ("cached", t.cached),
                            ("completion", t.completion)):  # fmt: skip
            family.add_metric([label, kind], count)
    return family


def _histogram(
    name: str, documentation: str, of: Callable[[Totals], Histogram]
) -> Callable[[Rows], Metric]:
    """A per-client histogram family of ``of(totals)``."""

    def family_of(rows: Rows) -> Metric:
        family = HistogramMetricFamily(PREFIX + name, documentation, labels=["client"])
        for label, t in rows:
            histogram = of(t)
            family.add_metric([label], _buckets(histogram), histogram.total_s)
        return family

    return family_of


_latency = _histogram(
    "request_latency_seconds", "End-to-end latency seen by the router.", attrgetter("latency")
)
_ttft = _histogram(
    "time_to_first_token_seconds",
    "Time to the first output token (streams) or the answer (non-streamed).",
    attrgetter("ttft"),
)


CLIENT_FAMILIES: tuple[Callable[[Rows], Metric], ...] = (
    _requests,
    _service,
    _tokens,
    _latency,
    _ttft,
)
"""The per-label families, in the order they are exposed."""


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
