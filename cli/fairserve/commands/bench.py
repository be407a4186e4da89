"""``fairserve bench``: run a workload against a live router (or any OpenAI-compatible server).

The workload's clients send their programs over HTTP with their identities, open-loop
arrivals and closed-loop programs alike, and the report is the one ``fairserve simulate``
prints (DESIGN §7), measured from the clients' side, plus errors by status. Comparing the two
on the same workload is how a simulation is checked against the real service.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from fairserve.commands import options as opts
from fairserve.commands.errors import ExitCode
from fairserve.commands.options import ReportJson, ReportPlot, WorkloadSeed
from fairserve.commands.output import Output
from fairserve.core.defaults import DEFAULT_MAX_IN_FLIGHT
from fairserve.core.errors import FairserveError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from rich.console import RenderableType
    from rich.table import Table

    from fairserve.bench import BenchOptions, BenchResult
    from fairserve.bench.runner import ProgressFn
    from fairserve.workloads import Workload

_APIS = ("completions", "chat", "generate")


def _check_api(value: str) -> str:
    if value not in _APIS:
        raise typer.BadParameter(f"unknown API {value!r}; expected one of: {', '.join(_APIS)}")
    return value


def bench(
    url: Annotated[
        str,
        opts.url_option(
            "Base URL of the router or server, e.g. http://127.0.0.1:8000.", show_default=False
        ),
    ],
    workload: Annotated[
        str,
        opts.workload_option(
            "Built-in workload name (see fairserve simulate --list-workloads), a "
            "workload TOML file or a trace (.jsonl)."
        ),
    ],
    duration_s: Annotated[
        float | None,
        typer.Option(
            "--duration",
            help="Seconds during which calls arrive (default: the workload's duration); "
            "calls in flight then get up to --timeout more to finish.",
            show_default=False,
        ),
    ] = None,
    seed: WorkloadSeed = None,
    api: Annotated[
        str,
        typer.Option(
            metavar="API",
            help="Route to call: completions (text prompts), chat (messages) or generate "
            "(SGLang native, token ids).",
            autocompletion=lambda: list(_APIS),
            callback=_check_api,
        ),
    ] = "completions",
    timeout_s: Annotated[
        float,
        typer.Option(
            "--timeout",
            min=0.001,
            help="Seconds a request may stay silent, and how long calls in flight at the "
            "end may still run before they count as unfinished.",
        ),
    ] = 30.0,
    max_in_flight: Annotated[
        int,
        typer.Option(
            min=1,
            help="Most requests one client has open at once (per client, so no client's "
            "backlog takes another's slots; its later calls wait).",
        ),
    ] = DEFAULT_MAX_IN_FLIGHT,
    token: Annotated[
        str | None,
        typer.Option(
            envvar="FAIRSERVE_API_KEY",
            help="API key sent as 'Authorization: Bearer' with every request.",
            show_default=False,
        ),
    ] = None,
    client_keys: Annotated[
        list[str] | None,
        typer.Option(
            "--client-key",
            metavar="CLIENT=KEY",
            help="API key of one workload client (repeatable; wins over --token), so a "
            "router with a clients file tells the clients apart.",
            show_default=False,
        ),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            help="The 'model' field of each request (default: none sent).", show_default=False
        ),
    ] = None,
    json_output: ReportJson = False,
    plot: ReportPlot = None,
) -> None:
    """Run a workload's clients against a live router over HTTP and report what they saw.

    Each client sends its calls with its identity (X-Fairserve-Client, X-Fairserve-App),
    streamed; arrivals stop after --duration seconds and calls still in flight get up to
    --timeout seconds more (the run can take up to their sum). Closed-loop programs wait
    for their answers. Prints throughput, cache hit rate, fairness (Jain's index of service
    divided by weight, the largest service gap) and per-client latency and time to first
    token; counts every error by status, and apart from them the calls still open at the
    end and those skipped because a call they depend on was not answered. Ctrl-C ends the
    run early and still prints the report of what ran (exit 130).
    """
    import asyncio

    from fairserve.bench import BenchOptions
    from fairserve.workloads import resolve_workload

    out = Output(json_mode=json_output)
    if plot is not None:
        from fairserve.sim.plot import check_plot_path

        check_plot_path(plot)
    loaded = resolve_workload(workload)
    options = BenchOptions(
        api=api,  # type: ignore[arg-type]  # checked by _check_api
        duration_s=duration_s,
        seed=seed,
        timeout_s=timeout_s,
        max_in_flight=max_in_flight,
        token=token,
        api_keys=parse_client_keys(client_keys or [], [c.name for c in loaded.clients]),
        model=model,
    )
    if not json_output and out.stderr.isatty():
        result = asyncio.run(_run_with_bar(url, loaded, options, out))
    else:
        result = asyncio.run(_interruptible(url, loaded, options))
    _finish(result, out, plot)


def parse_client_keys(items: list[str], clients: list[str]) -> dict[str, str]:
    """``--client-key CLIENT=KEY`` items as client → key; a usage error for a malformed
    item or a client the workload does not have (a typo would send that client's calls
    under --token, charged to someone else)."""
    keys: dict[str, str] = {}
    for item in items:
        name, sep, key = item.partition("=")
        if not sep or not name or not key:
            raise typer.BadParameter(
                f"expected CLIENT=KEY, got {item!r}", param_hint="--client-key"
            )
        if name not in clients:
            raise typer.BadParameter(
                f"the workload has no client {name!r} (its clients: {', '.join(clients)})",
                param_hint="--client-key",
            )
        keys[name] = key
    return keys


async def _run_with_bar(
    url: str, workload: Workload, options: BenchOptions, out: Output
) -> BenchResult:
    """The run with a transient rich progress bar on stderr (time, sent, ok, failed)."""
    from fairserve.bench import ProgressInfo
    from fairserve.tuning.render import progress_bar

    progress = progress_bar(
        out.stderr,
        "{task.description}",
        "{task.completed:.0f}/{task.total:.0f} s  {task.fields[counts]}",
    )
    total_s = options.duration_s or workload.duration_s
    task = progress.add_task(workload.name, total=total_s, counts="")

    def update(info: ProgressInfo) -> None:
        counts = (
            f"sent {info.sent}  ok {info.finished}  failed {info.failed}  "
            f"in flight {info.in_flight}"
        )
        if info.elapsed_s >= total_s:  # arrivals stopped: say what the wait is
            label = f"{workload.name}: draining (up to {options.timeout_s:g} s, --timeout)"
            progress.update(task, completed=total_s, counts=counts, description=label)
        else:
            progress.update(task, completed=info.elapsed_s, counts=counts)

    with progress:
        return await _interruptible(url, workload, options, update)


async def _interruptible(
    url: str, workload: Workload, options: BenchOptions, progress: ProgressFn | None = None
) -> BenchResult:
    """The run, with the first Ctrl-C ending it early rather than losing it: the calls in
    flight are counted as still open and the report of what ran is printed (exit 130). A
    second Ctrl-C, while that happens, interrupts at once."""
    import asyncio
    import signal

    from fairserve.bench import run_workload

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def first_interrupt() -> None:
        stop.set()
        loop.remove_signal_handler(signal.SIGINT)  # back to KeyboardInterrupt

    try:
        loop.add_signal_handler(signal.SIGINT, first_interrupt)
    except (NotImplementedError, RuntimeError, ValueError):  # no signals here (a thread)
        return await run_workload(url, workload, options, progress)
    try:
        return await run_workload(url, workload, options, progress, stop=stop)
    finally:
        loop.remove_signal_handler(signal.SIGINT)


def _finish(result: BenchResult, out: Output, plot: Path | None) -> None:
    from fairserve.bench import bench_report, to_sim_result
    from fairserve.bench.report import first_messages

    report = bench_report(result)
    out.data(report)
    out.render(*_view(report, first_messages(result.attempts)))
    if plot is not None:
        from fairserve.sim.plot import plot_runs

        title = f"{result.workload} against {result.url}"
        runs = [(f"{result.api} API", to_sim_result(result))]
        plot_runs(runs, plot, title=title, arrivals_end_s=result.duration_s)
        out.note(f"plot written to {plot}")
    if result.interrupted_s is not None:
        raise typer.Exit(ExitCode.INTERRUPT)
    _check_outcome(result)


def _check_outcome(result: BenchResult) -> None:
    """A run where nothing succeeded is a failure (exit 1, or 3 when the server vanished)."""
    from fairserve.bench import Unreachable

    sent = [a for a in result.attempts if a.sent_s is not None]
    if not sent or any(a.ok for a in sent):
        return
    if all(a.status == "connection" for a in sent):
        raise Unreachable(f"{result.url} stopped answering: every request failed to connect")
    if all(a.status == "unfinished" for a in sent):
        raise FairserveError(
            f"no request finished: all {len(sent)} were still open when the run ended "
            f"(arrivals stopped at {result.duration_s:g} s, then {result.timeout_s:g} s "
            "for calls in flight); a longer --timeout lets them finish"
        )
    statuses = sorted({a.status for a in sent})
    raise FairserveError(f"no request succeeded ({', '.join(statuses)}); see the report")


# ---------------------------------------------------------------------- views
def _view(report: dict[str, Any], messages: dict[str, str]) -> list[RenderableType]:
    from rich.text import Text

    throughput = report["throughput"]
    summary = [
        ("throughput (tokens/s)", _num(throughput["tokens_per_s"], 0)),
        ("service/s", _num(throughput["service_per_s"], 0)),
        ("requests/s", _num(throughput["requests_per_s"], 2)),
        ("cache hit rate", f"{100 * report['cache_hit_rate']:.1f}%"),
        (f"Jain (weighted, {report['jain_weights']} weights)", _num(report["jain_index"], 3)),
        ("max service gap (service units)", _num(report["max_service_gap"], 0)),
        ("errors", str(report["errors"]["total"])),
        ("still open at the end", str(report["unfinished"]["total"])),
        ("skipped", str(report["skipped"]["total"])),
    ]
    heading = Text(
        f"{report['workload']} against {report['url']} ({report['api']}, seed "
        f"{report['seed']}): arrivals for {_num(report['target_duration_s'], 1)} s "
        f"(--duration), then up to {_num(report['drain_timeout_s'], 1)} s (--timeout) for "
        f"calls in flight; ran {_num(report['duration_s'], 1)} s",
        style="bold",
    )
    clients = [_client_row(name, c) for name, c in report["clients"].items()]
    start_s, end_s = report["jain_window_s"]
    window = f"service/s\n{_num(start_s, 0)}-{_num(end_s, 0)} s"
    headers = ("client", "weight", "finished", "errors", "still\nopen", "skipped", window)
    views: list[RenderableType] = [
        heading,
        _table(("metric", "value"), summary, show_header=False),
        _table(
            (*headers, "latency\np50", "latency\np99", "TTFT\np50", "TTFT\np99"),
            clients,
            title="Clients (latency and TTFT in s; service/s in service units, over the "
            "window where every client is active, as Jain's index)",
        ),
    ]
    by_status = report["errors"]["by_status"]
    if by_status:
        rows = [(s, str(n), messages.get(s, "")) for s, n in by_status.items()]
        views.append(_table(("status", "count", "first message"), rows, title="Errors"))
    for kind in ("unfinished", "skipped"):
        for reason, count in report[kind]["reasons"].items():
            views.append(Text(f"{count} {kind}: {reason}"))
    if report.get("interrupted_s") is not None:
        views.append(
            Text(
                f"interrupted (Ctrl-C) at {_num(report['interrupted_s'], 1)} s: the figures "
                "cover the run until then",
                style="yellow",
            )
        )
    note = report.get("identity", {}).get("note")
    if note:
        views.append(Text(f"note: {note}", style="yellow"))
    return views


def _client_row(name: str, c: dict[str, Any]) -> tuple[str, ...]:
    errors = sum(c["errors"].values())
    latency = (_num(c["latency_p50_s"], 3), _num(c["latency_p99_s"], 3))
    ttft = (_num(c["ttft_p50_s"], 3), _num(c["ttft_p99_s"], 3))
    counts = (str(c["requests"]), str(errors), str(c["unfinished"]), str(c["skipped"]))
    rate = _num(c["window_service_rate"], 0)
    return (name, f"{c['weight']:g}", *counts, rate, *latency, *ttft)


def _table(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    title: str | None = None,
    show_header: bool = True,
) -> Table:
    """The CLI's report table; an error's first message is the one text column."""
    from fairserve.tuning.render import table

    return table(headers, rows, title=title, show_header=show_header, text=("first message",))


def _num(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"
