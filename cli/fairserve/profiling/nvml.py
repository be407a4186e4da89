"""GPU readings through NVML, failure-tolerant: the only module that imports ``pynvml``.

Every public function takes an optional ``nvml`` object with pynvml's API shape so tests
can pass a fake; without one, ``pynvml`` is imported lazily. Nothing here raises: NVML
missing or failing to initialise means "no GPUs" (``[]``/``0``/``False``), and a single
field that fails (unsupported on this board, a transient driver error mid-sweep) becomes
``None``, which callers show as "n/a". One :class:`NvmlSession` initialises NVML once and
reads every device per call, so a sampler thread does not pay ``nvmlInit`` per sample.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar

T = TypeVar("T")

MIB = 1024.0 * 1024.0
NVML_CLOCK_SM = 1

# Bit → human name of NVML's clocks event ("throttle") reasons (nvml.h, stable values).
THROTTLE_REASON_BITS: tuple[tuple[int, str], ...] = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)
# Reasons that mean the GPU ran slower than it could while busy: a profile measured under
# them under-states the hardware, so the sweep flags them (idle and settings are benign).
SLOWDOWN_REASONS = frozenset(
    {
        "sw_power_cap",
        "hw_slowdown",
        "sw_thermal_slowdown",
        "hw_thermal_slowdown",
        "hw_power_brake_slowdown",
    }
)


@dataclass(frozen=True)
class GpuReading:
    """One device at one instant; ``None`` in a field means "n/a" (unsupported or failed)."""

    index: int
    name: str
    uuid: str
    utilization_pct: float | None
    memory_used_mib: float | None
    memory_total_mib: float | None
    power_w: float | None
    sm_clock_mhz: float | None
    energy_mj: float | None  # total energy counter since driver load, millijoules
    throttle_reasons: tuple[str, ...]  # human names of the active reasons


def _load(nvml: Any | None) -> Any | None:
    """The NVML binding: the given object, else ``pynvml`` if it imports, else ``None``."""
    if nvml is not None:
        return nvml
    try:
        return importlib.import_module("pynvml")
    except Exception:  # ImportError, or a broken install: both mean "no NVML"
        return None


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _safe(read: Callable[[], T]) -> T | None:
    """``read()``, or ``None`` when it fails: one bad field must not lose the others."""
    try:
        return read()
    except Exception:  # NVMLError_NotSupported, NVMLError_GpuIsLost, ctypes errors...
        return None


def throttle_names(mask: int) -> tuple[str, ...]:
    """Names of the reasons set in an NVML clocks-event bit mask, lowest bit first."""
    return tuple(name for bit, name in THROTTLE_REASON_BITS if mask & bit)


def _throttle_mask(nvml: Any, handle: Any) -> int:
    # The call was renamed in driver 535 (ClocksEvent); older bindings only have the old name.
    getter = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
    if getter is None:
        getter = nvml.nvmlDeviceGetCurrentClocksThrottleReasons
    return int(getter(handle))


def _read_device(nvml: Any, index: int) -> GpuReading:
    handle = _safe(lambda: nvml.nvmlDeviceGetHandleByIndex(index))
    if handle is None:
        return GpuReading(index, "n/a", "n/a", None, None, None, None, None, None, ())
    memory = _safe(lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
    mask = _safe(lambda: _throttle_mask(nvml, handle))
    clock_sm = getattr(nvml, "NVML_CLOCK_SM", NVML_CLOCK_SM)
    return GpuReading(
        index=index,
        name=_safe(lambda: _text(nvml.nvmlDeviceGetName(handle))) or "n/a",
        uuid=_safe(lambda: _text(nvml.nvmlDeviceGetUUID(handle))) or "n/a",
        utilization_pct=_safe(lambda: float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)),
        memory_used_mib=_safe(lambda: float(memory.used) / MIB) if memory is not None else None,
        memory_total_mib=_safe(lambda: float(memory.total) / MIB) if memory is not None else None,
        power_w=_safe(lambda: float(nvml.nvmlDeviceGetPowerUsage(handle)) / 1000.0),
        sm_clock_mhz=_safe(lambda: float(nvml.nvmlDeviceGetClockInfo(handle, clock_sm))),
        energy_mj=_safe(lambda: float(nvml.nvmlDeviceGetTotalEnergyConsumption(handle))),
        throttle_reasons=throttle_names(mask) if mask is not None else (),
    )


class NvmlSession:
    """NVML initialised once for many batched reads (a sampler thread); never raises.

    ``with NvmlSession() as session: session.read()``; :attr:`available` is ``False`` when
    NVML is absent or ``nvmlInit`` failed, and then :meth:`read` returns ``[]``.
    """

    def __init__(self, nvml: Any | None = None) -> None:
        self._nvml = _load(nvml)
        self.available = False

    def open(self) -> NvmlSession:
        if self._nvml is not None and not self.available:
            self.available = _safe(self._init) is True
        return self

    def _init(self) -> bool:
        assert self._nvml is not None
        self._nvml.nvmlInit()
        return True

    def close(self) -> None:
        if self.available and self._nvml is not None:
            nvml = self._nvml
            _safe(lambda: nvml.nvmlShutdown())
        self.available = False

    def __enter__(self) -> NvmlSession:
        return self.open()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def count(self) -> int:
        if not self.available or self._nvml is None:
            return 0
        nvml = self._nvml
        return _safe(lambda: int(nvml.nvmlDeviceGetCount())) or 0

    def read(self) -> list[GpuReading]:
        """Every device, one reading each; ``[]`` when NVML is unavailable."""
        if self._nvml is None:
            return []
        return [_read_device(self._nvml, index) for index in range(self.count())]

    def driver_version(self) -> str | None:
        if not self.available or self._nvml is None:
            return None
        nvml = self._nvml
        return _safe(lambda: _text(nvml.nvmlSystemGetDriverVersion()))


def read_gpus(nvml: Any | None = None) -> list[GpuReading]:
    """One reading per GPU; ``[]`` when NVML is absent or fails to initialise. Never raises."""
    with NvmlSession(nvml) as session:
        return session.read()


def gpu_count(nvml: Any | None = None) -> int:
    """NVIDIA GPUs NVML sees; 0 without NVML or its driver. Never raises."""
    with NvmlSession(nvml) as session:
        return session.count()


def nvml_available(nvml: Any | None = None) -> bool:
    """Whether NVML initialises here (library and driver present)."""
    with NvmlSession(nvml) as session:
        return session.available


def driver_version(nvml: Any | None = None) -> str | None:
    """The NVIDIA driver version string, or ``None`` ("n/a") without NVML."""
    with NvmlSession(nvml) as session:
        return session.driver_version()
