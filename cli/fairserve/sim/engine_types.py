"""The engine model's shared types: its configuration, one step's result and its counters.

Below ``engine``, ``batching`` and ``decoding``, which all use them, so that those import
one way only (``engine`` is built from the other two); ``engine`` re-exports every name here
for existing importers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fairserve.core.counters import EngineCounts
from fairserve.core.defaults import BATCHING_DISCIPLINES, DEFAULT_BATCHING
from fairserve.core.errors import ConfigError
from fairserve.core.types import Request

__all__ = [
    "BATCHING_DISCIPLINES",
    "DEFAULT_BATCHING",
    "EngineConfig",
    "EngineStats",
    "StepResult",
]


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Capacity and batching of one engine (from a profile, see ``sim.profile``)."""

    kv_capacity_tokens: int
    max_batch_tokens: int
    max_running_requests: int | None = None
    batching: str = DEFAULT_BATCHING
    reserve_output_ratio: float = 1.0
    cache_outputs: bool = True

    def __post_init__(self) -> None:
        if self.batching not in BATCHING_DISCIPLINES:
            raise ConfigError(
                f"unknown batching {self.batching!r}; expected one of: "
                + ", ".join(BATCHING_DISCIPLINES)
            )
        if self.max_batch_tokens <= 0:
            raise ConfigError(f"max_batch_tokens must be > 0, got {self.max_batch_tokens}")
        if self.max_running_requests is not None and self.max_running_requests <= 0:
            raise ConfigError(f"max_running_requests must be > 0, got {self.max_running_requests}")


@dataclass(slots=True)
class StepResult:
    """What one (possibly fused) engine step did."""

    start_s: float
    end_s: float
    steps: int = 1
    prefill_tokens: int = 0
    decode_tokens: int = 0
    admitted: list[Request] = field(default_factory=list)
    prefilled: list[Request] = field(default_factory=list)
    """Requests whose prefill completed (their first or, after a retraction, next token)."""
    decoded: list[tuple[Request, int]] = field(default_factory=list)
    """Output tokens each request produced in this step (prefill completions included)."""
    decoded_by_client: dict[str, int] = field(default_factory=dict)
    """The same output tokens summed per client (what service accounting needs)."""
    finished: list[Request] = field(default_factory=list)
    retracted: list[Request] = field(default_factory=list)

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


EngineStats = EngineCounts
"""Cumulative counters (for ``/metrics``, reports and the dashboard): the engine counters
every host keeps alike (:class:`~fairserve.core.counters.EngineCounts`)."""
