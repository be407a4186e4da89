"""Plot series from hand-built results (exact numbers), and the PNG and its failure modes."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

from fairserve.core.errors import ConfigError
from fairserve.core.metrics import ServiceSample
from fairserve.sim.engine import EngineStats
from fairserve.sim.plot import (
    INSTALL_HINT,
    PlotUnavailable,
    check_plot_path,
    latency_points,
    latency_trend,
    plot_runs,
    require_matplotlib,
    service_rate_series,
)
from fairserve.sim.recorder import ClientCounters, RequestRecord, SimResult

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def make_result(
    rates: dict[str, float],
    end_s: float = 10.0,
    interval_s: float = 0.5,
    records: list[RequestRecord] | None = None,
    switch_s: float | None = None,
) -> SimResult:
    """Clients served at constant ``rates`` (service/s); after ``switch_s`` rates swap order
    (the first client gets the last's rate and so on), to test that windows see changes."""
    clients = list(rates)
    swapped = dict(zip(clients, reversed([rates[c] for c in clients]), strict=True))
    samples = []
    for i in range(int(end_s / interval_s) + 1):
        t_s = i * interval_s
        cumulative = {}
        for c in clients:
            if switch_s is None or t_s <= switch_s:
                cumulative[c] = rates[c] * t_s
            else:
                cumulative[c] = rates[c] * switch_s + swapped[c] * (t_s - switch_s)
        samples.append(ServiceSample(t_s, cumulative, frozenset()))
    return SimResult(
        end_s=end_s,
        clients=clients,
        weights={c: 1.0 for c in clients},
        counters={c: ClientCounters() for c in clients},
        service=dict(samples[-1].cumulative),
        samples=samples,
        records=records or [],
        worker_ids=["w0"],
        worker_stats=[EngineStats()],
        worker_finished=[len(records or [])],
    )


def record(client: str, arrival_s: float, latency_s: float) -> RequestRecord:
    return RequestRecord(client, 0, arrival_s, arrival_s, arrival_s + latency_s, 10, 0, 5)


def test_constant_service_gives_constant_rates() -> None:
    series = service_rate_series(make_result({"a": 10.0, "b": 30.0}), points=40)
    assert np.allclose(series["a"].values, 10.0)
    assert np.allclose(series["b"].values, 30.0)
    assert series["a"].t_s[-1] == pytest.approx(10.0)
    assert len(series["a"].t_s) == 40


def test_rates_follow_a_change_outside_the_window() -> None:
    result = make_result({"a": 10.0, "b": 30.0}, end_s=20.0, switch_s=10.0)
    series = service_rate_series(result, points=20, window_s=2.0)
    t_s, a = series["a"].t_s, series["a"].values
    assert np.allclose(a[t_s <= 9.0], 10.0)
    assert np.allclose(a[t_s >= 11.0], 30.0)
    # Whatever the split, the two rates add up to the total served.
    total = series["a"].values + series["b"].values
    assert np.allclose(total, 40.0)


def test_latency_points_are_in_arrival_order_per_client() -> None:
    records = [record("a", 5.0, 2.0), record("b", 1.0, 9.0), record("a", 1.0, 4.0)]
    points = latency_points(make_result({"a": 1.0, "b": 1.0}, records=records))
    assert points["a"].t_s.tolist() == [1.0, 5.0]
    assert points["a"].values.tolist() == pytest.approx([4.0, 2.0])
    assert points["b"].values.tolist() == pytest.approx([9.0])


def test_latency_trend_averages_arrivals_in_the_window_and_leaves_gaps() -> None:
    records = [record("a", 1.0, 2.0), record("a", 1.4, 4.0), record("a", 8.0, 1.0)]
    result = make_result({"a": 1.0, "b": 1.0}, records=records)
    trend = latency_trend(result, points=10, window_s=1.0)  # points at 1, 2, ..., 10 s
    by_t = dict(zip(trend["a"].t_s.tolist(), trend["a"].values.tolist(), strict=True))
    assert by_t[1.0] == pytest.approx(3.0)  # arrivals 1.0 and 1.4 in [0.5, 1.5]
    assert by_t[8.0] == pytest.approx(1.0)
    assert math.isnan(by_t[5.0])
    assert np.isnan(trend["b"].values).all()  # b finished nothing


def test_plot_runs_writes_a_png_one_column_per_run(tmp_path: Path) -> None:
    records = [record("a", 1.0, 2.0), record("b", 3.0, 1.0)]
    result = make_result({"a": 10.0, "b": 30.0}, records=records)
    one = plot_runs([("x", result)], tmp_path / "one.png")
    three = plot_runs([("x", result), ("y", result), ("z", result)], tmp_path / "three.png")
    assert one.read_bytes().startswith(PNG_MAGIC)
    assert png_width(three) > png_width(one)


def test_plot_of_no_runs_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no runs"):
        plot_runs([], tmp_path / "empty.png")


def test_plot_path_must_have_a_known_format_and_an_existing_directory(tmp_path: Path) -> None:
    check_plot_path(tmp_path / "ok.png")
    check_plot_path(tmp_path / "ok.svg")
    with pytest.raises(ConfigError, match=r"\.png"):
        check_plot_path(tmp_path / "plot.nope")
    with pytest.raises(ConfigError, match="does not exist"):
        check_plot_path(tmp_path / "missing" / "plot.png")


def test_missing_matplotlib_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    # None in sys.modules makes `import matplotlib` raise ImportError, as when not installed.
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(PlotUnavailable, match=r"fairserve\[plot\]") as caught:
        require_matplotlib()
    assert INSTALL_HINT in str(caught.value)
    assert not isinstance(caught.value, ConfigError)  # exit code 1, not a usage error


def png_width(path: Path) -> int:
    """Width in pixels from the PNG header (IHDR follows the 8-byte signature)."""
    return int.from_bytes(path.read_bytes()[16:20], "big")


def test_one_legend_names_every_client_and_runs_cut_short_say_so() -> None:
    from dataclasses import replace

    from fairserve.sim.plot import build_figure

    first = make_result({"a": 10.0, "b": 30.0})
    second = replace(make_result({"c": 5.0}), unfinished={"c": 4})
    figure = build_figure([("x", first), ("y", second)], arrivals_end_s=8.0)
    (legend,) = figure.legends
    assert [t.get_text() for t in legend.get_texts()] == ["a", "b", "c"]
    titles = [ax.get_title() for ax in figure.axes[:2]]
    assert titles == ["x", "y\n4 still open at the end"]
    dashed = [line for ax in figure.axes for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert len(dashed) == 4, "the end of arrivals is marked in every panel"
