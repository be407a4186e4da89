"""Justitia (§IV): application-level fair queuing on KV token-time.

An *application* is a group of calls (``req.app``; a request without one is its own
application). Its cost is KV token-time, ``p·d + d²/2`` per call, predicted for the whole
application when its first request arrives. Justitia serves applications in the order in
which they would *finish* under GPS, the ideal fair share of the KV cache, computed with
virtual time as in packet fair queuing:

* ``V`` advances at ``M / N_t`` per step (``M`` KV capacity in tokens, ``N_t`` applications
  active in the GPS reference; ``N_t`` is taken as at least 1, so ``V`` keeps moving when
  the reference is idle). It is brought up to date lazily at every event from ``now_s``.
* An application arriving at ``a_j`` with predicted cost ``C_j`` gets the virtual finish
  ``F_j = V(a_j) + C_j`` once; it stays active in GPS until ``V`` reaches ``F_j``.
* Waiting requests are admitted in ascending ``F_j`` of their application (ties by
  arrival), non-preemptively, skipping what does not fit.

Weights generalise it to weighted fair queuing: the application of a client with weight
``w`` finishes at ``V + C_j / w`` and counts ``w`` in ``N_t``.

An application *finishes* when its outstanding requests reach 0: its observed cost goes to
the predictor and it leaves the order. A later request with the same ``app`` opens a new
application (hosts replaying sequential multi-call programs should put the *remaining*
cost in ``meta["app_cost"]`` for the oracle). Its GPS reference entry is independent of
the real service and expires by virtual time alone.

Time: ``now_s`` is in seconds; ``steps_per_s`` converts to the paper's iterations
(``V`` gains ``M·steps_per_s/N_t`` per second). Hosts that count time in steps keep 1.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fairserve.core.cost import KVTokenTimeCost
from fairserve.core.errors import ConfigError
from fairserve.core.types import Request
from fairserve.sched.local.base import LocalPolicy, MatchLen, register_local
from fairserve.sched.local.predictor import (
    DemandPredictor,
    MovingAveragePredictor,
    OraclePredictor,
)
from fairserve.sched.params import Param

PARAMS = (
    Param(
        "kv_capacity_tokens",
        int,
        65536,
        "KV cache capacity M in tokens (virtual time advances M/N_t per step)",
        minimum=0,
        exclusive_minimum=True,
    ),
    Param(
        "predictor",
        str,
        "oracle",
        "application demand predictor (oracle: host-given true cost; moving-average: per type)",
        choices=("oracle", "moving-average"),
    ),
    Param(
        "prior_cost",
        float,
        1e6,
        "moving-average predictor: cost of an application type not seen yet (KV token-time)",
        minimum=0.0,
    ),
    Param(
        "predictor_window",
        int,
        16,
        "moving-average predictor: finished applications averaged per type",
        minimum=1,
    ),
    Param(
        "steps_per_s",
        float,
        1.0,
        "decode steps per second of now_s (1 when the host's clock counts steps)",
        minimum=0.0,
        exclusive_minimum=True,
    ),
)

AppKey = tuple[str, str]
SNAPSHOT_APPS = 100
"""Applications listed in a snapshot (earliest virtual finish first)."""


@dataclass(slots=True)
class AppInstance:
    """One application in the real queue: its virtual finish and what is still open."""

    key: AppKey
    client: str
    app_type: str | None
    finish_v: float
    predicted_cost: float
    seq: int
    outstanding: int = 0
    observed_cost: float = 0.0


@register_local
class Justitia(LocalPolicy):
    """Serve applications in ascending GPS virtual finish time (KV token-time cost)."""

    name = "justitia"
    description = "application-level fair queuing on KV token-time (virtual finish order)"
    params = PARAMS

    def __init__(self, *, demand_predictor: DemandPredictor | None = None, **kwargs: Any):
        kwargs["cost"] = kwargs.get("cost") or KVTokenTimeCost()
        super().__init__(**kwargs)
        self.predictor: DemandPredictor = demand_predictor or self._make_predictor()
        self.vtime = 0.0
        self._clock_s: float | None = None
        self._gps: list[tuple[float, float]] = []  # (F_j, weight) of apps active in GPS
        self._gps_active_weight = 0.0  # N_t, weighted
        self._apps: dict[AppKey, AppInstance] = {}
        self._of_request: dict[int, AppKey] = {}
        self._seq = 0

    def _make_predictor(self) -> DemandPredictor:
        if self.p["predictor"] == "oracle":
            return OraclePredictor()
        return MovingAveragePredictor(self.p["prior_cost"], self.p["predictor_window"])

    # ------------------------------------------------------------ virtual time
    def advance(self, now_s: float) -> float:
        """Bring ``V`` up to ``now_s``, retiring GPS applications whose ``F_j`` is reached."""
        if self._clock_s is None:
            self._clock_s = now_s
        left_s = now_s - self._clock_s
        if left_s <= 0:
            return self.vtime
        self._clock_s = now_s
        capacity = self.p["kv_capacity_tokens"] * self.p["steps_per_s"]
        while left_s > 0:
            rate = capacity / (self._gps_active_weight if self._gps else 1.0)
            if not self._gps or (self._gps[0][0] - self.vtime) / rate > left_s:
                self.vtime += rate * left_s
                break
            finish_v = self._gps[0][0]
            left_s -= max(0.0, (finish_v - self.vtime) / rate)
            self.vtime = max(self.vtime, finish_v)
            self._retire_reached()
        return self.vtime

    def _retire_reached(self) -> None:
        while self._gps and self._gps[0][0] <= self.vtime:
            _, weight = heapq.heappop(self._gps)
            self._gps_active_weight -= weight
        if not self._gps:
            self._gps_active_weight = 0.0  # no drift from repeated subtraction

    # ------------------------------------------------------------ events
    def _arrive(self, req: Request, now_s: float) -> None:
        self.advance(now_s)
        key: AppKey = ("app", req.app) if req.app is not None else ("request", req.id)
        app = self._apps.get(key)
        if app is None:
            app = self._open(key, req)
        app.outstanding += 1
        self._of_request[id(req)] = key

    def _open(self, key: AppKey, req: Request) -> AppInstance:
        """Eq. 3: ``F_j = V(a_j) + C_j`` (divided by the client's weight), fixed for good."""
        predicted = float(self.predictor.predict(req))
        if not math.isfinite(predicted) or predicted < 0:
            raise ConfigError(f"predictor {self.predictor.name}: bad cost {predicted!r}")
        weight = self.weight(req.client)
        self._seq += 1
        app = AppInstance(
            key, req.client, req.app_type, self.vtime + predicted / weight, predicted, self._seq
        )
        self._apps[key] = app
        if app.finish_v > self.vtime:
            heapq.heappush(self._gps, (app.finish_v, weight))
            self._gps_active_weight += weight
        return app

    def order(self, waiting: Sequence[Request], match_len: MatchLen) -> list[Request]:
        """Ascending virtual finish of the request's application, then arrival."""
        keyed = []
        for index, req in enumerate(waiting):
            app = self._apps.get(self._of_request.get(id(req), ("", "")))
            finish_v = app.finish_v if app is not None else math.inf
            keyed.append((finish_v, req.arrival_s, index, req))
        keyed.sort(key=lambda t: (t[0], t[1], t[2]))
        return [t[3] for t in keyed]

    def _finished(self, req: Request, now_s: float) -> None:
        """An application finishes when its last outstanding request does."""
        self.advance(now_s)
        key = self._of_request.pop(id(req), None)
        app = self._apps.get(key) if key is not None else None
        if app is None:
            return
        app.observed_cost += self.cost.request_cost(
            req.input_tokens, req.cached_tokens, req.output_tokens
        )
        app.outstanding -= 1
        if app.outstanding <= 0:
            del self._apps[app.key]
            self.predictor.observe(app.app_type, app.observed_cost)

    # ------------------------------------------------------------ state
    def snapshot(self) -> dict[str, Any]:
        out = super().snapshot()
        out["virtual_time"] = self.vtime
        out["gps_active"] = len(self._gps)
        out["predictor"] = self.predictor.state()
        apps = sorted(self._apps.values(), key=lambda a: (a.finish_v, a.seq))
        out["apps_total"] = len(apps)
        out["apps"] = [
            {
                "app": a.key[1],
                "client": a.client,
                "virtual_finish": a.finish_v,
                "predicted_cost": a.predicted_cost,
                "outstanding": a.outstanding,
            }
            for a in apps[:SNAPSHOT_APPS]
        ]
        return out

    def _client_state(self, client: str) -> dict[str, Any]:
        return {"apps": sum(1 for a in self._apps.values() if a.client == client)}
