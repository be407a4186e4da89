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
from collections.abc import Iterable
from dataclasses import dataclass

from fairserve.core.errors import ConfigError
from fairserve.core.ledger_view import WindowParts, WindowView, finish, view_steps
from fairserve.core.ledger_window import PAIR as _PAIR
from fairserve.core.ledger_window import ClientHistory as _ClientHistory
from fairserve.core.ledger_window import WindowCache
from fairserve.core.metrics import ServiceSample

_PAIR_SIZE = _PAIR.size

DEFAULT_WINDOW_S = 60.0
MAX_WINDOW_S = 600.0
"""The longest window a reader may ask for; history older than this is dropped."""
MIN_ACTIVE_S = 5.0
"""A client is judged once it has been active this long in the window (or half as long as
the longest-active client, when the window is younger than that)."""
SETTLE_NAMES = 256
"""Clients one :meth:`ServiceLedger.settle` call recomputes or judges (~2 ms at most)."""
WINDOW_CACHES = 4
"""Window lengths whose figures are kept across reads (:mod:`~fairserve.core.ledger_window`);
a read of another length drops the least recently read one."""


@dataclass(frozen=True, slots=True)
class WeightsCopy:
    """Every client's weight as :meth:`ServiceLedger.weights_copy` found it, and the window
    cache whose dirty clients say which changed since."""

    cache: WindowCache
    weights: dict[str, float]


def _check_window(window_s: float, max_window_s: float) -> None:
    if not (0 < window_s <= max_window_s):
        raise ConfigError(f"window_s must be within (0, {max_window_s:g}], got {window_s}")


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
        self._busy: dict[str, None] = {}
        """Clients with a request inside the host (``busy > 0``), in the order they became
        so: a sample reads them without walking every client."""
        self._due: dict[str, float] = {}
        """Client -> the time of its entry in ``_expiry``: no earlier than the horizon at
        which :meth:`_prune` first has something of it to drop (see :meth:`_schedule`)."""
        self._expiry: list[tuple[float, str]] = []
        """(due time, client): a heap of when clients have history to drop, so a sample
        touches only those (entries whose time is no longer in ``_due`` are stale)."""
        self._later: list[tuple[float, str]] = []
        """Entries of clients visited since the last sample, pushed back once its pruning
        is over (one may be due at that very horizon: a run ending there)."""
        self._horizon_s = -math.inf
        """The last sample's horizon: history before it is dropped (:meth:`prune`)."""

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
        self._busy.pop(name, None)
        self._due.pop(name, None)
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
        points = history.packed_points  # (t_s, cumulative) pairs, read in place: per token
        size, last_sample_s = len(points), self.samples[-1].t_s if self.samples else -math.inf
        one, two = size - _PAIR_SIZE, size - 2 * _PAIR_SIZE
        if (two >= 0 and _PAIR.unpack_from(points, two)[0] >= last_sample_s) or (
            size and _PAIR.unpack_from(points, one)[0] == now_s
        ):
            _PAIR.pack_into(points, one, now_s, history.cumulative)
        else:
            points += _PAIR.pack(now_s, history.cumulative)
        if len(points) == 2 * _PAIR_SIZE:  # points[1] moved or came: a prune may reach [0]
            self._schedule(name, history)

    def busy(self, name: str, now_s: float) -> None:
        """``name`` has one more request inside the host."""
        history = self.clients[name]
        if history.busy == 0:
            history.runs.append((now_s, math.inf))
            self._busy[name] = None
            if self._caches:
                self._touched.add(name)
        history.busy += 1

    def idle(self, name: str, now_s: float) -> None:
        """One of ``name``'s requests left the host (none inside: nothing changes; such a
        call used to move the end of the client's last run, perhaps one already dropped)."""
        history = self.clients[name]
        if history.busy == 0:
            return
        history.busy -= 1
        if history.busy == 0:
            self._busy.pop(name, None)
            if history.runs:
                history.runs[-1] = (history.runs[-1][0], now_s)
                if self._caches:
                    self._touched.add(name)
                if len(history.runs) == 1:  # runs[0] ended: a prune may reach it
                    self._schedule(name, history)

    def sample(
        self, now_s: float, backlogged: Iterable[str] | None = None, every_client: bool = False,
        prune_visits: float = math.inf,
    ) -> bool:  # fmt: skip
        """Record who is backlogged now (call periodically) and drop what fell out of reach.

        By default a client is backlogged while it has a request inside the host
        (:meth:`busy`) and the sample holds those clients' cumulative service only (what
        the service gap reads). A host with a narrower notion passes ``backlogged`` (the
        simulator: a call waiting in some queue, DESIGN §7); ``every_client`` keeps every
        client's cumulative (a report that also reads rates off the samples).

        ``prune_visits`` bounds the clients whose history is dropped now; True means some
        is left, for :meth:`prune` (an event loop's host drops it over several turns: a
        busy host has that many clients' requests leave the window every second). Until
        then the ledger keeps history no read reaches: every answer is the same."""
        clients = self.clients
        marked = frozenset(self._busy if backlogged is None else backlogged)
        if every_client:
            cumulative = self.cumulatives()
        elif backlogged is None:  # the busy clients only, not a walk over every client
            cumulative = {n: clients[n].cumulative for n in self._busy}
        else:
            cumulative = {n: h.cumulative for n, h in clients.items() if n in marked}
        self.samples.append(ServiceSample(now_s, cumulative, marked))
        if self.max_window_s == math.inf:
            return False
        self._horizon_s = max(self._horizon_s, now_s - self.max_window_s)  # never back
        self._flush_later()  # what the last sample left due at its horizon: due again now
        return self.prune(prune_visits)

    def prune(self, visits: float = math.inf) -> bool:
        """Drop what the last sample left to drop, up to ``visits`` clients' worth; True
        while some is left."""
        return self._prune(self._horizon_s, visits)

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
        return finish(view_steps(self.window_parts(window_s, now_s, weighted)))

    def settle(self, window_s: float, now_s: float, names: int = SETTLE_NAMES) -> int:
        """Do up to ``names`` clients' worth of the next weighted read of ``window_s``
        (what changed since the last one); returns how many remain. A host calls it
        between turns of its event loop until 0, so the read itself stays short."""
        _check_window(window_s, self.max_window_s)
        if self.samples and now_s < self.samples[-1].t_s:
            return 0  # such a read is computed in full (see window)
        return self._cache(window_s).settle(self.clients, now_s, MIN_ACTIVE_S, names)

    def window_parts(
        self, window_s: float, now_s: float, weighted: bool = True,
        weights: WeightsCopy | None = None,
    ) -> WindowParts:  # fmt: skip
        """What :meth:`window` computes its view from, copied now (the incremental part of
        the read happens here): :func:`view_steps` turns it into the view without reading
        the ledger again, so a host may do that later, in slices, while the ledger moves.
        ``weights`` (:meth:`weights_copy`, taken a turn of the host's loop before) spares
        copying every client's weight here: only those of the clients touched since are
        read again."""
        _check_window(window_s, self.max_window_s)
        if not weighted or (self.samples and now_s < self.samples[-1].t_s):
            # A read before the last sample may reach history pruned since (a host reads
            # at the present): computed from what is left, as before.
            view = self.window_full(window_s, now_s, weighted)
            return WindowParts(window_s, now_s, weighted, {}, now_s, frozenset(), (), {}, view)
        cache = self._cache(window_s)
        if weights is not None and weights.cache is cache:
            copied = weights.weights
            for name in cache.dirty:  # every client added, forgotten or re-weighted since
                history = self.clients.get(name)
                if history is None:
                    copied.pop(name, None)
                else:
                    copied[name] = history.weight
        else:
            copied = {name: history.weight for name, history in self.clients.items()}
        figures = cache.read(self.clients, self.samples, now_s, MIN_ACTIVE_S)
        start_s = now_s - window_s
        judged_start = start_s if figures.judged_start_s is None else figures.judged_start_s
        return WindowParts(
            window_s, now_s, True, figures.rates, judged_start, frozenset(figures.backlogged),
            tuple(s for s in self.samples if s.t_s >= start_s), copied,
        )  # fmt: skip

    def weights_copy(self, window_s: float) -> WeightsCopy:
        """Every client's weight now, for the next :meth:`window_parts` of ``window_s``:
        any client changed after this is marked dirty in that window's cache, and that
        read looks those up again (none of its clients settled in between)."""
        cache = self._cache(window_s)
        return WeightsCopy(cache, {name: h.weight for name, h in self.clients.items()})

    def _weights(self, names: frozenset[str]) -> dict[str, float]:
        """The weights of those of ``names`` still tracked."""
        clients = self.clients
        return {name: clients[name].weight for name in names if name in clients}

    def window_full(self, window_s: float, now_s: float, weighted: bool = True) -> WindowView:
        """The window computed from scratch over every client (what :meth:`window` keeps
        up to date; the tests compare the two)."""
        _check_window(window_s, self.max_window_s)
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
        inside = tuple(s for s in self.samples if s.t_s >= start_s)
        backlogged = frozenset().union(*(s.names for s in inside))
        parts = WindowParts(
            window_s, now_s, weighted, rates, judged_start, backlogged, inside,
            self._weights(backlogged),
        )  # fmt: skip
        return finish(view_steps(parts))

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

    def _prune(self, horizon_s: float, visits: float = math.inf) -> bool:
        """Drop the samples, points and runs that no read can reach any more: only the
        clients whose due time the horizon passed are visited (what :meth:`_prune_full`
        does to every client, with the same result), ``visits`` at most. True while some
        are left."""
        while self.samples and self.samples[0].t_s < horizon_s:
            self.samples.popleft()
        expiry, due, clients = self._expiry, self._due, self.clients
        heappop, inf = heapq.heappop, math.inf
        later = self._later
        while expiry and expiry[0][0] <= horizon_s:  # _drop_before and _schedule, inlined
            if visits <= 0:
                return True
            visits -= 1
            due_s, name = heappop(expiry)
            if due.get(name) != due_s:
                continue  # stale: forgotten, or scheduled earlier since
            history = clients[name]
            points, runs = history.points, history.runs
            while len(points) > 1 and points[1][0] <= horizon_s:
                points.popleft()
            while runs and runs[0][1] < horizon_s:
                runs.popleft()
            next_s = points[1][0] if len(points) > 1 else inf
            if runs and runs[0][1] < next_s:
                next_s = runs[0][1]
            if next_s == inf:
                del due[name]
            else:
                due[name] = next_s
                later.append((next_s, name))
        self._flush_later()
        if len(expiry) > 4 * len(due) + 64:
            self._expiry = [(t_s, n) for t_s, n in expiry if due.get(n) == t_s]
            heapq.heapify(self._expiry)
        return False

    def _flush_later(self) -> None:
        for entry in self._later:
            heapq.heappush(self._expiry, entry)
        self._later = []

    def _prune_full(self, horizon_s: float) -> None:
        """:meth:`_prune` by walking every client (the tests compare the two)."""
        while self.samples and self.samples[0].t_s < horizon_s:
            self.samples.popleft()
        for history in self.clients.values():
            _drop_before(history, horizon_s)

    def _schedule(self, name: str, history: _ClientHistory) -> None:
        """Keep ``name``'s entry in the expiry heap no later than the first horizon at which
        a prune drops something of it: its second point's time (the first point is dropped
        once the horizon reaches the second) or the end of its oldest run. Called whenever
        that time may have come earlier (a second point, a first run ended, a prune)."""
        if self.max_window_s == math.inf:
            return  # nothing is ever pruned (a simulation's whole history)
        points, runs = history.points, history.runs
        due_s = points[1][0] if len(points) > 1 else math.inf
        if runs and runs[0][1] < due_s:
            due_s = runs[0][1]
        if due_s < self._due.get(name, math.inf):
            self._due[name] = due_s
            heapq.heappush(self._expiry, (due_s, name))


def _drop_before(history: _ClientHistory, horizon_s: float) -> None:
    """Drop ``history``'s points and runs that no window ending now or later can reach:
    points before the last one at or before ``horizon_s``, runs over before it."""
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
