"""Screenshots of the dashboard (pytest-textual-snapshot) from a scripted source.

Every number on screen comes from :func:`tests.tui.fakes.scenario` (fixed data on a fixed
timeline, no clock read anywhere), so the SVGs are the same on every run. Update them with
``pytest tests/tui --snapshot-update`` and look at the diff before committing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from textual.pilot import Pilot

from fairserve.tui.app import TopApp
from fairserve.tui.history import History
from fairserve.tui.model import Snapshot
from fairserve.tui.source import SourceError
from tests.tui.fakes import FakeStateSource, scenario
from tests.tui.helpers import until

SnapCompare = Callable[..., bool]
POINTS = 40


def _app(script: Sequence[Snapshot | SourceError], seen: Sequence[Snapshot] = ()) -> TopApp:
    """The app after ``seen`` (history, not drawn), then polling ``script``."""
    history = History()
    for snapshot in seen:
        history.add(snapshot)
    return TopApp(FakeStateSource(script, hold=True), interval_s=0.01, history=history)


def _timeline(points: int = POINTS) -> tuple[list[Snapshot], list[Snapshot]]:
    """All but the last point as history, the last one as what the router says now."""
    snapshots = scenario(points)
    return snapshots[-1:], snapshots[:-1]


async def _settle(pilot: Pilot[None]) -> None:
    """Wait until the app consumed the whole script; its next poll never returns, so the
    picture cannot change before the screenshot."""
    app = pilot.app
    assert isinstance(app, TopApp) and isinstance(app.source, FakeStateSource)
    source = app.source
    await until(pilot, lambda: source.done)
    await pilot.pause()


def test_dashboard_wide(snap_compare: SnapCompare) -> None:
    assert snap_compare(_app(*_timeline()), terminal_size=(120, 40), run_before=_settle)


def test_dashboard_80x24(snap_compare: SnapCompare) -> None:
    assert snap_compare(_app(*_timeline()), terminal_size=(80, 24), run_before=_settle)


def test_sorted_by_deficit_and_paused(snap_compare: SnapCompare) -> None:
    assert snap_compare(
        _app(*_timeline()),
        press=["s", "s", "p"],
        terminal_size=(100, 30),
        run_before=_settle,
    )


def test_connection_lost_banner(snap_compare: SnapCompare) -> None:
    lost = SourceError("http://127.0.0.1:8000: cannot connect (connection refused)")
    now, seen = _timeline()
    script: list[Snapshot | SourceError] = [*now, lost]
    assert snap_compare(_app(script, seen), terminal_size=(100, 30), run_before=_settle)


def test_router_unreachable_from_the_start(snap_compare: SnapCompare) -> None:
    lost = SourceError("http://127.0.0.1:8000: cannot connect (connection refused)")
    assert snap_compare(_app([lost]), terminal_size=(80, 24), run_before=_settle)


def test_help_screen(snap_compare: SnapCompare) -> None:
    assert snap_compare(
        _app(*_timeline(2)), press=["question_mark"], terminal_size=(80, 24), run_before=_settle
    )
