"""From a sweep and its fit to a profile file the simulator reads (DESIGN §6).

The profile carries the coefficients under the simulator's own key names (``c_s``,
``a_s_per_token``, ``b0_tokens``, ...), the worker's limits, the fit quality and, where NVML
measured it, energy per token; the provenance text says how, when and against what the
numbers were taken, because a simulated throughput is only as credible as its profile.
"""

from __future__ import annotations

import os
import re
from datetime import date
from pathlib import Path
from typing import overload

import fairserve
from fairserve.core.errors import ConfigError
from fairserve.profiling.fit import BatchTimeFit
from fairserve.profiling.sweep import SweepResult
from fairserve.sim.profile import PROFILES_ENV, Profile, user_profiles_dir


def build_profile(
    result: SweepResult,
    fit: BatchTimeFit,
    step_overhead_s: float = 0.0,
    today: date | None = None,
    name: str | None = None,
) -> Profile:
    """The measured profile; ``step_overhead_s`` moves that much of the constant out of c."""
    if not 0.0 <= step_overhead_s <= fit.constant_s:
        raise ConfigError(
            f"--step-overhead-s: expected between 0 and the measured constant step time "
            f"{fit.constant_s:.6g} s, got {step_overhead_s:g}"
        )
    info, extension = result.server_info, result.extension
    gpu, model = gpu_name(result), model_name(result)
    energy = _energy(result)
    running = info.get("max_running_requests")
    tp = info.get("tp_size")
    return Profile(
        name=name or profile_name(gpu, model),
        gpu=gpu,
        model=model,
        engine=str(extension.get("engine") or "sglang"),
        engine_version=_text(info.get("version")),
        driver_version=result.gpu.driver_version if result.gpu else None,
        date=(today or date.today()).isoformat(),
        source=source(result),
        provenance=provenance(result, fit, step_overhead_s),
        tensor_parallel=tp if isinstance(tp, int) and tp >= 1 else 1,
        c_s=_round(fit.constant_s - step_overhead_s),
        a_s_per_token=_round(fit.a_s_per_token),
        b0_tokens=fit.b0_tokens,
        attention_s_per_token=_round(fit.attention_s_per_token),
        step_overhead_s=step_overhead_s,
        kv_capacity_tokens=result.limits.kv_capacity_tokens,
        max_batch_tokens=result.limits.max_batch_tokens,
        max_running_requests=running if isinstance(running, int) and running > 0 else None,
        fit_r2=_round(fit.r2),
        fit_points=fit.points,
        fit_timing=result.timing,
        fit_rms_residual_s=_round(fit.rms_residual_s),
        joules_per_token=_round(energy[0]),
        mean_power_w=_round(energy[1]),
    )


def is_simulated(result: SweepResult) -> bool:
    """The worker said it is fairserve's simulated engine (its extension's ``engine``)."""
    return result.extension.get("engine") == "sim"


def source(result: SweepResult) -> str:
    """What was profiled: ``simulated`` for a simulated worker (its numbers are the
    simulator's, whatever GPU it imitates), ``measured`` for a real engine."""
    return "simulated" if is_simulated(result) else "measured"


def gpu_name(result: SweepResult) -> str:
    """NVML's name for the board of the worker's host, and nothing else: a simulated
    worker's claimed GPU is not hardware that was measured (it is in the provenance), so
    without NVML the name is "simulated" for a simulated worker, else "unknown-gpu"."""
    if result.gpu is not None and result.gpu.name != "n/a":
        return result.gpu.name
    return "simulated" if is_simulated(result) else "unknown-gpu"


def model_name(result: SweepResult) -> str:
    info = result.server_info
    for value in (result.extension.get("model"), info.get("model_path")):
        text = _text(value)
        if text:
            return text
    return _text(info.get("served_model_name")) or "unknown-model"


def profile_name(gpu: str, model: str) -> str:
    """``<gpu>-<model>`` as a file stem: ``NVIDIA H100 80GB HBM3`` + ``meta-llama/Llama-2-7b``
    gives ``h100-80gb-hbm3-llama-2-7b``."""
    gpu_part = _slug(re.sub(r"^nvidia\s+", "", gpu.strip(), flags=re.IGNORECASE))
    model_part = _slug(model.rstrip("/").rsplit("/", 1)[-1])
    return f"{gpu_part or 'gpu'}-{model_part or 'model'}"


def default_path(profile: Profile) -> Path:
    """``<name>.toml`` in the first profile directory (``$FAIRSERVE_PROFILES_DIR``, else the
    user's data directory ``$XDG_DATA_HOME/fairserve/profiles``; never the source
    checkout), where ``--profile NAME`` finds it."""
    entries = [e for e in os.environ.get(PROFILES_ENV, "").split(os.pathsep) if e]
    directory = Path(entries[0]) if entries else user_profiles_dir()
    return directory / f"{profile.name}.toml"


def provenance(result: SweepResult, fit: BatchTimeFit, step_overhead_s: float) -> str:
    plan, limits = result.plan, result.limits
    kinds = {kind: sum(o.kind == kind for o in result.observations) for kind in _KINDS}
    timing = (
        "the worker's step counters (engine seconds, exact per step run)"
        if result.timing == "engine"
        else "client side: server e2e_latency for prefill, streamed token times for decode"
    )
    lines = [
        f"Measured by fairserve {fairserve.__version__} `fairserve profile"
        f"{' --quick' if plan.quick else ''}` against {result.url}.",
        f"Timing: {timing}; worker speed {limits.speed:g} (simulated s per wall s).",
        f"Points: {kinds['prefill']} prefill, {kinds['decode']} decode windows, "
        f"{kinds['mixed']} mixed; {result.dropped} dropped; sweep took {result.wall_s:.1f} s.",
        f"Fit: t = K + a*max(0, b - b0) + attention*context, K = {fit.constant_s:.6g} s, "
        f"R^2 {fit.r2:.6f}, RMS residual {fit.rms_residual_s:.3g} s.",
        f"step_overhead_s = {step_overhead_s:g} s given (step timings cannot separate it "
        "from c; c_s = K - step_overhead_s).",
        _gpu_line(result),
    ]
    if is_simulated(result):
        imitated = _text(result.extension.get("gpu")) or "an unnamed GPU"
        lines.append(
            f"Simulated worker: its profile {result.extension.get('profile')!r} imitates "
            f"{imitated}; these are the simulator's numbers, not a measurement of hardware."
        )
    lines += [f"Note: {note}" for note in result.notes]
    return "\n".join(lines) + "\n"


_KINDS = ("prefill", "decode", "mixed")
SIGNIFICANT_DIGITS = 6


def _gpu_line(result: SweepResult) -> str:
    gpu = result.gpu
    if gpu is None:
        return "GPU (NVML): n/a (no NVML on this host, or sampling off); energy not measured."
    slow = ", ".join(result.slowdowns) if result.slowdowns else "none"
    return (
        f"GPU (NVML): index {gpu.index}, {gpu.name}, {gpu.uuid}, driver "
        f"{gpu.driver_version or 'n/a'}; throttling seen while measuring: {slow}."
    )


def _energy(result: SweepResult) -> tuple[float | None, float | None]:
    """Joules per processed token and mean power over the points that measured energy."""
    per_token = result.joules_per_token
    powers = [o.gpu.mean_power_w for o in result.observations if o.gpu.mean_power_w]
    mean_power = sum(powers) / len(powers) if powers else None
    return per_token, mean_power


@overload
def _round(value: float) -> float: ...
@overload
def _round(value: None) -> None: ...
def _round(value: float | None) -> float | None:
    """Six significant digits: far below measurement noise, and a file a person can read."""
    return None if value is None else float(f"{value:.{SIGNIFICANT_DIGITS}g}")


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-.")


def _text(value: object) -> str | None:
    return value.strip() if isinstance(value, str) and value.strip() else None
