"""The auto-tuner's decisions: pure logic, no I/O (the loop lives in ``tuning.auto``).

The target is a fairness floor (Jain's index ≥ J over the backlogged clients of a window)
or a ceiling on the windowed service gap. A larger quantum buys locality (throughput) and
costs fairness, so the best quantum is the largest that still meets the target. The
controller searches for it on a log scale, keeping a bracket:

* ``good``: the largest quantum measured meeting the target;
* ``bad``: the smallest quantum measured breaking it.

While the target holds and nothing above is known to break it, the quantum grows by
``step_factor`` (at most). When it breaks, the quantum goes back towards ``good`` (or down
by ``step_factor`` if none is known). Once both ends are known the next quantum is their
geometric mean, so the bracket halves (in log) every step; when ``bad/good`` is within
``resolution`` the search settles on ``good``. A measurement that contradicts the bracket
(load changed) drops the stale end. Every step counts towards ``max_steps``; at the limit
the tuner stops on ``good``, or, when nothing met the target, on the smallest quantum it
tried (the fairest it saw). Windows without contention (fewer than two backlogged
clients) say nothing about fairness: the quantum is held.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Literal

from fairserve.core.errors import ConfigError
from fairserve.tuning.defaults import (
    DEFAULT_MAX_QUANTUM,
    DEFAULT_MAX_STEPS,
    DEFAULT_MIN_QUANTUM,
    DEFAULT_STEP_FACTOR,
)
from fairserve.tuning.observe import Observation

Action = Literal["raise", "lower", "hold", "settle", "stop"]


@dataclass(frozen=True, slots=True)
class Target:
    """``jain``: Jain's index at least this; ``max_gap``: windowed service gap at most this.
    Both may be given (both must hold)."""

    jain: float | None = None
    max_gap: float | None = None

    def __post_init__(self) -> None:
        if self.jain is None and self.max_gap is None:
            raise ConfigError("a target is required: --target-jain J or --max-gap TOKENS")
        if self.jain is not None and not 0 < self.jain <= 1:
            raise ConfigError(f"--target-jain: expected a number in (0, 1], got {self.jain}")
        if self.max_gap is not None and not (0 < self.max_gap < math.inf):
            raise ConfigError(
                f"--max-gap: expected a positive number of tokens, got {self.max_gap}"
            )

    def met(self, obs: Observation) -> bool | None:
        """Whether ``obs`` meets the target; None when it cannot tell (no contention)."""
        if obs.jain_index is None or obs.service_gap is None:
            return None
        if self.jain is not None and obs.jain_index < self.jain:
            return False
        return not (self.max_gap is not None and obs.service_gap > self.max_gap)

    def describe(self) -> str:
        parts = []
        if self.jain is not None:
            parts.append(f"Jain ≥ {self.jain:g}")
        if self.max_gap is not None:
            parts.append(f"gap ≤ {self.max_gap:g}")
        return " and ".join(parts)


@dataclass(frozen=True, slots=True)
class TunerConfig:
    target: Target
    min_quantum: float = DEFAULT_MIN_QUANTUM
    max_quantum: float = DEFAULT_MAX_QUANTUM
    step_factor: float = DEFAULT_STEP_FACTOR
    """The largest multiplicative change of one step."""
    resolution: float = 1.25
    """Settle when ``bad / good`` is at most this."""
    max_steps: int = DEFAULT_MAX_STEPS

    def __post_init__(self) -> None:
        if not (0 < self.min_quantum < math.inf) or not (0 < self.max_quantum < math.inf):
            raise ConfigError("--min-quantum/--max-quantum: expected positive finite numbers")
        if self.min_quantum > self.max_quantum:
            raise ConfigError(
                f"--min-quantum {self.min_quantum:g} is above --max-quantum {self.max_quantum:g}"
            )
        if not (1 < self.step_factor < math.inf):
            raise ConfigError(f"--max-step: expected a factor above 1, got {self.step_factor}")
        if not (1 < self.resolution < math.inf):
            raise ConfigError(f"resolution: expected a factor above 1, got {self.resolution}")
        if self.max_steps < 1:
            raise ConfigError(f"--max-steps: expected at least 1, got {self.max_steps}")

    def clamp(self, quantum: float) -> float:
        return min(self.max_quantum, max(self.min_quantum, quantum))


@dataclass(frozen=True, slots=True)
class TunerState:
    quantum: float
    """The quantum in force during the last window."""
    initial: float
    lowest: float
    """The smallest quantum measured: where to stop when nothing met the target."""
    good: float | None = None
    bad: float | None = None
    steps: int = 0
    done: bool = False

    @classmethod
    def start(cls, quantum: float) -> TunerState:
        return cls(quantum=quantum, initial=quantum, lowest=quantum)

    @property
    def fallback(self) -> float:
        """Where to stop now: the last good quantum, else the fairest one tried."""
        return self.good if self.good is not None else self.lowest


@dataclass(frozen=True, slots=True)
class Decision:
    """What the controller made of one window."""

    step: int
    quantum: float
    """The quantum the window was measured at."""
    next_quantum: float
    action: Action
    met: bool | None
    reason: str
    observation: Observation
    state: TunerState

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "quantum": self.quantum,
            "next_quantum": self.next_quantum,
            "action": self.action,
            "met": self.met,
            "reason": self.reason,
            "observation": self.observation.to_json(),
            "good": self.state.good,
            "bad": self.state.bad,
        }


def decide(state: TunerState, config: TunerConfig, obs: Observation) -> Decision:
    """The next quantum after a window measured at ``state.quantum``."""
    if state.done:
        raise ConfigError("the tuner already settled; start a new search")
    q = state.quantum
    stepped = replace(state, steps=state.steps + 1, lowest=min(state.lowest, q))
    met = config.target.met(obs)
    action: Action
    if met is None:
        action, nxt, reason = "hold", q, "fewer than 2 backlogged clients"
    elif met:
        action, nxt, reason, stepped = _on_met(stepped, config)
    else:
        action, nxt, reason, stepped = _on_broken(stepped, config)
    if action not in ("settle", "stop") and stepped.steps >= config.max_steps:
        nxt = stepped.fallback
        action, reason = "stop", f"{reason}; step limit {config.max_steps} reached"
    done = action in ("settle", "stop")
    new_state = replace(stepped, quantum=nxt, done=done)
    return Decision(new_state.steps, q, nxt, action, met, reason, obs, new_state)


Step = tuple[Action, float, str, TunerState]


def _on_met(state: TunerState, config: TunerConfig) -> Step:
    q = state.quantum
    good = q if state.good is None or q > state.good else state.good
    bad = state.bad if state.bad is not None and state.bad > q else None
    state = replace(state, good=good, bad=bad)
    if q >= config.max_quantum:
        return "settle", q, "target met at the upper bound", state
    if bad is None:
        return "raise", config.clamp(q * config.step_factor), "target met", state
    if bad / q <= config.resolution:
        return "settle", q, f"target met; {bad:g} breaks it", state
    nxt = min(math.sqrt(q * bad), q * config.step_factor)
    return "raise", config.clamp(nxt), f"target met; {bad:g} breaks it", state


def _on_broken(state: TunerState, config: TunerConfig) -> Step:
    q = state.quantum
    bad = q if state.bad is None or q < state.bad else state.bad
    good = state.good if state.good is not None and state.good < q else None
    state = replace(state, good=good, bad=bad)
    if good is not None and q / good <= config.resolution:
        return "settle", good, f"target broken; back to {good:g}", state
    if q <= config.min_quantum:
        return "stop", state.fallback, "target broken even at the lower bound", state
    if good is None:
        return "lower", config.clamp(q / config.step_factor), "target broken", state
    nxt = max(math.sqrt(good * q), q / config.step_factor)
    return "lower", config.clamp(nxt), f"target broken; {good:g} meets it", state
