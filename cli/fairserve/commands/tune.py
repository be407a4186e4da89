"""``fairserve tune``: the quantum and the clients' weights, live or in the simulator.

``tune quantum`` has four modes, picked by what is given: nothing (show Q^u, Q^w and the
service-gap bounds they imply), ``Q [--worker QW]`` (set them live), ``--auto`` (search for
the largest Q^u that meets a fairness target while traffic flows) and ``--sweep`` (replay a
workload or a recorded trace in the simulator for a grid of quanta). ``tune weight`` shows
or changes a client's weight live.

The live modes talk to the router in the run file ``launch`` wrote (or ``--url``); an
unreachable router exits 3, a refused admin token 1, a bad value 2. Heavy imports (the
simulator, rich) happen inside the functions so that ``--help`` stays fast; the logic lives
in :mod:`fairserve.tuning`, the tables in :mod:`fairserve.tuning.render`.
"""

from __future__ import annotations

import inspect
import math
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from fairserve.commands import options as opts
from fairserve.commands.errors import ExitCode
from fairserve.commands.options import WorkloadSeed, registry_option
from fairserve.commands.output import Output
from fairserve.core.defaults import DEFAULT_PROFILE
from fairserve.core.errors import ConfigError, FairserveError
from fairserve.tuning import defaults as tuner

if TYPE_CHECKING:
    from fairserve.api.admin_client import AdminClient
    from fairserve.tuning.auto import TuneResult
    from fairserve.tuning.sweep import SweepResult

app = typer.Typer(no_args_is_help=True, help="Tune the fairness quantum and client weights.")

Url = Annotated[
    str | None,
    opts.url_option("A router to talk to instead of the one in the run file."),
]
Token = Annotated[
    str | None,
    opts.admin_token_option("--token", "The router's admin token (default: the run file's)."),
]
_GRID_TEXT = f"{tuner.SWEEP_GRID[0]:g}..{tuner.SWEEP_GRID[-1]:g}, x4"
LIVE, AUTO, SWEEP = "Live", "Auto-tune (--auto)", "Sweep (--sweep)"


def _opt(panel: str, flag: str, help_text: str, meta: str | None = None, **kw: Any) -> Any:
    """An option of ``tune quantum`` in its help panel; defaults shown unless they are None."""
    kw.setdefault("show_default", kw.pop("shown", False))
    return typer.Option(flag, metavar=meta, help=help_text, rich_help_panel=panel, **kw)


def _sweep_registry(kind: str, help_text: str) -> Any:
    """A registry-checked option (``commands.options``) shown in the sweep's help panel."""
    option = registry_option(kind, help_text)
    option.rich_help_panel = SWEEP
    return option


def quantum(
    value: Annotated[
        float | None,
        typer.Argument(metavar="Q", help="Set Q^u live to this.", show_default=False),
    ] = None,
    worker: Annotated[float | None, _opt(LIVE, "--worker", "Set Q^w live (inf ok).", "QW")] = None,
    max_request_cost: Annotated[
        float | None,
        _opt(LIVE, "--max-request-cost", "U of the bounds (default: largest request seen).", "U"),
    ] = None,
    auto: Annotated[bool, _opt(AUTO, "--auto", "Auto-tune Q^u to a target.")] = False,
    target_jain: Annotated[
        float | None, _opt(AUTO, "--target-jain", "Jain's index to keep (and --sweep's).", "J")
    ] = None,
    max_gap: Annotated[
        float | None, _opt(AUTO, "--max-gap", "Windowed service gap to stay under.", "TOKENS")
    ] = None,
    min_quantum: Annotated[
        float, _opt(AUTO, "--min-quantum", "Lower bound.", shown=True)
    ] = tuner.DEFAULT_MIN_QUANTUM,
    max_quantum: Annotated[
        float, _opt(AUTO, "--max-quantum", "Upper bound.", shown=True)
    ] = tuner.DEFAULT_MAX_QUANTUM,
    max_step: Annotated[
        float, _opt(AUTO, "--max-step", "Largest factor of one step.", shown=True)
    ] = tuner.DEFAULT_STEP_FACTOR,
    max_steps: Annotated[
        int, _opt(AUTO, "--max-steps", "Most steps.", shown=True)
    ] = tuner.DEFAULT_MAX_STEPS,
    window_s: Annotated[
        float, _opt(AUTO, "--window", "Seconds measured per step.", shown=True)
    ] = 10.0,
    settle_s: Annotated[
        float, _opt(AUTO, "--settle", "Seconds after a change before measuring.", shown=True)
    ] = 2.0,
    dry_run: Annotated[bool, _opt(AUTO, "--dry-run", "Decide but change nothing.")] = False,
    sweep: Annotated[bool, _opt(SWEEP, "--sweep", "Sweep quanta in the simulator.")] = False,
    trace: Annotated[
        Path | None, _opt(SWEEP, "--trace", "A recorded trace to replay.", dir_okay=False)
    ] = None,
    workload: Annotated[
        str | None,
        _opt(
            SWEEP,
            "--workload",
            "A built-in workload or a workload file.",
            "NAME|FILE",
            autocompletion=opts.complete_workload,
        ),
    ] = None,
    grid: Annotated[
        str | None, _opt(SWEEP, "--grid", f"Q^u values (default {_GRID_TEXT}).", "Q,...")
    ] = None,
    worker_grid: Annotated[
        str | None, _opt(SWEEP, "--worker-grid", "Q^w values (inf ok).", "QW,...")
    ] = None,
    policy: Annotated[str, _sweep_registry("policy", "Local policy of the sweep.")] = "dlpm",
    dispatch: Annotated[str, _sweep_registry("dispatcher", "Dispatcher of the sweep.")] = "doubleq",
    workers: Annotated[int, _opt(SWEEP, "--workers", "Simulated workers.", shown=True, min=1)] = 2,
    profile: Annotated[
        str,
        _opt(
            SWEEP,
            "--profile",
            "Batch-time profile (name or file).",
            "NAME|FILE",
            shown=True,
            autocompletion=opts.complete_profile,
        ),
    ] = DEFAULT_PROFILE,
    duration_s: Annotated[
        float | None,
        _opt(
            SWEEP,
            "--duration",
            f"Simulated seconds per setting (default {tuner.SWEEP_DURATION_S:g}).",
        ),
    ] = None,
    seed: WorkloadSeed = None,
    apply: Annotated[bool, _opt(SWEEP, "--apply", "Set the recommended quantum live.")] = False,
    json_output: opts.JsonOutput = False,
    url: Url = None,
    token: Token = None,
) -> None:
    """Show, set, auto-tune or sweep the fairness quantum Q^u (and the per-worker Q^w).

    Without Q: the current Q^u and Q^w and the service-gap bounds they imply, 2·(U + Q^u)
    per worker and 2·|W|·(U + Q^u) across workers, in tokens and in seconds at the workers'
    capacity. With Q (and/or --worker QW): set them live; every worker uses the new Q^u
    from its next batching decision.

    --auto with --target-jain J (or --max-gap TOKENS): watch the router's fairness over
    windows of live traffic, raise Q^u while the target holds and lower it when it breaks,
    within the bounds, until it settles on the largest Q^u that meets the target. Ctrl-C
    puts the last good value back.

    --sweep with --workload or --trace: replay the traffic in the simulator for each Q^u
    of --grid (times each Q^w of --worker-grid); print throughput, Jain's index, the
    well-behaved clients' p99 latency and the cache hit rate, mark the Pareto front and
    recommend the highest throughput that meets --target-jain (default 0.9); --apply sets
    it live.
    """
    out = Output(json_mode=json_output)
    modes = [m for m, on in (("Q", value is not None or worker is not None), ("--auto", auto),
                              ("--sweep", sweep)) if on]  # fmt: skip
    if len(modes) > 1:
        raise ConfigError(f"{' and '.join(modes)} cannot be combined: pick one mode")
    if apply and not sweep:
        raise ConfigError("--apply goes with --sweep")
    cost = max_request_cost
    if cost is not None and not (cost > 0 and math.isfinite(cost)):
        raise ConfigError(f"--max-request-cost: expected a positive number, got {cost:g}")
    if sweep:
        _sweep(out, trace, workload, grid, worker_grid, policy, dispatch, workers, profile,
               duration_s, seed, target_jain, apply, url, token)  # fmt: skip
        return
    with _reaching():
        if auto:
            _auto(out, target_jain, max_gap, (min_quantum, max_quantum, max_step, max_steps),
                  (window_s, settle_s), dry_run, url, token)  # fmt: skip
        elif modes:
            _set(out, _connect(url, token), value, worker, max_request_cost)
        else:
            _show(out, _connect(url, token), max_request_cost)


def weight(
    client: Annotated[
        str | None, typer.Argument(metavar="CLIENT", help="The client's name.", show_default=False)
    ] = None,
    value: Annotated[
        float | None,
        typer.Argument(metavar="W", help="Its new weight (> 0).", show_default=False),
    ] = None,
    create: Annotated[
        bool,
        typer.Option(
            "--create",
            help="Set the weight of a client the router does not know yet (else an error, "
            "so a typo does not silently create a client).",
        ),
    ] = False,
    json_output: opts.JsonOutput = False,
    url: Url = None,
    token: Token = None,
) -> None:
    """Show the clients' weights, or change CLIENT's weight to W live.

    A client with weight 2 is entitled to twice the service of a client with weight 1. The
    router applies the change in its dispatcher, its fair queues and its accounting (the
    Jain index and service rates are weight-normalised), and pushes it to workers that
    support it; workers that do not are listed. A CLIENT the router has neither configured
    nor seen is an error unless --create is given.
    """
    out = Output(json_mode=json_output)
    if value is not None and not (value > 0 and math.isfinite(value)):
        raise ConfigError(f"W: expected a positive finite weight, got {value:g}")
    from fairserve.tuning import render

    with _reaching():
        router = _connect(url, token)
        if value is not None:
            router.require_token("changing a weight")
        before = router.weights()
        if client is None or value is None:
            weights = before.get("weights", {})
            shown = weights if client is None else {client: weights.get(client, 1.0)}
            out.data({"router": router.url, "weights": shown, "changed": before.get("changed")})
            out.render(render.weights_table(shown))
            return
        known = before.get("weights", {})
        if client not in known and not create:
            names = ", ".join(sorted(known)) or "none yet"
            raise FairserveError(
                f"unknown client {client!r} (the router knows: {names}); check the name, or "
                "pass --create to set the weight of a client not seen yet"
            )
        result = router.set_weight(client, value)
    out.data({"router": router.url, **result})
    out.render(render.weight_change(result))
    unsupported = [u for u, outcome in result.get("workers", {}).items() if outcome != "ok"]
    if unsupported:
        out.warn(
            "these workers kept their own weights (no weights endpoint, or refused): "
            + ", ".join(f"{u} ({result['workers'][u]})" for u in unsupported)
        )


# ---------------------------------------------------------------------- live modes
def _show(out: Output, router: AdminClient, max_request_cost: float | None) -> None:
    from fairserve.tuning import render
    from fairserve.tuning.bounds import quantum_report

    view = router.quantum()
    report = quantum_report(router.url, view, router.state(), max_request_cost)
    out.data(report)
    out.render(*render.quantum_view(report))


def _set(
    out: Output,
    router: AdminClient,
    value: float | None,
    worker: float | None,
    max_request_cost: float | None,
) -> None:
    from fairserve.tuning import render
    from fairserve.tuning.bounds import quantum_report

    if value is not None and not (value > 0 and math.isfinite(value)):
        raise ConfigError(f"Q: expected a positive finite quantum, got {value:g}")
    if worker is not None and not worker > 0:
        raise ConfigError(f"--worker: expected a positive quantum or inf, got {worker:g}")
    router.require_token("setting the quantum")
    before = router.quantum()
    after = router.set_quantum(value, worker)
    report = quantum_report(router.url, after, router.state(), max_request_cost)
    out.data({"before": before, **report})
    out.render(render.before_after(before, after), *render.quantum_view(report)[1:])
    errors = after.get("worker_errors") or []
    if errors:
        raise FairserveError("these workers did not take the new Q^u: " + "; ".join(errors))


def _auto(
    out: Output,
    target_jain: float | None,
    max_gap: float | None,
    limits: tuple[float, float, float, int],
    timing: tuple[float, float],
    dry_run: bool,
    url: str | None,
    token: str | None,
) -> None:
    from fairserve.tuning import render
    from fairserve.tuning.auto import AutoTuner
    from fairserve.tuning.controller import Target, TunerConfig

    config = TunerConfig(Target(target_jain, max_gap), *limits[:3], max_steps=int(limits[3]))
    router = _connect(url, token)
    if not dry_run:
        router.require_token("setting the quantum")  # now, not after minutes of measuring
    with render.DecisionLog(out.stderr, config) as log:
        tuner = AutoTuner(router, config, window_s=timing[0], settle_s=timing[1],
                          dry_run=dry_run, on_decision=log.add)  # fmt: skip
        result = tuner.run()
    out.data({"router": router.url, "target": config.target.describe(), **result.to_json()})
    out.render(render.tune_summary(result, config))
    _finish_auto(out, result)


def _finish_auto(out: Output, result: TuneResult) -> None:
    if result.worker_errors:
        out.warn("workers that refused a quantum: " + "; ".join(result.worker_errors))
    if result.interrupted:
        state = "left" if result.applied else "unchanged (dry run):"
        out.note(f"interrupted: Q^u {state} at {result.final:g}")
        raise typer.Exit(ExitCode.INTERRUPT)
    if all(d.met is None for d in result.decisions):
        out.warn("no window had two backlogged clients: nothing to judge, Q^u unchanged")
        return
    if not any(d.met for d in result.decisions):
        raise FairserveError(
            f"no quantum met the target; Q^u is at {result.final:g}, the fairest one tried"
        )


# ---------------------------------------------------------------------- sweep
def _sweep(
    out: Output,
    trace: Path | None,
    workload: str | None,
    grid: str | None,
    worker_grid: str | None,
    policy: str,
    dispatch: str,
    workers: int,
    profile: str,
    duration_s: float | None,
    seed: int | None,
    target_jain: float | None,
    apply: bool,
    url: str | None,
    token: str | None,
) -> None:
    from fairserve.sim.compare import Bench, RunSpec
    from fairserve.sim.profile import resolve_profile
    from fairserve.tuning import render, sweep
    from fairserve.workloads import load_trace, resolve_workload

    if (trace is None) == (workload is None):
        raise ConfigError("--sweep needs one of --trace FILE or --workload NAME|FILE")
    if duration_s is not None and not 0 < duration_s < math.inf:
        raise ConfigError(f"--duration: expected a positive number of seconds, got {duration_s}")
    quanta = sweep.parse_grid(grid, "--grid") if grid else list(tuner.SWEEP_GRID)
    wq = sweep.parse_grid(worker_grid, "--worker-grid", allow_inf=True) if worker_grid else None
    target = tuner.SWEEP_TARGET_JAIN if target_jain is None else target_jain
    router = _connect_checked(url, token) if apply else None
    loaded = load_trace(trace) if trace is not None else resolve_workload(str(workload))
    span = duration_s or min(tuner.SWEEP_DURATION_S, loaded.duration_s)
    bench = Bench(loaded, resolve_profile(profile), workers=workers,
                  duration_s=span, seed=seed)  # fmt: skip
    settings = sweep.settings(quanta, wq)
    with render.SweepProgress(out.stderr, len(settings), span, enabled=not out.json_mode) as bar:
        result = sweep.run_sweep(bench, RunSpec(policy, dispatch), settings, target, bar.update)
    data: dict[str, Any] = result.to_json()
    if router is not None:
        data["applied"] = _apply(router, result)
    out.data(data)
    out.render(*render.sweep_view(result))
    if router is not None:
        out.note(f"applied on {router.url}: Q^u {data['applied']['quantum']:g}")


def _apply(router: AdminClient, result: SweepResult) -> dict[str, Any]:
    best = result.recommended
    if best is None:
        raise FairserveError("nothing to apply: the sweep has no rows")
    with _reaching():
        view = router.set_quantum(best.setting.quantum, best.setting.worker_quantum)
    if view.get("worker_errors"):
        raise FairserveError("workers did not take Q^u: " + "; ".join(view["worker_errors"]))
    return dict(view)


# ---------------------------------------------------------------------- plumbing
def _connect(url: str | None, token: str | None) -> AdminClient:
    from fairserve.tuning.client import connect

    return connect(url, token)


def _connect_checked(url: str | None, token: str | None) -> AdminClient:
    """For --apply: the router must answer before the sweep spends its time."""
    with _reaching():
        router = _connect(url, token)
        router.quantum()
    return router


@contextmanager
def _reaching() -> Iterator[None]:
    """No router (nothing launched, or it does not answer): exit 3, like ``status``."""
    from fairserve.cluster.errors import NotRunning
    from fairserve.tuning.client import RouterUnreachable

    try:
        yield
    except (RouterUnreachable, NotRunning) as exc:
        sys.stderr.write(f"fairserve: error: {exc}\n")
        raise typer.Exit(ExitCode.UNAVAILABLE) from None


def _reflow(func: Callable[..., None]) -> str:
    """The docstring as help with paragraphs reflowed (Typer keeps single line breaks)."""
    paragraphs = inspect.cleandoc(func.__doc__ or "").split("\n\n")
    return "\n\n".join(" ".join(p.split()) for p in paragraphs)


app.command("quantum", help=_reflow(quantum))(quantum)
app.command("weight", help=_reflow(weight))(weight)
