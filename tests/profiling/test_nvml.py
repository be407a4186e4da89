"""The NVML layer against a fake with pynvml's API shape: conversions, and every failure
mode an operator meets (no driver, a lost GPU, a field a board does not support)."""

from __future__ import annotations

from typing import Any

import pytest

from fairserve.profiling.nvml import (
    GpuReading,
    NvmlSession,
    driver_version,
    gpu_count,
    nvml_available,
    read_gpus,
    throttle_names,
)
from tests.fakes.nvml import FakeGpu, FakeNvml


def test_readings_are_converted_to_the_documented_units() -> None:
    gpu = FakeGpu(
        utilization_pct=87,
        memory_used_bytes=3 * 1024**3,
        memory_total_bytes=80 * 1024**3,
        power_w=412.5,
        sm_clock_mhz=1755,
        energy_mj=5_000_000,
        throttle_mask=0x4 | 0x40,
    )
    nvml = FakeNvml(gpus=[gpu], seconds_per_read=0.0)

    (reading,) = read_gpus(nvml)

    assert reading == GpuReading(
        index=0,
        name=gpu.name,
        uuid=gpu.uuid,
        utilization_pct=87.0,
        memory_used_mib=3 * 1024.0,
        memory_total_mib=80 * 1024.0,
        power_w=412.5,
        sm_clock_mhz=1755.0,
        energy_mj=5_000_000.0,
        throttle_reasons=("sw_power_cap", "hw_thermal_slowdown"),
    )


def test_every_device_is_read_and_byte_names_are_decoded() -> None:
    nvml = FakeNvml(gpus=[FakeGpu(), FakeGpu(name="NVIDIA A100-SXM4-80GB", name_as_bytes=True)])

    readings = read_gpus(nvml)

    assert [r.index for r in readings] == [0, 1]
    assert readings[1].name == "NVIDIA A100-SXM4-80GB"
    assert gpu_count(nvml) == 2
    assert nvml_available(nvml)
    assert driver_version(nvml) == "550.54.15"


def test_each_call_initialises_and_shuts_nvml_down() -> None:
    nvml = FakeNvml()
    read_gpus(nvml)
    gpu_count(nvml)
    assert nvml.inits == nvml.shutdowns == 2


def test_init_failure_means_no_gpus_and_never_raises() -> None:
    nvml = FakeNvml(init_fails=True)

    assert read_gpus(nvml) == []
    assert gpu_count(nvml) == 0
    assert not nvml_available(nvml)
    assert driver_version(nvml) is None
    assert nvml.shutdowns == 0  # nothing to shut down


@pytest.mark.parametrize(
    ("function", "field"),
    [
        ("nvmlDeviceGetPowerUsage", "power_w"),
        ("nvmlDeviceGetTotalEnergyConsumption", "energy_mj"),
        ("nvmlDeviceGetUtilizationRates", "utilization_pct"),
        ("nvmlDeviceGetClockInfo", "sm_clock_mhz"),
        ("nvmlDeviceGetMemoryInfo", "memory_used_mib"),
    ],
)
def test_a_field_that_starts_failing_blanks_only_that_field(function: str, field: str) -> None:
    nvml = FakeNvml(fail_after={function: 1})
    session = NvmlSession(nvml).open()

    first, second = session.read()[0], session.read()[0]

    assert getattr(first, field) is not None
    assert getattr(second, field) is None
    kept = {"power_w", "energy_mj", "utilization_pct", "sm_clock_mhz", "memory_total_mib"}
    for other in kept - {field} - ({"memory_total_mib"} if field == "memory_used_mib" else set()):
        assert getattr(second, other) is not None, other
    session.close()


def test_failing_throttle_reasons_read_as_none_active() -> None:
    nvml = FakeNvml(
        gpus=[FakeGpu(throttle_mask=0x20)],
        fail_after={"nvmlDeviceGetCurrentClocksEventReasons": 0},
    )
    assert read_gpus(nvml)[0].throttle_reasons == ()


def test_a_lost_gpu_reads_as_n_a_and_the_others_still_read() -> None:
    nvml = FakeNvml(gpus=[FakeGpu(), FakeGpu(uuid="GPU-1")], lost_handles={0})

    lost, alive = read_gpus(nvml)

    assert (lost.name, lost.uuid, lost.power_w, lost.throttle_reasons) == ("n/a", "n/a", None, ())
    assert alive.uuid == "GPU-1" and alive.power_w is not None


def test_device_count_failure_means_no_gpus() -> None:
    nvml = FakeNvml(fail_after={"nvmlDeviceGetCount": 0})
    assert read_gpus(nvml) == [] and gpu_count(nvml) == 0


class _OldBinding(FakeNvml):
    """pynvml before the ClocksEvent rename only has the throttle-reasons call."""

    def __getattribute__(self, name: str) -> Any:
        if name == "nvmlDeviceGetCurrentClocksEventReasons":
            raise AttributeError(name)
        return super().__getattribute__(name)

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: FakeGpu) -> int:
        return handle.throttle_mask


def test_older_bindings_use_the_throttle_reasons_call() -> None:
    nvml = _OldBinding(gpus=[FakeGpu(throttle_mask=0x1 | 0x8)])
    assert read_gpus(nvml)[0].throttle_reasons == ("gpu_idle", "hw_slowdown")


def test_throttle_names_cover_every_documented_bit() -> None:
    assert throttle_names(0) == ()
    assert len(throttle_names(0x1FF)) == 9
    assert throttle_names(0x80) == ("hw_power_brake_slowdown",)


def test_the_real_binding_never_raises_here() -> None:
    """On this host pynvml may be missing, or present without a driver: either way a list
    comes back (empty on a CPU host) and the count agrees with it."""
    readings = read_gpus()
    assert isinstance(readings, list)
    assert gpu_count() == len(readings)
