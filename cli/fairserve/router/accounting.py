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
Each client's own figures are a :class:`~fairserve.router.client_stats.ClientStats`, kept
small for the garbage collector (:mod:`fairserve.router.client_stats`); each client also
counts into the Prometheus totals of its label (:mod:`fairserve.router.totals`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fairserve.core.counters import TokenCounts
from fairserve.core.ledger import DEFAULT_WINDOW_S, ServiceLedger
from fairserve.core.ledger_view import WindowParts, WindowView
from fairserve.router.client_stats import RATE_WINDOW_S as RATE_WINDOW_S
from fairserve.router.client_stats import RECENT_REQUESTS as RECENT_REQUESTS
from fairserve.router.client_stats import ClientCopy as ClientCopy
from fairserve.router.client_stats import ClientStats as ClientStats
from fairserve.router.client_stats import client_figures as client_figures
from fairserve.router.config import DEFAULT_METRICS_MAX_CLIENTS
from fairserve.router.totals import NO_USAGE as NO_USAGE
from fairserve.router.totals import OTHER as OTHER
from fairserve.router.totals import Histogram as Histogram
from fairserve.router.totals import Totals as Totals
from fairserve.router.totals import Usage as Usage
from fairserve.sched.base import MAX_CLIENTS

PRUNE_VISITS = 256
"""Clients whose expired history one turn of the router's loop drops (~1-2 ms): at 1,000
requests a second with 10,000 clients some 1,400 clients' requests leave the window each
second (~8 ms at once)."""


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
        stats.answered(latency_s, ttft_s)
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
        stats.count(now_s, service, prompt + output, finished)

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
        return self.clients[name].copy(now_s)
