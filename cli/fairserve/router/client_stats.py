"""One client's figures in the router, kept small for the garbage collector (issue 18).

A full garbage collection walks every object the collector tracks, and every reference each
one holds, while the router's event loop waits. A client's numeric history (its recent
latencies and TTFTs, its per-second rate buckets) is therefore packed into ``bytearray``
buffers of C doubles, which the collector does not track (an ``array.array`` is tracked
since Python 3.10), and the current second's bucket is four plain fields: a client's
:class:`ClientStats` is its only tracked object. Deques of floats and a list per second of
rates made it ~8 objects and ~60 references a client, and a full collection of the router's
accounting ~120 ms at 10,000 clients (``tests/perf/bench_gc.py``).

Why not ``gc.freeze()`` of this state instead: a freeze takes every object the collector
tracks at that instant out of its sight for good (reference counting still frees them, no
collection examines them again), so any reference cycle in the process that had become
garbage by then would never be reclaimed; repeated as clients come, that leaks. The router
freezes once, after start-up (``commands.router._settle_gc``).
"""

from __future__ import annotations

import math
import struct
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from fairserve.core.metrics import percentile
from fairserve.router.totals import Totals

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


@dataclass(slots=True)
class ClientStats:
    """One client's figures: counters, its recent latencies and TTFTs, its rate buckets."""

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

    def count(self, now_s: float, service: float, tokens: int, finished: int) -> None:
        """Add to the rate bucket of ``now_s``'s second (a new second with nothing to count
        opens none)."""
        second = float(math.floor(now_s))
        if self.second_s == second:
            self.second_service += service
            self.second_tokens += tokens
            self.second_finished += finished
        elif service != 0 or finished:
            # A new second: drop those past the rate window here too, so a router whose
            # state nobody reads keeps at most RATE_WINDOW_S buckets per client.
            _close_second(self)
            _drop_buckets_before(self.buckets, second - RATE_WINDOW_S)
            self.second_s, self.second_service = second, service
            self.second_tokens, self.second_finished = tokens, finished

    def answered(self, latency_s: float, ttft_s: float | None) -> None:
        """A request's latency and TTFT (None: no token came) for the percentiles."""
        _keep_recent(self.latencies_s, latency_s)
        if ttft_s is not None:
            _keep_recent(self.ttfts_s, ttft_s)

    def copy(self, now_s: float) -> ClientCopy:
        """The figures at ``now_s`` and copies of the recent latencies: everything of the
        client's view but the percentiles (sorting up to ``RECENT_REQUESTS`` values
        twice), which :func:`client_figures` computes from the copy later, without the
        live client."""
        horizon_s = now_s - RATE_WINDOW_S
        _drop_buckets_before(self.buckets, horizon_s)
        if self.second_s < horizon_s:  # every closed bucket is older: none is left
            self.second_s, self.second_service = NO_SECOND, 0.0
            self.second_tokens = self.second_finished = 0.0
        closed = _doubles(self.buckets)
        span_s = min(RATE_WINDOW_S, max(1.0, now_s - (self.first_s or now_s)))
        figures = {
            "weight": self.weight,
            "requests": self.requests,
            "finished": self.finished,
            "failed": self.failed,
            "aborted": self.aborted,
            "rejected": self.rejected,
            "in_flight": self.in_flight - self.queued,
            "queued": self.queued,
            "queue_depth": self.queue_depth,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "output_tokens": self.output_tokens,
            "service": self.service,
            "pending_service": self.pending_service,
            "service_rate": (sum(closed[1::4]) + self.second_service) / span_s,
            "requests_per_s": (sum(closed[3::4]) + self.second_finished) / span_s,
            "tokens_per_s": (sum(closed[2::4]) + self.second_tokens) / span_s,
        }
        last = -RECENT_REQUESTS * _FLOAT.size
        return ClientCopy(
            figures,
            _doubles(self.latencies_s[last:]).tolist(),
            _doubles(self.ttfts_s[last:]).tolist(),
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
    """One client's figures copied at one instant (:meth:`ClientStats.copy`)."""

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
