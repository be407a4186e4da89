"""``fairserve profile``: measure a worker's batch-time coefficients; ``profile show``.

``fairserve profile --url URL`` sweeps a live worker (prefill, decode and mixed points),
fits ``t = c + a·max(0, b − b0) + attention·context``, samples the GPU through NVML when the
worker runs on this host, and writes ``<gpu>-<model>.toml`` into the user's data directory
(``$XDG_DATA_HOME/fairserve/profiles``, or the first ``$FAIRSERVE_PROFILES_DIR`` entry;
never the source checkout) unless ``--out``, in the format the
simulator, the worker (``--profile``) and the dashboard read. ``fairserve profile show FILE``
prints a profile's coefficients, its capacity and, for a workload, the stability bound
``λ·(mean prompt + mean output) < capacity``.

Heavy imports (aiohttp, numpy, rich, the workload generators) happen inside the functions,
so ``fairserve --help`` stays fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from fairserve.commands import options as opts
from fairserve.commands.output import Output
from fairserve.core.errors import ConfigError, FairserveError

if TYPE_CHECKING:
    from rich.console import RenderableType
    from rich.progress import Progress

    from fairserve.profiling.fit import BatchTimeFit
    from fairserve.profiling.sweep import SweepOptions, SweepResult
    from fairserve.sim.profile import Profile

TIMINGS = ("auto", "engine", "client")

app = typer.Typer(
    help="Measure a worker's batch-time coefficients (and GPU power via NVML) into a profile.",
    no_args_is_help=False,
)

PlotOption = Annotated[
    Path | None,
    opts.plot_option(
        "Write the measurements against the fitted model to this PNG (needs the plot extra)."
    ),
]


@app.callback(invoke_without_command=True)
def measure(
    ctx: typer.Context,
    url: Annotated[
        str | None,
        opts.url_option("The worker to measure (SGLang or fairserve worker).", show_default=False),
    ] = None,
    quick: Annotated[
        bool, typer.Option("--quick", help="A reduced sweep (seconds on a simulated worker).")
    ] = False,
    out: Annotated[
        Path | None,
        typer.Option(
            help="Profile file to write (default: <gpu>-<model>.toml in "
            "$XDG_DATA_HOME/fairserve/profiles, or the first $FAIRSERVE_PROFILES_DIR entry).",
            dir_okay=False,
            show_default=False,
        ),
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing file.")] = False,
    json_output: opts.JsonOutput = False,
    plot: PlotOption = None,
    timing: Annotated[
        str,
        typer.Option(
            help="How step times are taken: engine (the worker's step counters), client "
            "(latencies and streamed tokens), auto (engine when the worker has counters).",
            autocompletion=lambda: list(TIMINGS),
        ),
    ] = "auto",
    step_overhead_s: Annotated[
        float,
        typer.Option(
            "--step-overhead-s",
            help="Known per-step overhead (s) to split from c (timings cannot separate them).",
        ),
    ] = 0.0,
    nvml: Annotated[
        bool | None,
        typer.Option(
            "--nvml/--no-nvml",
            help="Sample the GPU via NVML (default: when a real worker runs on this host).",
            show_default=False,
        ),
    ] = None,
    gpu_index: Annotated[int, typer.Option(min=0, help="NVML index of the worker's GPU.")] = 0,
    seed: Annotated[int, typer.Option(help="Seed of the random prompts and point order.")] = 0,
    timeout_s: Annotated[
        float, typer.Option("--timeout", help="Seconds to wait for any one request.")
    ] = 120.0,
) -> None:
    """Measure a worker's batch-time coefficients (and GPU via NVML) into a profile.

    Sweeps prefill points (one prompt per step), decode points (N concurrent generations)
    and mixed points, fits t = c + a*max(0, b - b0) + attention*context with R^2 and
    residuals, and writes the profile the simulator and `fairserve worker --profile` read.
    Exits 3 when the worker is unreachable.
    """
    if ctx.invoked_subcommand is not None:
        return
    if url is None:
        raise ConfigError("--url is required: the worker to measure (e.g. http://127.0.0.1:30000)")
    if timing not in TIMINGS:
        raise typer.BadParameter(
            f"unknown timing {timing!r}; expected one of: {', '.join(TIMINGS)}",
            param_hint="'--timing'",
        )
    if not timeout_s > 0:
        raise ConfigError(f"--timeout: expected a positive number of seconds, got {timeout_s}")
    if step_overhead_s < 0:
        raise ConfigError(f"--step-overhead-s: expected >= 0, got {step_overhead_s}")
    if plot is not None:
        from fairserve.sim.plot import check_plot_path

        check_plot_path(plot)
    if out is not None:
        _check_writable(out, force)
    from fairserve.profiling.sweep import SweepOptions

    options = SweepOptions(
        quick=quick,
        timing=timing,  # type: ignore[arg-type]  # checked against TIMINGS above
        seed=seed,
        request_timeout_s=timeout_s,
        sample_gpu=nvml,
        gpu_index=gpu_index,
    )
    output = Output(json_mode=json_output)
    _measure(url, options, out, force, step_overhead_s, plot, output)


def _measure(
    url: str,
    options: SweepOptions,
    out: Path | None,
    force: bool,
    step_overhead_s: float,
    plot: Path | None,
    output: Output,
) -> None:
    from fairserve.profiling.fit import fit_observations
    from fairserve.profiling.store import build_profile, default_path
    from fairserve.sim.profile import write_profile

    result = _run_sweep(url, options, output, show_bars=output.stderr.isatty())
    for note in result.notes:
        output.warn(note)
    if result.slowdowns:
        output.warn(f"the GPU throttled while measuring ({', '.join(result.slowdowns)})")
    if result.timing == "client" and result.limits.speed > 1:
        output.warn(
            f"client timing at worker speed {result.limits.speed:g}: a simulated worker that "
            "falls behind the wall clock makes decode steps look slower; use --speed 1"
        )
    fit = fit_observations(result.observations)
    profile = build_profile(result, fit, step_overhead_s)
    path = out if out is not None else default_path(profile)
    if out is None:
        _check_writable(path, force)
    write_profile(profile, path)
    found_as = f"; use it with --profile {profile.name}" if out is None else ""
    output.note(f"profile written to {path} ({result.wall_s:.1f} s sweep){found_as}")
    if plot is not None:
        from fairserve.profiling.plot import plot_fit

        plot_fit(result.observations, fit, plot, f"{profile.gpu} / {profile.model}")
        output.note(f"plot written to {plot}")
    output.data(_measure_json(result, fit, profile, path))
    output.render(*_measure_view(result, fit, profile))


def _run_sweep(url: str, options: SweepOptions, output: Output, show_bars: bool) -> SweepResult:
    from fairserve.profiling.sweep import sweep

    if not show_bars:
        return sweep(url, options)
    from fairserve.tuning.render import progress_bar

    progress = progress_bar(
        output.stderr, "profiling", "{task.completed:.0f}/{task.total:.0f} {task.description}"
    )
    with progress:
        task = progress.add_task("connecting", total=1)

        def advance(done: int, total: int, label: str, bar: Progress = progress) -> None:
            bar.update(task, completed=done, total=total, description=label)

        return sweep(url, options, advance)


def _check_writable(path: Path, force: bool) -> None:
    if path.exists() and not force:
        raise FairserveError(f"{path} exists; pass --force to overwrite it, or --out FILE")
    parent = path.parent if str(path.parent) else Path(".")
    if parent.exists() and not parent.is_dir():
        raise ConfigError(f"--out {path}: {parent} is not a directory")


@app.command("show")
def show(
    profile: Annotated[
        str,
        typer.Argument(
            help="A profile file, or a profile name on the search path ($FAIRSERVE_PROFILES_DIR, "
            "$XDG_DATA_HOME/fairserve/profiles, the shipped profiles)."
        ),
    ],
    workload: Annotated[
        str | None,
        opts.workload_option("Built-in workload name or workload file: check the stability bound."),
    ] = None,
    workers: Annotated[
        int, typer.Option(min=1, help="Workers sharing the workload (capacity x workers).")
    ] = 1,
    json_output: opts.JsonOutput = False,
) -> None:
    """Print a profile: coefficients, capacity in tokens/s and the stability load bound.

    With --workload, says whether lambda*(mean prompt + mean output) stays below the
    capacity of --workers such workers.
    """
    from fairserve.profiling.show import profile_summary
    from fairserve.sim.profile import resolve_profile

    loaded = resolve_profile(profile)
    mix = None
    if workload is not None:
        from fairserve.workloads import resolve_workload

        mix = resolve_workload(workload)
    summary = profile_summary(loaded, mix, workers)
    output = Output(json_mode=json_output)
    output.data(summary)
    output.render(*_show_view(summary))


# ---------------------------------------------------------------------- views
def _measure_json(
    result: SweepResult, fit: BatchTimeFit, profile: Profile, path: Path
) -> dict[str, Any]:
    from fairserve.profiling.show import profile_summary

    gpu = result.gpu
    return {
        "path": str(path),
        "profile": profile_summary(profile),
        "fit": {
            "constant_s": fit.constant_s,
            "a_s_per_token": fit.a_s_per_token,
            "b0_tokens": fit.b0_tokens,
            "attention_s_per_token": fit.attention_s_per_token,
            "r2": fit.r2,
            "points": fit.points,
            "rms_residual_s": fit.rms_residual_s,
            "residuals_s": list(fit.residuals_s),
        },
        "sweep": {
            "url": result.url,
            "timing": result.timing,
            "speed": result.limits.speed,
            "wall_s": result.wall_s,
            "dropped": result.dropped,
            "notes": result.notes,
        },
        "gpu": None
        if gpu is None
        else {
            "index": gpu.index,
            "name": gpu.name,
            "uuid": gpu.uuid,
            "driver_version": gpu.driver_version,
            "memory_total_mib": gpu.memory_total_mib,
            "throttle_slowdowns": list(result.slowdowns),
        },
        "observations": [o.to_json() for o in result.observations],
    }


def _measure_view(result: SweepResult, fit: BatchTimeFit, profile: Profile) -> list[RenderableType]:
    from fairserve.profiling.show import profile_summary

    views = _show_view(profile_summary(profile))
    gpu = result.gpu
    gpu_text = "n/a" if gpu is None else f"{gpu.name} ({gpu.uuid})"
    rows = [
        ("timing", f"{result.timing} (worker speed {result.limits.speed:g})"),
        ("measurements", f"{fit.points} kept, {result.dropped} dropped"),
        ("RMS residual", f"{fit.rms_residual_s * 1e3:.4g} ms"),
        ("sweep wall time", f"{result.wall_s:.1f} s"),
        ("GPU (NVML)", gpu_text),
    ]
    return [*views, _table(("sweep", ""), rows)]


def _show_view(summary: dict[str, Any]) -> list[RenderableType]:
    bt, capacity = summary["batch_time"], summary["capacity"]
    rows = [
        ("GPU / model", f"{summary['gpu']} / {summary['model']}"),
        ("engine", f"{summary['engine']} {summary['engine_version'] or ''}".strip()),
        ("source, date", f"{summary['source']}, {summary['date']}"),
        ("c", f"{bt['c_s'] * 1e3:.4g} ms"),
        ("a", f"{bt['a_s_per_token'] * 1e6:.4g} µs/token"),
        ("b0", f"{bt['b0_tokens']} tokens"),
        ("attention", f"{bt['attention_s_per_token'] * 1e9:.4g} ns/context token"),
        ("step overhead", f"{bt['step_overhead_s'] * 1e3:.4g} ms"),
        ("KV capacity", f"{capacity['kv_capacity_tokens']} tokens"),
        ("token budget", f"{capacity['max_batch_tokens']} tokens/step"),
        ("capacity", f"{capacity['tokens_per_s']:.0f} tokens/s"),
    ]
    fit = summary["fit"]
    if fit is not None:
        rows.append(("fit", f"R² {fit['r2']:.5f} over {fit['points']} points"))
    energy = summary["energy"]
    joules = energy and energy.get("joules_per_token")
    rows.append(("energy", "n/a" if not joules else f"{joules:.4g} J/token"))
    views: list[RenderableType] = [_table(("profile", summary["name"]), rows)]
    stability = summary["stability"]
    if stability is not None:
        verdict = "stable" if stability["stable"] else "UNSTABLE (over capacity)"
        views.append(
            _table(
                ("workload", stability["workload"]),
                [
                    ("arrival rate", f"{stability['arrival_rate_per_s']:.3g} calls/s"),
                    ("mean prompt", f"{stability['mean_prompt_tokens']:.0f} tokens"),
                    ("mean output", f"{stability['mean_output_tokens']:.0f} tokens"),
                    ("load λ·(prompt + output)", f"{stability['load_tokens_per_s']:.0f} tokens/s"),
                    (
                        "with ideal prefix cache",
                        f"{stability['load_tokens_per_s_ideal_cache']:.0f} tokens/s",
                    ),
                    (
                        f"capacity x {stability['workers']}",
                        f"{stability['capacity_tokens_per_s']:.0f} tokens/s",
                    ),
                    ("utilization", f"{stability['utilization']:.1%}: {verdict}"),
                    ("max arrival rate", f"{stability['max_arrival_rate_per_s']:.3g} calls/s"),
                ],
            )
        )
    return views


def _table(headers: tuple[str, str], rows: list[tuple[str, str]]) -> RenderableType:
    from rich.table import Table

    table = Table(*headers, title_justify="left")
    for left, right in rows:
        table.add_row(left, right)
    return table
