"""From ``launch``'s options to a validated plan: worker commands, ports, router config.

Everything that can be wrong with the command line is checked here, *before* any process
starts: a bad profile, policy, quantum or clients file, a busy router port. So a failed
``launch`` leaves nothing running, and ``--detach`` can report the error itself instead of
pointing the user at a background log.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from fairserve.cluster.engine import check_sglang, detect, parse_gpu_ids
from fairserve.cluster.options import LaunchOptions
from fairserve.cluster.paths import settings_file_path
from fairserve.cluster.worker_spec import (
    SIM_WORKERS,
    WorkerSpec,
    check_worker_policy,
    model_arg,
    profile_arg,
    sglang_config,
    sglang_only_options,
    sglang_spec,
    sglang_specs,
    sim_spec,
    sim_specs,
)
from fairserve.core.errors import ConfigError
from fairserve.router.config import RouterConfig, check_url, load_clients
from fairserve.router.server import bind
from fairserve.router.service import Router

SIM_READY_TIMEOUT_S = 60.0
SGLANG_READY_TIMEOUT_S = 900.0
"""SGLang loads the weights and captures CUDA graphs before ``/health`` answers."""


@dataclass(frozen=True)
class RayPlan:
    """``--ray``: ``workers`` workers (None: as many as the cluster's free GPUs hold) of
    ``gpus_per_worker`` GPUs each, placed on the Ray cluster at ``address`` when the launch
    starts. Each worker's command is built on its node, once its address, ports and GPUs
    are known, by :meth:`spec`: the same builders a local launch uses."""

    address: str
    engine: str
    workers: int | None
    gpus_per_worker: int
    options: LaunchOptions

    @property
    def ports_per_worker(self) -> int:
        """SGLang serves the fairserve extension on a second port."""
        return 2 if self.engine == "sglang" else 1

    def spec(
        self, index: int, host: str, ports: Sequence[int], gpus: tuple[int, ...]
    ) -> WorkerSpec:
        name = f"worker-{index}"
        if self.engine == "sglang":
            config = sglang_config(self.options)
            return sglang_spec(
                self.options, config, model_arg(self.options.model), name, host, ports, gpus
            )
        return sim_spec(self.options, profile_arg(self.options.profile), name, host, ports[0], gpus)

    def placeholder_urls(self) -> tuple[str, ...]:
        """Stand-ins that let the router's configuration be checked before placement."""
        return tuple(f"http://worker-{i}.ray.invalid:1" for i in range(self.workers or 1))


@dataclass(frozen=True)
class LaunchPlan:
    engine: str
    notice: str | None
    workers: tuple[WorkerSpec, ...]
    remote_urls: tuple[str, ...]
    router: RouterConfig
    ready_timeout_s: float
    ray: RayPlan | None = None
    """``--ray``: the workers are placed on a Ray cluster at start (``workers`` is empty;
    ``router.worker_urls`` are placeholders until the workers report their URLs)."""

    @property
    def extension_urls(self) -> dict[str, str]:
        """Worker URL → extension URL, for workers that serve it on a side port (SGLang).
        The router needs it to read state, quanta and evictions there."""
        return {w.url: w.extension_url for w in self.workers if w.extension_port is not None}


def build_plan(options: LaunchOptions, dry_run: bool = False) -> LaunchPlan:
    """Validate ``options`` and pick ports; raises ConfigError/FairserveError, starts nothing.

    ``dry_run`` (``launch --dry-run``) plans without requiring SGLang on this machine and
    without checking that the router's port is free: it only shows what would run."""
    _check_numbers(options)
    if options.record is not None:
        check_record_path(options.record)
    remote = tuple(check_url(u) for u in options.worker_urls)
    ray = _ray_plan(options, remote)
    engine, notice = (ray.engine, None) if ray else _engine(options, remote, dry_run)
    if remote or ray:
        specs: tuple[WorkerSpec, ...] = ()
    elif engine == "sglang":
        specs = sglang_specs(options)
    else:
        specs = sim_specs(options)
    keys, weights = load_clients(options.clients) if options.clients else ({}, {})
    router = RouterConfig(
        worker_urls=remote
        or tuple(s.url for s in specs)
        or (ray.placeholder_urls() if ray else ()),
        host=options.host,
        port=options.port,
        dispatch=options.dispatch,
        policy=options.policy,
        quantum=options.quantum,
        worker_quantum=options.worker_quantum,
        clients=keys,
        weights=weights,
        admin_token=secrets.token_urlsafe(32),
        trace_path=options.record,
        extension_urls={s.url: s.extension_url for s in specs if s.extension_port is not None},
        queue_cap=options.queue_cap,
        total_cap=options.total_cap,
        max_body_bytes=options.max_body_bytes,
        router_queue=options.router_queue,  # type: ignore[arg-type]  # the config checks it
        max_outstanding_per_worker=options.max_outstanding_per_worker,
        metrics_max_clients=options.metrics_max_clients,
        drain_timeout_s=options.drain_timeout_s,
        trust_identity_header=options.trust_identity_header,
        settings_path=str(settings_file_path()),
        request_timeout_s=options.request_timeout_s,
        first_byte_timeout_s=options.first_byte_timeout_s,
        stall_timeout_s=options.stall_timeout_s,
        queue_timeout_s=options.queue_timeout_s,
        outlier_failures=options.outlier_failures,
    )
    Router(router)  # validates policy/dispatcher names and quanta; starts nothing
    if not dry_run:
        check_port_free(options.host, options.port)
    return LaunchPlan(engine, notice, specs, remote, router, options.ready_timeout_s, ray)


def default_ready_timeout_s(engine: str | None, model: str | None) -> float:
    """How long a worker may take to answer ``/health`` when ``--ready-timeout`` is not
    given: SGLang loads weights and captures CUDA graphs first (minutes for large models)."""
    if engine is None and model:
        engine = detect(model).engine
    return SGLANG_READY_TIMEOUT_S if engine == "sglang" else SIM_READY_TIMEOUT_S


def _check_numbers(options: LaunchOptions) -> None:
    if options.workers is not None and options.workers < 1:
        raise ConfigError(f"--workers: expected a positive integer, got {options.workers}")
    if options.tp < 1:
        raise ConfigError(f"--tp: expected a positive integer, got {options.tp}")
    if not options.speed > 0:
        raise ConfigError(f"--speed: expected a positive number, got {options.speed}")
    if not options.ready_timeout_s > 0:
        raise ConfigError(
            f"--ready-timeout: expected a positive number, got {options.ready_timeout_s}"
        )
    if options.gpus is not None:
        parse_gpu_ids(options.gpus)


def _ray_plan(options: LaunchOptions, remote: tuple[str, ...]) -> RayPlan | None:
    """``--ray``'s options, checked; None without ``--ray``.

    The engine is never detected from *this* host's GPUs (they are not the ones that will
    run it): SGLang when ``--model`` is given, else the simulator, unless ``--engine`` says."""
    if options.ray_address is None:
        if options.gpus_per_worker is not None:
            raise ConfigError("--gpus-per-worker: applies to --ray (workers on a Ray cluster)")
        return None
    if remote:
        raise ConfigError("--ray: places the workers itself; drop --worker-url")
    if options.gpus is not None:
        raise ConfigError(
            "--gpus: on a Ray cluster Ray assigns the GPUs; use --tp (sglang) or "
            "--gpus-per-worker (sim) to say how many each worker gets"
        )
    engine = options.engine or ("sglang" if options.model else "sim")
    if engine == "sglang":
        check_sglang(options.model, installed=False)  # SGLang runs on the nodes, not here
        if options.gpus_per_worker is not None:
            raise ConfigError("--gpus-per-worker: SGLang workers get --tp GPUs each")
        sglang_config(options)
        gpus, workers = options.tp, options.workers
    elif engine == "sim":
        if sglang_only_options(options):
            raise ConfigError(
                f"{sglang_only_options(options)[0]}: applies to --engine sglang; use "
                "--gpus-per-worker for the simulated workers' logical GPUs"
            )
        gpus = 1 if options.gpus_per_worker is None else options.gpus_per_worker
        if gpus < 0:
            raise ConfigError(f"--gpus-per-worker: expected 0 or more, got {gpus}")
        check_worker_policy(options, profile_arg(options.profile))
        workers = options.workers or SIM_WORKERS
    else:
        raise ConfigError(f"--engine: expected sim or sglang, got {engine!r}")
    return RayPlan(options.ray_address, engine, workers, gpus, options)


def _engine(
    options: LaunchOptions, remote: tuple[str, ...], dry_run: bool = False
) -> tuple[str, str | None]:
    """The engine, and a notice when it was picked for the user (none for remote workers:
    no local engine runs)."""
    sglang_only = sglang_only_options(options)
    if remote:
        if options.engine == "sglang" or sglang_only:
            raise ConfigError(
                "--worker-url: workers are started elsewhere; drop --engine/"
                + "/".join(sglang_only or ["--gpus"])
            )
        return "remote", None
    engine, notice = options.engine, None
    if engine is None:
        choice = detect(options.model)
        engine, notice = choice.engine, choice.notice
    if engine == "sglang":
        check_sglang(options.model, installed=not dry_run)
        return engine, notice
    if engine != "sim":
        raise ConfigError(f"--engine: expected sim or sglang, got {engine!r}")
    if sglang_only:
        raise ConfigError(
            f"{sglang_only[0]}: applies to --engine sglang; simulated workers use no GPU"
        )
    return engine, notice


def check_record_path(path: str) -> None:
    """``--record TRACE`` must be a file the router can create or overwrite: checked with
    the other options, so a typo fails before any worker starts and names the option (the
    router itself opens it only once the workers are up)."""
    trace = Path(path).expanduser()
    if trace.is_dir():
        raise ConfigError(f"--record {path}: is a directory (give a file, e.g. trace.jsonl)")
    parent = trace.parent
    if not parent.is_dir():
        raise ConfigError(f"--record {path}: directory {parent} does not exist")
    writable = os.access(trace, os.W_OK) if trace.exists() else os.access(parent, os.W_OK)
    if not writable:
        raise ConfigError(f"--record {path}: not writable")


def check_port_free(host: str, port: int) -> None:
    """Fail now, before workers start, when the router's port is taken (bind's message
    says so and suggests another --port)."""
    if port != 0:
        bind(host, port).close()
