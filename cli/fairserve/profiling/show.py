"""What ``fairserve profile show`` prints: coefficients, capacity and the stability bound.

Capacity is ``b_max / t(b_max)`` tokens per second (DESIGN §1). A workload is stable on
``workers`` such workers when its token demand ``λ·(mean prompt + mean output)`` stays
below their capacity; the summary gives the demand with every prompt token computed and
with an ideal shared prefix cache (the least any scheduler can do), and the utilisation.
"""

from __future__ import annotations

from typing import Any

from fairserve.core.errors import ConfigError
from fairserve.sim.profile import Profile
from fairserve.workloads.model import Workload
from fairserve.workloads.stats import summarize


def profile_summary(
    profile: Profile, workload: Workload | None = None, workers: int = 1
) -> dict[str, Any]:
    """A JSON-able view of ``profile`` (and the load bound for ``workload``)."""
    if workers < 1:
        raise ConfigError(f"--workers: expected at least 1, got {workers}")
    fit = None
    if profile.fit_r2 is not None:
        fit = {
            "r2": profile.fit_r2,
            "points": profile.fit_points,
            "timing": profile.fit_timing,
            "rms_residual_s": profile.fit_rms_residual_s,
        }
    energy = None
    if profile.joules_per_token is not None or profile.mean_power_w is not None:
        energy = {
            "joules_per_token": profile.joules_per_token,
            "mean_power_w": profile.mean_power_w,
        }
    bt = profile.batch_time()
    summary: dict[str, Any] = {
        "name": profile.name,
        "path": str(profile.path) if profile.path else None,
        "gpu": profile.gpu,
        "model": profile.model,
        "engine": profile.engine,
        "engine_version": profile.engine_version,
        "driver_version": profile.driver_version,
        "date": profile.date,
        "source": profile.source,
        "provenance": profile.provenance,
        "batch_time": {
            "c_s": profile.c_s,
            "a_s_per_token": profile.a_s_per_token,
            "b0_tokens": profile.b0_tokens,
            "attention_s_per_token": profile.attention_s_per_token,
            "step_overhead_s": profile.step_overhead_s,
            "step_s_at_b0": bt.batch_time_s(profile.b0_tokens, 0),
            "step_s_at_max_batch": bt.batch_time_s(profile.max_batch_tokens, 0),
        },
        "capacity": {
            "kv_capacity_tokens": profile.kv_capacity_tokens,
            "max_batch_tokens": profile.max_batch_tokens,
            "max_running_requests": profile.max_running_requests,
            "tokens_per_s": profile.capacity_tokens_per_s,
        },
        "fit": fit,
        "energy": energy,
        "stability": None,
    }
    if workload is not None:
        summary["stability"] = stability(profile, workload, workers)
    return summary


def stability(profile: Profile, workload: Workload, workers: int = 1) -> dict[str, Any]:
    """``λ·(mean prompt + mean output) < capacity`` for ``workload`` on ``workers`` workers."""
    total = summarize(workload, ideal_cache=True).total()  # prompt and extend tokens both
    duration_s = workload.duration_s
    if total.calls == 0 or duration_s <= 0:
        raise ConfigError(f"workload {workload.name!r}: no calls to measure a load from")
    rate = total.calls / duration_s
    mean_prompt = total.prompt_tokens / total.calls
    mean_output = total.output_tokens / total.calls
    demand = rate * (mean_prompt + mean_output)
    demand_cached = total.demand_tokens() / duration_s
    capacity = profile.capacity_tokens_per_s * workers
    return {
        "workload": workload.name,
        "workers": workers,
        "arrival_rate_per_s": rate,
        "mean_prompt_tokens": mean_prompt,
        "mean_output_tokens": mean_output,
        "load_tokens_per_s": demand,
        "load_tokens_per_s_ideal_cache": demand_cached,
        "capacity_tokens_per_s": capacity,
        "utilization": demand / capacity,
        "utilization_ideal_cache": demand_cached / capacity,
        "stable": demand < capacity,
        "max_arrival_rate_per_s": capacity / (mean_prompt + mean_output),
    }
