"""Cost functions: how much *service* an admission or a decode step represents.

Three families from the papers:

* :class:`WeightedTokenCost` (VTC, DLPM): ``w_e`` per extend (uncached prompt) token and
  ``w_q`` per output token, defaults 1 and 2 (DLPM §3).
* :class:`KVTokenTimeCost` (Justitia §IV-A): KV token-time, the KV-cache occupancy summed
  over decode iterations; the i-th output token is charged ``p + i``, so a request with
  prompt ``p`` and ``d`` outputs costs ``p·d + d(d+1)/2`` (the paper writes ``p·d + d²/2``).
* :class:`TimeCost`: seconds of GPU time from a batch-time model (DESIGN §1), so that
  fairness can be expressed in time on heterogeneous workers.

Costs are *unweighted*; policies divide by a client's weight when they charge counters.
A decode charge is asked for after the host counted the new token in
``Request.output_tokens``, so ``req.output_tokens`` is the index ``i`` (1-based) of the
token being charged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Protocol, runtime_checkable

from fairserve.core.errors import ConfigError
from fairserve.core.types import Request


@runtime_checkable
class CostModel(Protocol):
    """Service charged for the two events every host reports."""

    @property
    def name(self) -> str:
        """Short name shown in snapshots (``tokens``, ``kv-token-time``, ``time``)."""
        ...

    def admit_cost(self, req: Request, extend_tokens: int) -> float:
        """Service of computing ``extend_tokens`` prompt tokens of ``req``."""
        ...

    def decode_cost(self, req: Request) -> float:
        """Service of the output token ``req.output_tokens`` (1-based) just produced."""
        ...

    def decode_span_cost(self, req: Request, steps: int) -> float:
        """Service of the last ``steps`` output tokens, ending at ``req.output_tokens``.

        Lets hosts that fuse several decode steps (the simulator) charge them at once;
        equals the sum of ``decode_cost`` over those tokens."""
        ...

    def request_cost(self, input_tokens: int, cached_tokens: int, output_tokens: int) -> float:
        """Total service of a whole request (used for predictions and reports)."""
        ...


def _non_negative(name: str, value: float) -> float:
    if not math.isfinite(value) or value < 0:
        raise ConfigError(f"{name} must be a non-negative number, got {value}")
    return value


@dataclass(frozen=True, slots=True)
class WeightedTokenCost:
    """``w_e`` per extend token plus ``w_q`` per output token (VTC, DLPM, DoubleQ)."""

    w_e: float = 1.0
    w_q: float = 2.0
    name: str = "tokens"
    per_request_decode: ClassVar[bool] = False
    """Every output token costs ``w_q`` whatever the request: charge groups at once."""

    def __post_init__(self) -> None:
        _non_negative("w_e", self.w_e)
        _non_negative("w_q", self.w_q)

    def admit_cost(self, req: Request, extend_tokens: int) -> float:
        return self.w_e * extend_tokens

    def decode_cost(self, req: Request) -> float:
        return self.w_q

    def decode_span_cost(self, req: Request, steps: int) -> float:
        return self.w_q * steps

    def request_cost(self, input_tokens: int, cached_tokens: int, output_tokens: int) -> float:
        return self.w_e * max(0, input_tokens - cached_tokens) + self.w_q * output_tokens

    def max_request_cost(self, max_input_tokens: int, max_batch_tokens: int) -> float:
        """``U = w_e·L_input + w_q·M``, the per-request term of the DLPM/DoubleQ bounds."""
        return self.w_e * max_input_tokens + self.w_q * max_batch_tokens


@dataclass(frozen=True, slots=True)
class KVTokenTimeCost:
    """Justitia's memory-centric cost: the i-th output token costs ``p + i`` (KV tokens held)."""

    name: str = "kv-token-time"

    def admit_cost(self, req: Request, extend_tokens: int) -> float:
        return 0.0

    def decode_cost(self, req: Request) -> float:
        return float(req.input_tokens + req.output_tokens)

    def decode_span_cost(self, req: Request, steps: int) -> float:
        last = req.input_tokens + req.output_tokens
        return float(steps * last - steps * (steps - 1) / 2)

    def request_cost(self, input_tokens: int, cached_tokens: int, output_tokens: int) -> float:
        return kv_token_time(input_tokens, output_tokens)


def kv_token_time(prompt_tokens: int, decode_tokens: int) -> float:
    """``sum_{i=1..d} (p + i) = p·d + d(d+1)/2`` (Justitia eq. 1)."""
    p, d = prompt_tokens, decode_tokens
    return float(p * d + d * (d + 1) / 2)


class BatchTimeModel(Protocol):
    """What a time cost needs from a batch-time profile (the simulator defines the file)."""

    def batch_time_s(self, token_load: int, context_tokens: int) -> float:
        """Seconds for one forward step over ``token_load`` new tokens reading
        ``context_tokens`` cached context tokens."""
        ...


@dataclass(frozen=True, slots=True)
class PiecewiseLinearBatchTime:
    """``t = overhead + c + a·max(0, b − b0) + attention·context`` (throughput-optimal paper).

    Below ``b0`` tokens a step is memory-bound and costs ``c``; above it every extra token
    adds ``a`` seconds. ``attention_s_per_token`` charges the context read by attention.
    """

    c_s: float
    a_s_per_token: float
    b0_tokens: int
    attention_s_per_token: float = 0.0
    step_overhead_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("c_s", "a_s_per_token", "attention_s_per_token", "step_overhead_s"):
            _non_negative(name, getattr(self, name))
        if self.b0_tokens < 0:
            raise ConfigError(f"b0_tokens must be >= 0, got {self.b0_tokens}")

    def batch_time_s(self, token_load: int, context_tokens: int) -> float:
        compute = self.c_s + self.a_s_per_token * max(0, token_load - self.b0_tokens)
        return self.step_overhead_s + compute + self.attention_s_per_token * context_tokens

    def capacity_tokens_per_s(self, max_token_load: int) -> float:
        """Throughput at a full token budget: ``b_max / t(b_max)``."""
        if max_token_load <= 0:
            raise ConfigError(f"max_token_load must be > 0, got {max_token_load}")
        step_s = self.batch_time_s(max_token_load, 0)
        if step_s <= 0:
            raise ConfigError("batch time is zero at the full token budget: no capacity bound")
        return max_token_load / step_s


@dataclass(frozen=True, slots=True)
class TimeCost:
    """GPU seconds per token at a reference (saturating) load, plus attention over context.

    Marginal cost below ``b0`` is zero, which would make fairness free; charging the
    average per-token time at ``reference_load_tokens`` keeps every token priced.
    """

    model: BatchTimeModel
    reference_load_tokens: int
    name: str = "time"

    def __post_init__(self) -> None:
        if self.reference_load_tokens <= 0:
            raise ConfigError(
                f"reference_load_tokens must be > 0, got {self.reference_load_tokens}"
            )

    @property
    def token_s(self) -> float:
        """Average seconds per token in a full batch (no context)."""
        ref = self.reference_load_tokens
        return self.model.batch_time_s(ref, 0) / ref

    def _attention_s(self, context_tokens: int) -> float:
        return self.model.batch_time_s(0, context_tokens) - self.model.batch_time_s(0, 0)

    def admit_cost(self, req: Request, extend_tokens: int) -> float:
        return self.token_s * extend_tokens + self._attention_s(req.cached_tokens)

    def decode_cost(self, req: Request) -> float:
        return self.token_s + self._attention_s(req.input_tokens + req.output_tokens)

    def decode_span_cost(self, req: Request, steps: int) -> float:
        last = req.input_tokens + req.output_tokens
        attention = sum(self._attention_s(last - i) for i in range(steps))
        return self.token_s * steps + attention

    def request_cost(self, input_tokens: int, cached_tokens: int, output_tokens: int) -> float:
        extend = max(0, input_tokens - cached_tokens)
        attention = self._attention_s(cached_tokens) + sum(
            self._attention_s(input_tokens + i) for i in range(1, output_tokens + 1)
        )
        return self.token_s * (extend + output_tokens) + attention
