"""Which engine ``launch`` runs: SGLang on a GPU box, the simulator everywhere else.

Auto-detection must never fail: a laptop without NVIDIA drivers, a container without the
NVML library and a box without SGLang all fall back to the embedded simulator, and the
notice says which of those it was, so a user on a GPU box who expected SGLang learns what
is missing. ``sglang`` is looked up with ``find_spec`` (not imported: importing it takes
seconds and initialises CUDA).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from fairserve.core.errors import ConfigError, FairserveError

ENGINES = ("sim", "sglang")


@dataclass(frozen=True, slots=True)
class EngineChoice:
    """The engine and, when it was picked automatically, the reason to tell the user."""

    engine: str
    notice: str | None = None


def gpu_count() -> int:
    """NVIDIA GPUs NVML sees; 0 when NVML or its driver library is missing."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # any NVML failure (no library, no driver, no device) means "no GPU"
        return 0


def sglang_installed() -> bool:
    try:
        return importlib.util.find_spec("sglang") is not None
    except (ImportError, ValueError):
        return False


def detect(model: str | None, gpus: int | None = None, sglang: bool | None = None) -> EngineChoice:
    """The engine for ``--engine`` left out (``gpus``/``sglang`` injectable for tests)."""
    found_gpus = gpu_count() if gpus is None else gpus
    has_sglang = sglang_installed() if sglang is None else sglang
    if found_gpus and has_sglang and model:
        return EngineChoice("sglang", f"using the sglang engine ({found_gpus} GPUs, {model})")
    if not found_gpus:
        why = "no NVIDIA GPU found (NVML)"
    elif not has_sglang:
        why = (
            f"{found_gpus} GPUs found but SGLang is not installed (pip install 'fairserve[sglang]')"
        )
    else:
        why = f"{found_gpus} GPUs and SGLang found but no --model given"
    return EngineChoice("sim", f"{why}: using the simulated engine (--engine sim)")


def check_sglang(model: str | None) -> None:
    """Refuse ``--engine sglang`` with the reason.

    A missing ``--model`` is a usage error (exit 2: the command line is incomplete); a
    missing SGLang install is an environment error (exit 1: the command line is right, the
    machine is not). With both present the launcher itself is still missing: it arrives with
    the SGLang issue.
    """
    if not model:
        raise ConfigError("--engine sglang: --model is required (a Hugging Face id or a path)")
    if not sglang_installed():
        raise FairserveError(
            "--engine sglang: SGLang is not installed (pip install 'fairserve[sglang]'); "
            "use --engine sim for simulated workers"
        )
    raise FairserveError(
        "--engine sglang: the SGLang worker launcher is not available yet (it arrives in a "
        "later release); use --engine sim, or start SGLang yourself and pass --worker-url"
    )
