"""Issue 18: the ledger's periodic sample reads the busy clients it keeps as they come and go,
and drops only the history whose time came (an expiry heap), instead of walking every
client. The result must be what the walk gives: the same samples, the same histories left,
after any sequence of events (random sequences, compared with a ledger that walks)."""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Iterable

from hypothesis import example, given, settings
from hypothesis import strategies as st

from fairserve.core.ledger import ServiceLedger
from fairserve.core.ledger_view import WindowView
from fairserve.core.metrics import ServiceSample

NAMES = ("a", "b", "c")


class WalkingLedger(ServiceLedger):
    """The sample as it was before: the busy clients and the history to drop found by
    walking every client."""

    def sample(
        self, now_s: float, backlogged: Iterable[str] | None = None, every_client: bool = False,
        prune_visits: float = math.inf,
    ) -> bool:  # fmt: skip
        marked = frozenset(n for n, h in self.clients.items() if h.busy > 0)
        cumulative = {n: h.cumulative for n, h in self.clients.items() if n in marked}
        self.samples.append(ServiceSample(now_s, cumulative, marked))
        if self.max_window_s != math.inf:
            self._prune_full(now_s - self.max_window_s)
        return False


Event = tuple[str, int, float, float]
"""(kind, client index, seconds since the last event, credited service)."""

events = st.lists(
    st.tuples(
        st.sampled_from(
            ["add", "busy", "idle", "credit", "credit", "sample", "sliced", "prune", "forget"]
        ),
        st.integers(0, len(NAMES) - 1),
        st.sampled_from([0.0, 0.0, 0.25, 1.0, 3.0, 12.0, 40.0, -0.5]),  # now and then back
        st.sampled_from([1.0, 7.5, -2.0]),
    ),
    min_size=10,
    max_size=200,
)


def _apply(ledger: ServiceLedger, event: Event, now_s: float) -> None:
    kind, index, _, service = event
    name = NAMES[index]
    if kind == "add":
        ledger.add_client(name, 1.0 + index, now_s)
    elif kind == "sample":
        ledger.sample(now_s)
    elif kind == "sliced":  # the router's way: a client's history dropped per turn
        ledger.sample(now_s, prune_visits=index)
    elif kind == "prune":
        ledger.prune(1)
    elif name not in ledger.clients:
        return
    elif kind == "busy":
        ledger.busy(name, now_s)
    elif kind == "idle":
        ledger.idle(name, now_s)  # also on a client with nothing inside (a no-op's edge)
    elif kind == "credit":
        ledger.credit(name, service, now_s)
    else:
        ledger.forget(name)


def _figures(view: WindowView) -> tuple[object, ...]:
    gap = view.service_gap
    return (view.start_s, view.jain_index, dict(view.rates), gap.value, gap.clients)


def _state(ledger: ServiceLedger) -> object:
    """Everything a sample writes or drops: the samples and every client's history."""
    return (
        [(s.t_s, s.cumulative, s.backlogged) for s in ledger.samples],
        {
            name: (h.cumulative, h.busy, list(h.points), [list(r) for r in h.runs])
            for name, h in ledger.clients.items()
        },
    )


@settings(max_examples=400)  # short sequences: the corner cases need many (~2 s)
@example(  # pruning left over, then a sample with the clock gone back: the horizon stays
    [("credit", 0, 3.0, 1.0), ("add", 0, 5.0, 1.0), ("sliced", 0, 0.0, 1.0),
     ("add", 0, -0.5, 1.0), ("sample", 0, 0.0, 1.0)],
    5.0,
)  # fmt: skip
@example(  # a second idle after the run's end was dropped, pruning left over
    [("busy", 2, 0.0, 1.0), ("idle", 2, 0.0, 1.0), ("sliced", 0, 12.0, 1.0),
     ("idle", 2, 0.0, 1.0)],
    5.0,
)  # fmt: skip
@given(events, st.sampled_from([5.0, 20.0, 600.0]))
def test_the_sample_equals_the_walk_over_every_client(
    sequence: list[Event], max_window_s: float
) -> None:
    kept, walking = ServiceLedger(max_window_s), WalkingLedger(max_window_s)
    for ledger in (kept, walking):
        for name in NAMES:
            ledger.add_client(name, 1.0, 0.0)
    now_s = 0.0
    for event in sequence:
        now_s += event[2]
        for ledger in (kept, walking):
            _apply(ledger, event, now_s)
        ordered = all(a.t_s <= b.t_s for a, b in itertools.pairwise(walking.samples))
        if kept._expiry and kept._expiry[0][0] <= kept._horizon_s:
            if not ordered:
                continue  # a clock gone back: no read to compare (samples out of order)
            # Pruning left for later turns: more history kept, but every read of the
            # present (or later) the same (one of the past may reach what was dropped).
            window_s = max_window_s
            for at_s in (now_s, now_s + max_window_s / 3):
                read = _figures(kept.window_full(window_s, at_s))
                assert read == _figures(walking.window_full(window_s, at_s))
        else:
            assert _state(kept) == _state(walking)
    while kept.prune(1):
        pass
    assert _state(kept) == _state(walking)
    later_s = now_s + max_window_s + 1.0  # a last sample past everything: all of it drops
    for ledger in (kept, walking):
        ledger.sample(later_s)
    assert _state(kept) == _state(walking)


def test_the_expiry_heap_stays_bounded_as_names_pass_through() -> None:
    """Clients forgotten leave stale entries in the heap: they are swept, not kept."""
    ledger = ServiceLedger(max_window_s=60.0)
    for i in range(20_000):
        name, t_s = f"n{i}", i * 1e-3
        ledger.add_client(name, 1.0, t_s)
        ledger.busy(name, t_s)
        ledger.credit(name, 1.0, t_s)
        ledger.idle(name, t_s)
        ledger.forget(name)
        if i % 1000 == 0:
            ledger.sample(t_s)
    assert len(ledger._expiry) <= 4 * len(ledger._due) + 64 + 1000


def test_a_sample_visits_the_busy_and_the_expired_clients_only() -> None:
    """10,000 clients served long ago and a few busy now: a sample costs what the few do
    (bounded here in CPU time against a walk over every client, the same ledger's)."""
    ledger = ServiceLedger(max_window_s=600.0)
    for i in range(10_000):
        name = f"c{i}"
        ledger.add_client(name, 1.0, 0.0)
        ledger.busy(name, 1.0)
        ledger.credit(name, 5.0, 2.0)
        ledger.idle(name, 3.0)
    for name in ("c1", "c2"):
        ledger.busy(name, 100.0)
    ledger.sample(100.0)
    assert ledger.samples[-1].backlogged == {"c1", "c2"}
    started_s = time.process_time()
    for k in range(100):
        ledger.sample(101.0 + k)
    kept_s = time.process_time() - started_s
    started_s = time.process_time()
    for k in range(100):
        ledger._prune_full(201.0 + k - ledger.max_window_s)  # the walk's pruning alone
    walk_s = time.process_time() - started_s
    assert kept_s * 20 < walk_s, (kept_s, walk_s)
