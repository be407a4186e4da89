"""Per-client and per-worker bookkeeping: what each client got, how fast, how long it waited.

Service is counted as the client sees it (DESIGN §7), ``w_e·prompt + w_q·output``, and
credited **as it is delivered**: a streamed request's prompt tokens when its first token
arrives, its output tokens as they stream (:meth:`Accounting.delivered`); the worker's final
``usage`` then corrects the estimate (:meth:`Accounting.finished`). So service, tokens/s and
load rise while long generations decode, not only when they end. A non-streamed answer is
credited when it arrives (the router sees nothing of it before).

Fairness figures (Jain's index, the service gap, rates) come from the sliding-window
:class:`~fairserve.core.ledger.ServiceLedger`, never from the whole uptime. Latency and TTFT
percentiles come from a bounded window of recent requests. The number of clients tracked is
bounded (``max_clients``): beyond it, the least recently seen idle client is forgotten.
Each client also counts into the Prometheus totals of its label (:mod:`fairserve.router.totals`):
its name for the clients of the clients file and the first ``labels`` other names seen,
``other`` for the rest.

**Few objects for the garbage collector** (issue 18): a full collection walks every object
the collector tracks, and every reference each one holds, while the event loop waits. A
client's numeric history (its recent latencies and TTFTs, its rate buckets) is therefore
packed into ``bytearray`` buffers of C doubles, which the collector does not track (an
``array.array`` is tracked since Python 3.10): a client's :class:`ClientStats` is its only
tracked object here. Deques of floats and a list per second of rates made it ~8 and a full
collection ~120 ms at 10,000 clients (``tests/perf/bench_gc.py``).
"""

from __future__ import annotations

import math
import struct
import time
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from fairserve.core.counters import TokenCounts
from fairserve.core.ledger import DEFAULT_WINDOW_S, ServiceLedger
from fairserve.core.ledger_view import WindowParts, WindowView
from fairserve.core.metrics import percentile
from fairserve.router.config import DEFAULT_METRICS_MAX_CLIENTS
from fairserve.router.totals import NO_USAGE as NO_USAGE
from fairserve.router.totals import OTHER as OTHER
from fairserve.router.totals import Histogram as Histogram
from fairserve.router.totals import Totals as Totals
from fairserve.router.totals import Usage as Usage
from fairserve.sched.base import MAX_CLIENTS

RECENT_REQUESTS = 2048
"""Latency/TTFT samples kept per client for percentiles."""
RECENT_SLACK = RECENT_REQUESTS // 4
"""Samples a client's buffer takes beyond ``RECENT_REQUESTS`` before the oldest are cut
(one move of ``RECENT_REQUESTS`` floats per ``RECENT_SLACK`` requests)."""
_FLOAT = struct.Struct("d")
_BUCKET = struct.Struct("4d")
"""One second of rate history: the second, service, tokens, requests finished."""
NO_SECOND = -math.inf
"""``ClientStats.second_s`` while no second is open."""
RATE_WINDOW_S = 60.0
PRUNE_VISITS = 256
"""Clients whose expired history one turn of the router's loop drops (~1-2 ms): at 1,000
requests a second with 10,000 clients some 1,400 clients' requests leave the window each
second (~8 ms at once)."""


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
    latencies_s: bytearray = field(default_factory=bytearray)
    """Latencies of the client's last requests (packed doubles), oldest first: the last
    ``RECENT_REQUESTS`` are read (:func:`_keep_recent`). Not a deque: see the module's
    docstring."""
    ttfts_s: bytearray = field(default_factory=bytearray)
    """Times to first token, kept as ``latencies_s``."""
    buckets: bytearray = field(default_factory=bytearray)
    """(second, service, tokens, requests finished) packed (``_BUCKET``) per wall-clock
    second in the rate window that credited something, oldest first, but the last one."""
    second_s: float = NO_SECOND
    """The last second that credited something (the open bucket: deliveries within one
    second add to these four fields, a new second packs them into ``buckets``)."""
    second_service: float = 0.0
    second_tokens: float = 0.0
    second_finished: float = 0.0
    label: Totals = field(default_factory=Totals)
    """The totals of this client's Prometheus label (shared by every client of ``other``)."""

    @property
    def recent(self) -> list[tuple[float, ...]]:
        """The rate buckets, one (second, service, tokens, finished) per second (a copy)."""
        closed: list[tuple[float, ...]] = list(_BUCKET.iter_unpack(self.buckets))
        if self.second_s == NO_SECOND:
            return closed
        return [*closed, (self.second_s, self.second_service, self.second_tokens,
                          self.second_finished)]  # fmt: skip

    @property
    def queue_depth(self) -> int:
        """Requests of this client inside the router (waiting or in flight)."""
        return self.in_flight


@dataclass(slots=True)
class WorkerStats(TokenCounts):
    """What the router counted of one worker (prompt and cached tokens: the shared
    :class:`~fairserve.core.counters.TokenCounts`, with its hit rate)."""

    requests: int = 0
    finished: int = 0
    failures: int = 0
    retried: int = 0
    output_tokens: int = 0


class Accounting:
    """All counters of one router; the state endpoint and the metrics read them."""

    def __init__(
        self,
        weights: Mapping[str, float],
        w_e: float = 1.0,
        w_q: float = 2.0,
        max_clients: int = MAX_CLIENTS,
        labels: int = DEFAULT_METRICS_MAX_CLIENTS,
    ) -> None:
        self.weights = dict(weights)
        self.w_e, self.w_q = w_e, w_q
        self.max_clients = max_clients
        self.clients: dict[str, ClientStats] = {}
        self.workers: dict[str, WorkerStats] = {}
        self.ledger = ServiceLedger()
        self.forgotten = 0
        """Idle clients dropped to stay within ``max_clients``."""
        self.max_request_cost = 0.0
        """Largest ``w_e·prompt + w_q·max_output`` seen: the ``U`` of the service-gap bound."""
        self.held = 0
        """Requests in the router now, over all clients (the router-wide cap counts them)."""
        self.busy = 0
        """Clients with at least one request in the router (the fair share divides by it)."""
        self.labels = labels
        self.totals: dict[str, Totals] = {name: Totals() for name in weights}
        """Label -> its totals: the clients file's names, then the first ``labels`` others."""
        self._own_labels = 0
        """Names beyond the clients file that got their own label."""
        self.other = Totals()
        """The totals of the label ``other``."""

    def client(self, name: str, now_s: float | None = None) -> ClientStats:
        stats = self.clients.get(name)
        if stats is None:
            if len(self.clients) >= self.max_clients:
                self._forget_one()
            stats = self.clients[name] = ClientStats(
                weight=self.weights.get(name, 1.0), label=self._label(name)
            )
            self.ledger.add_client(name, stats.weight, time.monotonic() if now_s is None else now_s)
        return stats

    def _label(self, name: str) -> Totals:
        """The totals ``name`` counts into; a name seen for the first time gets its own
        label while the cap allows."""
        totals = self.totals.get(name)
        if totals is None:
            if self._own_labels >= self.labels or name == OTHER:
                return self.other
            self._own_labels += 1
            totals = self.totals[name] = Totals()
        return totals

    def label_of(self, name: str) -> str:
        """The label ``name`` is counted under (its name, or ``other``)."""
        return name if name in self.totals else OTHER

    def labelled(self) -> list[tuple[str, Totals]]:
        """(label, totals) of every label, ``other`` last when it counted anything."""
        rows = list(self.totals.items())
        if self.other.outcomes:
            rows.append((OTHER, self.other))
        return rows

    def _forget_one(self) -> None:
        """Drop the least recently seen idle client (none idle: track one more). ``clients``
        is kept in order of last arrival, so this is the first idle one from the front,
        usually the very first: no scan of every client on the request path."""
        name = next((n for n, s in self.clients.items() if s.in_flight == 0), None)
        if name is None:
            return
        del self.clients[name]
        self.ledger.forget(name)
        self.forgotten += 1

    def set_weight(self, name: str, weight: float) -> None:
        self.weights[name] = weight
        if name in self.clients:
            self.clients[name].weight = weight
        self.ledger.set_weight(name, weight)

    def worker(self, worker: str) -> WorkerStats:
        stats = self.workers.get(worker)
        if stats is None:
            stats = self.workers[worker] = WorkerStats()
        return stats

    def estimate(self, prompt_tokens: int, max_output_tokens: int) -> float:
        return self.w_e * prompt_tokens + self.w_q * max_output_tokens

    # ------------------------------------------------------------------ events
    def arrived(self, client: str, estimate: float, now_s: float) -> ClientStats:
        stats = self.clients.pop(client, None)  # the hot path: no call for a known client
        if stats is None:
            stats = self.client(client, now_s)  # a new one goes last
        else:
            self.clients[client] = stats  # most recently seen last
        stats.requests += 1
        if not stats.in_flight:
            self.busy += 1
        stats.in_flight += 1
        self.held += 1
        stats.pending_service += estimate
        if stats.first_s is None:
            stats.first_s = now_s
        stats.last_s = now_s
        self.ledger.busy(client, now_s)
        return stats

    def rejected(self, client: str) -> None:
        """A request refused at the door (it never arrived)."""
        stats = self.client(client)
        stats.rejected += 1
        stats.label.ended("rejected")

    def delivered(
        self, client: str, worker: str, prompt_tokens: int, output_tokens: int, now_s: float
    ) -> None:
        """Tokens that reached the client just now (live credit, corrected at the end)."""
        stats = self.clients.get(client) or self.client(client, now_s)
        stats.prompt_tokens += prompt_tokens
        stats.output_tokens += output_tokens
        w = self.workers.get(worker) or self.worker(worker)
        w.prompt_tokens += prompt_tokens
        w.output_tokens += output_tokens
        self._credit(client, stats, prompt_tokens, output_tokens, now_s)

    def ended(self, client: str, estimate: float, outcome: str) -> None:
        """A request left without a usage report (``failed``, ``aborted``, ``rejected``);
        what it delivered before stays credited."""
        stats = self.clients.get(client) or self.client(client)
        self._left(stats)
        stats.pending_service = max(0.0, stats.pending_service - estimate)
        if outcome == "aborted":
            stats.aborted += 1
        elif outcome == "rejected":
            stats.rejected += 1
        else:
            stats.failed += 1
        stats.label.ended(outcome)
        self.ledger.idle(client, time.monotonic())

    def _left(self, stats: ClientStats) -> None:
        """One of ``stats``' requests left the router."""
        stats.in_flight -= 1
        self.held -= 1
        if not stats.in_flight:
            self.busy -= 1

    def fair_share(self, total_cap: int) -> float:
        """The requests one busy client may hold when the router holds ``total_cap``."""
        return total_cap / max(1, self.busy)

    def finished(
        self,
        client: str,
        worker: str,
        estimate: float,
        usage: Usage,
        latency_s: float,
        ttft_s: float | None,
        now_s: float,
        credited: Usage = NO_USAGE,
    ) -> float:
        """Record a finished request whose delivery already credited ``credited``; returns
        its whole service (the final usage replaces the live estimate)."""
        prompt = usage.prompt_tokens - credited.prompt_tokens
        output = usage.completion_tokens - credited.completion_tokens
        stats = self.clients.get(client) or self.client(client, now_s)
        self._left(stats)
        stats.finished += 1
        stats.pending_service = max(0.0, stats.pending_service - estimate)
        stats.prompt_tokens += prompt
        stats.cached_tokens += usage.cached_tokens
        stats.output_tokens += output
        _keep_recent(stats.latencies_s, latency_s)
        if ttft_s is not None:
            _keep_recent(stats.ttfts_s, ttft_s)
        self._credit(client, stats, prompt, output, now_s, finished=1)
        w = self.workers.get(worker) or self.worker(worker)
        w.finished += 1
        w.prompt_tokens += prompt
        w.cached_tokens += usage.cached_tokens
        w.output_tokens += output
        self.ledger.idle(client, now_s)
        service = self.w_e * usage.prompt_tokens + self.w_q * usage.completion_tokens
        stats.label.answered(service, usage, latency_s, ttft_s)
        return service

    def _credit(
        self,
        client: str,
        stats: ClientStats,
        prompt: int,
        output: int,
        now_s: float,
        finished: int = 0,
    ) -> None:
        service = self.w_e * prompt + self.w_q * output
        if service != 0:
            stats.service += service
            self.ledger.credit(client, service, now_s)
        second = float(math.floor(now_s))
        if stats.second_s == second:
            stats.second_service += service
            stats.second_tokens += prompt + output
            stats.second_finished += finished
        elif service != 0 or finished:
            # A new second: drop those past the rate window here too, so a router whose
            # state nobody reads keeps at most RATE_WINDOW_S buckets per client.
            _close_second(stats)
            _drop_buckets_before(stats.buckets, second - RATE_WINDOW_S)
            stats.second_s = second
            stats.second_service, stats.second_tokens = service, prompt + output
            stats.second_finished = finished

    # ------------------------------------------------------------------ windows
    def sample(self, now_s: float, prune_visits: float = math.inf) -> bool:
        """Who is backlogged now (the router calls it every ``sample_interval_s``). True
        while history that fell out of the window is left to drop (:meth:`prune`): at
        most ``prune_visits`` clients' is dropped now."""
        return self.ledger.sample(now_s, prune_visits=prune_visits)

    def prune(self, visits: float = PRUNE_VISITS) -> bool:
        """Drop up to ``visits`` clients' history left by the last sample; True while some
        is left (the router calls it once per turn of its loop)."""
        return self.ledger.prune(visits)

    def window(self, now_s: float, window_s: float = DEFAULT_WINDOW_S) -> WindowView:
        return self.ledger.window(window_s, now_s)

    def window_parts(self, now_s: float, window_s: float = DEFAULT_WINDOW_S) -> WindowParts:
        """What :meth:`window` is computed from, copied now (``ledger_view.view_steps``)."""
        return self.ledger.window_parts(window_s, now_s)

    def jain_index(
        self, now_s: float, window_s: float = DEFAULT_WINDOW_S
    ) -> tuple[float, tuple[float, float] | None]:
        """Jain's index over weighted service rates in the window (each client over its own
        active span in it), and the span judged."""
        if not self.clients:
            return 1.0, None
        view = self.window(now_s, window_s)
        return view.jain_index, (view.start_s, view.end_s)

    # ------------------------------------------------------------------ views
    def client_view(self, name: str, now_s: float) -> dict[str, Any]:
        return client_figures(self.client_copy(name, now_s))

    def client_copy(self, name: str, now_s: float) -> ClientCopy:
        """``name``'s figures at ``now_s`` and copies of its recent latencies: everything of
        its view but the percentiles (sorting up to ``RECENT_REQUESTS`` values twice), which
        :func:`client_figures` computes from the copy later, without the live client."""
        s = self.clients[name]
        horizon_s = now_s - RATE_WINDOW_S
        _drop_buckets_before(s.buckets, horizon_s)
        if s.second_s < horizon_s:  # every closed bucket is older: none is left
            s.second_s, s.second_service, s.second_tokens, s.second_finished = NO_SECOND, 0, 0, 0
        closed = _doubles(s.buckets)
        span_s = min(RATE_WINDOW_S, max(1.0, now_s - (s.first_s or now_s)))
        figures = {
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
            "service_rate": (sum(closed[1::4]) + s.second_service) / span_s,
            "requests_per_s": (sum(closed[3::4]) + s.second_finished) / span_s,
            "tokens_per_s": (sum(closed[2::4]) + s.second_tokens) / span_s,
        }
        last = -RECENT_REQUESTS * _FLOAT.size
        return ClientCopy(
            figures,
            _doubles(s.latencies_s[last:]).tolist(),
            _doubles(s.ttfts_s[last:]).tolist(),
        )


def _keep_recent(values: bytearray, value: float) -> None:
    """Append ``value``, keeping at least the last ``RECENT_REQUESTS`` (what a
    ``deque(maxlen=RECENT_REQUESTS)`` keeps, without a float object per value)."""
    values += _FLOAT.pack(value)
    if len(values) >= (RECENT_REQUESTS + RECENT_SLACK) * _FLOAT.size:
        del values[: -RECENT_REQUESTS * _FLOAT.size]


def _close_second(stats: ClientStats) -> None:
    """Pack the open second's bucket, if any, into the closed ones."""
    if stats.second_s != NO_SECOND:
        stats.buckets += _BUCKET.pack(
            stats.second_s, stats.second_service, stats.second_tokens, stats.second_finished
        )


def _drop_buckets_before(buckets: bytearray, horizon_s: float) -> None:
    """Drop the rate buckets of the seconds before ``horizon_s`` (they are in time order)."""
    end = 0
    while end < len(buckets) and _FLOAT.unpack_from(buckets, end)[0] < horizon_s:
        end += _BUCKET.size
    if end:
        del buckets[:end]


def _doubles(packed: bytes | bytearray) -> array[float]:
    """The doubles packed in ``packed``, as an array (a copy: the buffer may change)."""
    doubles = array("d")
    doubles.frombytes(packed)
    return doubles


class ClientCopy(NamedTuple):
    """One client's figures copied at one instant (:meth:`Accounting.client_copy`)."""

    figures: dict[str, Any]
    latencies_s: list[float]
    ttfts_s: list[float]


def client_figures(copy: ClientCopy) -> dict[str, Any]:
    """The client's view: its figures and its latency and TTFT percentiles."""
    return {
        **copy.figures,
        **_percentiles("latency", copy.latencies_s),
        **_percentiles("ttft", copy.ttfts_s),
    }


def _percentiles(name: str, values: Sequence[float]) -> dict[str, float | None]:
    """p50 and p99 of ``values`` (None when there are none), sorted once for both."""
    ordered = sorted(values)
    return {f"{name}_p50_s": _pct(ordered, 50), f"{name}_p99_s": _pct(ordered, 99)}


def _pct(ordered: Sequence[float], q: float) -> float | None:
    value = percentile(ordered, q)
    return None if math.isnan(value) else value
