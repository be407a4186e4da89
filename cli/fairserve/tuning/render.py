"""How ``fairserve tune`` looks on a terminal: rich tables, the live decision log, progress.

:func:`table` and :func:`progress_bar` are also the report table and the progress bar of
``simulate``, ``bench`` and ``profile``: one look for every command's reports and runs.

Kept apart from the logic (which never imports rich) and imported by the command only when
it draws; rich itself is imported inside the functions.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, TextIO

from fairserve.tuning.controller import Decision, TunerConfig

if TYPE_CHECKING:
    from rich.console import RenderableType
    from rich.live import Live
    from rich.progress import Progress, TaskID
    from rich.table import Table

    from fairserve.tuning.auto import TuneResult
    from fairserve.tuning.sweep import SweepResult


# ---------------------------------------------------------------------- quantum
BOUNDS_CAPTION = (
    "2·(U + Q^u) per worker, 2·|W|·(U + Q^u) across (finite Q^w); in service units "
    "(w_e·prompt + w_q·output tokens, divided by the client's weight); seconds at the "
    "workers' reported capacity (simulated seconds for simulated workers)"
)


def quantum_view(report: Mapping[str, Any]) -> list[RenderableType]:
    """Heading, quanta and bounds, and each worker's bound in seconds."""
    from rich.text import Text

    heading = Text(
        f"router {report['router']}  policy {report['policy']}  dispatch {report['dispatch']}",
        style="bold",
    )
    rows = [
        ("Q^u", f"{num(report['quantum'])} ({report.get('quantum_source') or 'no quantum'})"),
        ("Q^w", num(report["worker_quantum"])),
    ]
    bounds = report.get("bounds")
    if bounds is None:
        return [heading, table(("", "value"), rows, show_header=False)]
    cost, per, across = bounds["request_cost"], bounds["per_worker"], bounds["across_workers"]
    rows += [
        ("U (largest request)", f"{num(cost['value'])} ({cost['source']}: {cost['note']})"),
        ("workers |W|", str(bounds["worker_count"])),
        ("gap bound per worker", f"{num(per['tokens'])} service units = {secs(per['seconds'])}"),
        ("gap bound across workers", _across(across)),
    ]
    if bounds.get("seconds_equal_why"):
        rows.append(("", bounds["seconds_equal_why"]))
    workers = [
        (w["url"], num(w["capacity_tokens_per_s"]), secs(w["gap_s"])) for w in bounds["workers"]
    ]
    return [
        heading,
        table(("", "value"), rows, show_header=False, caption=BOUNDS_CAPTION),
        table(("worker", "capacity tokens/s", "gap bound"), workers, title="Workers"),
    ]


def _across(across: Mapping[str, Any]) -> str:
    if across.get("unbounded"):
        return f"unbounded: {across.get('why', 'Q^w = inf')}"
    return f"{num(across['tokens'])} service units = {secs(across['seconds'])}"


def before_after(before: Mapping[str, Any], after: Mapping[str, Any]) -> Table:
    rows = [
        ("Q^u", num(before.get("quantum")), num(after.get("quantum"))),
        ("Q^w", num(before.get("worker_quantum")), num(after.get("worker_quantum"))),
    ]
    return table(("", "before", "after"), rows)


def weights_table(weights: Mapping[str, float]) -> Table:
    rows = [(name, num(w)) for name, w in sorted(weights.items())]
    return table(("client", "weight"), rows, title="Client weights")


def weight_change(result: Mapping[str, Any]) -> Table:
    rows = [
        ("client", str(result["client"])),
        ("weight", f"{num(result['previous'])} → {num(result['weight'])}"),
        ("router queues", str(result.get("router_queues", 0))),
        *((f"worker {url}", outcome) for url, outcome in result.get("workers", {}).items()),
    ]
    return table(("", "value"), rows, show_header=False)


# ---------------------------------------------------------------------- auto-tuner
DECISION_HEADERS = ("step", "Q^u", "Jain", "gap", "cache hit", "tokens/s", "decision", "why")


def decision_row(d: Decision) -> tuple[str, ...]:
    obs = d.observation
    move = d.action if d.next_quantum == d.quantum else f"{d.action} → {num(d.next_quantum)}"
    return (
        str(d.step),
        num(d.quantum),
        num(obs.jain_index, 3),
        num(obs.service_gap),
        pct(obs.cache_hit_rate),
        num(obs.tokens_per_s),
        move,
        d.reason,
    )


class DecisionLog:
    """The auto-tuner's decisions as they come, on stderr: a live table on a terminal,
    one line per decision anywhere else (a log must not hold cursor movements)."""

    def __init__(self, stream: TextIO, config: TunerConfig) -> None:
        self.stream = stream
        self.config = config
        self.rows: list[tuple[str, ...]] = []
        self._live: Live | None = None

    def __enter__(self) -> DecisionLog:
        title = f"auto-tune to {self.config.target.describe()} (Ctrl-C keeps the last good Q^u)"
        if self.stream.isatty():
            from rich.console import Console
            from rich.live import Live

            self._live = Live(self._table(), console=Console(file=self.stream), transient=True)
            self._live.start()
            self._live.console.print(title)
        else:
            self.stream.write(title + "\n")
        return self

    def add(self, decision: Decision) -> None:
        row = decision_row(decision)
        self.rows.append(row)
        if self._live is not None:
            self._live.update(self._table(), refresh=True)
        else:
            pairs = zip(DECISION_HEADERS, row, strict=True)
            self.stream.write("  ".join(f"{h}={v}" for h, v in pairs) + "\n")
            self.stream.flush()

    def _table(self) -> Table:
        return table(DECISION_HEADERS, self.rows)

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None


def tune_summary(result: TuneResult, config: TunerConfig) -> Table:
    state = "in force" if result.applied else "not applied (dry run)"
    caption = (
        f"Q^u {num(result.initial)} → {num(result.final)} ({state}); "
        f"target {config.target.describe()}"
    )
    rows = [decision_row(d) for d in result.decisions]
    return table(DECISION_HEADERS, rows, title="Auto-tune decisions", caption=caption)


# ---------------------------------------------------------------------- sweep
class SweepProgress:
    """One transient progress bar over every run of the sweep (stderr, terminals only)."""

    def __init__(self, stream: TextIO, runs: int, span_s: float, enabled: bool) -> None:
        self.stream = stream
        self.runs = runs
        self.span_s = span_s
        self.enabled = enabled and stream.isatty()
        self._progress: Progress | None = None
        self._task: TaskID | None = None

    def __enter__(self) -> SweepProgress:
        if self.enabled:
            self._progress = progress_bar(
                self.stream, "sweep", "{task.fields[run]}/{task.fields[runs]} settings"
            )
            self._progress.start()
            total = self.runs * self.span_s
            self._task = self._progress.add_task("sweep", total=total, run=0, runs=self.runs)
        return self

    def update(self, index: int, done_s: float, total_s: float) -> None:
        if self._progress is not None and self._task is not None:
            done = index * self.span_s + min(done_s, self.span_s)
            self._progress.update(self._task, completed=done, run=index + 1)

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


def sweep_view(result: SweepResult) -> list[RenderableType]:
    from rich.text import Text

    meta = result.meta
    workers = f"{meta['workers']} worker{'s' if meta['workers'] != 1 else ''}"
    heading = Text(
        f"{meta['workload']}: {meta['policy']}/{meta['dispatch']} on {workers} "
        f"({meta['profile']}, {num(meta['duration_s'])} simulated s, seed {meta['seed']})",
        style="bold",
    )
    with_qw = any(r.setting.worker_quantum is not None for r in result.rows)
    headers = ("Q^u", *(("Q^w",) if with_qw else ()), "tokens/s", "Jain", "well-behaved p99 s",
               "cache hit", "max gap", "")  # fmt: skip
    rows = []
    for r in result.rows:
        marks = ("★ " if r.recommended else "") + ("pareto" if r.pareto else "")
        qw = (num(r.setting.worker_quantum),) if with_qw else ()
        jain = num(r.jain_index, 3) if r.meets_target else f"[dim]{num(r.jain_index, 3)}[/]"
        rows.append((num(r.setting.quantum), *qw, num(r.tokens_per_s), jain,
                     num(r.well_behaved_p99_s, 2), pct(r.cache_hit_rate),
                     num(r.max_service_gap), marks))  # fmt: skip
    best = result.recommended
    pick = "none" if best is None else f"Q^u {num(best.setting.quantum)}"
    if best is not None and best.setting.worker_quantum is not None:
        pick += f", Q^w {num(best.setting.worker_quantum)}"
    caption = (
        f"★ recommended: {pick} ({result.reason}); pareto: no other setting has both more "
        f"throughput and a higher Jain's index; well-behaved: {', '.join(result.well_behaved)}"
    )
    return [heading, table(headers, rows, caption=caption)]


# ---------------------------------------------------------------------- helpers
def table(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    title: str | None = None,
    caption: str | None = None,
    show_header: bool = True,
    text: Collection[str] = ("why", "value", ""),
) -> Table:
    """The one table of the CLI's reports (``tune``, ``simulate``, ``bench``): names on the
    left (kept at full width up to 24 characters), numbers on the right and never wrapped
    (a cut number misleads), the columns named in ``text`` left-aligned and wrapping."""
    from rich.box import SIMPLE_HEAD
    from rich.table import Table

    out = Table(
        title=title,
        caption=caption,
        title_justify="left",
        caption_justify="left",
        show_header=show_header,
        box=SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )
    names = [len(headers[0]), *(len(row[0]) for row in rows)]
    out.add_column(
        headers[0],
        no_wrap=True,
        min_width=min(max(names), 24),
        style=None if show_header else "bold",
    )
    for header in headers[1:]:
        is_text = header in text
        out.add_column(header, justify="left" if is_text else "right", no_wrap=not is_text)
    for row in rows:
        out.add_row(*row)
    return out


def progress_bar(stream: TextIO, label: str, counter: str) -> Progress:
    """The one progress bar of the CLI's long runs (tune's sweep, simulate, bench, profile):
    ``label``, the bar, ``counter`` (rich ``TextColumn`` templates) and the time elapsed, on
    ``stream`` (stderr: stdout carries only data), gone once the run ends."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn(label),
        BarColumn(),
        TextColumn(counter),
        TimeElapsedColumn(),
        console=Console(file=stream),
        transient=True,
    )


def num(value: object, digits: int = 0) -> str:
    """Numbers for people: thousands separated, ``inf``, ``n/a`` for unknown."""
    if value == "inf":
        return "inf"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "n/a"
    if math.isinf(value):
        return "inf"
    if digits == 0 and value != int(value) and abs(value) < 10:
        return f"{value:.2f}"
    return f"{value:,.{digits}f}"


def secs(value: object) -> str:
    return "n/a (capacity unknown)" if value is None else f"{num(value, 2)} s"


def pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"
