"""A sliding-window service ledger: what each client got, while it was competing, lately.

Why a window: a fairness index over a router's whole uptime barely moves after a change and
collapses when new clients appear (their service over the whole history is tiny), so an
operator reads "0.36" while the service is in fact equal. Every figure here covers the last
``window_s`` seconds only, and each client's rate is taken over *its own* active span inside
the window (from the first moment it had work in the router, or the window's start if it
already had), so a client that joined ten seconds ago is judged on those ten seconds.

Why bounded: client names come from requests. The ledger keeps, per client, only the points
where its cumulative service changed inside the longest window it can be asked about, and
the periodic samples hold the cumulative service of *backlogged* clients only (what the
service-gap definition needs). Nothing grows with uptime.

Why incremental: a live host reads the window often (the state endpoint, ``/metrics``, ``top``)
with thousands of clients. A weighted read keeps each client's figures from the last one and
recomputes only those that may have moved (:mod:`~fairserve.core.ledger_window`); the answers
equal the full computation's (:meth:`ServiceLedger.window_full`).

Service is credited as it is delivered (:meth:`ServiceLedger.credit`), by whoever hosts the
ledger (the router credits prompt tokens at the first streamed token and output tokens as
they stream, then corrects with the worker's final ``usage``).

Pure: standard library only, every time passed in.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import repeat
from typing import Any

from fairserve.core.errors import ConfigError
from fairserve.core.ledger_window import ClientHistory as _ClientHistory
from fairserve.core.ledger_window import WindowCache
from fairserve.core.metrics import ServiceGap, ServiceSample, jain_index, max_service_gap

SERVICE_UNIT = "service units: w_e·prompt + w_q·output tokens, divided by the client's weight"
"""What the ledger's rates and gaps are measured in (every view labels them with it)."""
DEFAULT_WINDOW_S = 60.0
MAX_WINDOW_S = 600.0
"""The longest window a reader may ask for; history older than this is dropped."""
MIN_ACTIVE_S = 5.0
"""A client is judged once it has been active this long in the window (or half as long as
the longest-active client, when the window is younger than that)."""
GAP_MAX_CLIENTS = 64
"""The pairwise gap is computed over at most this many backlogged clients (the most and the
least served in the window), so one read stays a few milliseconds whatever the fleet."""
WINDOW_CACHES = 4
"""Window lengths whose figures are kept across reads (:mod:`~fairserve.core.ledger_window`);
a read of another length drops the least recently read one."""


@dataclass(frozen=True, slots=True)
class WindowView:
    """Fairness over one window: who was judged, on what, and the result."""

    window_s: float
    start_s: float
    end_s: float
    jain_index: float
    weighted: bool
    rates: Mapping[str, float]
    """Weighted service per second over each judged client's active span."""
    service_gap: ServiceGap
    gap_clients: int
    """Backlogged clients the gap was computed over (capped at ``GAP_MAX_CLIENTS``)."""

    def to_json(self) -> dict[str, Any]:
        """The labelled figures every view shows (router state, ``top``, bench)."""
        gap = self.service_gap
        return {
            "window_s": self.window_s,
            "weighted": self.weighted,
            "span_s": self.end_s - self.start_s,
            "clients_judged": len(self.rates),
            "jain_index": self.jain_index,
            "service_gap": gap.value,
            "service_gap_clients": None if gap.clients is None else list(gap.clients),
            "service_gap_considered": self.gap_clients,
            "unit": SERVICE_UNIT,
        }


class ServiceLedger:
    """Per-client delivered service with bounded, windowed history."""

    def __init__(self, max_window_s: float = MAX_WINDOW_S) -> None:
        """``max_window_s = math.inf`` keeps the whole history: a simulation's report reads
        all of a run that has an end (a live host keeps it finite)."""
        if not max_window_s > 0:
            raise ConfigError(f"max_window_s must be a positive number, got {max_window_s}")
        self.max_window_s = max_window_s
        self.clients: dict[str, _ClientHistory] = {}
        self.samples: deque[ServiceSample] = deque()
        self._caches: dict[float, WindowCache] = {}
        """Window length -> its figures kept across reads (created by the first read)."""
        self._touched: set[str] = set()
        """Clients changed since the last read (kept only once a read created a cache)."""

    # ------------------------------------------------------------------ events
    def add_client(self, name: str, weight: float, now_s: float) -> None:
        if name not in self.clients:
            history = self.clients[name] = _ClientHistory(weight)
            history.points.append((now_s, 0.0))
            if self._caches:
                self._touched.add(name)
                if len(self._touched) > 2 * len(self.clients) + 1024:
                    self._drop_caches()  # names pass through unread: stay bounded

    def forget(self, name: str) -> None:
        """Drop an idle client's history (the host bounds how many it tracks)."""
        self.clients.pop(name, None)
        if self._caches:
            self._touched.add(name)

    def set_weight(self, name: str, weight: float) -> None:
        if name in self.clients:
            self.clients[name].weight = weight
            if self._caches:
                self._touched.add(name)

    def credit(self, name: str, service: float, now_s: float) -> None:
        """``service`` delivered to ``name`` at ``now_s`` (negative: a correction).

        A stream credits every token, so between two samples a client keeps only its first
        point (where its activity began) and its latest one (moved forward): at most two
        points per sample interval, whatever the token rate."""
        history = self.clients[name]
        history.cumulative += service
        if self._caches:
            self._touched.add(name)
        points = history.points
        last_sample_s = self.samples[-1].t_s if self.samples else -math.inf
        if (len(points) >= 2 and points[-2][0] >= last_sample_s) or (
            points and points[-1][0] == now_s
        ):
            points[-1] = (now_s, history.cumulative)
        else:
            points.append((now_s, history.cumulative))

    def busy(self, name: str, now_s: float) -> None:
        """``name`` has one more request inside the host."""
        history = self.clients[name]
        if history.busy == 0:
            history.runs.append([now_s, math.inf])
            if self._caches:
                self._touched.add(name)
        history.busy += 1

    def idle(self, name: str, now_s: float) -> None:
        """One of ``name``'s requests left the host."""
        history = self.clients[name]
        history.busy = max(0, history.busy - 1)
        if history.busy == 0 and history.runs:
            history.runs[-1][1] = now_s
            if self._caches:
                self._touched.add(name)

    def sample(
        self, now_s: float, backlogged: Iterable[str] | None = None, every_client: bool = False
    ) -> None:
        """Record who is backlogged now (call periodically) and drop what fell out of reach.

        By default a client is backlogged while it has a request inside the host
        (:meth:`busy`) and the sample holds those clients' cumulative service only (what
        the service gap reads). A host with a narrower notion passes ``backlogged`` (the
        simulator: a call waiting in some queue, DESIGN §7); ``every_client`` keeps every
        client's cumulative (a report that also reads rates off the samples)."""
        if backlogged is None:
            marked = frozenset(n for n, h in self.clients.items() if h.busy > 0)
        else:
            marked = frozenset(backlogged)
        if every_client:
            cumulative = self.cumulatives()
        else:
            cumulative = {n: h.cumulative for n, h in self.clients.items() if n in marked}
        self.samples.append(ServiceSample(now_s, cumulative, marked))
        if self.max_window_s != math.inf:
            self._prune(now_s - self.max_window_s)

    # ------------------------------------------------------------------ reads
    def cumulative(self, name: str) -> float:
        return self.clients[name].cumulative

    def cumulatives(self) -> dict[str, float]:
        """Every client's cumulative service, in the order the clients were added."""
        return {name: history.cumulative for name, history in self.clients.items()}

    def window(self, window_s: float, now_s: float, weighted: bool = True) -> WindowView:
        """Jain's index and the service gap over ``[now − window_s, now]``.

        Weighted reads are kept up to date across reads (:mod:`~fairserve.core.ledger_window`):
        a read recomputes only the clients whose figures may have changed since the last one,
        with answers equal to :meth:`window_full`'s."""
        if not (0 < window_s <= self.max_window_s):
            raise ConfigError(f"window_s must be within (0, {self.max_window_s:g}], got {window_s}")
        if not weighted or (self.samples and now_s < self.samples[-1].t_s):
            # A read before the last sample may reach history pruned since (a host reads
            # at the present): computed from what is left, as before.
            return self.window_full(window_s, now_s, weighted)
        cache = self._cache(window_s)
        figures = cache.read(self.clients, self.samples, now_s, MIN_ACTIVE_S)
        start_s = now_s - window_s
        judged_start = start_s if figures.judged_start_s is None else figures.judged_start_s
        return self._view(window_s, now_s, True, figures.rates, judged_start, figures.backlogged)

    def window_full(self, window_s: float, now_s: float, weighted: bool = True) -> WindowView:
        """The window computed from scratch over every client (what :meth:`window` keeps
        up to date; the tests compare the two)."""
        if not (0 < window_s <= self.max_window_s):
            raise ConfigError(f"window_s must be within (0, {self.max_window_s:g}], got {window_s}")
        start_s = now_s - window_s
        spans = {n: span for n, h in self.clients.items() if (span := _span(h, start_s, now_s))}
        longest_s = max((end - begin for begin, end in spans.values()), default=0.0)
        needed_s = min(MIN_ACTIVE_S, longest_s / 2)
        rates: dict[str, float] = {}
        for name, (begin_s, end_s) in spans.items():
            span_s = end_s - begin_s
            if span_s <= 0 or span_s < needed_s:
                continue
            history = self.clients[name]
            delta = history.cumulative - _value_at(history.points, start_s)
            rates[name] = max(0.0, delta) / span_s / (history.weight if weighted else 1.0)
        judged_start = min((spans[n][0] for n in rates), default=start_s)
        return self._view(window_s, now_s, weighted, rates, judged_start, None)

    def _drop_caches(self) -> None:
        """Forget the kept figures (the next read computes them afresh)."""
        self._caches = {}
        self._touched = set()

    def _cache(self, window_s: float) -> WindowCache:
        """The cache of ``window_s``, told of every client changed since the last read."""
        caches = self._caches
        cache = caches.pop(window_s, None)
        if cache is None:
            cache = WindowCache(window_s)
            if len(caches) >= WINDOW_CACHES:
                del caches[next(iter(caches))]
        caches[window_s] = cache  # most recently read last
        if self._touched:
            for each in caches.values():
                each.dirty |= self._touched
            self._touched = set()
        return cache

    def _view(
        self, window_s: float, now_s: float, weighted: bool, rates: dict[str, float],
        judged_start: float, backlogged: Iterable[str] | None,
    ) -> WindowView:  # fmt: skip
        start_s = now_s - window_s
        gap, gap_clients = self._gap(start_s, rates, backlogged)
        return WindowView(
            window_s=window_s,
            start_s=max(start_s, judged_start),
            end_s=now_s,
            jain_index=jain_index(sorted(rates.values())),  # one order whatever the dict's
            weighted=weighted,
            rates=rates,
            service_gap=gap,
            gap_clients=gap_clients,
        )

    def _gap(
        self, start_s: float, rates: Mapping[str, float], backlogged: Iterable[str] | None
    ) -> tuple[ServiceGap, int]:
        """The pairwise gap over the most and least served backlogged clients; each
        sample's cumulatives are looked up for those only, not walked whole."""
        inside = [s for s in self.samples if s.t_s >= start_s]
        if backlogged is None:
            backlogged = set().union(*(s.backlogged for s in inside)) if inside else set()
        keep = _extremes(backlogged, rates, GAP_MAX_CLIENTS)
        if len(keep) < 2:
            return ServiceGap(0.0), len(keep)
        clients = self.clients
        trimmed = [
            ServiceSample(
                s.t_s,
                {c: s.cumulative[c] / clients[c].weight for c in keep
                 if c in s.cumulative and c in clients},
                s.backlogged & keep,
            )
            for s in inside
        ]  # fmt: skip
        return max_service_gap(trimmed), len(keep)

    def _prune(self, horizon_s: float) -> None:
        while self.samples and self.samples[0].t_s < horizon_s:
            self.samples.popleft()
        for history in self.clients.values():
            points = history.points
            while len(points) > 1 and points[1][0] <= horizon_s:
                points.popleft()
            runs = history.runs
            while runs and runs[0][1] < horizon_s:
                runs.popleft()


def _value_at(points: Iterable[tuple[float, float]], t_s: float) -> float:
    """Cumulative service at ``t_s``: the last point at or before it (0 before the first)."""
    value = 0.0
    for point_t, cumulative in points:
        if point_t > t_s:
            break
        value = cumulative
    return value


def _span(history: _ClientHistory, start_s: float, now_s: float) -> tuple[float, float] | None:
    """When ``history``'s client was active inside the window: from its first moment with a
    request inside the host (or service credited) to its last one (``now_s`` while it still
    has one). A client that was served and left is judged on the time it was there, not
    diluted by the idle rest of the window. None if it was never active in the window."""
    begins: list[float] = []
    ends: list[float] = []
    for run_start, run_end in history.runs:
        if run_end >= start_s and run_start <= now_s:
            begins.append(max(start_s, run_start))
            ends.append(min(now_s, run_end))
    changed = [t for t, _ in history.points if start_s < t <= now_s]
    if changed and history.cumulative > _value_at(history.points, start_s):
        begins.append(changed[0])
        ends.append(changed[-1])
    if not begins:
        return None
    return min(begins), max(ends)


def _extremes(names: Iterable[str], rates: Mapping[str, float], limit: int) -> frozenset[str]:
    """At most ``limit`` of ``names``: the most and the least served (by window rate, then
    name), picked from (rate, name) pairs built and compared in C, not by a key function."""
    names = frozenset(names)
    if len(names) <= limit:
        return names
    half = limit // 2
    ranked = list(zip(map(rates.get, names, repeat(0.0)), names, strict=True))
    ends = heapq.nsmallest(half, ranked) + heapq.nlargest(limit - half, ranked)
    return frozenset(name for _, name in ends)
