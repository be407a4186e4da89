"""One window's fairness view, and its computation in steps.

Why its own module: the ledger (:mod:`~fairserve.core.ledger`) copies what a view needs at
one instant (:class:`WindowParts`); turning that copy into the figures (Jain's index, the
pairwise service gap over the most and least served backlogged clients) needs nothing of
the ledger, so a host may run it later, in steps between turns of its event loop
(:func:`view_steps`), or at once (:func:`finish`).

Pure: standard library only.
"""

from __future__ import annotations

import heapq
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from itertools import repeat
from typing import Any, TypeVar

from fairserve.core.metrics import ServiceGap, ServiceSample, jain_index, max_service_gap

SERVICE_UNIT = "service units: w_e·prompt + w_q·output tokens, divided by the client's weight"
"""What the ledger's rates and gaps are measured in (every view labels them with it)."""
GAP_MAX_CLIENTS = 64
"""The pairwise gap is computed over at most this many backlogged clients (the most and the
least served in the window), so one read stays a few milliseconds whatever the fleet."""
EXTREMES_SLICE = 2048
"""(rate, name) pairs ranked per step of the gap's client choice (~1 ms each)."""


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


@dataclass(frozen=True, slots=True)
class WindowParts:
    """What one window view is computed from, copied out of the ledger at one instant: no
    part of it is shared with the ledger, so it may be turned into the view later (in
    slices, on a busy event loop) and still describe that instant."""

    window_s: float
    now_s: float
    weighted: bool
    rates: dict[str, float]
    judged_start_s: float
    backlogged: frozenset[str]
    """Clients backlogged at some sample inside the window."""
    samples: tuple[ServiceSample, ...]
    """The samples inside the window."""
    weights: dict[str, float]
    """The weights of the backlogged clients."""
    view: WindowView | None = None
    """The view itself, when it was computed at once (a read of the past)."""


T = TypeVar("T")
Steps = Generator[None, None, T]
"""A computation in steps: it yields where a host may let other work run, then returns."""


def finish(steps: Steps[T]) -> T:
    """Run ``steps`` to the end at once."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]


def view_steps(parts: WindowParts) -> Steps[WindowView]:
    """The window view of ``parts``: Jain's index over the judged rates and the pairwise
    gap over the most and least served backlogged clients, in steps of about a millisecond
    or two each (10,000 clients)."""
    if parts.view is not None:
        return parts.view
    rates = parts.rates
    start_s = parts.now_s - parts.window_s
    jain = jain_index(sorted(rates.values()))  # one order whatever the dict's
    yield
    keep = yield from _extremes(parts.backlogged, rates, GAP_MAX_CLIENTS)
    yield
    if len(keep) < 2:
        gap = ServiceGap(0.0)
    else:
        weights = parts.weights
        trimmed = [
            ServiceSample(
                s.t_s,
                {c: s.cumulative[c] / weights[c] for c in keep
                 if c in s.cumulative and c in weights},
                keep.intersection(s.names),
            )
            for s in parts.samples
        ]  # fmt: skip
        gap = max_service_gap(trimmed)
    return WindowView(
        window_s=parts.window_s,
        start_s=max(start_s, parts.judged_start_s),
        end_s=parts.now_s,
        jain_index=jain,
        weighted=parts.weighted,
        rates=rates,
        service_gap=gap,
        gap_clients=len(keep),
    )


def _extremes(
    names: frozenset[str], rates: Mapping[str, float], limit: int
) -> Steps[frozenset[str]]:
    """At most ``limit`` of ``names``: the most and the least served (by window rate, then
    name), picked from (rate, name) pairs built and compared in C, not by a key function,
    ``EXTREMES_SLICE`` pairs per step (the k smallest of a union are the k smallest of
    one part's k smallest and the other part: the same answer as in one go)."""
    if len(names) <= limit:
        return names
    half = limit // 2
    listed = list(names)
    least: list[tuple[float, str]] = []
    most: list[tuple[float, str]] = []
    for at in range(0, len(listed), EXTREMES_SLICE):
        yield
        some = listed[at : at + EXTREMES_SLICE]
        part = list(zip(map(rates.get, some, repeat(0.0)), some, strict=True))
        least = heapq.nsmallest(half, least + part)
        most = heapq.nlargest(limit - half, most + part)
    return frozenset(name for _, name in least + most)
