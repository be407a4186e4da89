"""From a sweep to a profile file, and what ``profile show`` reports about one."""

from __future__ import annotations

from dataclasses import replace
from datetime import date
from pathlib import Path

import pytest

from fairserve.core.errors import ConfigError
from fairserve.profiling.fit import BatchTimeFit, fit_observations
from fairserve.profiling.observations import GpuStats, Observation, decode_window, prefill
from fairserve.profiling.plan import WorkerLimits, make_plan
from fairserve.profiling.sampler import GpuIdentity
from fairserve.profiling.show import profile_summary
from fairserve.profiling.store import build_profile, default_path, profile_name
from fairserve.profiling.sweep import PointEnergy, SweepResult
from fairserve.sim.profile import (
    PROFILES_ENV,
    load_profile,
    profile_from_toml,
    profile_to_toml,
    write_profile,
)
from fairserve.workloads import loads_workload

INFO = {
    "model_path": "meta-llama/Llama-3.1-8B-Instruct",
    "max_total_num_tokens": 200_000,
    "chunked_prefill_size": 8192,
    "max_running_requests": 256,
    "tp_size": 1,
    "version": "0.5.1",
}


def _observations(energy_j: float | None = None) -> list[Observation]:
    gpu = GpuStats(energy_j=energy_j, mean_power_w=300.0 if energy_j else None)
    loads = (16, 64, 256, 1024, 4096)
    found = [prefill(b, 0.01 + 2e-5 * max(0, b - 128), "engine") for b in loads]
    found.append(decode_window(8, 16, 8, 10, 10 * 0.01, "engine"))
    return [Observation(**{**o.__dict__, "gpu": gpu}) for o in found]


def _result(observations: list[Observation], gpu: GpuIdentity | None = None) -> SweepResult:
    limits = WorkerLimits.from_server_info(INFO)
    return SweepResult(
        url="http://gpu-box:30000",
        server_info=INFO,
        limits=limits,
        timing="engine",
        plan=make_plan(limits, True, False),
        observations=observations,
        wall_s=12.5,
        gpu=gpu,
    )


H100 = GpuIdentity(0, "NVIDIA H100 80GB HBM3", "GPU-1234", "550.54.15", 81559.0)


def test_a_measured_profile_round_trips_through_the_simulator_format(tmp_path: Path) -> None:
    observations = _observations(energy_j=2.0)
    fit = fit_observations(observations)
    result = _result(observations, H100)
    result.energy = [PointEnergy("prefill 16", 2.0, 17), PointEnergy("decode", 8.0, 983)]
    profile = build_profile(result, fit, today=date(2026, 3, 4))

    loaded = load_profile(write_profile(profile, tmp_path / f"{profile.name}.toml"))

    assert loaded == profile
    assert profile.name == "h100-80gb-hbm3-llama-3.1-8b-instruct"
    assert (profile.gpu, profile.model, profile.engine) == (H100.name, INFO["model_path"], "sglang")
    assert (profile.source, profile.date, profile.driver_version) == (
        "measured",
        "2026-03-04",
        "550.54.15",
    )
    assert profile.c_s == pytest.approx(0.01) and profile.b0_tokens == 128
    assert (profile.kv_capacity_tokens, profile.max_batch_tokens) == (200_000, 8192)
    assert profile.max_running_requests == 256
    assert profile.fit_timing == "engine" and profile.fit_points == len(observations)
    assert profile.joules_per_token == pytest.approx(10.0 / 1000)
    assert profile.mean_power_w == 300.0
    assert "GPU-1234" in profile.provenance and "--quick" in profile.provenance


def test_without_nvml_the_profile_says_n_a_and_has_no_energy() -> None:
    observations = _observations()
    profile = build_profile(_result(observations), fit_observations(observations))
    assert profile.joules_per_token is None and profile.mean_power_w is None
    assert "n/a" in profile.provenance
    assert profile.gpu == "unknown-gpu"


def test_a_known_step_overhead_is_split_from_c() -> None:
    observations = _observations()
    fit = fit_observations(observations)
    profile = build_profile(_result(observations), fit, step_overhead_s=0.003)
    assert profile.step_overhead_s == 0.003
    assert profile.c_s == pytest.approx(0.007)
    assert profile.batch_time().batch_time_s(64, 0) == pytest.approx(fit.step_s(64))
    with pytest.raises(ConfigError, match="--step-overhead-s"):
        build_profile(_result(observations), fit, step_overhead_s=0.5)


def test_coefficients_are_written_readably() -> None:
    fit = BatchTimeFit(0.0123456789123, 1.23456789e-5, 100, 0.0, 0.99999912345, 6, (0.0,) * 6)
    profile = build_profile(_result(_observations()), fit)
    assert profile.c_s == 0.0123457 and profile.a_s_per_token == 1.23457e-05


@pytest.mark.parametrize(
    ("gpu", "model", "name"),
    [
        ("NVIDIA H100 80GB HBM3", "meta-llama/Llama-2-7b-hf", "h100-80gb-hbm3-llama-2-7b-hf"),
        ("NVIDIA A100-SXM4-80GB", "/models/qwen2.5-7b/", "a100-sxm4-80gb-qwen2.5-7b"),
        ("???", "", "gpu-model"),
    ],
)
def test_profile_names_are_file_stems(gpu: str, model: str, name: str) -> None:
    assert profile_name(gpu, model) == name


def test_the_default_path_is_the_first_profile_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    observations = _observations()
    profile = build_profile(_result(observations), fit_observations(observations))
    monkeypatch.setenv(PROFILES_ENV, str(tmp_path))
    assert default_path(profile) == tmp_path / f"{profile.name}.toml"


WORKLOAD = """
name = "two-clients"
duration_s = 100
seed = 3

[[clients]]
name = "a"
arrival = "uniform"
rate_per_s = 2
input_tokens = 300
output_tokens = 100

[[clients]]
name = "b"
arrival = "uniform"
rate_per_s = 1
input_tokens = 600
output_tokens = 400
"""


def test_show_reports_capacity_and_the_stability_bound() -> None:
    observations = _observations()
    profile = build_profile(_result(observations), fit_observations(observations))
    workload = loads_workload(WORKLOAD)

    summary = profile_summary(profile, workload, workers=2)

    capacity = profile.capacity_tokens_per_s
    assert summary["capacity"]["tokens_per_s"] == pytest.approx(8192 / (0.01 + 2e-5 * 8064))
    assert summary["capacity"]["tokens_per_s"] == pytest.approx(capacity)
    stability = summary["stability"]
    assert stability["arrival_rate_per_s"] == pytest.approx(3.0, rel=0.02)
    # λ·(mean prompt + mean output) = 2·400 + 1·1000 tokens/s
    assert stability["load_tokens_per_s"] == pytest.approx(1800.0, rel=0.02)
    assert stability["capacity_tokens_per_s"] == pytest.approx(2 * capacity)
    assert stability["stable"] is (stability["load_tokens_per_s"] < 2 * capacity)
    assert stability["utilization"] == pytest.approx(
        stability["load_tokens_per_s"] / (2 * capacity)
    )
    assert summary["fit"]["points"] == len(observations)


def test_show_flags_an_overloaded_mix() -> None:
    observations = _observations()
    profile = build_profile(_result(observations), fit_observations(observations))
    heavy_text = WORKLOAD.replace("rate_per_s = 2", "rate_per_s = 200")
    heavy = loads_workload(heavy_text.replace("duration_s = 100", "duration_s = 5"))
    stability = profile_summary(profile, heavy)["stability"]
    assert not stability["stable"] and stability["utilization"] > 1


def test_show_refuses_zero_workers() -> None:
    observations = _observations()
    profile = build_profile(_result(observations), fit_observations(observations))
    with pytest.raises(ConfigError, match="--workers"):
        profile_summary(profile, None, workers=0)


def test_the_measured_fields_are_validated_like_the_others() -> None:
    observations = _observations()
    profile = build_profile(_result(observations), fit_observations(observations))
    good = profile_to_toml(profile)
    with pytest.raises(ConfigError, match=r"fit\.timing: expected one of engine, client"):
        profile_from_toml(good.replace('timing = "engine"', 'timing = "vibes"'), name="p")
    with pytest.raises(ConfigError, match="need r2 and points"):
        replace(profile, fit_r2=None, fit_points=None)
    with pytest.raises(ConfigError, match=r"energy\.mean_power_w"):
        profile_from_toml(good + "\n[energy]\nmean_power_w = -3.0\n", name="p")


SIM_INFO = {
    **INFO,
    "fairserve": {
        "engine": "sim",
        "profile": "a100-llama-3-8b",
        "gpu": "NVIDIA A100-SXM4-80GB",
        "model": "meta-llama/Meta-Llama-3-8B",
    },
}


def test_a_simulated_worker_is_labelled_simulated_without_a_gpu_name() -> None:
    # Before: source "measured" and the simulated A100's name, on a machine with no GPU.
    observations = _observations()
    result = replace(_result(observations), server_info=SIM_INFO)
    profile = build_profile(result, fit_observations(observations))
    assert profile.source == "simulated"
    assert profile.gpu == "simulated" and profile.name == "simulated-meta-llama-3-8b"
    assert "NVIDIA A100-SXM4-80GB" in profile.provenance  # what it imitates, said as such
    assert "not a measurement of hardware" in profile.provenance


def test_nvml_of_the_workers_host_names_the_gpu_even_for_a_simulated_worker() -> None:
    observations = _observations()
    result = replace(_result(observations, H100), server_info=SIM_INFO)
    profile = build_profile(result, fit_observations(observations))
    assert profile.gpu == H100.name and profile.source == "simulated"


def test_the_default_path_is_the_users_data_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    observations = _observations()
    profile = build_profile(_result(observations), fit_observations(observations))
    monkeypatch.delenv(PROFILES_ENV, raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    expected = tmp_path / "fairserve" / "profiles" / f"{profile.name}.toml"
    assert default_path(profile) == expected
