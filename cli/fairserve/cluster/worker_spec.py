"""How each local worker is started: its command line, environment, ports and GPUs.

A local launch and a worker a Ray actor starts on its node use the same builders
(:func:`sim_spec`, :func:`sglang_spec`), so a worker runs the same command wherever it is
placed. Everything here validates what it is given before any process starts.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from fairserve.cluster.engine import gpu_groups
from fairserve.cluster.options import LaunchOptions
from fairserve.core.errors import ConfigError

if TYPE_CHECKING:
    from fairserve.sglang.config import PluginConfig

WORKER_HOST = "127.0.0.1"
"""Local workers listen on loopback only: the router is the service's one front door."""


SIM_WORKERS = 2
"""Simulated workers a launch starts when ``--workers`` is not given."""


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


def sglang_only_options(options: LaunchOptions) -> list[str]:
    """The options given that only an SGLang launch uses."""
    given = []
    if options.gpus is not None:
        given.append("--gpus")
    if options.tp != 1:
        given.append("--tp")
    if options.sglang_args:
        given.append("-- SGLANG_ARGS")
    return given


def sim_specs(options: LaunchOptions) -> tuple[WorkerSpec, ...]:
    profile = profile_arg(options.profile)
    ports = free_ports(options.workers or SIM_WORKERS)
    specs = [sim_spec(options, profile, f"worker-{i}", WORKER_HOST, p) for i, p in enumerate(ports)]
    check_worker_policy(options, profile)
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


def sglang_specs(options: LaunchOptions) -> tuple[WorkerSpec, ...]:
    """One ``python -m sglang.launch_server`` per GPU group, with the plugin configured.

    ``--schedule-policy lpm`` (unless given after ``--``) makes SGLang match every waiting
    request's prefix before the plugin orders the queue, so the policy's LPM order and
    extend charges see the real cache; ``--enable-metrics`` keeps SGLang's Prometheus
    gauges for ``fairserve top``."""
    config = sglang_config(options)
    groups = gpu_groups(options.gpus, options.tp, options.workers)
    ports = free_ports(2 * len(groups))
    model = model_arg(options.model)
    return tuple(
        sglang_spec(
            options, config, model, f"worker-{i}", WORKER_HOST, ports[2 * i : 2 * i + 2], gpus
        )
        for i, gpus in enumerate(groups)
    )


def sglang_config(options: LaunchOptions) -> PluginConfig:
    """The plugin's configuration, checked (unknown policies, quanta without a quantum)."""
    from fairserve.sglang.config import PluginConfig, build_policy

    _check_sglang_args(options.sglang_args)
    config = PluginConfig(policy=options.policy, quantum=options.quantum)
    build_policy(config)
    return config


def model_arg(model: str | None) -> str:
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


def profile_arg(profile: str | None) -> str | None:
    """The profile as the workers get it: validated here, files made absolute (the workers
    must find the same file whatever their working directory)."""
    if profile is None:
        return None
    from fairserve.sim.profile import resolve_profile

    resolve_profile(profile)
    path = Path(profile)
    return str(path.resolve()) if path.exists() else profile


def check_worker_policy(options: LaunchOptions, profile: str | None) -> None:
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
