"""Recent snapshots, and the rates that need more than one of them.

The router reports cumulative counters (tokens, cached tokens) per worker and per client;
rates over the last few polls are differences between snapshots. Time is the router's own
``uptime_s``, never the dashboard's clock: rates stay right when a poll is late, a test
replaying fixed snapshots gets the same picture every run, and a restarted router (uptime
going backwards) simply starts a new history.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from fairserve.tui.model import ClientView, Snapshot, WorkerView

MAX_POINTS = 120
"""Snapshots kept for the charts (two minutes at the default one-second interval)."""
RATE_POINTS = 5
"""Rates are differences over this many polls: smooth, yet recent."""


@dataclass(frozen=True, slots=True)
class ClientSeries:
    """One client over the kept history, oldest first; ``None`` = not known at that poll."""

    name: str
    service_rate: tuple[float | None, ...]
    cache_hit_rate: tuple[float | None, ...]


@dataclass(frozen=True, slots=True)
class Frame:
    """What the widgets render: a snapshot plus what history adds, immutable."""

    snapshot: Snapshot
    worker_tokens_per_s: tuple[float | None, ...] = ()
    """Prompt + output tokens per second of each worker, aligned with ``snapshot.workers``."""
    cache_hit_rate: float | None = None
    """Cluster-wide cached / prompt tokens over the last polls (all time at the start)."""
    load_tokens_per_s: float | None = None
    """Tokens the workers had to compute (prompt not served from cache + output) per second."""
    series: tuple[ClientSeries, ...] = ()
    polls: int = 0

    @property
    def capacity_tokens_per_s(self) -> float | None:
        """Sum over healthy workers that report one (per wall second)."""
        values = [
            c
            for w in self.snapshot.workers
            if w.healthy and (c := w.wall_capacity_tokens_per_s) is not None
        ]
        return sum(values) if values else None

    @property
    def load_fraction(self) -> float | None:
        capacity = self.capacity_tokens_per_s
        if self.load_tokens_per_s is None or not capacity:
            return None
        return self.load_tokens_per_s / capacity


class History:
    """Owned by the app (mutable); hands out frozen :class:`Frame` objects."""

    def __init__(self, max_points: int = MAX_POINTS, rate_points: int = RATE_POINTS) -> None:
        self.snapshots: deque[Snapshot] = deque(maxlen=max_points)
        self.rate_points = rate_points
        self.polls = 0

    def add(self, snapshot: Snapshot) -> Frame:
        self.polls += 1
        if self.snapshots:
            last_s = self.snapshots[-1].router.uptime_s
            if snapshot.router.uptime_s < last_s:
                self.snapshots.clear()  # the router restarted: its counters did too
            elif snapshot.router.uptime_s == last_s:
                self.snapshots.pop()  # the same instant seen again: keep one
        self.snapshots.append(snapshot)
        return self.frame()

    def frame(self) -> Frame:
        points = list(self.snapshots)
        now = points[-1]
        before = points[max(0, len(points) - 1 - self.rate_points)]
        return Frame(
            snapshot=now,
            worker_tokens_per_s=tuple(_worker_rate(before, now, w) for w in now.workers),
            cache_hit_rate=_cache_hit(before, now),
            load_tokens_per_s=_load(before, now),
            series=_series(points, self.rate_points),
            polls=self.polls,
        )


def _elapsed_s(before: Snapshot, now: Snapshot) -> float:
    return now.router.uptime_s - before.router.uptime_s


def _worker(snapshot: Snapshot, url: str) -> WorkerView | None:
    return next((w for w in snapshot.workers if w.url == url), None)


def _worker_rate(before: Snapshot, now: Snapshot, worker: WorkerView) -> float | None:
    elapsed_s = _elapsed_s(before, now)
    old = _worker(before, worker.url)
    if elapsed_s <= 0 or old is None:
        return None
    tokens = worker.prompt_tokens + worker.output_tokens
    return max(0.0, tokens - old.prompt_tokens - old.output_tokens) / elapsed_s


def _load(before: Snapshot, now: Snapshot) -> float | None:
    elapsed_s = _elapsed_s(before, now)
    if elapsed_s <= 0:
        return None
    total = 0.0
    for worker in now.workers:
        old = _worker(before, worker.url)
        if old is None:
            continue
        computed = worker.prompt_tokens - worker.cached_tokens + worker.output_tokens
        computed_before = old.prompt_tokens - old.cached_tokens + old.output_tokens
        total += max(0, computed - computed_before)
    return total / elapsed_s


def _cache_hit(before: Snapshot, now: Snapshot) -> float | None:
    prompt = sum(w.prompt_tokens for w in now.workers)
    cached = sum(w.cached_tokens for w in now.workers)
    prompt_before = sum(w.prompt_tokens for w in before.workers)
    cached_before = sum(w.cached_tokens for w in before.workers)
    if before is not now and prompt > prompt_before:
        return (cached - cached_before) / (prompt - prompt_before)
    return cached / prompt if prompt else None


def _client(snapshot: Snapshot, name: str) -> ClientView | None:
    return next((c for c in snapshot.clients if c.name == name), None)


def _series(points: Sequence[Snapshot], rate_points: int) -> tuple[ClientSeries, ...]:
    names = sorted({c.name for s in points for c in s.clients})
    series = []
    for name in names:
        views = [_client(s, name) for s in points]
        rates = tuple(None if v is None else v.service_rate for v in views)
        hits = tuple(
            _client_hit(views[max(0, i - rate_points)], view) for i, view in enumerate(views)
        )
        series.append(ClientSeries(name, rates, hits))
    return tuple(series)


def _client_hit(before: ClientView | None, now: ClientView | None) -> float | None:
    """Cached share of the prompt tokens a client sent since ``before`` (or ever)."""
    if now is None:
        return None
    if before is not None and before is not now and now.prompt_tokens > before.prompt_tokens:
        return (now.cached_tokens - before.cached_tokens) / (
            now.prompt_tokens - before.prompt_tokens
        )
    if before is not None and before is not now:
        return None  # nothing finished in the window: no news, not a zero hit rate
    return now.cached_tokens / now.prompt_tokens if now.prompt_tokens else None
