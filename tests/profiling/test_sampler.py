"""The NVML sampler: per-point summaries, energy from the counter or from power, and a
sweep that goes on when NVML breaks under it."""

from __future__ import annotations

import time

from fairserve.profiling.nvml import GpuReading
from fairserve.profiling.sampler import NvmlSampler, summarize
from tests.fakes.nvml import FakeGpu, FakeNvml

NEVER_S = 3600.0
"""An interval the background thread never reaches: the test drives every sample."""


class _Clock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        self.now_s += 0.5
        return self.now_s


def test_a_point_reports_energy_power_and_identity() -> None:
    nvml = FakeNvml(gpus=[FakeGpu(power_w=300.0)], seconds_per_read=0.5)
    with NvmlSampler(nvml, interval_s=NEVER_S, clock=_Clock()) as sampler:
        assert sampler.identity is not None
        assert sampler.identity.name == "NVIDIA H100 80GB HBM3"
        assert sampler.identity.driver_version == "550.54.15"
        sampler.begin()
        sampler.sample()
        stats = sampler.end()
    # three counter reads at 300 W and 0.5 s per read after the first: 2 × 150 J
    assert stats.energy_j == 300.0
    assert stats.mean_power_w == 300.0
    assert stats.mean_utilization_pct == 87.0
    assert stats.max_memory_used_mib == 60 * 1024.0
    assert nvml.inits == nvml.shutdowns == 1


def test_energy_falls_back_to_integrated_power_when_the_counter_breaks() -> None:
    nvml = FakeNvml(
        gpus=[FakeGpu(power_w=200.0)],
        fail_after={"nvmlDeviceGetTotalEnergyConsumption": 2},
    )
    with NvmlSampler(nvml, interval_s=NEVER_S, clock=_Clock()) as sampler:
        sampler.begin()  # the counter's second and last good read
        sampler.sample()
        stats = sampler.end()
    # three samples 0.5 s apart at 200 W: 200 J by the trapezoid rule
    assert stats.energy_j == 200.0


def test_every_field_failing_mid_sweep_gives_n_a_not_an_error() -> None:
    failing = {
        name: 1
        for name in (
            "nvmlDeviceGetTotalEnergyConsumption",
            "nvmlDeviceGetPowerUsage",
            "nvmlDeviceGetUtilizationRates",
            "nvmlDeviceGetClockInfo",
        )
    }
    nvml = FakeNvml(fail_after=failing)
    with NvmlSampler(nvml, interval_s=NEVER_S, clock=_Clock()) as sampler:
        sampler.begin()
        stats = sampler.end()
    assert stats.energy_j is None
    assert stats.mean_power_w is None
    assert stats.mean_sm_clock_mhz is None


def test_init_failure_makes_an_inert_sampler() -> None:
    with NvmlSampler(FakeNvml(init_fails=True), interval_s=0.001) as sampler:
        assert not sampler.available
        assert sampler.identity is None
        sampler.begin()
        stats = sampler.end()
    assert stats.energy_j is None and stats.throttle_reasons == ()


def test_disabled_sampler_never_touches_nvml() -> None:
    nvml = FakeNvml()
    with NvmlSampler(nvml, enabled=False) as sampler:
        sampler.begin()
        assert sampler.end().mean_power_w is None
    assert nvml.inits == 0


def test_a_missing_gpu_index_makes_an_inert_sampler() -> None:
    nvml = FakeNvml()
    with NvmlSampler(nvml, gpu_index=3, interval_s=NEVER_S) as sampler:
        assert sampler.identity is None
    assert nvml.inits == nvml.shutdowns == 1


def test_slowdowns_flag_thermal_and_power_throttling_not_idle() -> None:
    gpu = FakeGpu(throttle_mask=0x1)
    nvml = FakeNvml(gpus=[gpu])
    with NvmlSampler(nvml, interval_s=NEVER_S) as sampler:
        idle_only = sampler.slowdowns
        gpu.throttle_mask = 0x1 | 0x4 | 0x20
        sampler.begin()
        stats = sampler.end()
    assert idle_only == ()
    assert sampler.slowdowns == ("sw_power_cap", "sw_thermal_slowdown")
    assert stats.throttle_reasons == ("gpu_idle", "sw_power_cap", "sw_thermal_slowdown")


def test_the_thread_samples_on_its_own() -> None:
    nvml = FakeNvml()
    with NvmlSampler(nvml, interval_s=0.005):
        deadline = time.monotonic() + 5.0
        while nvml.calls.get("nvmlDeviceGetPowerUsage", 0) < 4:
            assert time.monotonic() < deadline, "sampler thread took no samples"
            time.sleep(0.005)
    calls = nvml.calls["nvmlDeviceGetPowerUsage"]
    time.sleep(0.03)
    assert nvml.calls["nvmlDeviceGetPowerUsage"] == calls  # stopped with the context


def test_summary_of_nothing_is_all_n_a() -> None:
    empty = summarize([])
    assert empty.energy_j is None and empty.mean_power_w is None


def test_counter_going_backwards_is_not_trusted() -> None:
    def reading(energy_mj: float, power_w: float) -> GpuReading:
        return GpuReading(0, "g", "u", None, None, None, power_w, None, energy_mj, ())

    stats = summarize([(0.0, reading(5000.0, 100.0)), (1.0, reading(1000.0, 100.0))])
    assert stats.energy_j == 100.0  # power over 1 s, not a negative counter delta
