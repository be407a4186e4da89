"""Which points a sweep measures, sized from the worker's own limits.

Prefill points are single prompts over a geometric ladder of lengths up to the token budget
(one chunk each, so one step each), dense enough around small loads to place ``b0``.
Decode points run ``N`` concurrent long generations and time a window in which all ``N``
decode together; short and long prompts separate the attention (context) term from the
load term. Mixed points add one prefill of ``L`` tokens to a decode window, a step at load
``N + L`` that checks the model's claim that prefill and decode tokens cost the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fairserve.core.errors import ConfigError

_QUICK_PREFILL_POINTS = 14
_FULL_PREFILL_POINTS = 28
_MIN_PREFILL_TOKENS = 8
_KV_SHARE = 0.45
"""Fraction of the KV pool one decode point may reserve (prompt + max output, all requests):
well clear of retractions, which would break the window's accounting."""


@dataclass(frozen=True)
class WorkerLimits:
    """What the sweep must stay within, from ``/get_server_info``."""

    max_batch_tokens: int
    kv_capacity_tokens: int
    max_running_requests: int
    speed: float = 1.0
    """Simulated seconds per wall second (``fairserve.speed``; 1 for a real GPU)."""

    @classmethod
    def from_server_info(cls, info: dict[str, Any]) -> WorkerLimits:
        extension = info.get("fairserve") if isinstance(info.get("fairserve"), dict) else {}
        budget = info.get("chunked_prefill_size") or info.get("max_prefill_tokens")
        kv = info.get("max_total_num_tokens")
        if not isinstance(budget, int) or budget <= 0:
            raise ConfigError(
                "worker server info: expected a positive chunked_prefill_size or "
                f"max_prefill_tokens, got {budget!r}"
            )
        if not isinstance(kv, int) or kv <= 0:
            raise ConfigError(
                f"worker server info: expected a positive max_total_num_tokens, got {kv!r}"
            )
        running = info.get("max_running_requests")
        speed = extension.get("speed", 1.0) if isinstance(extension, dict) else 1.0
        if not isinstance(speed, int | float) or not speed > 0:
            raise ConfigError(f"worker server info: fairserve.speed: expected > 0, got {speed!r}")
        return cls(
            max_batch_tokens=budget,
            kv_capacity_tokens=kv,
            max_running_requests=running if isinstance(running, int) and running > 0 else kv,
            speed=float(speed),
        )


@dataclass(frozen=True)
class DecodePoint:
    running: int
    prompt_tokens: int
    mixed_prefill_tokens: tuple[int, ...] = ()

    @property
    def label(self) -> str:
        return f"decode N={self.running} prompt={self.prompt_tokens}"


@dataclass(frozen=True)
class SweepPlan:
    prefill_tokens: tuple[int, ...]
    repetitions: int
    decode: tuple[DecodePoint, ...]
    decode_repetitions: int
    window_wall_s: float
    """Wall seconds a decode window should last (longer with client timing: less jitter)."""
    quick: bool = False
    warmup_tokens: tuple[int, ...] = (64, 512)
    """Prompts sent first and not measured (CUDA graphs, allocator, JIT warm up)."""

    @property
    def units(self) -> int:
        """Progress units: one per request or decode run."""
        prefill = len(self.prefill_tokens) * self.repetitions
        return len(self.warmup_tokens) + prefill + len(self.decode) * self.decode_repetitions


def make_plan(limits: WorkerLimits, quick: bool, client_timing: bool) -> SweepPlan:
    budget = limits.max_batch_tokens
    count = _QUICK_PREFILL_POINTS if quick else _FULL_PREFILL_POINTS
    low = min(_MIN_PREFILL_TOKENS, budget)
    ladder = np.unique(np.round(np.geomspace(low, budget, count)).astype(int))
    prefill = tuple(int(v) for v in ladder if v <= min(budget, limits.kv_capacity_tokens // 2))
    wanted = _QUICK_DECODE if quick else _FULL_DECODE
    decode = tuple(p for p in (_fit(p, limits) for p in wanted) if p is not None)
    window_s = (0.6 if quick else 1.5) if client_timing else (0.15 if quick else 0.4)
    return SweepPlan(
        prefill_tokens=prefill,
        repetitions=(3 if client_timing else 2) if quick else 5,
        decode=tuple(dict.fromkeys(decode)),
        decode_repetitions=1 if quick else 2,
        window_wall_s=window_s,
        quick=quick,
    )


_QUICK_DECODE = (
    DecodePoint(8, 16),
    DecodePoint(32, 512, (256, 1024)),
    DecodePoint(128, 16),
)
_FULL_DECODE = (
    DecodePoint(1, 16),
    DecodePoint(4, 16),
    DecodePoint(16, 16, (128, 512, 2048)),
    DecodePoint(64, 16),
    DecodePoint(128, 16, (512,)),
    DecodePoint(256, 16),
    DecodePoint(8, 2048),
    DecodePoint(32, 1024, (1024,)),
    DecodePoint(64, 512),
)


def _fit(point: DecodePoint, limits: WorkerLimits) -> DecodePoint | None:
    """The point shrunk to the worker's limits, or None when it cannot run there."""
    running = min(point.running, limits.max_running_requests)
    share = int(limits.kv_capacity_tokens * _KV_SHARE)
    prompt = min(point.prompt_tokens, max(1, share // (4 * running)))
    if running < 1 or running * (prompt + 32) > share:
        return None
    room = limits.max_batch_tokens - running
    mixed = tuple(t for t in point.mixed_prefill_tokens if 0 < t <= room)
    return DecodePoint(running, prompt, mixed)
