"""A background thread that samples one GPU through NVML while a sweep runs.

The sweep brackets every measured point with :meth:`NvmlSampler.begin` and
:meth:`NvmlSampler.end`; ``end`` summarises the samples taken in between (mean power,
utilisation and SM clock, energy used, throttle reasons seen). Energy comes from the
board's total-energy counter when it works, else from integrating power over the samples.
Without NVML (a CPU host, a remote worker) the sampler is inert and every figure is
``None``, shown as "n/a". A field that starts failing mid-sweep only blanks that field.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fairserve.profiling.nvml import SLOWDOWN_REASONS, GpuReading, NvmlSession
from fairserve.profiling.observations import GpuStats

DEFAULT_INTERVAL_S = 0.1


@dataclass(frozen=True)
class GpuIdentity:
    """Which board a profile was measured on (fields ``None``/"n/a" when unknown)."""

    index: int
    name: str
    uuid: str
    driver_version: str | None
    memory_total_mib: float | None


@dataclass(frozen=True)
class _Sample:
    t_s: float
    reading: GpuReading


class NvmlSampler:
    """Samples GPU ``gpu_index`` every ``interval_s`` on a daemon thread (see module doc)."""

    def __init__(
        self,
        nvml: Any | None = None,
        gpu_index: int = 0,
        interval_s: float = DEFAULT_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        enabled: bool = True,
    ) -> None:
        self._session = NvmlSession(nvml) if enabled else None
        self.gpu_index = gpu_index
        self.interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._samples: list[_Sample] = []
        self._mark = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.identity: GpuIdentity | None = None
        self.throttle_seen: set[str] = set()

    @property
    def available(self) -> bool:
        return self._session is not None and self._session.available

    def start(self) -> NvmlSampler:
        if self._session is None or not self._session.open().available:
            return self
        first = self.sample()
        if first is None:  # no such GPU index
            self._session.close()
            return self
        driver = self._session.driver_version()
        self.identity = GpuIdentity(
            first.index, first.name, first.uuid, driver, first.memory_total_mib
        )
        self._thread = threading.Thread(target=self._run, name="nvml-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(1.0, 5 * self.interval_s))
            self._thread = None
        if self._session is not None:
            self._session.close()

    def __enter__(self) -> NvmlSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def sample(self) -> GpuReading | None:
        """Read the GPU now and keep the reading; ``None`` when NVML is unavailable."""
        if not self.available or self._session is None:
            return None
        with self._lock:
            readings = self._session.read()
            reading = next((r for r in readings if r.index == self.gpu_index), None)
            if reading is not None:
                self._samples.append(_Sample(self._clock(), reading))
                self.throttle_seen.update(reading.throttle_reasons)
        return reading

    def begin(self) -> None:
        """A measured point starts now."""
        self.sample()
        with self._lock:
            self._mark = max(0, len(self._samples) - 1)

    def end(self) -> GpuStats:
        """The point ended: what the GPU did since :meth:`begin`."""
        self.sample()
        with self._lock:
            window = self._samples[self._mark :]
        return summarize(window_readings(window))

    @property
    def slowdowns(self) -> tuple[str, ...]:
        """Throttle reasons seen that slow a busy GPU (thermal, power), sorted."""
        return tuple(sorted(self.throttle_seen & SLOWDOWN_REASONS))


def window_readings(samples: list[_Sample]) -> list[tuple[float, GpuReading]]:
    return [(s.t_s, s.reading) for s in samples]


def summarize(samples: list[tuple[float, GpuReading]]) -> GpuStats:
    """Means, energy and throttle reasons over timed readings (``None`` where unmeasured)."""
    if not samples:
        return GpuStats()
    reasons: set[str] = set()
    for _, reading in samples:
        reasons.update(reading.throttle_reasons)
    return GpuStats(
        energy_j=_energy_j(samples),
        mean_power_w=_mean([r.power_w for _, r in samples]),
        mean_utilization_pct=_mean([r.utilization_pct for _, r in samples]),
        mean_sm_clock_mhz=_mean([r.sm_clock_mhz for _, r in samples]),
        max_memory_used_mib=max(
            (r.memory_used_mib for _, r in samples if r.memory_used_mib is not None),
            default=None,
        ),
        throttle_reasons=tuple(sorted(reasons)),
    )


def _mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def _energy_j(samples: list[tuple[float, GpuReading]]) -> float | None:
    """Counter delta between the window's ends when both ends read it, else ∫ power dt."""
    first, last = samples[0][1].energy_mj, samples[-1][1].energy_mj
    if first is not None and last is not None and len(samples) > 1 and last >= first:
        return (last - first) / 1000.0
    powered: list[tuple[float, float]] = [
        (t, r.power_w) for t, r in samples if r.power_w is not None
    ]
    if len(powered) < 2:
        return None
    total = 0.0
    for (t0, p0), (t1, p1) in itertools.pairwise(powered):
        total += (t1 - t0) * (p0 + p1) / 2.0
    return total
