"""Plots of simulated runs, laid out like the papers' figures.

Two panels per run, one line per client: the service rate each client received over time
(VTC's and DLPM's fairness figures) and the response time of its requests by arrival time
(their latency figures). Several runs go side by side, one column each, with shared y axes
so that the eye compares policies, not axis ranges.

matplotlib is the optional ``plot`` extra: it is imported only when a plot is asked for,
and :func:`require_matplotlib` says how to install it before any simulation time is spent.
The series are computed with numpy alone, so they are tested without matplotlib.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from fairserve.core.errors import ConfigError, FairserveError
from fairserve.sim.recorder import SimResult

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

FloatArray = npt.NDArray[np.float64]

INSTALL_HINT = "pip install 'fairserve[plot]'"
RATE_POINTS = 120
"""Points per service-rate line: enough to show phases (on/off, ramps)."""


class PlotUnavailable(FairserveError):
    """matplotlib (the ``plot`` extra) is not installed."""


def require_matplotlib() -> None:
    """Fail early, with the install command, when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise PlotUnavailable(
            f"plotting needs matplotlib, which is not installed: {INSTALL_HINT}"
        ) from None


def check_plot_path(path: Path) -> None:
    """Refuse a path the plot cannot be written to before the simulation runs."""
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    formats = FigureCanvasAgg(Figure()).get_supported_filetypes()
    suffix = path.suffix.lstrip(".").lower()
    if suffix not in formats:
        raise ConfigError(
            f"plot file {path}: expected a name ending in one of: "
            + ", ".join(f".{f}" for f in sorted(formats))
        )
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise ConfigError(f"plot file {path}: directory {parent} does not exist")


@dataclass(frozen=True)
class Series:
    """One line: x (seconds) and y values."""

    t_s: FloatArray
    values: FloatArray


def service_rate_series(
    result: SimResult, points: int = RATE_POINTS, window_s: float | None = None
) -> dict[str, Series]:
    """Service per second each client received, over a sliding window centred on each point.

    Read from the cumulative service samples: a window's rate is the service credited
    between the samples at its two ends divided by the time between them. Prefill arrives
    in bursts (a whole prompt in one step), so a window of a twentieth of the run (default)
    shows trends rather than single steps.
    """
    end_s = max(result.end_s, 1e-9)
    half_s = (window_s if window_s is not None else end_s / 20) / 2
    centres = np.linspace(0.0, end_s, points + 1)[1:]
    lows, highs = np.maximum(centres - half_s, 0.0), np.minimum(centres + half_s, end_s)
    times = np.array([s.t_s for s in result.samples], dtype=np.float64)
    lo = np.clip(np.searchsorted(times, lows, side="right") - 1, 0, len(times) - 1)
    hi = np.clip(np.searchsorted(times, highs, side="right") - 1, 0, len(times) - 1)
    spans = times[hi] - times[lo]
    out: dict[str, Series] = {}
    for client in result.clients:
        cumulative = np.array([s.cumulative.get(client, 0.0) for s in result.samples])
        gained = cumulative[hi] - cumulative[lo]
        rates = np.full(points, np.nan)
        np.divide(gained, spans, out=rates, where=spans > 0)
        out[client] = Series(centres, rates)
    return out


def latency_points(result: SimResult) -> dict[str, Series]:
    """Response time of each client's finished requests, by arrival time (arrival order)."""
    out: dict[str, Series] = {}
    for client in result.clients:
        records = sorted(
            (r for r in result.records if r.client == client), key=lambda r: r.arrival_s
        )
        arrivals = np.array([r.arrival_s for r in records], dtype=np.float64)
        latencies = np.array([r.latency_s for r in records], dtype=np.float64)
        out[client] = Series(arrivals, latencies)
    return out


def latency_trend(
    result: SimResult, points: int = RATE_POINTS, window_s: float | None = None
) -> dict[str, Series]:
    """Mean response time of the requests that arrived in a sliding window centred on each
    point (NaN where none did): the line drawn through :func:`latency_points`."""
    end_s = max(result.end_s, 1e-9)
    half_s = (window_s if window_s is not None else end_s / 20) / 2
    centres = np.linspace(0.0, end_s, points + 1)[1:]
    out: dict[str, Series] = {}
    for client, raw in latency_points(result).items():
        prefix = np.concatenate(([0.0], np.cumsum(raw.values)))
        lo = np.searchsorted(raw.t_s, centres - half_s, side="left")
        hi = np.searchsorted(raw.t_s, centres + half_s, side="right")
        counts = (hi - lo).astype(np.float64)
        means = np.full(points, np.nan)
        np.divide(prefix[hi] - prefix[lo], counts, out=means, where=counts > 0)
        out[client] = Series(centres, means)
    return out


def plot_runs(
    runs: Sequence[tuple[str, SimResult]],
    path: Path,
    title: str | None = None,
    arrivals_end_s: float | None = None,
) -> Path:
    """Write a PNG (or any format matplotlib's Agg canvas writes) of ``runs``; returns path.

    The Agg canvas is used directly (no pyplot): no GUI backend, no global figure state.
    One legend for the whole figure names every client of every run (colours are shared
    across columns). A run that ended with requests still open says so in its title, and
    ``arrivals_end_s`` (a bench's ``--duration``) is drawn as a dashed line: what follows it
    is the drain, not the offered load.
    """
    figure = build_figure(runs, title, arrivals_end_s)
    figure.savefig(path)
    return path


def build_figure(
    runs: Sequence[tuple[str, SimResult]],
    title: str | None = None,
    arrivals_end_s: float | None = None,
) -> Figure:
    """The figure :func:`plot_runs` writes (tests read its legend and titles)."""
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    if not runs:
        raise ConfigError("nothing to plot: no runs")
    columns = len(runs)
    figure = Figure(figsize=(max(8.0, 5.0 * columns), 7.0), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(2, columns, sharex="col", sharey="row", squeeze=False)
    clients = list(dict.fromkeys(c for _, result in runs for c in result.clients))
    colors = {c: f"C{i % 10}" for i, c in enumerate(clients)}
    for column, (label, result) in enumerate(runs):
        rate_ax, latency_ax = axes[0][column], axes[1][column]
        _lines(rate_ax, service_rate_series(result), colors)
        _lines(latency_ax, latency_trend(result), colors)
        for client, series in latency_points(result).items():
            latency_ax.scatter(series.t_s, series.values, s=4, color=colors[client], alpha=0.35)
        open_requests = sum(result.unfinished.values())
        rate_ax.set_title(
            f"{label}\n{open_requests} still open at the end" if open_requests else label
        )
        latency_ax.set_xlabel("time (s)")
        if arrivals_end_s is not None:
            for ax in (rate_ax, latency_ax):
                ax.axvline(arrivals_end_s, color="0.4", linestyle="--", linewidth=0.8)
            rate_ax.annotate(
                "arrivals stop",
                (arrivals_end_s, 1.0),
                xycoords=("data", "axes fraction"),
                fontsize="x-small",
                ha="right",
                va="top",
                rotation=90,
                color="0.4",
            )
    for ax in axes.flat:  # after drawing: a bottom-only limit freezes the top too
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("service rate (service/s)")
    axes[1][0].set_ylabel("response time (s) by arrival, finished requests")
    if len(clients) <= 12:
        handles = [Line2D([], [], color=colors[c], label=c) for c in clients]
        figure.legend(handles=handles, loc="outside right upper", fontsize="small")
    if title:
        figure.suptitle(title)
    return figure


def _lines(ax: Axes, lines: dict[str, Series], colors: dict[str, str]) -> None:
    for client, series in lines.items():
        ax.plot(series.t_s, series.values, label=client, color=colors[client], linewidth=1.2)
