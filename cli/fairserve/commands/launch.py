"""``fairserve launch``: one command brings up workers and the fair router.

Without options it runs the embedded default: two simulated workers (the shipped profile),
policy dlpm, dispatch doubleq, on 127.0.0.1:8000. The engine is picked for the user (SGLang
when NVML finds GPUs and SGLang is installed, else the simulator, with a notice saying why).
``--detach`` leaves a background supervisor running; ``fairserve status`` and ``fairserve
stop`` find it through the run file. Heavy imports happen inside the command.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from fairserve.commands import options as opts
from fairserve.commands.options import registry_option
from fairserve.commands.output import Output
from fairserve.core.defaults import ENGINES

if TYPE_CHECKING:
    from fairserve.cluster.options import LaunchOptions
    from fairserve.cluster.plan import LaunchPlan


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
    workers: Annotated[
        int | None,
        typer.Option(
            "--workers",
            min=1,
            help="Local workers to start (sim: 2; sglang: one per --tp GPUs).",
            show_default=False,
        ),
    ] = None,
    gpus: Annotated[
        str | None,
        typer.Option(
            "--gpus", metavar="IDS", help="GPU ids for SGLang workers, e.g. 0,1 (default: all)."
        ),
    ] = None,
    tp: Annotated[
        int, typer.Option("--tp", min=1, help="GPUs per SGLang worker (tensor parallelism).")
    ] = 1,
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
    worker_quantum: opts.WorkerQuantum = None,
    profile: Annotated[
        str | None,
        opts.profile_option("Sim workers' batch-time profile: a name or a TOML file."),
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
    ray: Annotated[
        str | None,
        typer.Option(
            "--ray",
            metavar="ADDRESS",
            help="Place the workers on the Ray cluster at HOST:PORT (auto: RAY_ADDRESS or "
            "the one started on this host).",
            show_default=False,
        ),
    ] = None,
    gpus_per_worker: Annotated[
        int | None,
        typer.Option(
            "--gpus-per-worker",
            min=0,
            help="With --ray and sim workers: logical GPUs each reserves (default 1).",
            show_default=False,
        ),
    ] = None,
    trust_identity_header: opts.TrustIdentityHeader = False,
    queue_cap: opts.QueueCap = opts.DEFAULT_QUEUE_CAP,
    total_cap: opts.TotalCap = opts.DEFAULT_TOTAL_CAP,
    max_body_bytes: opts.MaxBodyBytes = opts.DEFAULT_MAX_BODY_BYTES,
    router_queue: opts.RouterQueue = "auto",
    max_outstanding_per_worker: opts.MaxOutstandingPerWorker = opts.DEFAULT_MAX_OUTSTANDING,
    metrics_max_clients: opts.MetricsMaxClients = opts.DEFAULT_METRICS_MAX_CLIENTS,
    drain_timeout: opts.DrainTimeout = opts.DEFAULT_DRAIN_TIMEOUT_S,
    request_timeout: opts.RequestTimeout = opts.DEFAULT_REQUEST_TIMEOUT_S,
    first_byte_timeout: opts.FirstByteTimeout = opts.DEFAULT_FIRST_BYTE_TIMEOUT_S,
    stall_timeout: opts.StallTimeout = opts.DEFAULT_STALL_TIMEOUT_S,
    queue_timeout: opts.QueueTimeout = opts.DEFAULT_QUEUE_TIMEOUT_S,
    outlier_failures: opts.OutlierFailures = opts.DEFAULT_OUTLIER_FAILURES,
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
        float | None,
        typer.Option(
            "--ready-timeout",
            help="Seconds each worker has to become healthy (sim: 60; sglang: 900).",
            show_default=False,
        ),
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Print the worker commands and environment; start nothing."),
    ] = False,
    json_output: Annotated[
        bool, typer.Option("--json", help="With --detach or --dry-run: print JSON.")
    ] = False,
    supervise: Annotated[
        str | None, typer.Option("--supervise", hidden=True, metavar="RUNDIR")
    ] = None,
    sglang_args: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="[-- SGLANG_ARGS...]",
            help="Extra arguments for every sglang.launch_server (after --).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Start workers and the fair router (foreground; --detach to background).

    Workers are restarted with backoff if they crash; Ctrl-C or SIGTERM stops everything
    cleanly. The run file (router URL, admin token, workers) lets status, stop, top and
    tune find the service. With --detach, prints the router URL and returns once it serves.

    With --engine sglang, one SGLang server runs per group of --tp GPUs (--gpus, default
    all), each with the fairserve plugin running --policy inside its scheduler and the
    fairserve extension on a side port; arguments after -- go to every server.
    --dry-run prints the exact commands and environment instead.

    With --ray ADDRESS the workers run on a Ray cluster (docs/ray.md): one placement group
    and one actor per worker, spread over the nodes by free GPUs (--tp for SGLang,
    --gpus-per-worker for sim); the router runs here. --dry-run then shows each worker's
    node and GPU count.
    """
    from fairserve.cluster.options import LaunchOptions
    from fairserve.cluster.plan import default_ready_timeout_s
    from fairserve.commands import logs

    logs.configure("fairserve launch")  # the router's ejections, timestamped, in the logs
    if supervise is not None:
        from fairserve.cluster.run import run_detached_child

        run_detached_child(Path(supervise))
        return
    if ready_timeout is None:
        ready_timeout = default_ready_timeout_s(engine, model)
    options = LaunchOptions(
        engine=engine, workers=workers, gpus=gpus, tp=tp, model=model, policy=policy,
        dispatch=dispatch, quantum=quantum, worker_quantum=worker_quantum,
        profile=profile, clients=clients, host=host, port=port,
        worker_urls=list(worker_url or []), record=record, speed=speed,
        ready_timeout_s=ready_timeout, sglang_args=list(sglang_args or []),
        queue_cap=queue_cap, total_cap=total_cap, max_body_bytes=max_body_bytes,
        router_queue=router_queue,
        max_outstanding_per_worker=max_outstanding_per_worker,
        metrics_max_clients=metrics_max_clients, drain_timeout_s=drain_timeout,
        trust_identity_header=trust_identity_header, request_timeout_s=request_timeout,
        first_byte_timeout_s=first_byte_timeout, stall_timeout_s=stall_timeout,
        queue_timeout_s=queue_timeout,
        outlier_failures=outlier_failures, ray_address=ray, gpus_per_worker=gpus_per_worker,
    )  # fmt: skip
    out = Output(json_mode=json_output)
    if dry_run:
        _dry_run(options, out)
        return
    if detach:
        _detach(options, out)
        return
    from fairserve.cluster.run import run_foreground

    run_foreground(options, out.note)


def _detach(options: LaunchOptions, out: Output) -> None:
    """Validate here (errors print directly), then start the background supervisor."""
    from fairserve.cluster.detach import SupervisorFailed, start_detached
    from fairserve.cluster.plan import build_plan
    from fairserve.cluster.runfile import refuse_if_running

    refuse_if_running()
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


def _dry_run(options: LaunchOptions, out: Output) -> None:
    """Plan as a launch would, print it, start nothing (any machine: SGLang not required)."""
    from fairserve.cluster.engine import sglang_installed
    from fairserve.cluster.plan import build_plan

    plan = build_plan(options, dry_run=True)
    if plan.notice:
        out.note(plan.notice)
    if plan.engine == "sglang" and not sglang_installed():
        out.warn("SGLang is not installed here; the commands need pip install 'fairserve[sglang]'")
    description = describe_plan(plan)
    out.data(description)
    if not out.json_mode:
        out.stdout.write(_as_shell(description))
        out.stdout.flush()


def describe_plan(plan: LaunchPlan) -> dict[str, Any]:
    """``--dry-run --json``: the workers' commands and environment, and the router."""
    from fairserve.cluster.workers import describe
    from fairserve.router.identity import auth_mode

    cfg = plan.router
    placed: dict[str, Any] = {}
    if plan.ray is not None:
        from fairserve.cluster.ray_fleet import describe_placement

        placed = describe_placement(plan.ray)
    return {
        "engine": plan.engine,
        "workers": placed.get("workers") or [describe(spec) for spec in plan.workers],
        "remote_workers": list(plan.remote_urls),
        "router": {
            "url": f"http://{cfg.host}:{cfg.port}",
            "policy": cfg.policy,
            "dispatch": cfg.dispatch,
            "quantum": cfg.quantum,
            "worker_quantum": cfg.worker_quantum,
            "worker_urls": [w["url"] for w in placed["workers"]]
            if placed
            else list(cfg.worker_urls),
            "extension_urls": plan.extension_urls,
            "queue_cap": cfg.queue_cap,
            "total_cap": cfg.total_cap,
            "max_body_bytes": cfg.max_body_bytes,
            "router_queue": cfg.router_queue,
            "max_outstanding_per_worker": cfg.max_outstanding_per_worker,
            "metrics_max_clients": cfg.metrics_max_clients,
            "drain_timeout_s": cfg.drain_timeout_s,
            "request_timeout_s": cfg.request_timeout_s,
            "first_byte_timeout_s": cfg.first_byte_timeout_s,
            "stall_timeout_s": cfg.stall_timeout_s,
            "queue_timeout_s": cfg.queue_timeout_s,
            "outlier_failures": cfg.outlier_failures,
            "settings_file": cfg.settings_path,
            "auth_mode": auth_mode(cfg.clients, cfg.trust_identity_header),
        },
        "ready_timeout_s": plan.ready_timeout_s,
        **({"ray": {k: placed[k] for k in ("ray_address", "nodes")}} if placed else {}),
    }


def _as_shell(description: dict[str, Any]) -> str:
    """One copy-pastable ``env ... command`` line per worker, then the router."""
    lines = []
    for worker in description["workers"]:
        if "node" in worker:  # --ray: the node it is placed on; GPU ids come from Ray there
            where = (
                f"node {worker['node_address']} ({worker['node'][:8]}), {worker['gpus']} GPU(s), "
                f"{worker['url']} (port 0: picked free on the node at start)"
            )
        else:
            gpus = ",".join(map(str, worker["gpus"]))
            where = f"{worker['url']}" + (f", GPUs {gpus}" if gpus else "")
        if worker["extension_url"] != worker["url"]:
            where += f", fairserve extension {worker['extension_url']}"
        lines.append(f"# {worker['name']}: {where}")
        assignments = [f"{k}={shlex.quote(v)}" for k, v in worker["env"].items()]
        unset = [f"-u {name}" for name in worker["unset_env"]]
        lines.append(" ".join(["env", *unset, *assignments, shlex.join(worker["argv"])]))
    router = description["router"]
    if "ray" in description:
        lines.insert(0, f"# Ray cluster {description['ray']['ray_address']}")
    lines.append(
        f"# router (in this process): {router['url']}, policy {router['policy']}, "
        f"dispatch {router['dispatch']}, workers {' '.join(router['worker_urls'])}"
    )
    return "\n".join(lines) + "\n"
