"""A fake of pynvml's API shape for :mod:`fairserve.profiling.nvml` tests (no GPU needed).

Each device is a :class:`FakeGpu` whose counters advance on every read (energy grows by
``power_w`` × ``seconds_per_read``), so a sampler sees real deltas. Failures are scripted:
``init_fails`` makes ``nvmlInit`` raise; ``fail_after[name] = n`` makes the NVML function
``name`` raise :class:`NVMLError` from its (n+1)-th call on, which is how a field that starts
failing mid-sweep is simulated; ``lost_handles`` makes ``nvmlDeviceGetHandleByIndex`` raise
for those indices.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

NVML_CLOCK_SM = 1


class NVMLError(Exception):
    """The fake's error class, like ``pynvml.NVMLError``."""


@dataclass
class FakeGpu:
    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    utilization_pct: int = 87
    memory_used_bytes: int = 60 * 1024**3
    memory_total_bytes: int = 80 * 1024**3
    power_w: float = 500.0
    sm_clock_mhz: int = 1980
    throttle_mask: int = 0
    energy_mj: int = 1_000_000
    name_as_bytes: bool = False


@dataclass
class _Utilization:
    gpu: int
    memory: int


@dataclass
class _Memory:
    used: int
    total: int
    free: int


@dataclass
class FakeNvml:
    """pynvml's functions over a list of :class:`FakeGpu`; records init/shutdown calls."""

    gpus: list[FakeGpu] = field(default_factory=lambda: [FakeGpu()])
    init_fails: bool = False
    fail_after: dict[str, int] = field(default_factory=dict)
    lost_handles: set[int] = field(default_factory=set)
    seconds_per_read: float = 0.1
    driver: str = "550.54.15"
    calls: dict[str, int] = field(default_factory=dict)
    inits: int = 0
    shutdowns: int = 0
    NVMLError: type[Exception] = NVMLError
    NVML_CLOCK_SM: int = NVML_CLOCK_SM

    def _call(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1
        limit = self.fail_after.get(name)
        if limit is not None and self.calls[name] > limit:
            raise NVMLError(f"{name}: GPU is lost")

    def nvmlInit(self) -> None:
        if self.init_fails:
            raise NVMLError("NVML Shared Library Not Found")
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._call("nvmlSystemGetDriverVersion")
        return self.driver

    def nvmlDeviceGetCount(self) -> int:
        self._call("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        self._call("nvmlDeviceGetHandleByIndex")
        if index in self.lost_handles:
            raise NVMLError(f"device {index}: GPU is lost")
        return self.gpus[index]

    def nvmlDeviceGetName(self, handle: FakeGpu) -> str | bytes:
        self._call("nvmlDeviceGetName")
        return handle.name.encode() if handle.name_as_bytes else handle.name

    def nvmlDeviceGetUUID(self, handle: FakeGpu) -> str:
        self._call("nvmlDeviceGetUUID")
        return handle.uuid

    def nvmlDeviceGetUtilizationRates(self, handle: FakeGpu) -> _Utilization:
        self._call("nvmlDeviceGetUtilizationRates")
        return _Utilization(gpu=handle.utilization_pct, memory=40)

    def nvmlDeviceGetMemoryInfo(self, handle: FakeGpu) -> _Memory:
        self._call("nvmlDeviceGetMemoryInfo")
        free = handle.memory_total_bytes - handle.memory_used_bytes
        return _Memory(used=handle.memory_used_bytes, total=handle.memory_total_bytes, free=free)

    def nvmlDeviceGetPowerUsage(self, handle: FakeGpu) -> int:
        self._call("nvmlDeviceGetPowerUsage")
        return int(handle.power_w * 1000)

    def nvmlDeviceGetClockInfo(self, handle: FakeGpu, clock: int) -> int:
        self._call("nvmlDeviceGetClockInfo")
        if clock != NVML_CLOCK_SM:
            raise NVMLError(f"clock {clock} not supported by the fake")
        return handle.sm_clock_mhz

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: FakeGpu) -> int:
        """The counter, advanced by one read interval at ``power_w`` per call."""
        self._call("nvmlDeviceGetTotalEnergyConsumption")
        handle.energy_mj += int(handle.power_w * self.seconds_per_read * 1000)
        return handle.energy_mj

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: FakeGpu) -> int:
        self._call("nvmlDeviceGetCurrentClocksEventReasons")
        return handle.throttle_mask


def fake_nvml(**kwargs: Any) -> FakeNvml:
    """A :class:`FakeNvml` (factory, for symmetry with the other fakes)."""
    return FakeNvml(**kwargs)
