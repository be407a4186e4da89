"""The dashboard's widgets. Each renders a frozen :class:`~fairserve.tui.history.Frame`
handed to it; none of them fetches anything or keeps state another widget relies on."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.widget import Widget
from textual.widgets import DataTable, Static
from textual.widgets.data_table import CellDoesNotExist

from fairserve.tui import format as fmt
from fairserve.tui.history import ClientSeries, Frame
from fairserve.tui.model import Snapshot
from fairserve.tui.views import (
    CLIENT_COLUMNS,
    WORKER_COLUMNS,
    Cell,
    SortOrder,
    client_row,
    short_url,
    sorted_clients,
    worker_rows,
)

PALETTE = ("cyan", "magenta", "yellow", "green", "bright_blue", "bright_red", "white")


def _part(text: Text, label: str, value: str, style: str = "bold") -> None:
    if text.plain:
        text.append("  ")
    if label:
        text.append(f"{label} ", style="dim")
    text.append(value, style=style)


class HeaderPanel(Static):
    """Router, policy, quanta, uptime; throughput, cache, fairness and load at a glance."""

    def show(self, frame: Frame | None, url: str) -> None:
        self.update(header_text(frame, url))


def header_text(frame: Frame | None, url: str) -> Text:
    """Two lines that fit 80 columns (cropped, never wrapped, beyond that)."""
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append("fairserve top ", style="bold")
    if frame is None:
        text.append(short_url(url), style="bold")
        text.append("  connecting…", style="dim")
        return text
    s = frame.snapshot
    text.append(short_url(s.router.url or url), style="bold")
    _part(text, "up", fmt.duration(s.router.uptime_s))
    _part(text, "", f"{s.router.policy} + {s.router.dispatch}", "bold cyan")
    _part(text, "Q^u", fmt.quantum(s.local_quantum), "bold yellow")
    _part(text, "Q^w", fmt.quantum(s.quanta.worker_quantum), "bold yellow")
    if s.router.draining:
        _part(text, "", "DRAINING", "bold red")
    second = Text()
    _part(second, "tok/s", fmt.si(s.throughput.tokens_per_s))
    _part(second, "cache hit", fmt.pct(frame.cache_hit_rate))
    _part(second, "Jain", _jain(frame))
    load = frame.load_fraction
    capacity = frame.capacity_tokens_per_s
    load_text = f"{fmt.pct(load)} of {fmt.si(capacity)}" if capacity else fmt.NA
    _part(second, "load", load_text, "bold red" if load is not None and load > 0.9 else "bold")
    _part(second, "gap", _gap(frame))
    text.append("\n")
    text.append_text(second)
    return text


def _jain(frame: Frame) -> str:
    """Weighted Jain's index and the window it covers ("wtd": service divided by weight)."""
    s = frame.snapshot
    if s.jain_index is None:
        return fmt.NA
    return f"{s.jain_index:.2f} wtd{_window(s)}"


def _gap(frame: Frame) -> str:
    """The weighted service gap in service units ("su") and the window it covers."""
    s = frame.snapshot
    if s.max_service_gap is None:
        return fmt.NA
    return f"{fmt.si(s.max_service_gap)} su{_window(s)}"


def _window(s: Snapshot) -> str:
    if s.fairness_window_s is not None:
        return f"/{fmt.duration(s.fairness_window_s)}"
    if s.jain_window_s is not None:
        return f"/{fmt.duration(s.jain_window_s[1] - s.jain_window_s[0])}"
    return ""


class Banner(Static):
    """One line shown only when something is off: the router cannot be read (the last data
    stays on screen below), or polling is paused."""

    def show_message(self, message: str | None, kind: str = "lost") -> None:
        self.set_class(message is not None, "-shown")
        self.set_class(kind == "paused", "-paused")
        self.update(Text(message or "", style="bold"))


class _Table(DataTable[Cell]):
    """A table fed a full set of rows per frame. Rows in the same order are updated cell by
    cell (cursor and scroll stay where the user left them); a new order or new headers
    refill it, with the cursor back on its row and the horizontal scroll kept."""

    COLUMNS: tuple[tuple[str, str], ...] = ()

    def on_mount(self) -> None:
        self._labels: tuple[str, ...] = ()
        self._rows: dict[str, tuple[Cell, ...]] = {}
        self.show_rows([], tuple(label for _, label in self.COLUMNS))

    def show_rows(
        self, rows: Sequence[tuple[str, tuple[Cell, ...]]], labels: tuple[str, ...] | None = None
    ) -> None:
        selected, scroll_x = self._selected_key(), self.scroll_x
        refilled = False
        if labels is not None and labels != self._labels:
            self.clear(columns=True)
            for (key, _), label in zip(self.COLUMNS, labels, strict=True):
                self.add_column(label, key=key)
            self._labels, self._rows = labels, {}
            refilled = True
        if [key for key, _ in rows] == list(self._rows):
            for key, cells in rows:
                self._update_row(key, cells, self._rows[key])
        else:
            self.clear()
            for key, cells in rows:
                self.add_row(*cells, key=key)
            if selected is not None and selected in {key for key, _ in rows}:
                self.move_cursor(row=self.get_row_index(selected), animate=False)
            refilled = True
        self._rows = dict(rows)
        if refilled and scroll_x:
            self.call_after_refresh(self.scroll_to, x=scroll_x, animate=False)

    def _update_row(self, key: str, cells: tuple[Cell, ...], old: tuple[Cell, ...]) -> None:
        for (column, _), value, before in zip(self.COLUMNS, cells, old, strict=True):
            if value != before:
                self.update_cell(key, column, value, update_width=True)

    def _selected_key(self) -> str | None:
        if not self.row_count or self.cursor_type == "none":
            return None
        try:
            return self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value
        except CellDoesNotExist:
            return None


class ClientsTable(_Table):
    COLUMNS = CLIENT_COLUMNS

    def show(self, frame: Frame, order: SortOrder) -> None:
        """Rows in ``order``; its column's header carries the ▼."""
        labels = tuple(label + (" ▼" if key == order.column else "") for key, label in self.COLUMNS)
        s = frame.snapshot
        self.show_rows([(c.name, client_row(s, c)) for c in sorted_clients(s, order)], labels)


class WorkersTable(_Table):
    COLUMNS = WORKER_COLUMNS

    def show(self, frame: Frame) -> None:
        self.show_rows(worker_rows(frame))


class RateChart(Widget):
    """One line per client: its name, a sparkline over the kept history, the last value.

    Service rates share one scale (the largest of any client) so that unfairness is a
    visible difference in height; cache hit rates are on 0..100%."""

    def __init__(self, title: str, kind: str, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.border_title = title
        self.kind = kind
        self._series: tuple[ClientSeries, ...] = ()
        self._colors: dict[str, str] = {}

    def show(self, frame: Frame, names: Sequence[str]) -> None:
        by_name = {s.name: s for s in frame.series}
        self._series = tuple(by_name[n] for n in names if n in by_name)
        self._colors = {s.name: PALETTE[i % len(PALETTE)] for i, s in enumerate(frame.series)}
        self.refresh()

    def render(self) -> Text:
        width, height = self.content_size.width, self.content_size.height
        return chart_text(self._series, self.kind, self._colors, width, height)


MAX_ROWS_PER_CLIENT = 3


def chart_text(
    series: Sequence[ClientSeries], kind: str, colors: dict[str, str], width: int, height: int
) -> Text:
    """The chart as text, ``width`` × ``height`` cells at most: bars up to three lines
    high per client when there is room, one line each otherwise, "+N more" past that."""
    if not series:
        return Text("no clients yet", style="dim")
    values = [s.service_rate if kind == "service" else s.cache_hit_rate for s in series]
    top = 1.0 if kind != "service" else max((v for vs in values for v in vs if v), default=0.0)
    label_w = min(10, max(len(s.name) for s in series))
    value_w = 6
    spark_w = max(0, width - label_w - value_w - 2)
    shown = list(zip(series, values, strict=True))
    more = 0
    if height > 0 and len(shown) > height:
        more = len(shown) - (height - 1)
        shown = shown[: height - 1]
    rows = max(1, min(MAX_ROWS_PER_CLIENT, height // max(1, len(shown))))
    lines: list[Text] = []
    for one, vals in shown:
        last = next((v for v in reversed(vals) if v is not None), None)
        value = fmt.si(last) if kind == "service" else fmt.pct(last)
        color = colors.get(one.name, "white")
        for i, bar in enumerate(fmt.bars(vals, top, spark_w, rows)):
            bottom = i == rows - 1
            line = Text((one.name[:label_w] if bottom else "").ljust(label_w) + " ")
            line.append(bar, style=color)
            line.append(" " + (value if bottom else "").rjust(value_w))
            lines.append(line)
    if more:
        lines.append(Text(f"+{more} more", style="dim"))
    return Text("\n", no_wrap=True, overflow="crop").join(lines)
