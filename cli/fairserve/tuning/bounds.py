"""What a quantum promises: the service-gap bounds of DLPM and DoubleQ, in tokens and seconds.

DLPM (Theorem 4.1): two continuously backlogged clients of one worker never differ in
service by more than ``2·(U + Q^u)``; DoubleQ (Theorem 5.1) across ``|W|`` workers by
``2·|W|·(U + Q^u)``, for a finite worker quantum: with ``Q^w = inf`` the across-worker gap
is unbounded (Theorem A.5), and so it is reported. ``U = w_e·L_input + w_q·M`` is the cost
of the largest request. The bounds are in *service units* (``w_e`` per prompt token plus
``w_q`` per output token, divided by the client's weight), not tokens; divided by a
worker's capacity they say how long that worker takes to serve the gap: how far behind a
client can fall, in wall time.

``U`` comes from the router (the largest ``w_e·prompt + w_q·max_output`` it has seen), from
``--max-request-cost``, or, before any traffic, from a stated assumption.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fairserve.core.cost import WeightedTokenCost
from fairserve.core.errors import ConfigError

ASSUMED_INPUT_TOKENS = 4096
ASSUMED_OUTPUT_TOKENS = 1024
_COST = WeightedTokenCost()
W_E, W_Q = _COST.w_e, _COST.w_q
ASSUMED_REQUEST_COST = _COST.request_cost(ASSUMED_INPUT_TOKENS, 0, ASSUMED_OUTPUT_TOKENS)
ASSUMPTION = (
    f"{ASSUMED_INPUT_TOKENS} prompt + {ASSUMED_OUTPUT_TOKENS} output tokens "
    f"(w_e={W_E:g}, w_q={W_Q:g}); no request seen yet"
)
"""The note of an assumed ``U`` (printed after the source, "assumed: ...")."""
UNBOUNDED_WHY = "Q^w = inf, so no bound holds across workers (DLPM paper, Theorem A.5)"
EQUAL_WHY = (
    "equal because the workers have equal capacity: |W| workers serve |W| times the "
    "per-worker gap in the same time"
)


@dataclass(frozen=True, slots=True)
class RequestCost:
    """``U`` and where it came from: ``given``, ``observed`` or ``assumed``."""

    value: float
    source: str
    note: str = ""


def request_cost(state: Mapping[str, Any], given: float | None = None) -> RequestCost:
    """``U``: ``given`` (``--max-request-cost``), else the router's largest request seen,
    else :data:`ASSUMED_REQUEST_COST`."""
    if given is not None:
        return RequestCost(given, "given", "--max-request-cost")
    seen = state.get("max_request_cost")
    if isinstance(seen, int | float) and not isinstance(seen, bool) and seen > 0:
        return RequestCost(float(seen), "observed", "largest request the router has seen")
    return RequestCost(ASSUMED_REQUEST_COST, "assumed", ASSUMPTION)


@dataclass(frozen=True, slots=True)
class WorkerBound:
    url: str
    capacity_tokens_per_s: float | None
    gap_s: float | None
    """``2·(U + Q^u)`` at this worker's capacity; None when the capacity is unknown."""


@dataclass(frozen=True, slots=True)
class Bounds:
    quantum: float
    request_cost: RequestCost
    worker_count: int
    per_worker_tokens: float
    per_worker_s: float | None
    """At the slowest worker's capacity (None if a capacity is unknown)."""
    across_tokens: float | None
    """None when unbounded (``Q^w = inf``)."""
    across_s: float | None
    """At the cluster's total capacity (None if a capacity is unknown, or unbounded)."""
    workers: tuple[WorkerBound, ...]

    @property
    def across_unbounded(self) -> bool:
        return self.across_tokens is None

    @property
    def seconds_equal(self) -> bool:
        """Both bounds take the same time (workers of equal capacity): worth saying why."""
        per, across = self.per_worker_s, self.across_s
        return per is not None and across is not None and math.isclose(per, across)

    def to_json(self) -> dict[str, Any]:
        return {
            "quantum": self.quantum,
            "request_cost": {
                "value": self.request_cost.value,
                "source": self.request_cost.source,
                "note": self.request_cost.note,
            },
            "worker_count": self.worker_count,
            "per_worker": {"tokens": self.per_worker_tokens, "seconds": self.per_worker_s},
            "across_workers": {
                "tokens": self.across_tokens,
                "seconds": self.across_s,
                "unbounded": self.across_unbounded,
                **({"why": UNBOUNDED_WHY} if self.across_unbounded else {}),
            },
            "unit": "service units (w_e·prompt + w_q·output tokens, divided by weight)",
            "seconds_equal_why": EQUAL_WHY if self.seconds_equal else None,
            "workers": [
                {"url": w.url, "capacity_tokens_per_s": w.capacity_tokens_per_s, "gap_s": w.gap_s}
                for w in self.workers
            ],
        }


def gap_bounds(
    quantum: float,
    cost: RequestCost,
    capacities: Sequence[tuple[str, float | None]],
    worker_quantum: float | None = None,
) -> Bounds:
    """The bounds for ``quantum`` over workers ``(url, capacity_tokens_per_s | None)``;
    ``worker_quantum`` infinite makes the across-worker bound unbounded (Theorem A.5)."""
    if not (quantum > 0 and math.isfinite(quantum)):
        raise ValueError(f"quantum must be a positive finite number, got {quantum}")
    count = max(1, len(capacities))
    per_worker = 2.0 * (cost.value + quantum)
    unbounded = worker_quantum is not None and math.isinf(worker_quantum)
    across = None if unbounded else count * per_worker
    workers = tuple(
        WorkerBound(url, cap, per_worker / cap if cap else None) for url, cap in capacities
    )
    known = [cap for _, cap in capacities if cap]
    complete = bool(capacities) and len(known) == len(capacities)
    return Bounds(
        quantum=quantum,
        request_cost=cost,
        worker_count=count,
        per_worker_tokens=per_worker,
        per_worker_s=per_worker / min(known) if complete else None,
        across_tokens=across,
        across_s=across / sum(known) if complete and across is not None else None,
        workers=workers,
    )


def state_capacities(state: Mapping[str, Any]) -> list[tuple[str, float | None]]:
    """``(url, capacity)`` of the workers the router routes to (all of them if none is
    healthy: the bound is about the configured cluster)."""
    workers = [w for w in state.get("workers", []) if isinstance(w, dict)]
    healthy = [w for w in workers if w.get("healthy")] or workers
    out: list[tuple[str, float | None]] = []
    for worker in healthy:
        cap = worker.get("capacity_tokens_per_s")
        if isinstance(cap, bool) or not isinstance(cap, int | float) or cap <= 0:
            cap = None
        out.append((str(worker.get("url")), None if cap is None else float(cap)))
    return out


def quantum_report(
    router_url: str,
    view: Mapping[str, Any],
    state: Mapping[str, Any],
    max_request_cost: float | None = None,
) -> dict[str, Any]:
    """What ``tune quantum`` prints: the router's quantum view (``GET /fairserve/v1/quantum``)
    and the bounds of its Q^u (None for a policy without a quantum)."""
    given = max_request_cost
    if given is not None and not (given > 0 and math.isfinite(given)):
        raise ConfigError(f"--max-request-cost: expected a positive number, got {given:g}")
    quantum = view.get("quantum")
    bounds = None
    if isinstance(quantum, int | float) and not isinstance(quantum, bool):
        cost = request_cost(state, given)
        worker_q = _number(view.get("worker_quantum"))
        capacities = state_capacities(state)
        bounds = gap_bounds(float(quantum), cost, capacities, worker_q).to_json()
    keys = ("policy", "dispatch", "quantum", "quantum_source", "worker_quantum", "worker_quanta")
    return {"router": router_url, **{k: view.get(k) for k in keys}, "bounds": bounds}


def _number(value: object) -> float | None:
    """A JSON number, or ``"inf"`` (how the router writes an infinite ``Q^w``)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None
