"""What a sweep measures: runs of engine steps with known token loads and their total time.

An :class:`Observation` is a run of ``steps`` consecutive forward steps whose token loads are
known exactly (``loads``: how many steps ran at each load) together with the context tokens
attention read over the run and the total engine seconds it took. One prefill request is one
step at load ``L``; a window of a decode point is ``k`` steps at load ``N`` (one token per
running request); a mixed point is a decode window with one step of ``N + L`` in it.

Working with runs rather than single steps is what makes client-side measurement possible:
a client (or a worker's step counters) sees totals over many steps, never a step boundary,
and the batch-time model is linear in its coefficients once ``b0`` is fixed, so a run's total
time is as good a regression row as a single step (see :mod:`fairserve.profiling.fit`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Kind = Literal["prefill", "decode", "mixed"]
Timing = Literal["engine", "client"]
KINDS: tuple[Kind, ...] = ("prefill", "decode", "mixed")


@dataclass(frozen=True)
class GpuStats:
    """NVML readings over one observation (``None``: not measured, "n/a")."""

    energy_j: float | None = None
    mean_power_w: float | None = None
    mean_utilization_pct: float | None = None
    mean_sm_clock_mhz: float | None = None
    max_memory_used_mib: float | None = None
    throttle_reasons: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "energy_j": self.energy_j,
            "mean_power_w": self.mean_power_w,
            "mean_utilization_pct": self.mean_utilization_pct,
            "mean_sm_clock_mhz": self.mean_sm_clock_mhz,
            "max_memory_used_mib": self.max_memory_used_mib,
            "throttle_reasons": list(self.throttle_reasons),
        }


@dataclass(frozen=True)
class Observation:
    """``steps`` forward steps at known loads that took ``time_s`` engine seconds in all."""

    kind: Kind
    loads: tuple[tuple[int, int], ...]
    """``(token_load, steps_at_that_load)`` pairs; the counts sum to :attr:`steps`."""
    context_tokens: float
    """Context tokens read by attention, summed over the steps."""
    time_s: float
    timing: Timing
    tokens: int = 0
    """Tokens the steps processed (prompt + output), for energy per token."""
    label: str = ""
    gpu: GpuStats = field(default_factory=GpuStats)

    @property
    def steps(self) -> int:
        return sum(count for _, count in self.loads)

    @property
    def mean_step_s(self) -> float:
        return self.time_s / self.steps

    @property
    def mean_load_tokens(self) -> float:
        return sum(load * count for load, count in self.loads) / self.steps

    @property
    def mean_context_tokens(self) -> float:
        return self.context_tokens / self.steps

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "label": self.label,
            "timing": self.timing,
            "steps": self.steps,
            "loads": [list(pair) for pair in self.loads],
            "mean_load_tokens": self.mean_load_tokens,
            "mean_context_tokens": self.mean_context_tokens,
            "mean_step_s": self.mean_step_s,
            "tokens": self.tokens,
            "gpu": self.gpu.to_json(),
        }


def prefill(load_tokens: int, time_s: float, timing: Timing, label: str = "") -> Observation:
    """One step over a prompt of ``load_tokens`` (no cached context)."""
    return Observation(
        "prefill", ((load_tokens, 1),), 0.0, time_s, timing, tokens=load_tokens, label=label
    )


def decode_window(
    running: int,
    prompt_tokens: int,
    outputs_before: int,
    steps: int,
    time_s: float,
    timing: Timing,
    label: str = "",
) -> Observation:
    """``steps`` pure decode steps of ``running`` requests with ``prompt_tokens`` each, which
    had produced ``outputs_before`` output tokens in all when the window opened.

    Step ``s`` reads ``running·prompt + outputs_before + running·s`` context tokens, so the
    window's sum is exact without seeing the steps.
    """
    context = steps * (running * prompt_tokens + outputs_before)
    context += running * steps * (steps - 1) // 2
    return Observation(
        "decode",
        ((running, steps),),
        float(context),
        time_s,
        timing,
        tokens=running * steps,
        label=label,
    )


def mixed_window(window: Observation, prefill_tokens: int, time_s: float) -> Observation:
    """A decode ``window`` in which one step also prefilled ``prefill_tokens`` tokens."""
    ((running, steps),) = window.loads
    loads: tuple[tuple[int, int], ...] = ((running + prefill_tokens, 1),)
    if steps > 1:
        loads = ((running, steps - 1), *loads)
    return Observation(
        "mixed",
        loads,
        window.context_tokens,
        time_s,
        window.timing,
        tokens=window.tokens + prefill_tokens,
        label=window.label,
    )
