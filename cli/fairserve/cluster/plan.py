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
from dataclasses import asdict, dataclass, field
from pathlib import Path

from fairserve.cluster.engine import check_sglang, detect
from fairserve.core.errors import ConfigError
from fairserve.router.config import RouterConfig, check_url, load_clients
from fairserve.router.server import bind
from fairserve.router.service import Router

WORKER_HOST = "127.0.0.1"
"""Local workers listen on loopback only: the router is the service's one front door."""


@dataclass
class LaunchOptions:
    """``fairserve launch``'s options, as given (JSON-able: the detached supervisor gets
    them in a file)."""

    engine: str | None = None
    workers: int = 2
    gpus: str | None = None
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

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self)), encoding="utf-8")

    @classmethod
    def load(cls, path: Path) -> LaunchOptions:
        return cls(**json.loads(path.read_text(encoding="utf-8")))


@dataclass(frozen=True)
class WorkerSpec:
    """One local worker: its name, port and the command that starts it."""

    name: str
    port: int
    argv: tuple[str, ...]

    @property
    def url(self) -> str:
        return f"http://{WORKER_HOST}:{self.port}"


@dataclass(frozen=True)
class LaunchPlan:
    engine: str
    notice: str | None
    workers: tuple[WorkerSpec, ...]
    remote_urls: tuple[str, ...]
    router: RouterConfig
    ready_timeout_s: float


def build_plan(options: LaunchOptions) -> LaunchPlan:
    """Validate ``options`` and pick ports; raises ConfigError/FairserveError, starts nothing."""
    _check_numbers(options)
    remote = tuple(check_url(u) for u in options.worker_urls)
    engine, notice = _engine(options, remote)
    specs = () if remote else _worker_specs(options)
    keys, weights = load_clients(options.clients) if options.clients else ({}, {})
    router = RouterConfig(
        worker_urls=remote or tuple(s.url for s in specs),
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
    )
    Router(router)  # validates policy/dispatcher names and quanta; starts nothing
    check_port_free(options.host, options.port)
    return LaunchPlan(engine, notice, specs, remote, router, options.ready_timeout_s)


def _check_numbers(options: LaunchOptions) -> None:
    if options.workers < 1:
        raise ConfigError(f"--workers: expected a positive integer, got {options.workers}")
    if not options.speed > 0:
        raise ConfigError(f"--speed: expected a positive number, got {options.speed}")
    if not options.ready_timeout_s > 0:
        raise ConfigError(
            f"--ready-timeout: expected a positive number, got {options.ready_timeout_s}"
        )
    if options.gpus is not None:
        ids = options.gpus.split(",")
        if not all(i.strip().isdigit() for i in ids):
            raise ConfigError(f"--gpus: expected GPU ids like 0,1,2, got {options.gpus!r}")


def _engine(options: LaunchOptions, remote: tuple[str, ...]) -> tuple[str, str | None]:
    """The engine, and a notice when it was picked for the user (none for remote workers:
    no local engine runs)."""
    if remote:
        if options.engine == "sglang" or options.gpus:
            raise ConfigError("--worker-url: workers are started elsewhere; drop --engine/--gpus")
        return "remote", None
    engine, notice = options.engine, None
    if engine is None:
        choice = detect(options.model)
        engine, notice = choice.engine, choice.notice
    if engine == "sglang":
        check_sglang(options.model)
    if engine != "sim":
        raise ConfigError(f"--engine: expected sim or sglang, got {engine!r}")
    if options.gpus is not None:
        raise ConfigError("--gpus: applies to --engine sglang; simulated workers use no GPU")
    return engine, notice


def _worker_specs(options: LaunchOptions) -> tuple[WorkerSpec, ...]:
    profile = _profile_arg(options.profile)
    specs = []
    for i, port in enumerate(free_ports(options.workers)):
        argv = [sys.executable, "-m", "fairserve", "worker", "--host", WORKER_HOST]
        argv += ["--port", str(port), "--policy", options.policy, "--speed", f"{options.speed:g}"]
        argv += ["--profile", profile] if profile else []
        argv += ["--model-name", options.model] if options.model else []
        argv += ["--quantum", f"{options.quantum:g}"] if options.quantum is not None else []
        specs.append(WorkerSpec(f"worker-{i}", port, tuple(argv)))
    _check_worker_policy(options, profile)
    return tuple(specs)


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


def free_ports(count: int) -> list[int]:
    """``count`` distinct free loopback ports (held open together so they differ)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind((WORKER_HOST, 0))
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
