"""The foreground launch's compact live status on stderr (stdout stays free for data).

On a terminal it is a small rich table redrawn in place, with events (restarts) printed
above it; anywhere else (a pipe, a log file, a detached supervisor) events are plain
timestamped lines, because cursor movement would garble a log.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from rich.live import Live
    from rich.table import Table

    from fairserve.cluster.supervisor import Supervisor


REDRAW_S = 1.0


def traffic_line(state: Mapping[str, Any] | None) -> str:
    """One line of what the service is doing now: requests in flight and done, errors,
    tokens per second and fairness (weighted Jain over the state's window)."""
    if state is None:
        return "router starting"
    clients = state.get("clients", {}).values()
    done = sum(c.get("finished", 0) for c in clients)
    errors = sum(c.get("failed", 0) + c.get("rejected", 0) for c in clients)
    tokens_per_s = state.get("throughput", {}).get("tokens_per_s", 0.0)
    fairness = state.get("fairness", {})
    window_s = fairness.get("window_s", 60.0)
    # Over fewer than two clients the router reports 1.0, which would read as perfect.
    judged = fairness.get("clients_judged", 0) >= 2
    jain = f"{fairness.get('jain_index', 1.0):.2f}" if judged else "n/a"
    return (
        f"in flight {state.get('router', {}).get('active_requests', 0)}  done {done}  "
        f"errors {errors}  tokens/s {tokens_per_s:,.0f}  clients {state.get('clients_total', 0)}"
        f"  Jain (weighted, {window_s:g} s) {jain}"
    )


def worker_traffic(state: Mapping[str, Any] | None) -> dict[str, tuple[str, str, str, str]]:
    """Worker URL → (health, requests done, failed answers, prompt + output tokens)."""
    rows: dict[str, tuple[str, str, str, str]] = {}
    for w in (state or {}).get("workers", []):
        health = "up" if w.get("healthy") else "DOWN"
        tokens = w.get("prompt_tokens", 0) + w.get("output_tokens", 0)
        rows[w["url"]] = (
            health,
            str(w.get("finished", 0)),
            str(w.get("failures", 0)),
            f"{tokens:,}",
        )
    return rows


class StatusView:
    """Events and, on a terminal, the live table; a context manager around the run."""

    def __init__(self, stream: TextIO | None = None, live: bool | None = None) -> None:
        self.stream = stream or sys.stderr
        self.live_enabled = self.stream.isatty() if live is None else live
        self.supervisor: Supervisor | None = None
        self.router_url = ""
        self._live: Live | None = None
        self._drawn_s = 0.0

    def log(self, message: str) -> None:
        if self._live is not None:
            self._live.console.print(message, highlight=False, markup=False)
            return
        stamp = time.strftime("%H:%M:%S")
        self.stream.write(f"{stamp} fairserve launch: {message}\n")
        self.stream.flush()

    def ready(self, supervisor: Supervisor, router_url: str) -> None:
        """Switch to the live table (terminal only) once everything is up."""
        self.supervisor, self.router_url = supervisor, router_url
        if not self.live_enabled:
            return
        from rich.console import Console
        from rich.live import Live

        console = Console(file=self.stream)
        self._live = Live(self._table(), console=console, auto_refresh=False, transient=True)
        self._live.start()

    def tick(self) -> None:
        """Redraw at most once a second: the supervisor ticks faster to catch crashes."""
        now_s = time.monotonic()
        if self._live is not None and now_s - self._drawn_s >= REDRAW_S:
            self._drawn_s = now_s
            self._live.update(self._table(), refresh=True)

    def _table(self) -> Table:
        from rich.table import Table

        sup = self.supervisor
        cfg = sup.plan.router if sup is not None else None
        title = f"fairserve  {self.router_url}"
        if cfg is not None:
            from fairserve.router.identity import auth_mode

            mode = auth_mode(cfg.clients, cfg.trust_identity_header)
            title += f"  policy {cfg.policy}  dispatch {cfg.dispatch}  identity {mode}"
            title += "  (Ctrl-C stops)"
        state = sup.router_state() if sup is not None else None
        table = Table(
            title=title, title_justify="left", box=None, padding=(0, 2), caption=traffic_line(state)
        )
        for column in ("worker", "url", "state", "restarts", "health", "done", "failed", "tokens"):
            table.add_column(column)
        routed = worker_traffic(state)
        for name, url, process, restarts in sup.worker_rows() if sup is not None else []:
            table.add_row(name, url, process, str(restarts), *routed.get(url, ("?", "-", "-", "-")))
        return table

    def __enter__(self) -> StatusView:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
