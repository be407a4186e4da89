"""What the dashboard says, computed without a terminal: rates over history, each table
row, the sort orders and the number formats."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from fairserve.tui import format as fmt
from fairserve.tui.history import History
from fairserve.tui.model import ClientView, GpuView, Snapshot, WorkerProbe
from fairserve.tui.parse import parse_state
from fairserve.tui.views import (
    SORT_ORDERS,
    ClientLoadView,
    client_load,
    client_row,
    sorted_clients,
    worker_rows,
)
from tests.tui.fakes import WORKERS, scenario, state_json


def _at(
    t_s: float, workers: list[tuple[int, int, int]], clients: dict[str, tuple[int, int]]
) -> Snapshot:
    """A snapshot at uptime ``t_s``: workers (prompt, cached, output), clients (prompt, cached)."""
    return parse_state(
        {
            "router": {"uptime_s": t_s},
            "workers": [
                {"url": f"http://w{i}", "healthy": True, "prompt_tokens": p,
                 "cached_tokens": c, "output_tokens": o, "capacity_tokens_per_s": 1000.0}
                for i, (p, c, o) in enumerate(workers)
            ],
            "clients": {
                n: {"prompt_tokens": p, "cached_tokens": c, "service_rate": p / 10}
                for n, (p, c) in clients.items()
            },
        }
    )  # fmt: skip


def test_rates_are_differences_over_router_uptime() -> None:
    history = History(rate_points=2)
    first = history.add(_at(10.0, [(0, 0, 0), (100, 0, 0)], {}))
    assert first.worker_tokens_per_s == (None, None) and first.load_tokens_per_s is None
    assert first.cache_hit_rate == 0.0  # cumulative while there is one point
    history.add(_at(11.0, [(100, 50, 20), (100, 0, 0)], {}))
    frame = history.add(_at(12.0, [(400, 250, 60), (300, 0, 100)], {}))
    # Over the last two polls (10 s -> 12 s): worker 0 did 400 + 60 tokens, worker 1 300.
    assert frame.worker_tokens_per_s == (230.0, 150.0)
    # Computed (not cached) tokens: (400-250+60) + (300-0+100 - 100) over 2 s.
    assert frame.load_tokens_per_s == pytest.approx((210 + 300) / 2)
    assert frame.cache_hit_rate == pytest.approx(250 / 600)
    assert frame.capacity_tokens_per_s == 2000.0
    assert frame.load_fraction == pytest.approx(255 / 2000)


def test_restart_resets_and_repeats_collapse() -> None:
    history = History()
    history.add(_at(50.0, [(1000, 0, 0)], {}))
    history.add(_at(51.0, [(2000, 0, 0)], {}))
    assert history.add(_at(51.0, [(2000, 0, 0)], {})).polls == 3
    assert len(history.snapshots) == 2  # the same instant seen twice is kept once
    frame = history.add(_at(1.0, [(10, 0, 0)], {}))  # uptime went back: a new router
    assert len(history.snapshots) == 1 and frame.worker_tokens_per_s == (None,)


def test_client_series_align_and_show_gaps() -> None:
    history = History(rate_points=1)
    history.add(_at(1.0, [], {"a": (100, 50)}))
    history.add(_at(2.0, [], {"a": (100, 50), "b": (10, 0)}))
    frame = history.add(_at(3.0, [], {"a": (300, 200), "b": (20, 10)}))
    a, b = frame.series
    assert (a.name, b.name) == ("a", "b")
    assert a.service_rate == (10.0, 10.0, 30.0)
    assert b.service_rate == (None, 1.0, 2.0)
    # a: cumulative at first, nothing new at t=2 (unknown, not 0%), 150/200 at t=3.
    assert a.cache_hit_rate == (0.5, None, 0.75)
    assert b.cache_hit_rate == (None, 0.0, 1.0)


def _live() -> Snapshot:
    return scenario()[-1]


def test_client_load_uses_worker_queues_when_known() -> None:
    snapshot = _live()
    alice = snapshot.clients[0]
    # Router queue 1 + one waiting on each of the two probed workers; 2 + 3 running.
    assert client_load(snapshot, alice) == ClientLoadView(queued=3, running=5)
    bare = parse_state(state_json(1.0))
    assert client_load(bare, bare.clients[0]).queued == 1
    assert client_load(bare, bare.clients[0]).running == bare.clients[0].in_flight


def test_client_row_share_deficits_and_rejections() -> None:
    snapshot = _live()
    by_name = {c.name: c for c in snapshot.clients}
    total = sum(c.service_rate for c in snapshot.clients)
    row = client_row(snapshot, by_name["alice"])
    assert row[0] == "alice"
    assert row[4] == fmt.pct(by_name["alice"].service_rate / total)
    assert str(row[5]) == "-300/1.80k"
    assert "red" in str(row[5].style)  # type: ignore[union-attr]
    assert str(row[6]) == "▇▾▄"  # workers table order; the overdrawn worker in the middle
    assert str(client_row(snapshot, by_name["dave-batch"])[9]) == "7"
    lone = Snapshot(router=snapshot.router, clients=(ClientView("x"),))
    assert client_row(lone, lone.clients[0])[4] == "n/a"  # no service at all: no share


@pytest.mark.parametrize(
    ("label", "first"),
    [("service rate", "carol"), ("name", "alice"), ("deficit", "alice"),
     ("p99 latency", "dave-batch"), ("rejected", "dave-batch")],
)  # fmt: skip
def test_sort_orders(label: str, first: str) -> None:
    order = next(o for o in SORT_ORDERS if o.label == label)
    names = [c.name for c in sorted_clients(_live(), order)]
    assert names[0] == first and sorted(names) == ["alice", "bob", "carol", "dave-batch"]


def test_worker_rows_match_gpus_and_list_unclaimed_ones() -> None:
    frame = History().add(_live())
    rows = dict(worker_rows(frame))
    assert list(rows) == [*WORKERS, "gpu:7"]
    first = rows[WORKERS[0]]
    assert first[0] == "10.0.0.1:30000" and str(first[1]) == "● up"
    assert first[2:5] == ("8/3", "60%", "25%")
    assert first[6:] == ("87%", "60/80G", "512W")
    assert rows[WORKERS[1]][6:] == ("n/a", "30/80G", "n/a")  # NVML could not read those
    assert str(rows[WORKERS[2]][1]) == "✖ down" and rows[WORKERS[2]][6:] == ("n/a",) * 3
    assert rows["gpu:7"][0] == "gpu7 H100"


def test_gpu_matched_by_index_when_no_uuid() -> None:
    snapshot = _live()
    by_index = WorkerProbe(gpu_index=7)
    worker = replace(snapshot.workers[2], probe=by_index)
    frame = History().add(replace(snapshot, workers=(worker,), gpus=(GpuView(7, "G", "u", 5.0),)))
    assert [key for key, _ in worker_rows(frame)] == [worker.url]
    assert worker_rows(frame)[0][1][6] == "5%"


def test_formats() -> None:
    assert [fmt.si(v) for v in (0.0, 12.34, 999.0, 1234.0, 2.5e6, None, math.inf)] == [
        "0", "12.3", "999", "1.23k", "2.50M", "n/a", "∞",
    ]  # fmt: skip
    assert fmt.si(-300.0) == "-300"
    assert [fmt.seconds(v) for v in (0.0421, 3.21, 125.0, None)] == ["42ms", "3.2s", "2m05s", "n/a"]
    assert fmt.duration(3 * 86400 + 4 * 3600) == "3d04h" and fmt.duration(7260) == "2h01m"
    assert fmt.pct(None) == "n/a" and fmt.pct(0.375) == "38%"
    assert fmt.quantum(None) == "-" and fmt.quantum(math.inf) == "∞" and fmt.quantum(512.0) == "512"
    assert fmt.mib(None, 1.0) == "n/a" and fmt.watts(None) == "n/a"
    assert str(fmt.deficit_strip([2048.0, 0.0, -1.0, 5000.0], 2048.0)) == "█▁▾█"
    assert fmt.sparkline([0.0, None, 5.0, 10.0], top=10.0, width=6) == "  ▁ ▄█"
    # Two lines: 16 steps; 10/16 of the top fills the lower line and 2/8 of the upper one.
    assert fmt.bars([10.0, 16.0, 4.0, None], top=16.0, width=4, rows=2) == ["▂█  ", "██▄ "]
    assert fmt.sparkline([1.0, 2.0], top=0.0, width=2) == "  "
