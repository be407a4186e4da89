"""What a quantum promises: the service-gap bounds of DLPM and DoubleQ, in tokens and seconds.

DLPM (Theorem 4.1): two continuously backlogged clients of one worker never differ in
service by more than ``2·(U + Q^u)``; DoubleQ (Theorem 5.1) across ``|W|`` workers by
``2·|W|·(U + Q^u)``. ``U = w_e·L_input + w_q·M`` is the cost of the largest request. Service
units are weighted tokens (``w_e`` per prompt token, ``w_q`` per output token), so the bound
reads as tokens; divided by a worker's capacity (tokens per second) it says how long that
worker takes to serve the gap: how far behind a client can fall, in wall time.

``U`` comes from the router (the largest ``w_e·prompt + w_q·max_output`` it has seen), from
``--max-request-cost``, or, before any traffic, from a stated assumption.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fairserve.core.errors import ConfigError

ASSUMED_INPUT_TOKENS = 4096
ASSUMED_OUTPUT_TOKENS = 1024
W_E, W_Q = 1.0, 2.0
ASSUMED_REQUEST_COST = W_E * ASSUMED_INPUT_TOKENS + W_Q * ASSUMED_OUTPUT_TOKENS
ASSUMPTION = (
    f"assumed: {ASSUMED_INPUT_TOKENS} prompt + {ASSUMED_OUTPUT_TOKENS} output tokens "
    f"(w_e={W_E:g}, w_q={W_Q:g}); no request seen yet"
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
    across_tokens: float
    across_s: float | None
    """At the cluster's total capacity (None if a capacity is unknown)."""
    workers: tuple[WorkerBound, ...]

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
            "across_workers": {"tokens": self.across_tokens, "seconds": self.across_s},
            "workers": [
                {"url": w.url, "capacity_tokens_per_s": w.capacity_tokens_per_s, "gap_s": w.gap_s}
                for w in self.workers
            ],
        }


def gap_bounds(
    quantum: float, cost: RequestCost, capacities: Sequence[tuple[str, float | None]]
) -> Bounds:
    """The bounds for ``quantum`` over workers ``(url, capacity_tokens_per_s | None)``."""
    if not (quantum > 0 and math.isfinite(quantum)):
        raise ValueError(f"quantum must be a positive finite number, got {quantum}")
    count = max(1, len(capacities))
    per_worker = 2.0 * (cost.value + quantum)
    across = count * per_worker
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
        across_s=across / sum(known) if complete else None,
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
        bounds = gap_bounds(float(quantum), cost, state_capacities(state)).to_json()
    keys = ("policy", "dispatch", "quantum", "quantum_source", "worker_quantum", "worker_quanta")
    return {"router": router_url, **{k: view.get(k) for k in keys}, "bounds": bounds}
