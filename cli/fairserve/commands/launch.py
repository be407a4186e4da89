"""``fairserve launch``: one command brings up workers and the fair router.

Without options it runs the embedded default: two simulated workers (the shipped profile),
policy dlpm, dispatch doubleq, on 127.0.0.1:8000. The engine is picked for the user (SGLang
when NVML finds GPUs and SGLang is installed, else the simulator, with a notice saying why).
``--detach`` leaves a background supervisor running; ``fairserve status`` and ``fairserve
stop`` find it through the run file. Heavy imports happen inside the command.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from fairserve.commands.options import registry_option
from fairserve.commands.output import Output

if TYPE_CHECKING:
    from fairserve.cluster.plan import LaunchOptions

ENGINES = ("sim", "sglang")
"""``fairserve.cluster.engine.ENGINES`` (kept equal by a test)."""


def _check_engine(value: str | None) -> str | None:
    if value is not None and value not in ENGINES:
        raise typer.BadParameter(f"expected one of: {', '.join(ENGINES)}, got {value!r}")
    return value


def launch(
    engine: Annotated[
        str | None,
        typer.Option(
            "--engine",
            metavar="ENGINE",
            help="sim or sglang (default: sglang when GPUs and SGLang are found, else sim).",
            callback=_check_engine,
            autocompletion=lambda: list(ENGINES),
            show_default=False,
        ),
    ] = None,
    workers: Annotated[int, typer.Option("--workers", min=1, help="Local workers to start.")] = 2,
    gpus: Annotated[
        str | None,
        typer.Option("--gpus", metavar="IDS", help="GPU ids for SGLang workers, e.g. 0,1."),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option("--model", help="Model to serve (required by sglang; sim: name shown)."),
    ] = None,
    policy: Annotated[
        str, registry_option("policy", "Local scheduling policy of the workers.")
    ] = "dlpm",
    dispatch: Annotated[
        str, registry_option("dispatcher", "Dispatcher placing requests on workers.")
    ] = "doubleq",
    quantum: Annotated[
        float | None, typer.Option("--quantum", help="Local quantum Q^u (workers' policy).")
    ] = None,
    worker_quantum: Annotated[
        float | None,
        typer.Option("--worker-quantum", help="Dispatcher quantum Q^w (doubleq; inf ok)."),
    ] = None,
    profile: Annotated[
        str | None,
        typer.Option("--profile", help="Sim workers' batch-time profile: a name or a TOML file."),
    ] = None,
    clients: Annotated[
        str | None,
        typer.Option("--clients", metavar="FILE", help="Clients file (TOML: API keys, weights)."),
    ] = None,
    host: Annotated[str, typer.Option("--host", help="Address the router binds.")] = "127.0.0.1",
    port: Annotated[
        int, typer.Option("--port", min=0, max=65535, help="Router port (0: any free port).")
    ] = 8000,
    worker_url: Annotated[
        list[str] | None,
        typer.Option(
            "--worker-url",
            metavar="URL",
            help="Front a worker started elsewhere (repeatable; no local workers then).",
            show_default=False,
        ),
    ] = None,
    detach: Annotated[
        bool, typer.Option("--detach", help="Run in the background; print the router URL.")
    ] = False,
    record: Annotated[
        str | None,
        typer.Option("--record", metavar="TRACE", help="Record a request trace (JSON lines)."),
    ] = None,
    speed: Annotated[
        float, typer.Option("--speed", help="Sim workers: simulated seconds per wall second.")
    ] = 1.0,
    ready_timeout: Annotated[
        float,
        typer.Option("--ready-timeout", help="Seconds each worker has to become healthy."),
    ] = 60.0,
    json_output: Annotated[
        bool, typer.Option("--json", help="With --detach: print the run info as JSON.")
    ] = False,
    supervise: Annotated[
        str | None, typer.Option("--supervise", hidden=True, metavar="RUNDIR")
    ] = None,
) -> None:
    """Start workers and the fair router (foreground; --detach to background).

    Workers are restarted with backoff if they crash; Ctrl-C or SIGTERM stops everything
    cleanly. The run file (router URL, admin token, workers) lets status, stop, top and
    tune find the service. With --detach, prints the router URL and returns once it serves.
    """
    from fairserve.cluster.plan import LaunchOptions

    if supervise is not None:
        from fairserve.cluster.run import run_detached_child

        run_detached_child(Path(supervise))
        return
    options = LaunchOptions(
        engine=engine, workers=workers, gpus=gpus, model=model, policy=policy,
        dispatch=dispatch, quantum=quantum, worker_quantum=worker_quantum,
        profile=profile, clients=clients, host=host, port=port,
        worker_urls=list(worker_url or []), record=record, speed=speed,
        ready_timeout_s=ready_timeout,
    )  # fmt: skip
    out = Output(json_mode=json_output)
    if detach:
        _detach(options, out)
        return
    from fairserve.cluster.run import run_foreground

    run_foreground(options, out.note)


def _detach(options: LaunchOptions, out: Output) -> None:
    """Validate here (errors print directly), then start the background supervisor."""
    from fairserve.cluster.detach import SupervisorFailed, start_detached
    from fairserve.cluster.plan import build_plan

    plan = build_plan(options)
    if plan.notice:
        out.note(plan.notice)
    try:
        info = start_detached(options)
    except SupervisorFailed as exc:
        sys.stderr.write(f"fairserve: error: {exc}\n")
        raise typer.Exit(exc.exit_code) from None
    out.data({"router_url": info.router_url, "supervisor_pid": info.supervisor_pid,
              "run_dir": info.run_dir, "workers": [w.url for w in info.workers]})  # fmt: skip
    if not out.json_mode:
        typer.echo(info.router_url)
    out.note(f"fairserve is running in the background (logs in {info.run_dir}); "
             "fairserve status shows it, fairserve stop stops it")  # fmt: skip
