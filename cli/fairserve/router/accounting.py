"""Per-client and per-worker bookkeeping: what each client got, how fast, how long it waited.

Service is counted as the client sees it (DESIGN §7), ``w_e·prompt + w_q·output``: an
*estimate* when a request is dispatched (prompt from the router's tokenizer, the requested
maximum output), *corrected* with the worker's ``usage`` when it ends. Latency and TTFT
percentiles come from a bounded window of recent requests; the Jain index is computed from
periodic samples of cumulative service exactly as the simulator's report does it (weighted
service rates inside the window where every client is active).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from fairserve.core.metrics import ServiceSample, jain_index, max_service_gap, percentile, sample_at

RECENT_REQUESTS = 2048
"""Latency/TTFT samples kept per client for percentiles."""
RATE_WINDOW_S = 60.0
MAX_SAMPLES = 7200


@dataclass(slots=True)
class ClientStats:
    weight: float = 1.0
    requests: int = 0
    finished: int = 0
    failed: int = 0
    aborted: int = 0
    rejected: int = 0
    in_flight: int = 0
    queued: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    service: float = 0.0
    pending_service: float = 0.0
    first_s: float | None = None
    last_s: float | None = None
    latencies_s: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT_REQUESTS))
    ttfts_s: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT_REQUESTS))
    recent: deque[tuple[float, float, int]] = field(default_factory=deque)
    """(finish time, service, tokens) of requests finished in the rate window."""

    @property
    def queue_depth(self) -> int:
        """Requests of this client inside the router (waiting or in flight)."""
        return self.in_flight


@dataclass(slots=True)
class WorkerStats:
    requests: int = 0
    finished: int = 0
    failures: int = 0
    retried: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0

    @property
    def cache_hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


class Usage(NamedTuple):
    """Tokens of one finished request, as the worker reported them (a tuple: one is built
    per request, and a frozen dataclass costs several times more to create)."""

    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int


class Accounting:
    """All counters of one router; the state endpoint and the metrics read them."""

    def __init__(self, weights: Mapping[str, float], w_e: float = 1.0, w_q: float = 2.0) -> None:
        self.weights = dict(weights)
        self.w_e, self.w_q = w_e, w_q
        self.clients: dict[str, ClientStats] = {}
        self.workers: dict[str, WorkerStats] = {}
        self.samples: deque[ServiceSample] = deque(maxlen=MAX_SAMPLES)

    def client(self, name: str) -> ClientStats:
        stats = self.clients.get(name)
        if stats is None:
            stats = self.clients[name] = ClientStats(weight=self.weights.get(name, 1.0))
        return stats

    def worker(self, worker: str) -> WorkerStats:
        stats = self.workers.get(worker)
        if stats is None:
            stats = self.workers[worker] = WorkerStats()
        return stats

    def estimate(self, prompt_tokens: int, max_output_tokens: int) -> float:
        return self.w_e * prompt_tokens + self.w_q * max_output_tokens

    # ------------------------------------------------------------------ events
    def arrived(self, client: str, estimate: float, now_s: float) -> ClientStats:
        stats = self.client(client)
        stats.requests += 1
        stats.in_flight += 1
        stats.pending_service += estimate
        if stats.first_s is None:
            stats.first_s = now_s
        stats.last_s = now_s
        return stats

    def rejected(self, client: str) -> None:
        self.client(client).rejected += 1

    def ended(self, client: str, estimate: float, outcome: str) -> None:
        """A request left without a usage report (``failed``, ``aborted``, ``rejected``)."""
        stats = self.client(client)
        stats.in_flight -= 1
        stats.pending_service = max(0.0, stats.pending_service - estimate)
        if outcome == "aborted":
            stats.aborted += 1
        elif outcome == "rejected":
            stats.rejected += 1
        else:
            stats.failed += 1

    def finished(
        self,
        client: str,
        worker: str,
        estimate: float,
        usage: Usage,
        latency_s: float,
        ttft_s: float | None,
        now_s: float,
    ) -> float:
        """Record a finished request; returns its service."""
        service = self.w_e * usage.prompt_tokens + self.w_q * usage.completion_tokens
        stats = self.client(client)
        stats.in_flight -= 1
        stats.finished += 1
        stats.pending_service = max(0.0, stats.pending_service - estimate)
        stats.prompt_tokens += usage.prompt_tokens
        stats.cached_tokens += usage.cached_tokens
        stats.output_tokens += usage.completion_tokens
        stats.service += service
        stats.latencies_s.append(latency_s)
        if ttft_s is not None:
            stats.ttfts_s.append(ttft_s)
        stats.recent.append((now_s, service, usage.prompt_tokens + usage.completion_tokens))
        w = self.worker(worker)
        w.finished += 1
        w.prompt_tokens += usage.prompt_tokens
        w.cached_tokens += usage.cached_tokens
        w.output_tokens += usage.completion_tokens
        return service

    # ------------------------------------------------------------------ samples
    def sample(self, now_s: float) -> ServiceSample:
        """Cumulative service now; clients with requests inside the router are backlogged."""
        sample = ServiceSample(
            now_s,
            {c: s.service for c, s in self.clients.items()},
            frozenset(c for c, s in self.clients.items() if s.in_flight > 0),
        )
        self.samples.append(sample)
        return sample

    def jain_index(self, now_s: float) -> tuple[float, tuple[float, float] | None]:
        """Jain's index over weighted service rates where every client is active (like the
        simulator's report), and that window."""
        if not self.clients:
            return 1.0, None
        samples = [*self.samples, self._current(now_s)]
        window = self._active_window(samples[0].t_s, now_s)
        start, end = sample_at(samples, window[0]), sample_at(samples, window[1])
        rates = [
            (end.cumulative.get(c, 0.0) - start.cumulative.get(c, 0.0)) / s.weight
            for c, s in self.clients.items()
        ]
        return jain_index(max(0.0, r) for r in rates), window

    def max_service_gap(self, now_s: float) -> float:
        return max_service_gap([*self.samples, self._current(now_s)]).value

    def _current(self, now_s: float) -> ServiceSample:
        return ServiceSample(
            now_s,
            {c: s.service for c, s in self.clients.items()},
            frozenset(c for c, s in self.clients.items() if s.in_flight > 0),
        )

    def _active_window(self, begin_s: float, now_s: float) -> tuple[float, float]:
        """After the last client's first request and before the first client's last one
        (the simulator's window); the whole history when that is too short."""
        firsts = [s.first_s for s in self.clients.values() if s.first_s is not None]
        lasts = [s.last_s for s in self.clients.values() if s.last_s is not None]
        if not firsts or not lasts:
            return (begin_s, now_s)
        start, end = max(firsts), min(min(lasts), now_s)
        if end - start <= (now_s - begin_s) * 0.05:
            return (begin_s, now_s)
        return (start, end)

    # ------------------------------------------------------------------ views
    def client_view(self, name: str, now_s: float) -> dict[str, Any]:
        s = self.clients[name]
        while s.recent and s.recent[0][0] < now_s - RATE_WINDOW_S:
            s.recent.popleft()
        span_s = min(RATE_WINDOW_S, max(1e-9, now_s - (s.first_s or now_s)))
        return {
            "weight": s.weight,
            "requests": s.requests,
            "finished": s.finished,
            "failed": s.failed,
            "aborted": s.aborted,
            "rejected": s.rejected,
            "in_flight": s.in_flight - s.queued,
            "queued": s.queued,
            "queue_depth": s.queue_depth,
            "prompt_tokens": s.prompt_tokens,
            "cached_tokens": s.cached_tokens,
            "output_tokens": s.output_tokens,
            "service": s.service,
            "pending_service": s.pending_service,
            "service_rate": sum(r[1] for r in s.recent) / span_s,
            "requests_per_s": len(s.recent) / span_s,
            "tokens_per_s": sum(r[2] for r in s.recent) / span_s,
            "latency_p50_s": _pct(s.latencies_s, 50),
            "latency_p99_s": _pct(s.latencies_s, 99),
            "ttft_p50_s": _pct(s.ttfts_s, 50),
            "ttft_p99_s": _pct(s.ttfts_s, 99),
        }


def _pct(values: Sequence[float], q: float) -> float | None:
    value = percentile(list(values), q)
    return None if math.isnan(value) else value
