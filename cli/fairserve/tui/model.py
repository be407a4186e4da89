"""The dashboard's data: frozen snapshots of a router, its workers and the local GPUs.

Widgets get a :class:`Snapshot` and cannot change what others see; parsing the JSON that
routers and workers send (tolerant of anything) lives in :mod:`fairserve.tui.parse`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol


# ---------------------------------------------------------------- snapshot parts
@dataclass(frozen=True, slots=True)
class RouterInfo:
    url: str
    version: str = ""
    uptime_s: float = 0.0
    draining: bool = False
    active_requests: int = 0
    dispatch: str = "?"
    policy: str = "?"
    router_queue: str = ""


@dataclass(frozen=True, slots=True)
class Quanta:
    """Q^u (local policy) and Q^w (DoubleQ's per-worker quantum); ``None`` = not set/none."""

    quantum: float | None = None
    worker_quantum: float | None = None


@dataclass(frozen=True, slots=True)
class Throughput:
    tokens_per_s: float = 0.0
    service_per_s: float = 0.0
    requests_per_s: float = 0.0


@dataclass(frozen=True, slots=True)
class ClientView:
    """One client as the router accounts it (rates over the router's window)."""

    name: str
    weight: float = 1.0
    requests: int = 0
    finished: int = 0
    failed: int = 0
    rejected: int = 0
    in_flight: int = 0
    queued: int = 0
    service: float = 0.0
    service_rate: float = 0.0
    tokens_per_s: float = 0.0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    latency_p50_s: float | None = None
    latency_p99_s: float | None = None
    ttft_p50_s: float | None = None
    ttft_p99_s: float | None = None
    deficits: tuple[tuple[str, float], ...] = ()
    """DoubleQ's per-worker deficit counters, in the router's worker order."""


@dataclass(frozen=True, slots=True)
class ClientLoad:
    """A client's requests inside one worker (the worker's own view)."""

    name: str
    waiting: int = 0
    running: int = 0


@dataclass(frozen=True, slots=True)
class WorkerProbe:
    """What a worker says about itself (``/fairserve/worker/state`` or SGLang's metrics)."""

    running: int | None = None
    waiting: int | None = None
    kv_used_tokens: float | None = None
    kv_capacity_tokens: float | None = None
    kv_usage: float | None = None
    quantum: float | None = None
    speed: float = 1.0
    gpu_index: int | None = None
    gpu_uuid: str | None = None
    clients: tuple[ClientLoad, ...] = ()
    per_client: bool = False
    """Whether ``clients`` is known (the fairserve extension says who waits and runs)."""

    @property
    def kv_fraction(self) -> float | None:
        if self.kv_usage is not None:
            return self.kv_usage
        if self.kv_used_tokens is not None and self.kv_capacity_tokens:
            return self.kv_used_tokens / self.kv_capacity_tokens
        return None


@dataclass(frozen=True, slots=True)
class WorkerView:
    url: str
    healthy: bool = False
    extension_url: str = ""
    """Where the worker's fairserve extension answers (a side port for SGLang); "" = ``url``."""
    fairness: str = ""
    extension: bool = False
    outstanding: int = 0
    in_flight: int = 0
    requests: int = 0
    finished: int = 0
    failures: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    cache_hit_rate: float = 0.0
    capacity_tokens_per_s: float | None = None
    max_total_tokens: int | None = None
    last_error: str | None = None
    probe: WorkerProbe | None = None

    @property
    def wall_capacity_tokens_per_s(self) -> float | None:
        """Capacity per wall second: a simulated worker at speed K does K times its profile."""
        if self.capacity_tokens_per_s is None:
            return None
        speed = self.probe.speed if self.probe is not None else 1.0
        return self.capacity_tokens_per_s * speed


class GpuReadingLike(Protocol):
    """The fields of :class:`fairserve.profiling.nvml.GpuReading` the dashboard shows."""

    @property
    def index(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def uuid(self) -> str: ...
    @property
    def utilization_pct(self) -> float | None: ...
    @property
    def memory_used_mib(self) -> float | None: ...
    @property
    def memory_total_mib(self) -> float | None: ...
    @property
    def power_w(self) -> float | None: ...


@dataclass(frozen=True, slots=True)
class GpuView:
    index: int
    name: str
    uuid: str
    utilization_pct: float | None = None
    memory_used_mib: float | None = None
    memory_total_mib: float | None = None
    power_w: float | None = None

    @classmethod
    def of(cls, reading: GpuReadingLike) -> GpuView:
        return cls(
            reading.index,
            reading.name,
            reading.uuid,
            reading.utilization_pct,
            reading.memory_used_mib,
            reading.memory_total_mib,
            reading.power_w,
        )


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything one poll saw, immutable."""

    router: RouterInfo
    quanta: Quanta = field(default_factory=Quanta)
    jain_index: float | None = None
    jain_window_s: tuple[float, float] | None = None
    max_service_gap: float | None = None
    fairness_window_s: float | None = None
    """The window Jain's index and the gap cover (None: an older router, whole uptime)."""
    throughput: Throughput = field(default_factory=Throughput)
    clients: tuple[ClientView, ...] = ()
    workers: tuple[WorkerView, ...] = ()
    gpus: tuple[GpuView, ...] = ()

    def with_probes(self, probes: Mapping[str, WorkerProbe]) -> Snapshot:
        workers = tuple(replace(w, probe=probes.get(w.url, w.probe)) for w in self.workers)
        return replace(self, workers=workers)

    def with_gpus(self, gpus: tuple[GpuView, ...]) -> Snapshot:
        return replace(self, gpus=gpus)

    @property
    def local_quantum(self) -> float | None:
        """Q^u: the router's, else the first worker's own (the router does not set it until
        someone does; workers that are fair inside run their policy's default)."""
        if self.quanta.quantum is not None:
            return self.quanta.quantum
        for worker in self.workers:
            if worker.probe is not None and worker.probe.quantum is not None:
                return worker.probe.quantum
        return None
