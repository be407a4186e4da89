"""Application demand predictors for Justitia (§IV-B).

Justitia orders applications by their virtual finish time ``F_j = V(a_j) + C_j``, so it
needs the cost ``C_j`` of a whole application when its first request arrives. The paper
trains a small MLP per application type on TF-IDF features of the prompt; fairserve keeps
the predictor pluggable behind :class:`DemandPredictor` and ships two:

* :class:`OraclePredictor` — the true demand, for simulation and for upper-bound studies:
  the host (simulator, replay) puts the application's total cost in
  ``req.meta["app_cost"]``; without it the request's own KV token-time is used.
* :class:`MovingAveragePredictor` — a windowed mean of the observed costs of the last
  finished applications of the same ``req.app_type``; a prior for types not seen yet.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any, Protocol, runtime_checkable

from fairserve.core.cost import kv_token_time
from fairserve.core.errors import ConfigError
from fairserve.core.types import Request
from fairserve.sched.base import MAX_CLIENTS

APP_COST_KEY = "app_cost"
"""``Request.meta`` key under which a host passes an application's true total cost."""


@runtime_checkable
class DemandPredictor(Protocol):
    """Predicts an application's total cost from its first request; learns from finishes."""

    name: str

    def predict(self, req: Request) -> float:
        """Predicted total cost of the application that ``req`` opens."""
        ...

    def observe(self, app_type: str | None, cost: float) -> None:
        """An application of ``app_type`` finished having cost ``cost``."""
        ...

    def state(self) -> dict[str, Any]:
        """JSON-able state for snapshots."""
        ...


class OraclePredictor:
    """The true cost: ``meta["app_cost"]`` when the host knows it, else the request's own."""

    name = "oracle"

    def predict(self, req: Request) -> float:
        given = req.meta.get(APP_COST_KEY)
        if given is None:
            return kv_token_time(req.input_tokens, req.expected_output_tokens)
        if not isinstance(given, int | float) or not math.isfinite(given) or given < 0:
            raise ConfigError(
                f"request {req.id!r}: meta[{APP_COST_KEY!r}] must be a non-negative number, "
                f"got {given!r}"
            )
        return float(given)

    def observe(self, app_type: str | None, cost: float) -> None:
        """The oracle already knows; nothing to learn."""

    def state(self) -> dict[str, Any]:
        return {"predictor": self.name}


class MovingAveragePredictor:
    """Mean cost of the last ``window`` finished applications of the same type.

    Applications without a type share one pool (``None``). A type with no finished
    application yet is predicted at ``prior_cost``.
    """

    name = "moving-average"

    def __init__(self, prior_cost: float, window: int) -> None:
        if not math.isfinite(prior_cost) or prior_cost < 0:
            raise ConfigError(f"prior_cost must be a non-negative number, got {prior_cost}")
        if window < 1:
            raise ConfigError(f"predictor window must be >= 1, got {window}")
        self.prior_cost = float(prior_cost)
        self.window = int(window)
        self._seen: dict[str | None, deque[float]] = {}

    def predict(self, req: Request) -> float:
        return self.estimate(req.app_type)

    def estimate(self, app_type: str | None) -> float:
        """Current prediction for ``app_type``."""
        seen = self._seen.get(app_type)
        if not seen:
            return self.prior_cost
        return sum(seen) / len(seen)

    def observe(self, app_type: str | None, cost: float) -> None:
        """Past ``MAX_CLIENTS`` types (names come from requests), the least recently
        observed type is dropped: it is predicted at ``prior_cost`` again, as a new one."""
        seen = self._seen
        costs = seen.pop(app_type, None)
        if costs is None:
            costs = deque(maxlen=self.window)
            if len(seen) >= MAX_CLIENTS:
                del seen[next(iter(seen))]
        costs.append(float(cost))
        seen[app_type] = costs  # last observed, last dropped

    def state(self) -> dict[str, Any]:
        return {
            "predictor": self.name,
            "prior_cost": self.prior_cost,
            "window": self.window,
            "estimates": {str(t): self.estimate(t) for t in self._seen},
        }
