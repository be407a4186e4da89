"""The ``fairserve top`` application: layout, keys, the poll loop and quantum writes.

One poll loop runs as a Textual worker and awaits each fetch before sleeping, so polls
never overlap however slow the router is. A failed poll keeps the last picture on screen,
shows a banner and retries with a growing (capped) delay; nothing a router or a worker
sends can end the app. Quantum keys write through the same source and wake the loop so the
new value shows at once.
"""

from __future__ import annotations

import asyncio
import math
from contextlib import suppress
from typing import ClassVar

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal
from textual.widgets import Footer

from fairserve.tui import format as fmt
from fairserve.tui.help import HelpScreen
from fairserve.tui.history import Frame, History
from fairserve.tui.source import SourceError, StateSource
from fairserve.tui.views import SORT_ORDERS, sorted_clients
from fairserve.tui.widgets import Banner, ClientsTable, HeaderPanel, RateChart, WorkersTable

MAX_RETRY_S = 5.0
MIN_QUANTUM = 1.0

CSS = """
Screen { layout: vertical; }
#header { height: auto; max-height: 4; padding: 0 1; background: $boost; }
#banner { display: none; height: auto; padding: 0 1; background: $error; color: $text; }
#banner.-shown { display: block; }
#banner.-paused { background: $warning; color: $text; }
#clients, #workers { scrollbar-size-horizontal: 0; }
#clients { height: auto; max-height: 45%; min-height: 3; }
#workers { height: auto; max-height: 30%; min-height: 2; }
#charts { height: 1fr; min-height: 4; layout: horizontal; }
RateChart { width: 1fr; height: 100%; border: round $primary-darken-1; padding: 0 1; }
"""


class TopApp(App[None]):
    """The live dashboard; ``source`` is the router (or a test's fake)."""

    TITLE = "fairserve top"
    CSS = CSS
    ENABLE_COMMAND_PALETTE = False
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("plus", "quantum(2.0)", "Q^u+", key_display="+"),
        Binding("equals_sign", "quantum(2.0)", "Q^u+", show=False),
        Binding("minus", "quantum(0.5)", "Q^u-", key_display="-"),
        Binding("W", "worker_quantum(2.0)", "Q^w+", key_display="W"),
        Binding("w", "worker_quantum(0.5)", "Q^w-", key_display="w"),
        Binding("p", "pause", "pause"),
        Binding("s", "sort", "sort"),
        Binding("question_mark", "help", "help", key_display="?"),
        Binding("q", "quit", "quit"),
    ]

    def __init__(
        self, source: StateSource, interval_s: float = 1.0, history: History | None = None
    ) -> None:
        """``history``: snapshots seen before (tests start with a full chart this way)."""
        super().__init__()
        self.source = source
        self.interval_s = interval_s
        self.history = history if history is not None else History()
        self.frame: Frame | None = None
        self.paused = False
        self.sort_index = 0
        self.failures = 0
        self.lost: str | None = None
        self._wake = asyncio.Event()
        self._pending_quantum: float | None = None
        self._pending_worker_quantum: float | None = None

    # ------------------------------------------------------------ layout
    def compose(self) -> ComposeResult:
        yield HeaderPanel(id="header")
        yield Banner(id="banner")
        yield ClientsTable(id="clients", cursor_type="row", zebra_stripes=True)
        yield WorkersTable(id="workers", cursor_type="none")
        with Horizontal(id="charts"):
            yield RateChart("service rate /s", "service", id="service-chart")
            yield RateChart("cache hit rate", "hit", id="hit-chart")
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        # Held, not queried per frame: with the help screen on top, a query would search it.
        self._header_panel = self.query_one(HeaderPanel)
        self._banner_panel = self.query_one(Banner)
        self._clients_table = self.query_one(ClientsTable)
        self._workers_table = self.query_one(WorkersTable)
        self._rate_charts = list(self.query(RateChart))
        self._render_all()
        self.poll_loop()

    async def on_unmount(self) -> None:
        await self.source.close()

    # ------------------------------------------------------------ polling
    @work(exclusive=True, group="poll", exit_on_error=False)
    async def poll_loop(self) -> None:
        while True:
            if not self.paused:
                await self.poll_once()
            self._wake.clear()
            with suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._delay_s())

    async def poll_once(self) -> None:
        """One fetch, its result (or failure) on screen; never raises."""
        try:
            snapshot = await self.source.fetch()
        except SourceError as exc:
            self._lose(str(exc))
        except Exception as exc:  # a bug must show, not end the dashboard
            self._lose(f"internal error: {type(exc).__name__}: {exc}")
        else:
            was_lost = self.lost is not None
            self.failures, self.lost = 0, None
            frame = self.history.add(snapshot)
            if was_lost or self.frame is None or frame.snapshot != self.frame.snapshot:
                self.frame = frame
                self._render_all()  # an unchanged router is not redrawn

    def _lose(self, message: str) -> None:
        self.failures += 1
        self.lost = message
        self._render_all()

    def _delay_s(self) -> float:
        if not self.failures:
            return self.interval_s
        return min(MAX_RETRY_S, self.interval_s * 2.0 ** (self.failures - 1))

    # ------------------------------------------------------------ rendering
    def _banner_message(self) -> tuple[str | None, str]:
        if self.lost is not None:
            retry = f"retry {self.failures}, every {fmt.quantum(self._delay_s())}s"
            if self.frame is None:
                return f"✖ cannot reach the router: {self.lost} · {retry}", "lost"
            return f"✖ connection lost: {self.lost} · {retry} · showing the last poll", "lost"
        if self.paused:
            return "⏸ paused: p resumes", "paused"
        return None, ""

    def _render_all(self) -> None:
        self._header_panel.show(self.frame, self.source.url)
        self._banner_panel.show_message(*self._banner_message())
        frame = self.frame
        if frame is None:
            return
        order = SORT_ORDERS[self.sort_index]
        self._clients_table.show(frame, order)
        self._workers_table.show(frame)
        names = [c.name for c in sorted_clients(frame.snapshot, order)]
        for chart in self._rate_charts:
            chart.show(frame, names)

    # ------------------------------------------------------------ actions
    def action_pause(self) -> None:
        self.paused = not self.paused
        self._wake.set()
        self._render_all()

    def action_sort(self) -> None:
        self.sort_index = (self.sort_index + 1) % len(SORT_ORDERS)
        self._render_all()

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def action_quantum(self, factor: float) -> None:
        if self.frame is None:
            self.notify("no data from the router yet", severity="warning")
            return
        snapshot = self.frame.snapshot
        current = self._pending_quantum
        if current is None:
            current = snapshot.local_quantum
        if current is None:
            policy = snapshot.router.policy
            self.notify(f"policy {policy} shows no quantum (Q^u)", severity="warning")
            return
        self._pending_quantum = max(MIN_QUANTUM, current * factor)
        self._write(self._pending_quantum, None)

    def action_worker_quantum(self, factor: float) -> None:
        if self.frame is None:
            self.notify("no data from the router yet", severity="warning")
            return
        snapshot = self.frame.snapshot
        current = self._pending_worker_quantum
        if current is None:
            current = snapshot.quanta.worker_quantum
        if current is None:
            dispatch = snapshot.router.dispatch
            self.notify(f"dispatch {dispatch} has no per-worker quantum", severity="warning")
            return
        if math.isinf(current):
            self.notify(
                "Q^w is ∞ (clients never leave their worker): set a finite one with "
                "fairserve tune quantum --worker Q",
                severity="warning",
            )
            return
        self._pending_worker_quantum = max(MIN_QUANTUM, current * factor)
        self._write(None, self._pending_worker_quantum)

    def _write(self, quantum: float | None, worker_quantum: float | None) -> None:
        """One writer per quantum: the latest press wins (an earlier write of the same
        quantum still in flight is cancelled), and a Q^w press never cancels a Q^u one."""
        group = "quantum" if quantum is not None else "worker-quantum"
        self.run_worker(
            self._write_quanta(quantum, worker_quantum),
            group=group,
            exclusive=True,
            exit_on_error=False,
        )

    async def _write_quanta(self, quantum: float | None, worker_quantum: float | None) -> None:
        try:
            view = await self.source.set_quanta(quantum, worker_quantum)
        except SourceError as exc:  # QuantumRefused included: the message says why
            self.notify(f"quantum not changed: {exc}", severity="error")
        else:
            if quantum is not None:
                self.notify(f"Q^u → {fmt.quantum(view.quantum)}")
            if worker_quantum is not None:
                self.notify(f"Q^w → {fmt.quantum(view.worker_quantum)}")
        finally:
            # A newer press has its own target pending; only this write's is done.
            if quantum is not None and self._pending_quantum == quantum:
                self._pending_quantum = None
            if worker_quantum is not None and self._pending_worker_quantum == worker_quantum:
                self._pending_worker_quantum = None
        self._wake.set()
