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

from fairserve.core.defaults import ENGINES
from fairserve.core.errors import ConfigError, FairserveError
from fairserve.profiling.nvml import gpu_count

__all__ = [
    "ENGINES", "EngineChoice", "check_sglang", "detect", "gpu_count", "gpu_groups",
    "parse_gpu_ids", "sglang_installed",
]  # fmt: skip


@dataclass(frozen=True, slots=True)
class EngineChoice:
    """The engine and, when it was picked automatically, the reason to tell the user."""

    engine: str
    notice: str | None = None


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


def check_sglang(model: str | None, *, installed: bool = True) -> None:
    """Refuse ``--engine sglang`` with the reason.

    A missing ``--model`` is a usage error (exit 2: the command line is incomplete); a
    missing SGLang install is an environment error (exit 1: the command line is right, the
    machine is not). ``installed=False`` skips the install check (``--dry-run`` shows the
    commands on any machine).
    """
    if not model:
        raise ConfigError("--engine sglang: --model is required (a Hugging Face id or a path)")
    if installed and not sglang_installed():
        raise FairserveError(
            "--engine sglang: SGLang is not installed (pip install 'fairserve[sglang]'); "
            "use --engine sim for simulated workers"
        )


def parse_gpu_ids(text: str) -> list[int]:
    """``--gpus 0,1,2`` as distinct ids; anything else is a usage error naming the option."""
    parts = [p.strip() for p in text.split(",")]
    if not parts or not all(p.isdigit() for p in parts):
        raise ConfigError(f"--gpus: expected GPU ids like 0,1,2, got {text!r}")
    ids = [int(p) for p in parts]
    if len(set(ids)) != len(ids):
        raise ConfigError(f"--gpus: GPU ids must be distinct, got {text!r}")
    return ids


def gpu_groups(
    gpus: str | None, tp: int, workers: int | None = None, found: int | None = None
) -> list[tuple[int, ...]]:
    """The GPUs of each SGLang server: ``tp`` consecutive ids of ``--gpus`` (default: every
    GPU NVML finds, or ``found`` for tests), one server per group (``workers`` of them, or
    as many as fit)."""
    if tp < 1:
        raise ConfigError(f"--tp: expected a positive integer, got {tp}")
    if gpus is not None:
        ids = parse_gpu_ids(gpus)
    else:
        count = gpu_count() if found is None else found
        if count <= 0:
            raise FairserveError(
                "--engine sglang: no NVIDIA GPU found (NVML); pass --gpus IDS to choose GPUs"
            )
        ids = list(range(count))
    if workers is None:
        if len(ids) % tp:
            raise ConfigError(
                f"--tp {tp}: {len(ids)} GPUs ({_ids(ids)}) do not split into groups of {tp}; "
                "pass --gpus or --workers"
            )
        workers = len(ids) // tp
    if workers < 1 or workers * tp > len(ids):
        raise ConfigError(
            f"--workers {workers} with --tp {tp} needs {workers * tp} GPUs; "
            f"{len(ids)} available ({_ids(ids)})"
        )
    return [tuple(ids[i * tp : (i + 1) * tp]) for i in range(workers)]


def _ids(ids: list[int]) -> str:
    return ",".join(map(str, ids))
