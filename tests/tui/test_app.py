"""The app driven by Textual's pilot with a scripted source: keys, pausing, sorting, the
banner, quantum writes, non-overlapping polls, and the 80×24 layout."""

from __future__ import annotations

import asyncio
import math
from dataclasses import replace
from typing import Any

from textual.widget import Widget
from textual.widgets import DataTable, Footer

from fairserve.tui import format as fmt
from fairserve.tui.app import TopApp
from fairserve.tui.help import HelpScreen
from fairserve.tui.model import Quanta, Snapshot
from fairserve.tui.source import SourceError
from fairserve.tui.widgets import Banner, ClientsTable, HeaderPanel, RateChart, WorkersTable
from tests.tui.fakes import FakeStateSource, scenario
from tests.tui.helpers import until
from tests.worker.helpers import run


def _client_names(app: TopApp) -> list[str]:
    table = app.query_one(ClientsTable)
    return [str(table.get_row_at(i)[0]) for i in range(table.row_count)]


def test_first_poll_fills_every_widget() -> None:
    async def body() -> None:
        app = TopApp(FakeStateSource(scenario(points=3)), interval_s=0.01)
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: app.history.polls >= 3)
            assert app.query_one(ClientsTable).row_count == 4
            assert app.query_one(WorkersTable).row_count == 4  # 3 workers + an unclaimed GPU
            assert not app.query_one(Banner).has_class("-shown")
            header = str(app.query_one(HeaderPanel).render())
            assert "dlpm + doubleq" in header and "Q^u 512" in header and "Q^w 2048" in header
            assert "Jain 0.94" in header

    run(body())


def test_sort_key_cycles_orders() -> None:
    async def body() -> None:
        source = FakeStateSource(scenario(points=3), hold=True)
        app = TopApp(source, interval_s=0.01)
        async with app.run_test() as pilot:
            await until(pilot, lambda: source.done and app.frame is not None)
            assert app.frame is not None
            fastest = max(app.frame.snapshot.clients, key=lambda c: c.service_rate)
            assert _client_names(app)[0] == fastest.name
            await pilot.press("s")
            assert _client_names(app) == ["alice", "bob", "carol", "dave-batch"]
            await pilot.press("s")
            assert _client_names(app)[0] == "alice"  # the overdrawn deficit first
            table = app.query_one(ClientsTable)
            assert str(table.ordered_columns[table.get_column_index("deficit")].label).endswith("▼")

    run(body())


def test_pause_stops_polling_and_resume_restarts_it() -> None:
    async def body() -> None:
        source = FakeStateSource(scenario(points=2))
        app = TopApp(source, interval_s=0.01)
        async with app.run_test() as pilot:
            await until(pilot, lambda: source.fetches >= 2)
            await pilot.press("p")
            assert app.query_one(Banner).has_class("-paused")
            paused_at = source.fetches
            await pilot.pause(0.15)
            assert source.fetches <= paused_at + 1  # at most the poll already under way
            await pilot.press("p")
            await until(pilot, lambda: source.fetches >= paused_at + 3)
            assert not app.query_one(Banner).has_class("-shown")

    run(body())


def test_lost_connection_shows_banner_keeps_data_and_recovers() -> None:
    async def body() -> None:
        good = scenario(points=2)
        lost = SourceError("http://127.0.0.1:8000: cannot connect (connection refused)")
        source = FakeStateSource([*good, lost, lost, lost, replace(good[-1], router=replace(
            good[-1].router, uptime_s=good[-1].router.uptime_s + 5))])  # fmt: skip
        app = TopApp(source, interval_s=0.01)
        async with app.run_test() as pilot:
            await until(pilot, lambda: app.failures >= 2)
            banner = app.query_one(Banner)
            assert banner.has_class("-shown") and banner.display
            assert "connection lost: http://127.0.0.1:8000" in str(banner.render())
            assert f"retry {app.failures}," in str(banner.render())
            assert app.query_one(ClientsTable).row_count == 4  # the last data stays
            await until(pilot, lambda: source.fetches >= 6, timeout_s=5.0)
            await until(pilot, lambda: app.failures == 0)
            assert not banner.has_class("-shown")

    run(body())


def test_polls_never_overlap_with_a_slow_source() -> None:
    class Slow(FakeStateSource):
        active = peak = 0

        async def fetch(self) -> Snapshot:
            self.active += 1
            self.peak = max(self.peak, self.active)
            try:
                await asyncio.sleep(0.03)  # slower than the interval below
                return await super().fetch()
            finally:
                self.active -= 1

    async def body() -> None:
        source = Slow(scenario(points=5))
        app = TopApp(source, interval_s=0.001)
        async with app.run_test() as pilot:
            await until(pilot, lambda: source.fetches >= 5)
            await pilot.press("plus")  # a write wakes the loop: still one poll at a time
            await until(pilot, lambda: source.fetches >= 8)
        assert source.peak == 1

    run(body())


def test_quantum_keys_write_doubled_and_halved_values() -> None:
    async def body() -> None:
        source = FakeStateSource(scenario(points=2))
        app = TopApp(source, interval_s=0.01)
        async with app.run_test() as pilot:
            await until(pilot, lambda: app.frame is not None)
            await pilot.press("plus")
            await until(pilot, lambda: len(source.writes) == 1)
            await until(
                pilot, lambda: app.frame is not None and app.frame.snapshot.local_quantum == 1024
            )
            await pilot.press("minus", "minus")
            await until(pilot, lambda: source.quanta is not None and source.quanta.quantum == 256)
            await pilot.press("W")
            await until(
                pilot, lambda: source.quanta is not None and source.quanta.worker_quantum == 4096
            )
            await pilot.press("w", "w", "w")
            await until(
                pilot, lambda: source.quanta is not None and source.quanta.worker_quantum == 512
            )
        assert source.writes[0] == (1024.0, None)
        assert all(q is None or qw is None for q, qw in source.writes)  # one quantum per key
        assert source.closed

    run(body())


class RecordingApp(TopApp):
    """Keeps the notifications it shows (the toasts vanish after a few seconds)."""

    def __init__(self, source: FakeStateSource, interval_s: float) -> None:
        super().__init__(source, interval_s)
        self.messages: list[str] = []

    def notify(self, message: str, **kwargs: Any) -> None:
        self.messages.append(message)
        super().notify(message, **kwargs)


def test_refused_and_impossible_quantum_changes_do_not_crash() -> None:
    async def body() -> None:
        base = scenario(points=1)[0]
        infinite = replace(base, quanta=Quanta(None, math.inf))
        source = FakeStateSource([infinite], token=None)
        app = RecordingApp(source, interval_s=0.01)
        async with app.run_test() as pilot:
            await until(pilot, lambda: app.frame is not None)
            await pilot.press("W")  # Q^w = inf: nothing to double
            await pilot.press("plus")  # no token: the router refuses
            await pilot.pause(0.05)
            assert any("Q^w is ∞" in m for m in app.messages)
            assert any("quantum not changed: HTTP 401" in m for m in app.messages)
            assert app.is_running and source.writes == []

    run(body())


def _on_help(app: TopApp) -> bool:
    return isinstance(app.screen, HelpScreen)


def test_help_opens_and_closes() -> None:
    async def body() -> None:
        app = TopApp(FakeStateSource(scenario(points=1)), interval_s=0.01)
        async with app.run_test() as pilot:
            await pilot.press("question_mark")
            assert _on_help(app)
            await pilot.press("escape")
            assert not _on_help(app)
            await pilot.press("q")
        assert app.return_code == 0

    run(body())


def test_polling_goes_on_behind_the_help_screen() -> None:
    async def body() -> None:
        source = FakeStateSource(scenario(points=300))
        app = TopApp(source, interval_s=0.1)
        async with app.run_test() as pilot:
            await until(pilot, lambda: app.frame is not None)
            await pilot.press("question_mark")
            polls = app.history.polls
            await until(pilot, lambda: app.history.polls >= polls + 3)
            await pilot.press("escape")
            assert app.frame is not None
            shown_s = app.frame.snapshot.router.uptime_s
            await until(
                pilot,
                lambda: app.frame is not None and app.frame.snapshot.router.uptime_s > shown_s,
            )
            header = str(app.query_one(HeaderPanel).render())
            assert fmt.duration(app.frame.snapshot.router.uptime_s) in header

    run(body())


def _visible(app: TopApp, widget: Widget) -> bool:
    region = widget.region
    return bool(widget.display) and region.height > 0 and app.screen.region.contains_region(region)


def test_80x24_shows_the_essentials() -> None:
    async def body() -> None:
        source = FakeStateSource(scenario(points=3), hold=True)
        app = TopApp(source, interval_s=0.01)
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: source.done)
            await pilot.pause()
            for kind in (HeaderPanel, ClientsTable, WorkersTable, Footer):
                assert _visible(app, app.query_one(kind)), kind.__name__
            charts = list(app.query(RateChart))
            assert len(charts) == 2 and all(_visible(app, c) for c in charts)
            assert all(c.content_size.height >= 4 for c in charts)  # every client's line
            clients, workers = app.query_one(ClientsTable), app.query_one(WorkersTable)
            assert clients.region.height >= clients.row_count + 1  # no client scrolled away
            assert workers.region.height >= workers.row_count + 1
            # name, weight, queue/run, service rate, share and deficit fit the width.
            assert _columns_width(clients, "deficit") <= clients.region.width
            assert _columns_width(workers, "kv") <= workers.region.width

    run(body())


def _columns_width(table: DataTable[Any], last: str) -> int:
    upto = table.ordered_columns[: table.get_column_index(last) + 1]
    return sum(c.get_render_width(table) for c in upto)


def test_cursor_and_scroll_survive_polls() -> None:
    async def body() -> None:
        source = FakeStateSource(scenario(points=300))
        app = TopApp(source, interval_s=0.2)  # key presses wait for an idle app
        async with app.run_test(size=(60, 24)) as pilot:
            await until(pilot, lambda: app.history.polls >= 3)
            await pilot.press("s", "down", "right", "right", "right")
            table = app.query_one(ClientsTable)
            await until(pilot, lambda: table.scroll_x > 0)
            scrolled_at, polls = table.scroll_x, app.history.polls
            await until(pilot, lambda: app.history.polls >= polls + 3)
            assert source.fetches < 300  # the data was still changing meanwhile
            assert table.cursor_row == 1 and _client_names(app)[1] == "bob"
            assert table.scroll_x == scrolled_at

    run(body())
