"""The ledger's window kept up to date across reads (``core.ledger_window``) answers exactly
what the full computation over every client answers, on random histories read at random
moments (clients joining, streaming, idling, forgotten, reweighted; several window lengths;
a read back in time)."""

from __future__ import annotations

import gc
import random

import pytest

from fairserve.core.ledger import ServiceLedger
from fairserve.core.ledger_view import WindowView
from fairserve.core.ledger_window import ClientHistory, Pairs


def _figures(view: WindowView) -> tuple[object, ...]:
    gap = view.service_gap
    return (
        view.start_s,
        view.end_s,
        view.jain_index,
        dict(view.rates),
        (gap.value, gap.clients, gap.t1_s, gap.t2_s),
        view.gap_clients,
    )


def _step(ledger: ServiceLedger, rng: random.Random, now_s: float, names: list[str]) -> None:
    """One random event at ``now_s``."""
    name = rng.choice(names)
    if name not in ledger.clients:
        ledger.add_client(name, rng.choice([1.0, 2.0, 0.5]), now_s)
        return
    history = ledger.clients[name]
    kind = rng.random()
    if kind < 0.25:
        ledger.busy(name, now_s)
    elif kind < 0.45 and history.busy:
        ledger.idle(name, now_s)
    elif kind < 0.85:
        ledger.credit(name, rng.choice([1.0, 5.0, 30.0, -2.0]), now_s)
    elif kind < 0.9:
        ledger.set_weight(name, rng.choice([1.0, 3.0]))
    elif kind < 0.93 and not history.busy:
        ledger.forget(name)


@pytest.mark.parametrize("seed", range(12))
def test_incremental_window_equals_the_full_computation(seed: int) -> None:
    rng = random.Random(seed)
    ledger = ServiceLedger(max_window_s=rng.choice([30.0, 600.0]))
    names = [f"c{i}" for i in range(rng.choice([3, 12, 80]))]
    now_s, next_sample_s, reads = 0.0, 0.0, 0
    while now_s < 120.0:
        now_s += rng.choice([0.0, 0.01, 0.1, 0.3, 1.0, 2.5])
        while next_sample_s <= now_s:
            ledger.sample(next_sample_s)
            next_sample_s += 1.0
        for _ in range(rng.randrange(1, 6)):
            _step(ledger, rng, now_s, names)
        if rng.random() < 0.3:
            window_s = rng.choice([1.0, 4.0, 10.0, 30.0])
            at_s = now_s if rng.random() < 0.9 else rng.uniform(0.0, now_s)  # back in time
            full = ledger.window_full(window_s, at_s)
            assert _figures(ledger.window(window_s, at_s)) == _figures(full), (seed, at_s)
            reads += 1
    assert reads > 20


def test_a_read_recomputes_only_what_changed() -> None:
    """10,000 clients served for 6 s each a while ago, a few streaming now: a read after the
    first recomputes the streaming ones (and those the window's start passed), not all."""
    ledger = ServiceLedger()
    for i in range(10_000):
        name, t_s = f"c{i}", i * 0.003
        ledger.add_client(name, 1.0, t_s)
        ledger.busy(name, t_s)
        ledger.credit(name, 10.0, t_s + 1.0)
        ledger.idle(name, t_s + 6.0)
    ledger.sample(40.0)
    first = ledger.window(60.0, 41.0)
    cache = ledger._caches[60.0]
    for name in ("c1", "c2", "c3"):
        ledger.busy(name, 41.5)
        ledger.credit(name, 5.0, 41.6)
    second = ledger.window(60.0, 42.0)
    assert {"c1", "c2", "c3"} <= set(cache.moving) and not cache.dirty and not cache.flux
    assert len(cache.entries) >= 9_990  # the others' figures were kept, not recomputed
    assert _figures(second) == _figures(ledger.window_full(60.0, 42.0))
    assert len(first.rates) == len(second.rates) == 10_000


def test_names_passing_through_unread_keep_the_ledger_bounded() -> None:
    """A host forgetting idle clients while nobody reads: the clients touched since the last
    read are not kept for ever (the kept figures are dropped and computed afresh)."""
    ledger = ServiceLedger()
    ledger.add_client("first", 1.0, 0.0)
    ledger.window(60.0, 1.0)
    for i in range(20_000):
        name = f"n{i}"
        ledger.add_client(name, 1.0, 1.0 + i * 1e-4)
        ledger.forget(name)
    assert len(ledger._touched) <= 2 * len(ledger.clients) + 1024
    view = ledger.window(60.0, 3.0)
    assert _figures(view) == _figures(ledger.window_full(60.0, 3.0))


def test_a_history_is_one_tracked_object_and_its_pairs_read_like_a_deque() -> None:
    """Points and runs are packed in bytearrays (not containers for the collector, issue
    18), read and changed through :class:`Pairs` as the deques of tuples were."""
    history = ClientHistory(1.0)
    points = history.points
    for k in range(3):
        points.append((float(k), 10.0 * k))
    points[-1] = (2.5, 25.0)
    assert list(history.points) == [(0.0, 0.0), (1.0, 10.0), (2.5, 25.0)]
    assert (len(points), points[0], points[-2], bool(history.runs)) == (
        3,
        (0.0, 0.0),
        (1.0, 10.0),
        False,
    )
    points.popleft()
    assert list(points) == [(1.0, 10.0), (2.5, 25.0)]
    with pytest.raises(IndexError):
        points[2]
    with pytest.raises(IndexError):
        points[-3] = (0.0, 0.0)
    assert not any(gc.is_tracked(o) for o in gc.get_referents(history) if not isinstance(o, type))
    assert isinstance(points, Pairs)
