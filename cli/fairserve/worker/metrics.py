"""``GET /metrics``: Prometheus text with SGLang's metric names.

Dashboards and routers built for SGLang (``sglang:num_running_reqs``, ``sglang:token_usage``,
...) read a simulated worker unchanged. Each worker has its own ``CollectorRegistry``, so
several workers in one process (tests, ``launch``) never share or clash on metrics. Gauges
are read from the engine at scrape time; counters and histograms are fed when a request
finishes. Latencies are *simulated* seconds, like ``meta_info.e2e_latency``.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from fairserve.worker.runtime import Ticket, WorkerRuntime

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_E2E_BUCKETS_S = (0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 40, 60, 120, 300, 600)
_TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.08, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class WorkerMetrics:
    """The SGLang-named metrics of one worker."""

    def __init__(self, runtime: WorkerRuntime) -> None:
        self.runtime = runtime
        self.registry = CollectorRegistry(auto_describe=True)
        label = ["model_name"]
        name = runtime.config.model_name
        reg = self.registry

        def gauge(metric: str, doc: str) -> Gauge:
            return Gauge(metric, doc, label, registry=reg)

        self.running = gauge("sglang:num_running_reqs", "Running requests.").labels(name)
        self.queued = gauge("sglang:num_queue_reqs", "Waiting requests.").labels(name)
        self.cache_hit_rate = gauge(
            "sglang:cache_hit_rate", "Prompt tokens served from the prefix cache (fraction)."
        ).labels(name)
        self.token_usage = gauge(
            "sglang:token_usage", "Used fraction of the KV cache's token capacity."
        ).labels(name)
        self.used_tokens = gauge("sglang:num_used_tokens", "KV cache tokens in use.").labels(name)
        self.prompt_tokens = Counter(
            "sglang:prompt_tokens", "Prompt tokens of finished requests.", label, registry=reg
        ).labels(name)
        self.cached_tokens = Counter(
            "sglang:cached_tokens",
            "Cached prompt tokens of finished requests.",
            label,
            registry=reg,
        ).labels(name)
        self.generation_tokens = Counter(
            "sglang:generation_tokens",
            "Output tokens of finished requests.",
            label,
            registry=reg,
        ).labels(name)
        self.requests = Counter(
            "sglang:num_requests", "Finished requests.", label, registry=reg
        ).labels(name)
        self.e2e = Histogram(
            "sglang:e2e_request_latency_seconds",
            "End-to-end latency of finished requests (simulated seconds).",
            label,
            registry=reg,
            buckets=_E2E_BUCKETS_S,
        ).labels(name)
        self.ttft = Histogram(
            "sglang:time_to_first_token_seconds",
            "Time to first token (simulated seconds).",
            label,
            registry=reg,
            buckets=_TTFT_BUCKETS_S,
        ).labels(name)
        runtime.finish_hooks.append(self.on_finish)

    def on_finish(self, ticket: Ticket) -> None:
        req = ticket.req
        self.requests.inc()
        self.prompt_tokens.inc(req.input_tokens)
        self.cached_tokens.inc(req.cached_tokens)
        self.generation_tokens.inc(ticket.produced)
        if ticket.latency_s is not None:
            self.e2e.observe(ticket.latency_s)
        if ticket.ttft_s is not None:
            self.ttft.observe(ticket.ttft_s)

    def render(self) -> bytes:
        engine = self.runtime.engine
        pool = engine.pool
        self.running.set(len(engine.running))
        self.queued.set(len(engine.waiting))
        self.cache_hit_rate.set(engine.stats.cache_hit_rate)
        self.token_usage.set(pool.used_tokens / pool.capacity_tokens)
        self.used_tokens.set(pool.used_tokens)
        return generate_latest(self.registry)
