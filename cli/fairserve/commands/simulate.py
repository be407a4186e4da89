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
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, Annotated, Any

import typer

from fairserve.commands import options as opts
from fairserve.commands.options import ReportJson, ReportPlot, WorkloadSeed, registry_option
from fairserve.commands.output import Output
from fairserve.core.defaults import DEFAULT_PROFILE
from fairserve.core.errors import ConfigError

if TYPE_CHECKING:
    from rich.console import RenderableType
    from rich.progress import Progress, TaskID
    from rich.table import Table
    from rich.text import Text

    from fairserve.sim.cluster import SimConfig
    from fairserve.sim.compare import Bench, RunSpec
    from fairserve.sim.recorder import SimResult


def simulate(
    workload: Annotated[
        str | None,
        opts.workload_option(
            "Built-in workload name (see --list-workloads) or a workload TOML file."
        ),
    ] = None,
    policy: Annotated[
        str,
        registry_option("policy", "Local policy on each worker (see fairserve policies)."),
    ] = "dlpm",
    dispatch: Annotated[
        str,
        registry_option(
            "dispatcher", "Dispatcher placing requests on workers (see fairserve policies)."
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
        str,
        opts.profile_option("Batch-time profile: a name in profiles/ or a profile TOML file."),
    ] = DEFAULT_PROFILE,
    batching: Annotated[
        str,
        registry_option(
            "batching discipline", "Engine batching (the default is SGLang's: chunked prefill)."
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
    seed: WorkloadSeed = None,
    json_output: ReportJson = False,
    plot: ReportPlot = None,
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
    param: Annotated[
        list[str] | None,
        typer.Option(
            "--param",
            metavar="POLICY.NAME=VALUE",
            help="Set a parameter of a local policy or dispatcher (repeatable; see fairserve "
            "policies), e.g. dlpm.fill_patience=4 or rpm.limit_per_min=30. It goes to every "
            "run using that policy or dispatcher.",
            show_default=False,
        ),
    ] = None,
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
    settings = _param_settings(param or [], specs, quantum, worker_quantum)
    if plot is not None:
        from fairserve.sim.plot import check_plot_path

        check_plot_path(plot)
    from fairserve.sim.compare import Bench
    from fairserve.sim.profile import resolve_profile
    from fairserve.workloads import resolve_workload

    loaded = resolve_workload(workload)
    bench = Bench(loaded, resolve_profile(profile), batching, workers, duration_s, seed, drain)
    configs = _with_params(specs, bench.configs(specs, quantum, worker_quantum), settings)
    show_progress = not json_output and out.stderr.isatty()
    results = _run_all(bench, specs, configs, out, show_progress)
    reports = [bench.report(c, r) for c, r in zip(configs, results, strict=True)]
    for spec, run_report in zip(specs, reports, strict=True):
        used = (spec.policy, spec.dispatch)
        run_report["params"] = {owner: settings[owner] for owner in used if owner in settings}
    if compare is None:
        out.data(reports[0])
        out.render(*_single_view(reports[0]))
    else:
        out.data({"runs": reports})
        out.render(*_compare_view(specs, reports))
    if plot is not None:
        from fairserve.sim.plot import plot_runs

        runs = [(spec.label, result) for spec, result in zip(specs, results, strict=True)]
        plot_runs(runs, plot, title=f"{bench.workload.name} on {bench.workers} workers")
        out.note(f"plot written to {plot}")


# ---------------------------------------------------------------------- listing, parsing
def _list_workloads(out: Output) -> None:
    from fairserve.workloads import list_builtin

    entries = list_builtin()
    out.data([{"name": name, "description": text} for name, text in entries])
    out.render(_table(("name", "description"), entries, title="Built-in workloads", wrap=True))


def _run_specs(policy: str, dispatch: str, compare: str | None) -> list[RunSpec]:
    from fairserve.sim.compare import RunSpec, parse_runs

    if compare is None:
        return [RunSpec(policy, dispatch)]
    try:
        return parse_runs(compare, default_dispatch=dispatch)
    except ConfigError as exc:
        raise typer.BadParameter(str(exc), param_hint="'--compare'") from None


def _param_settings(
    texts: Sequence[str],
    specs: Sequence[RunSpec],
    quantum: float | None,
    worker_quantum: float | None,
) -> dict[str, dict[str, Any]]:
    """``--param`` values checked against the registry and against the runs: a setting no
    run can use, or one also given by its own option, is an error, not silently dropped."""
    from fairserve.sched.registry import local_policies, parse_param_settings

    try:
        settings = parse_param_settings(texts)
    except ConfigError as exc:
        raise ConfigError(f"--param {exc}") from None
    used = {s.policy for s in specs} | {s.dispatch for s in specs}
    for owner, values in settings.items():
        if owner not in used:
            kind = "policy" if owner in local_policies() else "dispatcher"
            runs = ", ".join(s.label for s in specs)
            raise ConfigError(f"--param {owner}.*: no run uses {kind} {owner} (runs: {runs})")
        for name, given in (("quantum", quantum), ("worker_quantum", worker_quantum)):
            if name in values and given is not None:
                option = "--" + name.replace("_", "-")
                raise ConfigError(f"--param {owner}.{name}: {name} given twice (also {option})")
    return settings


def _with_params(
    specs: Sequence[RunSpec], configs: Sequence[SimConfig], settings: dict[str, dict[str, Any]]
) -> list[SimConfig]:
    """Each run gets the settings of its own policy and dispatcher; quanta go where
    ``--quantum``/``--worker-quantum`` would have put them, so the report shows them."""
    from dataclasses import replace

    out = []
    for spec, config in zip(specs, configs, strict=True):
        policy_params = dict(settings.get(spec.policy, {}))
        dispatch_params = dict(settings.get(spec.dispatch, {}))
        config = replace(
            config,
            quantum=policy_params.pop("quantum", config.quantum),
            worker_quantum=dispatch_params.pop("worker_quantum", config.worker_quantum),
            policy_params=policy_params,
            dispatch_params=dispatch_params,
        )
        out.append(config)
    return out


# ---------------------------------------------------------------------- running
def _run_all(
    bench: Bench, specs: Sequence[RunSpec], configs: Sequence[SimConfig], out: Output, bars: bool
) -> list[SimResult]:
    """Run every configuration; with ``bars``, one transient rich progress bar per run on
    stderr (the simulator calls back every few hundred events, so updates stay cheap)."""
    if not bars:
        return [bench.run(config) for config in configs]
    from fairserve.tuning.render import progress_bar

    progress = progress_bar(
        out.stderr, "{task.description}", "{task.completed:.0f}/{task.total:.0f} simulated s"
    )
    results = []
    with progress:
        for spec, config in zip(specs, configs, strict=True):
            task = progress.add_task(spec.label, total=bench.span_s)
            results.append(bench.run(config, partial(_advance, progress, task)))
    return results


def _advance(progress: Progress, task: TaskID, done_s: float, total_s: float) -> None:
    progress.update(task, completed=done_s, total=total_s)


# ---------------------------------------------------------------------- views
def _single_view(report: dict[str, Any]) -> list[RenderableType]:
    throughput = report["throughput"]
    summary = [
        ("throughput (tokens/s)", _num(throughput["tokens_per_s"], 0)),
        ("service/s", _num(throughput["service_per_s"], 0)),
        ("requests/s", _num(throughput["requests_per_s"], 2)),
        ("cache hit rate", _pct(report["cache_hit_rate"])),
        ("Jain's index", _num(report["jain_index"], 3)),
        ("max service gap", _num(report["max_service_gap"], 0)),
        ("max service gap, extend tokens", _num(report["max_service_gap_extend"], 0)),
        ("gap bound", _bound_text(report["service_gap_bound"])),
    ]
    clients = [_client_row(name, c) for name, c in report["clients"].items()]
    workers = [
        (w["id"], str(w["requests"]), _pct(w["cache_hit_rate"]), _pct(w["busy_fraction"]))
        for w in report["workers"]
    ]
    client_headers = ("client", "weight", "finished", "unfinished", "service/s")
    return [
        _heading(report, f"{report['policy']}/{report['dispatch']}"),
        _table(("metric", "value"), summary, show_header=False),
        _table(
            (*client_headers, "latency\np50", "latency\np99", "TTFT\np50", "TTFT\np99"),
            clients,
            title="Clients (latency and TTFT in s)",
        ),
        _table(("worker", "requests", "cache hit rate", "busy"), workers, title="Workers"),
    ]


def _bound_text(bound: dict[str, Any]) -> str:
    """The bound with its view and theorem, or why there is none."""
    if bound["value"] is None:
        return f"none: {bound['reason']}"
    theorem = str(bound["theorem"]).split(":", 1)[0]  # the formula is in --json
    return f"{_num(bound['value'], 0)} ({bound['view']} view, {theorem})"


def _client_row(name: str, c: dict[str, Any]) -> tuple[str, ...]:
    latency = (_num(c["latency_p50_s"], 2), _num(c["latency_p99_s"], 2))
    ttft = (_num(c["ttft_p50_s"], 3), _num(c["ttft_p99_s"], 3))
    counts = (str(c["requests"]), str(c["unfinished"]))
    return (name, _num(c["weight"], 2), *counts, _num(c["service_rate"], 0), *latency, *ttft)


def _compare_view(
    specs: Sequence[RunSpec], reports: Sequence[dict[str, Any]]
) -> list[RenderableType]:
    from fairserve.sim.compare import best_indices, comparison_row

    rows = [comparison_row(s.label, r) for s, r in zip(specs, reports, strict=True)]
    best_tokens = best_indices([r.tokens_per_s for r in rows])
    best_jain = best_indices([r.jain_index for r in rows])
    summary = [
        (
            row.label,
            _best(_num(row.tokens_per_s, 0), index in best_tokens),
            _num(row.service_per_s, 0),
            _pct(row.cache_hit_rate),
            _best(_num(row.jain_index, 3), index in best_jain),
            _num(row.max_service_gap, 0),
        )
        for index, row in enumerate(rows)
    ]
    latency = [
        (client, *(_num(row.latency_p99_s.get(client), 2) for row in rows))
        for client in rows[0].latency_p99_s
    ]
    return [
        _heading(reports[0], f"{len(rows)} runs"),
        _table(
            ("policy/dispatch", "tokens/s", "service/s", "cache hit", "Jain", "max gap"),
            summary,
            caption="* best throughput / best Jain's index",
        ),
        _table(("client", *(r.label for r in rows)), latency, title="p99 latency (s) per client"),
    ]


def _heading(report: dict[str, Any], runs: str) -> Text:
    """One line saying what was simulated (shared by every run of a comparison)."""
    from rich.text import Text

    return Text(
        f"{report['workload']}: {runs} on {report['worker_count']} workers "
        f"({report['profile']}, {report['batching']} batching, seed {report['seed']}, "
        f"{_num(report['duration_s'], 0)} simulated s)",
        style="bold",
    )


def _table(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    title: str | None = None,
    caption: str | None = None,
    show_header: bool = True,
    wrap: bool = False,
) -> Table:
    """The CLI's report table; ``wrap``: every column after the names holds text."""
    from fairserve.tuning.render import table

    text = headers[1:] if wrap else ()
    return table(headers, rows, title=title, caption=caption, show_header=show_header, text=text)


def _best(text: str, is_best: bool) -> str:
    return f"[bold green]{text} *[/]" if is_best else text


def _num(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _pct(value: float) -> str:
    return f"{100 * value:.1f}%"
