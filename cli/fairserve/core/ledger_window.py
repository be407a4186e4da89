"""The ledger's window figures kept up to date incrementally, for a host that reads them often.

A window read judges every client on its own active span (see :mod:`fairserve.core.ledger`).
Computed from scratch, one read walks every client's history: some 36 ms on the event loop
with 10,000 clients (issue 18). Yet between two reads most clients' figures cannot change:
a client's span and service delta move only when something happens to it (an event), while
it has a request inside the host (its span ends *now*), while the window's start cuts its
span (it began before the start), or when the start passes one of its recorded times.

:class:`WindowCache` keeps, per window length, each client's (begin, end, delta) with the
start up to which it holds, recomputes only the clients touched since the last read, those
still in flux and those whose time came (a heap), and folds the cached ones into the rates
and Jain's index with built-in reductions. Each client's entry is computed exactly as the
full computation does (with bisection over its time-ordered history instead of a scan), so
the answers are equal (``tests/core/test_ledger_window.py`` compares them on random
histories).

Pure: standard library only.
"""

from __future__ import annotations

import heapq
import itertools
import math
import struct
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from fairserve.core.metrics import ServiceSample

PAIR = struct.Struct("=2d")
"""A pair of floats as packed in :class:`ClientHistory`'s buffers."""


class Pairs:
    """A view of ``(a, b)`` pairs of floats packed in a ``bytearray``, in the order kept,
    read and changed like the deque of tuples it replaces (issue 18). A bytearray is not a
    container for the garbage collector, while a deque is one it walks in every full
    collection, a reference per pair (~650,000 at 10,000 clients, 300 requests a second);
    this view is made on each use and not kept. Iterating reads a copy: the buffer may
    change while a loop runs."""

    __slots__ = ("packed",)

    def __init__(self, packed: bytearray) -> None:
        self.packed = packed

    def __len__(self) -> int:
        return len(self.packed) // PAIR.size

    def __bool__(self) -> bool:
        return bool(self.packed)

    def __getitem__(self, index: int) -> tuple[float, float]:
        count = len(self.packed) // PAIR.size
        at = index + count if index < 0 else index
        if not 0 <= at < count:
            raise IndexError(index)
        pair: tuple[float, float] = PAIR.unpack_from(self.packed, at * PAIR.size)
        return pair

    def __setitem__(self, index: int, pair: tuple[float, float]) -> None:
        count = len(self.packed) // PAIR.size
        at = index + count if index < 0 else index
        if not 0 <= at < count:
            raise IndexError(index)
        PAIR.pack_into(self.packed, at * PAIR.size, *pair)

    def __iter__(self) -> Iterator[tuple[float, float]]:
        return PAIR.iter_unpack(bytes(self.packed))

    def append(self, pair: tuple[float, float]) -> None:
        self.packed += PAIR.pack(*pair)

    def popleft(self) -> None:
        """Drop the oldest pair (a bytearray drops its head without moving the rest)."""
        del self.packed[: PAIR.size]


@dataclass(slots=True)
class ClientHistory:
    """One client's history in the ledger: its only object the garbage collector tracks
    (the points and runs are packed in bytearrays, read through :class:`Pairs`)."""

    weight: float
    cumulative: float = 0.0
    packed_points: bytearray = field(default_factory=bytearray)
    packed_runs: bytearray = field(default_factory=bytearray)
    busy: int = 0

    @property
    def points(self) -> Pairs:
        """(t_s, cumulative) where the cumulative changed, oldest first."""
        return Pairs(self.packed_points)

    @property
    def runs(self) -> Pairs:
        """(start_s, end_s) of busy runs (end is +inf while busy), oldest first."""
        return Pairs(self.packed_runs)


Entry = tuple[float, float, float]
"""(begin_s, end_s, service delta ≥ 0) of a client active in the window."""


def _column(packed: bytearray, k: int) -> memoryview[float]:
    """The ``k``-th float of every pair in ``packed`` (0: first, 1: second), for bisection
    in C. A view: the buffer cannot grow or shrink while one is alive, so the reads of
    this module drop theirs (``del``) right after the bisection (a ``with`` block costs
    as much again as the view)."""
    return memoryview(packed).cast("d")[k::2]


def entry_and_until(
    history: ClientHistory, start_s: float, now_s: float
) -> tuple[Entry | None, float]:
    """The client's entry: its active span in ``[start_s, now_s]`` and its service delta
    over the window (None if it was not active), the ledger's ``_span`` and ``_value_at``
    by bisection (runs and points are in time order); and until when it holds: the
    earliest recorded time at or after ``start_s`` (the entry computed for ``start_s``
    holds for every later start before it; inf: for good). One pass, as few bisections
    as a read at the present needs (the last times are at or before now)."""
    begins: list[float] = []
    ends: list[float] = []
    until = math.inf
    unpack, size = PAIR.unpack_from, PAIR.size  # locals: ~10 pairs read per client
    runs = history.packed_runs
    count = len(runs) // size
    if count:
        run_ends = _column(runs, 1)
        first = bisect_left(run_ends, start_s)  # the first run ending at or after start
        del run_ends
        if unpack(runs, (count - 1) * size)[0] <= now_s:
            last = count - 1
        else:
            run_starts = _column(runs, 0)
            last = bisect_right(run_starts, now_s) - 1  # the last run starting by now
            del run_starts
        if first < count:
            first_start, until = unpack(runs, first * size)
            if first_start >= start_s:
                until = min(until, first_start)
            if first + 1 < count:
                until = min(until, unpack(runs, (first + 1) * size)[0])
            if first <= last:
                begins.append(max(start_s, first_start))
                ends.append(min(now_s, unpack(runs, last * size)[1]))
    points = history.packed_points
    count = len(points) // size
    after = upto = 0
    if count:
        last_at_or_before_now = unpack(points, (count - 1) * size)[0] <= now_s
        times = _column(points, 0)
        after = bisect_right(times, start_s)  # the first point after start
        at = bisect_left(times, start_s)  # the first point at or after start
        upto = count if last_at_or_before_now else bisect_right(times, now_s)
        del times
        if at < count:
            until = min(until, unpack(points, at * size)[0])
    before = unpack(points, (after - 1) * size)[1] if after > 0 else 0.0
    if after < upto and history.cumulative > before:
        begins.append(unpack(points, after * size)[0])
        ends.append(unpack(points, (upto - 1) * size)[0])
    if not begins:
        return None, until
    return (min(begins), max(ends), max(0.0, history.cumulative - before)), until


def _has_future(history: ClientHistory, now_s: float) -> bool:
    """The client has times after ``now_s`` (a read of the past): recomputed every read."""
    runs, points = history.packed_runs, history.packed_points
    if runs:
        run_start, run_end = PAIR.unpack_from(runs, len(runs) - PAIR.size)
        if run_start > now_s or (run_end != math.inf and run_end > now_s):
            return True
    return bool(points) and PAIR.unpack_from(points, len(points) - PAIR.size)[0] > now_s


Moving = tuple[float | None, float | None, float]
"""An entry that moves with the clock alone: (begin, or None for the window's start; end,
or None for now; delta). A client with a request inside the host ends *now*; one whose
span began before the window's start begins *at* it; nothing else moves until an event or
the start passing one of its times."""


@dataclass(slots=True)
class Figures:
    """One read's judged rates and what the window view needs of them."""

    rates: dict[str, float]
    judged_start_s: float | None
    backlogged: Iterable[str]


class WindowCache:
    """The window figures of one window length, kept across reads (see the module)."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.dirty: set[str] = set()
        self.reset = True
        self.last_now_s = -math.inf
        self.entries: dict[str, Entry] = {}
        self.lengths: dict[str, float] = {}
        self.flux: set[str] = set()
        """Clients with times after the last read's now: recomputed at every read."""
        self.moving: dict[str, Moving] = {}
        self.expiry: list[tuple[float, str]] = []
        self.until: dict[str, float] = {}
        self.needed_s: float | None = None
        self.rates: dict[str, float] = {}
        self.begins: dict[str, float] = {}
        self.counted: deque[ServiceSample] = deque()
        self.backlogged: dict[str, int] = {}
        self.unjudged: set[str] = set()
        """Clients recomputed by :meth:`settle` whose rate the next read must judge."""

    def settle(
        self, clients: Mapping[str, ClientHistory], now_s: float, needed: float, names: int
    ) -> int:
        """Do up to ``names`` clients' worth of what the next read would do (recompute the
        clients changed since the last read, then judge them); returns how many remain.

        A host calls it in slices before a read, yielding between them, so that even after
        many changes (or for a new window length) the read itself has little left to do:
        an entry computed now holds for later reads exactly as one computed by a read does
        (the clients changed since are marked dirty again, expiries are in the heap)."""
        if self.reset or now_s < self.last_now_s:
            self._clear()
            self.dirty = set(clients)
        self.last_now_s = now_s
        if self.dirty:
            batch = set(itertools.islice(self.dirty, names))
            self.dirty -= batch
            changed = self._recompute(batch, clients, now_s - self.window_s, now_s, {})
            self.unjudged |= changed
            return len(self.dirty) + len(self.unjudged)
        if self.needed_s is None:
            if max(self.lengths.values(), default=0.0) / 2 < needed:
                return 0  # the read decides who is judged (the history is still short)
            self.needed_s, self.rates, self.begins = needed, {}, {}
            self.unjudged = set(self.entries)
        batch = set(itertools.islice(self.unjudged, names))
        self.unjudged -= batch
        for name in batch:
            self._judge(name, self.entries.get(name), clients, self.rates, self.begins)
        return len(self.unjudged)

    def read(
        self, clients: Mapping[str, ClientHistory], samples: deque[ServiceSample], now_s: float,
        needed: float,
    ) -> Figures:  # fmt: skip
        """The judged rates at ``now_s`` (a client is judged once active ``needed`` s or half
        as long as the longest-active one), and the clients backlogged in the window."""
        start_s = now_s - self.window_s
        if self.reset or now_s < self.last_now_s:
            self._clear()
            self.dirty = set(clients)
        self.last_now_s = now_s
        todo = self.dirty | self.flux
        self.dirty = set()
        while self.expiry and self.expiry[0][0] <= start_s:
            until, name = heapq.heappop(self.expiry)
            if self.until.get(name) == until:
                todo.add(name)
        flux: dict[str, Entry] = {}
        changed = self._recompute(todo, clients, start_s, now_s, flux) | self.unjudged
        self.unjudged = set()
        for name, (begin_s, end_s, delta) in self.moving.items():
            flux[name] = (start_s if begin_s is None else begin_s,
                          now_s if end_s is None else end_s, delta)  # fmt: skip
        longest = max(self.lengths.values(), default=0.0)
        longest = max([longest, *(end - begin for begin, end, _ in flux.values())])
        needed_s = min(needed, longest / 2)
        if needed_s != self.needed_s:
            self.needed_s, self.rates, self.begins = needed_s, {}, {}
            changed = set(self.entries)
        for name in changed:
            self._judge(name, self.entries.get(name), clients, self.rates, self.begins)
        rates: dict[str, float] = {}
        begins: dict[str, float] = {}
        for name, found in flux.items():
            self._judge(name, found, clients, rates, begins)
        judged_start = min([*begins.values(), min(self.begins.values(), default=math.inf)])
        return Figures(
            {**self.rates, **rates},
            None if judged_start == math.inf else judged_start,
            self._backlogged(samples, start_s),
        )

    def _clear(self) -> None:
        self.reset = False
        self.entries, self.lengths, self.flux, self.moving = {}, {}, set(), {}
        self.expiry, self.until = [], {}
        self.needed_s, self.rates, self.begins = None, {}, {}
        self.counted, self.backlogged = deque(), {}
        self.unjudged = set()

    def _recompute(
        self, todo: set[str], clients: Mapping[str, ClientHistory], start_s: float,
        now_s: float, flux: dict[str, Entry],
    ) -> set[str]:  # fmt: skip
        """Recompute ``todo``'s entries (into ``entries`` or ``moving``; a client with
        times after now into ``flux``, this read only). Returns the names whose cached
        entry changed."""
        changed: set[str] = set()
        for name in todo:
            if name in self.entries:
                del self.entries[name], self.lengths[name]
                changed.add(name)
            self.flux.discard(name)
            self.moving.pop(name, None)
            self.until.pop(name, None)
            history = clients.get(name)
            if history is None:
                continue
            found, until = entry_and_until(history, start_s, now_s)
            if _has_future(history, now_s):
                self.flux.add(name)
                if found is not None:
                    flux[name] = found
                continue
            if until != math.inf:
                self.until[name] = until
                heapq.heappush(self.expiry, (until, name))
            if found is None:
                continue
            runs = history.packed_runs
            is_open = bool(runs) and PAIR.unpack_from(runs, len(runs) - PAIR.size)[1] == math.inf
            if is_open or found[0] <= start_s:
                begin = None if found[0] <= start_s else found[0]
                self.moving[name] = (begin, None if is_open else found[1], found[2])
            else:
                self.entries[name], self.lengths[name] = found, found[1] - found[0]
                changed.add(name)
        if len(self.expiry) > 4 * len(self.until) + 64:
            self.expiry = [(u, n) for u, n in self.expiry if self.until.get(n) == u]
            heapq.heapify(self.expiry)
        return changed

    def _judge(
        self, name: str, found: Entry | None, clients: Mapping[str, ClientHistory],
        rates: dict[str, float], begins: dict[str, float],
    ) -> None:  # fmt: skip
        """Put ``name``'s rate in ``rates`` if it is judged, else take it out."""
        rates.pop(name, None)
        begins.pop(name, None)
        if found is None:
            return
        begin_s, end_s, delta = found
        span_s = end_s - begin_s
        assert self.needed_s is not None
        if span_s <= 0 or span_s < self.needed_s:
            return
        rates[name] = delta / span_s / clients[name].weight
        begins[name] = begin_s

    def _backlogged(self, samples: deque[ServiceSample], start_s: float) -> Iterable[str]:
        """The clients backlogged at some sample inside the window: how many samples each
        was backlogged at, kept as samples enter the window and leave it."""
        counted, counts = self.counted, self.backlogged
        while counted and counted[0].t_s < start_s:
            for name in counted.popleft().names:
                counts[name] -= 1
                if not counts[name]:
                    del counts[name]
        newer: list[ServiceSample] = []
        last = counted[-1] if counted else None
        for sample in reversed(samples):
            if sample is last or sample.t_s < start_s:
                break
            newer.append(sample)
        for sample in reversed(newer):
            counted.append(sample)
            for name in sample.names:
                counts[name] = counts.get(name, 0) + 1
        return counts.keys()
