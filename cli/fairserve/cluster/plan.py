"""From ``launch``'s options to a validated plan: worker commands, ports, router config.

Everything that can be wrong with the command line is checked here, *before* any process
starts: a bad profile, policy, quantum or clients file, a busy router port. So a failed
``launch`` leaves nothing running, and ``--detach`` can report the error itself instead of
pointing the user at a background log.
"""

from __future__ import annotations

import json
import secrets
import socket
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from fairserve.cluster.engine import check_sglang, detect, gpu_groups, parse_gpu_ids
from fairserve.cluster.paths import settings_file_path
from fairserve.core.errors import ConfigError
from fairserve.router.config import (
    DEFAULT_DRAIN_TIMEOUT_S,
    DEFAULT_FIRST_BYTE_TIMEOUT_S,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_OUTSTANDING,
    DEFAULT_METRICS_MAX_CLIENTS,
    DEFAULT_OUTLIER_FAILURES,
    DEFAULT_QUEUE_CAP,
    DEFAULT_QUEUE_TIMEOUT_S,
    DEFAULT_REQUEST_TIMEOUT_S,
    DEFAULT_STALL_TIMEOUT_S,
    DEFAULT_TOTAL_CAP,
    RouterConfig,
    check_url,
    load_clients,
)
from fairserve.router.server import bind
from fairserve.router.service import Router

if TYPE_CHECKING:
    from fairserve.sglang.config import PluginConfig

WORKER_HOST = "127.0.0.1"
"""Local workers listen on loopback only: the router is the service's one front door."""


@dataclass
class LaunchOptions:
    """``fairserve launch``'s options, as given (JSON-able: the detached supervisor gets
    them in a file)."""

    engine: str | None = None
    workers: int | None = None
    """None: two simulated workers, or one SGLang server per ``tp`` GPUs."""
    gpus: str | None = None
    tp: int = 1
    model: str | None = None
    policy: str = "dlpm"
    dispatch: str = "doubleq"
    quantum: float | None = None
    worker_quantum: float | None = None
    profile: str | None = None
    clients: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    worker_urls: list[str] = field(default_factory=list)
    record: str | None = None
    speed: float = 1.0
    ready_timeout_s: float = 60.0
    """``launch`` passes :func:`default_ready_timeout_s` unless ``--ready-timeout`` is given."""
    sglang_args: list[str] = field(default_factory=list)
    """Extra ``sglang.launch_server`` arguments (after ``--`` on the command line)."""
    queue_cap: int = DEFAULT_QUEUE_CAP
    total_cap: int = DEFAULT_TOTAL_CAP
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    router_queue: str = "auto"
    max_outstanding_per_worker: int = DEFAULT_MAX_OUTSTANDING
    metrics_max_clients: int = DEFAULT_METRICS_MAX_CLIENTS
    drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S
    trust_identity_header: bool = False
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
    first_byte_timeout_s: float = DEFAULT_FIRST_BYTE_TIMEOUT_S
    stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S
    queue_timeout_s: float = DEFAULT_QUEUE_TIMEOUT_S
    outlier_failures: int = DEFAULT_OUTLIER_FAILURES
    ray_address: str | None = None
    """``--ray [ADDRESS]``: place the workers on this Ray cluster (``auto``: ``RAY_ADDRESS``
    or the cluster started on this host); None: workers run on this host."""
    gpus_per_worker: int | None = None
    """``--gpus-per-worker`` (Ray, simulated workers): GPUs each reserves (default 1)."""

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self)), encoding="utf-8")

    @classmethod
    def load(cls, path: Path) -> LaunchOptions:
        return cls(**json.loads(path.read_text(encoding="utf-8")))


SIM_WORKERS = 2
SIM_READY_TIMEOUT_S = 60.0
SGLANG_READY_TIMEOUT_S = 900.0
"""SGLang loads the weights and captures CUDA graphs before ``/health`` answers."""


@dataclass(frozen=True)
class WorkerSpec:
    """One local worker: its name, port, the command that starts it and the environment it
    adds (SGLang: its GPUs and the plugin's settings)."""

    name: str
    port: int
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    extension_port: int | None = None
    """SGLang workers serve the fairserve extension on this side port."""
    gpus: tuple[int, ...] = ()
    host: str = WORKER_HOST
    """Where it listens: loopback here, its node's address on a Ray cluster."""

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def extension_url(self) -> str:
        """Where the fairserve extension answers (the worker URL itself for sim workers)."""
        if self.extension_port is None:
            return self.url
        return f"http://{self.host}:{self.extension_port}"


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
            config = _sglang_config(self.options)
            return sglang_spec(
                self.options, config, _model_arg(self.options.model), name, host, ports, gpus
            )
        return sim_spec(
            self.options, _profile_arg(self.options.profile), name, host, ports[0], gpus
        )

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
    remote = tuple(check_url(u) for u in options.worker_urls)
    ray = _ray_plan(options, remote)
    engine, notice = (ray.engine, None) if ray else _engine(options, remote, dry_run)
    if remote or ray:
        specs: tuple[WorkerSpec, ...] = ()
    elif engine == "sglang":
        specs = _sglang_specs(options)
    else:
        specs = _worker_specs(options)
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
        _sglang_config(options)
        gpus, workers = options.tp, options.workers
    elif engine == "sim":
        if _sglang_only_options(options):
            raise ConfigError(
                f"{_sglang_only_options(options)[0]}: applies to --engine sglang; use "
                "--gpus-per-worker for the simulated workers' logical GPUs"
            )
        gpus = 1 if options.gpus_per_worker is None else options.gpus_per_worker
        if gpus < 0:
            raise ConfigError(f"--gpus-per-worker: expected 0 or more, got {gpus}")
        _check_worker_policy(options, _profile_arg(options.profile))
        workers = options.workers or SIM_WORKERS
    else:
        raise ConfigError(f"--engine: expected sim or sglang, got {engine!r}")
    return RayPlan(options.ray_address, engine, workers, gpus, options)


def _engine(
    options: LaunchOptions, remote: tuple[str, ...], dry_run: bool = False
) -> tuple[str, str | None]:
    """The engine, and a notice when it was picked for the user (none for remote workers:
    no local engine runs)."""
    sglang_only = _sglang_only_options(options)
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


def _sglang_only_options(options: LaunchOptions) -> list[str]:
    """The options given that only an SGLang launch uses."""
    given = []
    if options.gpus is not None:
        given.append("--gpus")
    if options.tp != 1:
        given.append("--tp")
    if options.sglang_args:
        given.append("-- SGLANG_ARGS")
    return given


def _worker_specs(options: LaunchOptions) -> tuple[WorkerSpec, ...]:
    profile = _profile_arg(options.profile)
    ports = free_ports(options.workers or SIM_WORKERS)
    specs = [sim_spec(options, profile, f"worker-{i}", WORKER_HOST, p) for i, p in enumerate(ports)]
    _check_worker_policy(options, profile)
    return tuple(specs)


def sim_spec(
    options: LaunchOptions,
    profile: str | None,
    name: str,
    host: str,
    port: int,
    gpus: tuple[int, ...] = (),
) -> WorkerSpec:
    """One ``fairserve worker`` listening on ``host:port`` (``gpus``: the logical GPUs a
    Ray placement reserved for it, shown by ``status``; a simulated worker uses none)."""
    argv = [sys.executable, "-m", "fairserve", "worker", "--host", host]
    argv += ["--port", str(port), "--policy", options.policy, "--speed", f"{options.speed:g}"]
    argv += ["--profile", profile] if profile else []
    argv += ["--model-name", options.model] if options.model else []
    argv += ["--quantum", f"{options.quantum:g}"] if options.quantum is not None else []
    return WorkerSpec(name, port, tuple(argv), gpus=gpus, host=host)


RESERVED_SGLANG_FLAGS = {
    "--model-path": "--model", "--model": "--model", "--host": "(loopback)",
    "--port": "(a free port)", "--tp-size": "--tp", "--tensor-parallel-size": "--tp",
    "--dp-size": "--gpus/--tp (one server per GPU group)",
    "--dp": "--gpus/--tp (one server per GPU group)",
}  # fmt: skip
"""SGLang flags the launcher sets itself (value: the fairserve option to use instead)."""


def _sglang_specs(options: LaunchOptions) -> tuple[WorkerSpec, ...]:
    """One ``python -m sglang.launch_server`` per GPU group, with the plugin configured.

    ``--schedule-policy lpm`` (unless given after ``--``) makes SGLang match every waiting
    request's prefix before the plugin orders the queue, so the policy's LPM order and
    extend charges see the real cache; ``--enable-metrics`` keeps SGLang's Prometheus
    gauges for ``fairserve top``."""
    config = _sglang_config(options)
    groups = gpu_groups(options.gpus, options.tp, options.workers)
    ports = free_ports(2 * len(groups))
    model = _model_arg(options.model)
    return tuple(
        sglang_spec(
            options, config, model, f"worker-{i}", WORKER_HOST, ports[2 * i : 2 * i + 2], gpus
        )
        for i, gpus in enumerate(groups)
    )


def _sglang_config(options: LaunchOptions) -> PluginConfig:
    """The plugin's configuration, checked (unknown policies, quanta without a quantum)."""
    from fairserve.sglang.config import PluginConfig, build_policy

    _check_sglang_args(options.sglang_args)
    config = PluginConfig(policy=options.policy, quantum=options.quantum)
    build_policy(config)
    return config


def _model_arg(model: str | None) -> str:
    """The model as the servers get it: a local directory made absolute."""
    text = str(model)
    return str(Path(text).resolve()) if Path(text).exists() else text


def sglang_spec(
    options: LaunchOptions,
    config: PluginConfig,
    model: str,
    name: str,
    host: str,
    ports: Sequence[int],
    gpus: tuple[int, ...],
) -> WorkerSpec:
    """One SGLang server on ``host:ports[0]`` with the plugin's extension on ``ports[1]``,
    seeing only ``gpus`` (``CUDA_VISIBLE_DEVICES``): the same for a local launch and for a
    worker a Ray actor starts on its node with the GPUs Ray assigned it."""
    from fairserve.sglang.config import plugin_env
    from fairserve.sglang.targets import LAUNCH_MODULE, launch_flag

    port, extension_port = ports
    argv = [sys.executable, "-m", LAUNCH_MODULE, launch_flag("model_path"), model]
    argv += [launch_flag("host"), host, launch_flag("port"), str(port)]
    argv += [launch_flag("tp_size"), str(options.tp), launch_flag("enable_metrics")]
    if not _has_flag(options.sglang_args, launch_flag("schedule_policy")):
        argv += [launch_flag("schedule_policy"), "lpm"]
    argv += options.sglang_args
    env = {"CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus))}
    env.update(plugin_env(replace(config, extension_port=extension_port, extension_host=host)))
    return WorkerSpec(name, port, tuple(argv), tuple(env.items()), extension_port, gpus, host)


def _check_sglang_args(args: list[str]) -> None:
    for arg in args:
        flag = arg.split("=", 1)[0]
        if flag in RESERVED_SGLANG_FLAGS:
            raise ConfigError(
                f"-- {flag}: fairserve launch sets it for each worker; use "
                f"{RESERVED_SGLANG_FLAGS[flag]} instead"
            )


def _has_flag(args: list[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in args)


def _profile_arg(profile: str | None) -> str | None:
    """The profile as the workers get it: validated here, files made absolute (the workers
    must find the same file whatever their working directory)."""
    if profile is None:
        return None
    from fairserve.sim.profile import resolve_profile

    resolve_profile(profile)
    path = Path(profile)
    return str(path.resolve()) if path.exists() else profile


def _check_worker_policy(options: LaunchOptions, profile: str | None) -> None:
    from fairserve.sim.profile import DEFAULT_PROFILE, resolve_profile
    from fairserve.worker.config import WorkerConfig, build_policy

    config = WorkerConfig(
        profile=resolve_profile(profile or DEFAULT_PROFILE),
        policy=options.policy,
        quantum=options.quantum,
    )
    build_policy(config)


def free_ports(count: int, host: str = WORKER_HOST) -> list[int]:
    """``count`` distinct free ports on ``host`` (held open together so they differ)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind((host, 0))
            sockets.append(sock)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


def check_port_free(host: str, port: int) -> None:
    """Fail now, before workers start, when the router's port is taken (bind's message
    says so and suggests another --port)."""
    if port != 0:
        bind(host, port).close()
