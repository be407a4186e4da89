"""``fairserve simulate``: run a workload through simulated workers, report or compare.

The simulator runs the same ``sched`` policies and dispatchers as the router and the SGLang
plugin, so this command is where a policy choice is tried before it meets real GPUs. One run
prints the DESIGN §7 report; ``--compare`` runs several policy/dispatch pairs on identical
traffic and prints them side by side.

Choices for ``--policy``/``--dispatch``/``--batching`` come from the registries, loaded only
when a choice is checked or listed, so ``fairserve --help`` does not import the scheduling
layer. Everything is validated (names, quanta, plot path) before the first simulated second.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from fairserve.commands.output import Output
from fairserve.core.errors import ConfigError
from fairserve.sim.profile import DEFAULT_PROFILE

if TYPE_CHECKING:
    from rich.console import RenderableType
    from rich.table import Table
    from rich.text import Text

    from fairserve.sim.cluster import Progress as ProgressCallback
    from fairserve.sim.cluster import SimConfig
    from fairserve.sim.compare import RunSpec
    from fairserve.sim.profile import Profile
    from fairserve.sim.recorder import SimResult
    from fairserve.workloads.model import Workload


def _registry_option(kind: str, load: Callable[[], Sequence[str]], help_text: str) -> Any:
    """A ``typer.Option`` whose valid names come from a registry, read on first use.

    Typer (which vendors click) takes no custom click types, and an ``Enum``/``Literal``
    annotation would be built on every start, loading the registry (and numpy behind it)
    for ``fairserve --version``. So the names reach shell completion (and the generated
    completions and man pages) through ``autocompletion``, and validation through a callback
    whose message lists them.
    """

    def complete() -> list[str]:
        return list(load())

    def check(value: str) -> str:
        names = load()
        if value not in names:
            raise typer.BadParameter(
                f"unknown {kind} {value!r}; expected one of: {', '.join(names)}"
            )
        return value

    metavar = kind.split()[0].upper()
    return typer.Option(metavar=metavar, help=help_text, autocompletion=complete, callback=check)


def _policy_names() -> list[str]:
    from fairserve.sched.registry import local_policies

    return local_policies()


def _dispatcher_names() -> list[str]:
    from fairserve.sched.registry import dispatchers

    return dispatchers()


def _batching_names() -> tuple[str, ...]:
    from fairserve.sim.engine import BATCHING_DISCIPLINES

    return BATCHING_DISCIPLINES


@dataclass(frozen=True)
class _Setup:
    """What every run of one invocation shares."""

    workload: Workload
    workload_label: str
    profile: Profile
    batching: str
    workers: int
    duration_s: float | None
    seed: int
    drain: bool


def simulate(
    workload: Annotated[
        str | None,
        typer.Option(
            "--workload",
            "-w",
            help="Built-in workload name (see --list-workloads) or a workload TOML file.",
            show_default=False,
        ),
    ] = None,
    policy: Annotated[
        str,
        _registry_option(
            "policy", _policy_names, "Local policy on each worker (see fairserve policies)."
        ),
    ] = "dlpm",
    dispatch: Annotated[
        str,
        _registry_option(
            "dispatcher",
            _dispatcher_names,
            "Dispatcher placing requests on workers (see fairserve policies).",
        ),
    ] = "doubleq",
    workers: Annotated[int, typer.Option(min=1, help="Number of simulated workers.")] = 2,
    quantum: Annotated[
        float | None,
        typer.Option(
            help="Per-client quantum Q^u of the local policy (policies that have one).",
            show_default=False,
        ),
    ] = None,
    worker_quantum: Annotated[
        float | None,
        typer.Option(
            help="Per-worker quantum Q^w of the dispatcher (dispatchers that have one; inf ok).",
            show_default=False,
        ),
    ] = None,
    profile: Annotated[
        str, typer.Option(help="Batch-time profile: a name in profiles/ or a profile TOML file.")
    ] = DEFAULT_PROFILE,
    batching: Annotated[
        str,
        _registry_option(
            "batching discipline",
            _batching_names,
            "Engine batching discipline (the default is SGLang's: chunked prefill).",
        ),
    ] = "sarathi",
    duration_s: Annotated[
        float | None,
        typer.Option(
            "--duration",
            help="Simulated seconds (default: the workload's duration).",
            show_default=False,
        ),
    ] = None,
    seed: Annotated[
        int | None,
        typer.Option(help="Workload seed (default: the workload's).", show_default=False),
    ] = None,
    json_output: Annotated[
        bool, typer.Option("--json", help="Print one JSON report object.")
    ] = False,
    plot: Annotated[
        Path | None,
        typer.Option(
            help="Write service rate and response time over time to this PNG "
            "(needs the plot extra).",
            dir_okay=False,
            show_default=False,
        ),
    ] = None,
    compare: Annotated[
        str | None,
        typer.Option(
            metavar="P/D,...",
            help="Compare POLICY/DISPATCH pairs (a bare POLICY uses --dispatch) on the same "
            "workload and seed, e.g. lpm/round-robin,vtc/client-rr,dlpm/doubleq.",
            show_default=False,
        ),
    ] = None,
    drain: Annotated[
        bool,
        typer.Option(
            "--drain", help="After the duration, keep simulating until every call finished."
        ),
    ] = False,
    list_workloads: Annotated[
        bool,
        typer.Option("--list-workloads", help="List the built-in workloads and exit."),
    ] = False,
) -> None:
    """Run a workload through simulated workers with a chosen policy and dispatcher.

    Prints throughput, cache hit rate, fairness (Jain's index, the largest service gap) and
    per-client latency, or with --compare one row per policy/dispatch pair on identical
    traffic. Times are simulated seconds.
    """
    out = Output(json_mode=json_output)
    if list_workloads:
        _list_workloads(out)
        return
    if workload is None:
        raise ConfigError(
            "--workload is required: a built-in name (see --list-workloads) or a workload file"
        )
    if duration_s is not None and not 0 < duration_s < math.inf:
        raise ConfigError(f"--duration: expected a positive number of seconds, got {duration_s}")
    specs = _run_specs(policy, dispatch, compare)
    quanta = _quanta(specs, quantum, worker_quantum)
    if plot is not None:
        from fairserve.sim.plot import check_plot_path

        check_plot_path(plot)
    setup = _setup(workload, profile, batching, workers, duration_s, seed, drain)
    configs = [_config(setup, spec, *q) for spec, q in zip(specs, quanta, strict=True)]
    show_progress = not json_output and out.stderr.isatty()
    results = _run_all(setup, specs, configs, out, show_progress)
    reports = [_report(setup, s, c, r) for s, c, r in zip(specs, configs, results, strict=True)]
    if compare is None:
        out.data(reports[0])
        out.render(*_single_view(reports[0]))
    else:
        out.data({"runs": reports})
        out.render(*_compare_view(specs, reports))
    if plot is not None:
        from fairserve.sim.plot import plot_runs

        runs = [(spec.label, result) for spec, result in zip(specs, results, strict=True)]
        plot_runs(runs, plot, title=f"{setup.workload_label} on {setup.workers} workers")
        out.note(f"plot written to {plot}")


# ---------------------------------------------------------------------- validation
def _list_workloads(out: Output) -> None:
    from fairserve.workloads import list_builtin

    entries = [{"name": n, "description": d} for n, d in list_builtin()]
    out.data(entries)
    if not out.json_mode:
        from rich.table import Table

        table = Table(title="Built-in workloads", title_justify="left")
        table.add_column("name", style="bold", no_wrap=True)
        table.add_column("description")
        for entry in entries:
            table.add_row(entry["name"], entry["description"])
        out.render(table)


def _run_specs(policy: str, dispatch: str, compare: str | None) -> list[RunSpec]:
    from fairserve.sim.compare import RunSpec, parse_runs

    if compare is None:
        return [RunSpec(policy, dispatch)]
    try:
        return parse_runs(compare, default_dispatch=dispatch)
    except ConfigError as exc:
        raise typer.BadParameter(str(exc), param_hint="'--compare'") from None


def _quanta(
    specs: Sequence[RunSpec], quantum: float | None, worker_quantum: float | None
) -> list[tuple[float | None, float | None]]:
    """Per run, the quanta to pass: a given quantum goes to every run that takes one.

    A quantum that no run can use is an error rather than silently ignored: the user
    believes it shaped the result.
    """
    from fairserve.sched.dispatch.base import dispatcher_class
    from fairserve.sched.local.base import local_policy_class

    takes_q = [_declares(local_policy_class(s.policy).params, "quantum") for s in specs]
    takes_qw = [_declares(dispatcher_class(s.dispatch).params, "worker_quantum") for s in specs]
    _check_taken("--quantum", quantum, takes_q, [s.policy for s in specs], "policy")
    _check_taken(
        "--worker-quantum", worker_quantum, takes_qw, [s.dispatch for s in specs], "dispatcher"
    )
    return [
        (quantum if q else None, worker_quantum if qw else None)
        for q, qw in zip(takes_q, takes_qw, strict=True)
    ]


def _declares(params: Sequence[Any], name: str) -> bool:
    return any(p.name == name for p in params)


def _check_taken(
    flag: str, value: float | None, taken: Sequence[bool], names: Sequence[str], kind: str
) -> None:
    if value is None or any(taken):
        return
    listed = ", ".join(dict.fromkeys(names))
    raise ConfigError(
        f"{flag}: {kind} {listed} has no quantum; drop {flag} or pick a {kind}"
        f" that has one (see fairserve policies)"
    )


def _setup(
    workload: str,
    profile: str,
    batching: str,
    workers: int,
    duration_s: float | None,
    seed: int | None,
    drain: bool,
) -> _Setup:
    from fairserve.sim.profile import resolve_profile
    from fairserve.workloads import resolve_workload

    loaded = resolve_workload(workload)
    return _Setup(
        workload=loaded,
        workload_label=loaded.name,
        profile=resolve_profile(profile),
        batching=batching,
        workers=workers,
        duration_s=duration_s,
        seed=loaded.seed if seed is None else seed,
        drain=drain,
    )


def _config(
    setup: _Setup, spec: RunSpec, quantum: float | None, worker_quantum: float | None
) -> SimConfig:
    """The simulation of one run; building the policies once here validates every parameter
    before any run starts (a bad quantum in the third run must not cost two runs first)."""
    from fairserve.sched.registry import make_dispatcher, make_local_policy
    from fairserve.sim.cluster import SimConfig
    from fairserve.sim.engine import EngineConfig

    profile = setup.profile
    engine = EngineConfig(
        kv_capacity_tokens=profile.kv_capacity_tokens,
        max_batch_tokens=profile.max_batch_tokens,
        max_running_requests=profile.max_running_requests,
        batching=setup.batching,
    )
    q: dict[str, Any] = {} if quantum is None else {"quantum": quantum}
    qw: dict[str, Any] = {} if worker_quantum is None else {"worker_quantum": worker_quantum}
    make_local_policy(spec.policy, **q)
    make_dispatcher(spec.dispatch, ["w0"], **qw)
    return SimConfig(
        engine=engine,
        time_model=profile.batch_time(),
        policy=spec.policy,
        dispatch=spec.dispatch,
        workers=setup.workers,
        quantum=quantum,
        worker_quantum=worker_quantum,
        duration_s=setup.duration_s,
        seed=setup.seed,
        drain=setup.drain,
    )


# ---------------------------------------------------------------------- running
def _run_all(
    setup: _Setup,
    specs: Sequence[RunSpec],
    configs: Sequence[SimConfig],
    out: Output,
    show_progress: bool,
) -> list[SimResult]:
    from fairserve.sim.cluster import simulate as run_simulation

    results = []
    with _progress_bars(out, show_progress) as bar:
        for spec, config in zip(specs, configs, strict=True):
            results.append(run_simulation(setup.workload, config, bar(spec.label)))
    return results


@contextmanager
def _progress_bars(
    out: Output, enabled: bool
) -> Iterator[Callable[[str], ProgressCallback | None]]:
    """Yields ``bar(label)``: a progress callback drawing one rich bar on stderr, or None.

    The simulator calls back every few hundred events, so updates stay cheap; the bars are
    transient and disappear once the report prints.
    """
    if not enabled:
        yield lambda label: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    bars = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed:.0f}/{task.total:.0f} simulated s"),
        TimeElapsedColumn(),
        console=Console(file=out.stderr),
        transient=True,
    )

    def bar(label: str) -> ProgressCallback | None:
        task = bars.add_task(label, total=None)

        def update(done_s: float, total_s: float) -> None:
            bars.update(task, completed=done_s, total=total_s)

        return update

    with bars:
        yield bar


def _report(setup: _Setup, spec: RunSpec, config: SimConfig, result: SimResult) -> dict[str, Any]:
    from fairserve.sched.dispatch.base import dispatcher_class
    from fairserve.sched.local.base import local_policy_class
    from fairserve.sim.report import build_report

    meta = {
        "workload": setup.workload_label,
        "policy": spec.policy,
        "dispatch": spec.dispatch,
        "worker_count": setup.workers,
        "profile": setup.profile.name,
        "batching": setup.batching,
        "seed": setup.seed,
        "drain": setup.drain,
        "quantum": _effective(local_policy_class(spec.policy).params, "quantum", config.quantum),
        "worker_quantum": _effective(
            dispatcher_class(spec.dispatch).params, "worker_quantum", config.worker_quantum
        ),
    }
    return build_report(result, meta)


def _effective(params: Sequence[Any], name: str, given: float | None) -> float | str | None:
    """The quantum a run used (given, else the declared default); None if it has none.

    Infinity is written ``"inf"``, as ``fairserve policies --json`` does: JSON has none.
    """
    declared = next((p for p in params if p.name == name), None)
    if declared is None:
        return None
    value = float(declared.default if given is None else given)
    return "inf" if math.isinf(value) else value


# ---------------------------------------------------------------------- views
def _heading(report: dict[str, Any], runs: str) -> Text:
    """One line saying what was simulated (shared by every run of a comparison)."""
    from rich.text import Text

    return Text(
        f"{report['workload']}: {runs} on {report['worker_count']} workers "
        f"({report['profile']}, {report['batching']} batching, seed {report['seed']}, "
        f"{_num(report['duration_s'], 0)} simulated s)",
        style="bold",
    )


def _single_view(report: dict[str, Any]) -> list[RenderableType]:
    runs = f"{report['policy']}/{report['dispatch']}"
    return [
        _heading(report, runs),
        _summary_table(report),
        _clients_table(report),
        _workers_table(report),
    ]


def _summary_table(report: dict[str, Any]) -> Table:
    from rich.table import Table

    throughput = report["throughput"]
    table = Table(show_header=False)
    table.add_column("metric", style="bold")
    table.add_column("value", justify="right")
    table.add_row("throughput (tokens/s)", _num(throughput["tokens_per_s"], 0))
    table.add_row("service/s", _num(throughput["service_per_s"], 0))
    table.add_row("requests/s", _num(throughput["requests_per_s"], 2))
    table.add_row("cache hit rate", _pct(report["cache_hit_rate"]))
    table.add_row("Jain's index", _num(report["jain_index"], 3))
    table.add_row("max service gap", _num(report["max_service_gap"], 0))
    return table


def _clients_table(report: dict[str, Any]) -> Table:
    from rich.table import Table

    table = Table(title="Clients (latency and TTFT in s)", title_justify="left")
    headers = ["client", "weight", "requests", "unfinished", "service", "service/s"]
    headers += ["lat p50", "lat p99", "TTFT p50", "TTFT p99"]
    for index, header in enumerate(headers):
        table.add_column(header, justify="left" if index == 0 else "right", no_wrap=index == 0)
    for name, c in report["clients"].items():
        table.add_row(
            name,
            _num(c["weight"], 2),
            str(c["requests"]),
            str(c["unfinished"]),
            _num(c["service"], 0),
            _num(c["service_rate"], 0),
            *(_num(c[k], 2) for k in ("latency_p50_s", "latency_p99_s")),
            *(_num(c[k], 3) for k in ("ttft_p50_s", "ttft_p99_s")),
        )
    return table


def _workers_table(report: dict[str, Any]) -> Table:
    from rich.table import Table

    table = Table(title="Workers", title_justify="left")
    for index, header in enumerate(["worker", "requests", "cache hit rate", "busy"]):
        table.add_column(header, justify="left" if index == 0 else "right")
    for worker in report["workers"]:
        table.add_row(
            worker["id"],
            str(worker["requests"]),
            _pct(worker["cache_hit_rate"]),
            _pct(worker["busy_fraction"]),
        )
    return table


def _compare_view(
    specs: Sequence[RunSpec], reports: Sequence[dict[str, Any]]
) -> list[RenderableType]:
    from rich.table import Table

    from fairserve.sim.compare import best_indices, comparison_row

    rows = [comparison_row(s.label, r) for s, r in zip(specs, reports, strict=True)]
    best_tokens = best_indices([r.tokens_per_s for r in rows])
    best_jain = best_indices([r.jain_index for r in rows])
    table = Table(caption="* best throughput / best Jain's index", caption_justify="left")
    headers = ["policy/dispatch", "tokens/s", "service/s", "requests/s", "cache hit"]
    headers += ["Jain", "max gap"]
    for index, header in enumerate(headers):
        table.add_column(header, justify="left" if index == 0 else "right", no_wrap=True)
    for index, row in enumerate(rows):
        table.add_row(
            row.label,
            _best(_num(row.tokens_per_s, 0), index in best_tokens),
            _num(row.service_per_s, 0),
            _num(row.requests_per_s, 2),
            _pct(row.cache_hit_rate),
            _best(_num(row.jain_index, 3), index in best_jain),
            _num(row.max_service_gap, 0),
        )
    latency = Table(title="p99 latency (s) per client", title_justify="left")
    latency.add_column("client", no_wrap=True)
    for row in rows:
        latency.add_column(row.label, justify="right", no_wrap=True)
    for client in rows[0].latency_p99_s:
        latency.add_row(client, *(_num(row.latency_p99_s.get(client), 2) for row in rows))
    return [_heading(reports[0], f"{len(rows)} runs"), table, latency]


def _best(text: str, is_best: bool) -> str:
    return f"[bold green]{text} *[/]" if is_best else text


def _num(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _pct(value: float) -> str:
    return f"{100 * value:.1f}%"
