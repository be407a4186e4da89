"""Justitia (§IV): application-level fair queuing on KV token-time.

An *application* is a group of calls (``req.app``, a workload program, the router's
``X-Fairserve-App``; a request without one is its own application). Its cost is KV
token-time, ``p·d + d²/2`` per call, predicted **once**, for the whole application, when its
first call arrives. Justitia serves applications in the order in which they would *finish*
under GPS, the ideal fair share of the KV cache, computed with virtual time as in packet fair
queuing:

* ``V`` advances at ``M / N_t`` per engine iteration (eq. 2: ``M`` the KV capacity in tokens,
  the host's engine's; ``N_t`` applications active in the GPS reference, taken as at least 1
  so ``V`` keeps moving when the reference is idle). Costs are token·iterations, so ``V`` must
  count iterations too: with ``clock = "steps"`` (default) it advances by the decode steps the
  host reports (``on_decode_step(s)``), exactly the paper's units; hosts that report no steps
  use ``clock = "seconds"`` and ``steps_per_s``, their measured iteration rate.
* An application arriving at ``a_j`` with predicted cost ``C_j`` gets the virtual finish
  ``F_j = V(a_j) + C_j`` once (eq. 3); it stays active in GPS until ``V`` reaches ``F_j``.
* Waiting requests are admitted in ascending ``F_j`` of their application (ties by
  arrival), non-preemptively. As in the paper's vLLM scheduler, admission stops at the
  first call that does not fit (``memory_patience = 0``, the shared
  :class:`~fairserve.sched.local.patience.MemoryPatience` at its strictest): skipping it would
  let later, lower priority calls take the memory it waits for, again and again (measured
  on the paper's mix: 83% instead of 90% of applications no later than under VTC, and 1.8x
  the average completion time). A larger patience skips it for that many decisions.

Weights generalise it to weighted fair queuing: the application of a client with weight
``w`` finishes at ``V + C_j / w`` and counts ``w`` in ``N_t``.

An application keeps its identity, and so its ``F_j``, over all its calls until it *ends*:
when the host says so (:meth:`Justitia.end_app`, the simulator does when a program's last
call ended), or, for hosts that cannot know (an HTTP client's next call may come any time),
once it had no call outstanding for ``app_idle_s``. A call that finishes while its
application waits for its next call (a tree's children, a chat's next turn) therefore does
not reopen it as a new, later application. At its end its observed cost goes to the
predictor, and the prediction error is kept (``snapshot()["prediction"]``): with the
moving-average predictor in the simulator, that is the online predictor measured against
the oracle. Its GPS reference entry is independent of the real service and expires by
virtual time alone.

Delay bound (Theorem 1): ``f_j − f̄_j ≤ 2·c_max + C_max/M``, with ``c_max`` the largest
call's and ``C_max`` the largest application's KV token-time, time in iterations (the paper
counts ``c_max`` as a duration too, which makes the bound loose). The policy measures it:
when ``V`` reaches an application's ``F_j`` the GPS reference finished it (``f̄_j``, in
iterations); when its last call ends it really finished (``f_j``); ``snapshot()["delay"]``
holds the largest ``f_j − f̄_j`` and the bound for the costs seen so far.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from fairserve.core.cost import KVTokenTimeCost
from fairserve.core.errors import ConfigError
from fairserve.core.types import Request
from fairserve.sched.local.base import LocalPolicy, MatchLen, register_local
from fairserve.sched.local.predictor import (
    DemandPredictor,
    MovingAveragePredictor,
    OraclePredictor,
)
from fairserve.sched.params import Params, param


@dataclass(frozen=True, slots=True)
class JustitiaParams(Params):
    """The virtual clock (capacity, units), the demand predictor and when applications end."""

    kv_capacity_tokens: int = param(
        65536,
        "KV cache capacity M in tokens (virtual time advances M/N_t per iteration); hosts "
        "pass their engine's",
        minimum=0,
        exclusive_minimum=True,
    )
    predictor: Literal["oracle", "moving-average"] = param(
        "oracle",
        "application demand predictor (oracle: host-given true cost; moving-average: per type)",
    )
    prior_cost: float = param(
        1e6,
        "moving-average predictor: cost of an application type not seen yet (KV token-time)",
        minimum=0.0,
    )
    predictor_window: int = param(
        16, "moving-average predictor: finished applications averaged per type", minimum=1
    )
    clock: Literal["steps", "seconds"] = param(
        "steps",
        "what virtual time counts: steps (the decode iterations the host reports, the "
        "paper's units) or seconds (now_s times steps_per_s, for hosts reporting no steps)",
    )
    steps_per_s: float = param(
        1.0,
        "clock=seconds: the engine's iterations per second of now_s",
        minimum=0.0,
        exclusive_minimum=True,
    )
    memory_patience: int = param(
        0,
        "decisions in a row the first call (in priority order) that does not fit may be "
        "bypassed before admissions wait for it (0: the paper's vLLM admission, never)",
        minimum=0,
    )
    app_idle_s: float = param(
        30.0,
        "an application with no call outstanding for this long has ended (hosts that "
        "signal ends, like the simulator, pass inf)",
        minimum=0.0,
        allow_inf=True,
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
    ending: bool = False
    """The host said the application ended; it goes when its last call does."""
    gps_finish_iteration: float | None = None
    """When ``V`` reached ``F_j`` (the GPS reference finished it), in iterations."""
    last_finish_iteration: float = 0.0


@dataclass(slots=True)
class DelayStats:
    """Theorem 1 measured: real minus GPS completion, against its bound."""

    apps: int = 0
    late_apps: int = 0
    max_delay_iterations: float = 0.0
    max_call_cost: float = 0.0
    max_app_cost: float = 0.0

    def bound_iterations(self, capacity_tokens: float) -> float:
        """``2·c_max + C_max/M`` for the costs seen so far."""
        return 2 * self.max_call_cost + self.max_app_cost / capacity_tokens

    def state(self, capacity_tokens: float) -> dict[str, Any]:
        return {
            "apps": self.apps,
            "late_apps": self.late_apps,
            "max_delay_iterations": self.max_delay_iterations,
            "bound_iterations": self.bound_iterations(capacity_tokens),
            "max_call_cost": self.max_call_cost,
            "max_app_cost": self.max_app_cost,
        }


@dataclass(slots=True)
class PredictionError:
    """How far the predictions were from the costs observed when applications ended."""

    apps: int = 0
    relative_error_sum: float = 0.0

    def add(self, predicted: float, observed: float) -> None:
        if observed > 0:
            self.apps += 1
            self.relative_error_sum += abs(predicted - observed) / observed

    def state(self) -> dict[str, Any]:
        mean = self.relative_error_sum / self.apps if self.apps else None
        return {"apps": self.apps, "mean_relative_error": mean}


@register_local
class Justitia(LocalPolicy):
    """Serve applications in ascending GPS virtual finish time (KV token-time cost)."""

    name = "justitia"
    description = "application-level fair queuing on KV token-time (virtual finish order)"
    config: JustitiaParams

    def __init__(self, *, demand_predictor: DemandPredictor | None = None, **kwargs: Any):
        kwargs["cost"] = kwargs.get("cost") or KVTokenTimeCost()
        super().__init__(**kwargs)
        self.predictor: DemandPredictor = demand_predictor or self._make_predictor()
        self.vtime = 0.0
        self.iterations = 0.0
        """Engine iterations the virtual clock has run (the paper's time unit)."""
        self._steps_clock = self.config.clock == "steps"
        self._clock_s: float | None = None
        self._gps: list[tuple[float, int, float, AppKey]] = []  # (F_j, seq, weight, app)
        self._gps_active_weight = 0.0  # N_t, weighted
        self._apps: dict[AppKey, AppInstance] = {}
        self._apps_of_client: dict[str, int] = {}
        """Open applications per client (a snapshot lists every tracked client)."""
        self._idle_since: dict[AppKey, float] = {}  # no call outstanding, oldest first
        self._of_request: dict[int, AppKey] = {}
        self._seq = 0
        self.prediction = PredictionError()
        self.delay = DelayStats()

    def _make_predictor(self) -> DemandPredictor:
        if self.config.predictor == "oracle":
            return OraclePredictor()
        return MovingAveragePredictor(self.config.prior_cost, self.config.predictor_window)

    # ------------------------------------------------------------ virtual time
    def advance(self, now_s: float) -> float:
        """Bring ``V`` up to ``now_s`` (``clock = "seconds"``; with the steps clock the
        iterations reported so far already did), retiring GPS applications reached."""
        if self._clock_s is None:
            self._clock_s = now_s
        left_s = now_s - self._clock_s
        if left_s <= 0:
            return self.vtime
        self._clock_s = now_s
        if not self._steps_clock:
            self.advance_iterations(left_s * self.config.steps_per_s)
        return self.vtime

    def advance_iterations(self, iterations: float) -> float:
        """Eq. 2 over ``iterations`` engine iterations: ``dV = M / N_t`` per iteration,
        piecewise between GPS finishes (``N_t`` drops at each)."""
        capacity = float(self.config.kv_capacity_tokens)
        left = iterations
        while left > 0:
            rate = capacity / (self._gps_active_weight if self._gps else 1.0)
            if not self._gps or (self._gps[0][0] - self.vtime) / rate > left:
                self.vtime += rate * left
                self.iterations += left
                break
            finish_v = self._gps[0][0]
            used = max(0.0, (finish_v - self.vtime) / rate)
            left -= used
            self.iterations += used
            self.vtime = max(self.vtime, finish_v)
            self._retire_reached()
        return self.vtime

    def _retire_reached(self) -> None:
        while self._gps and self._gps[0][0] <= self.vtime:
            _, _, weight, key = heapq.heappop(self._gps)
            self._gps_active_weight -= weight
            app = self._apps.get(key)
            if app is not None:
                app.gps_finish_iteration = self.iterations
        if not self._gps:
            self._gps_active_weight = 0.0  # no drift from repeated subtraction

    def on_decode_step(self, running: Sequence[Request], now_s: float) -> None:
        super().on_decode_step(running, now_s)
        if self._steps_clock and running:
            self.advance_iterations(1)

    def on_decode_groups(
        self, groups: Mapping[str, Sequence[Request]], steps: int, now_s: float
    ) -> None:
        super().on_decode_groups(groups, steps, now_s)
        if self._steps_clock and groups:
            self.advance_iterations(steps)

    # ------------------------------------------------------------ events
    def _arrive(self, req: Request, now_s: float) -> None:
        self.advance(now_s)
        self._expire_idle(now_s)
        key: AppKey = ("app", req.app) if req.app is not None else ("request", req.id)
        app = self._apps.get(key)
        if app is None:
            app = self._open(key, req)
        self._idle_since.pop(key, None)
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
        self._apps_of_client[app.client] = self._apps_of_client.get(app.client, 0) + 1
        if app.finish_v > self.vtime:
            heapq.heappush(self._gps, (app.finish_v, app.seq, weight, key))
            self._gps_active_weight += weight
        else:
            app.gps_finish_iteration = self.iterations
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
        """A call ended; its application ends with it only if it was its own, or the host
        already said the application ended. Otherwise it waits for its next call."""
        self.advance(now_s)
        key = self._of_request.pop(id(req), None)
        app = self._apps.get(key) if key is not None else None
        if app is None:
            return
        call_cost = self.cost.request_cost(req.input_tokens, req.cached_tokens, req.output_tokens)
        app.observed_cost += call_cost
        self.delay.max_call_cost = max(self.delay.max_call_cost, call_cost)
        app.last_finish_iteration = self.iterations
        app.outstanding -= 1
        if app.outstanding > 0:
            return
        if app.key[0] == "request" or app.ending:
            self._end(app)
        else:
            self._idle_since[app.key] = now_s
        self._expire_idle(now_s)

    def end_app(self, app_id: str, now_s: float) -> None:
        """The host knows application ``app_id`` ended (a program's last call ended): it
        leaves the order now, or when its calls still outstanding here have finished."""
        app = self._apps.get(("app", app_id))
        if app is None:
            return
        if app.outstanding > 0:
            app.ending = True
        else:
            self._end(app)

    def _expire_idle(self, now_s: float) -> None:
        """End the applications idle for ``app_idle_s`` (hosts that cannot signal ends),
        and, past ``max_clients`` idle ones, the longest idle: application names come from
        requests, so without this a caller could grow the policy without bound. Ending one
        early is ending it as if its ``app_idle_s`` had passed: its next call opens a new
        application (a new ``F_j``); applications with calls outstanding are never ended."""
        for _ in range(len(self._idle_since) - self.max_clients):
            self._end(self._apps[next(iter(self._idle_since))])
        idle_s = self.config.app_idle_s
        while self._idle_since:
            key, since_s = next(iter(self._idle_since.items()))
            if now_s - since_s < idle_s:
                return
            self._end(self._apps[key])

    def _end(self, app: AppInstance) -> None:
        del self._apps[app.key]
        left = self._apps_of_client.pop(app.client) - 1
        if left:
            self._apps_of_client[app.client] = left
        self._idle_since.pop(app.key, None)
        self.prediction.add(app.predicted_cost, app.observed_cost)
        self._measure_delay(app)
        self.predictor.observe(app.app_type, app.observed_cost)

    def _measure_delay(self, app: AppInstance) -> None:
        """``f_j − f̄_j`` of an application that ended (0 if it beat the GPS reference)."""
        stats = self.delay
        stats.apps += 1
        stats.max_app_cost = max(stats.max_app_cost, app.observed_cost)
        if app.gps_finish_iteration is None:
            return  # GPS has not finished it yet: it is not late
        delay = app.last_finish_iteration - app.gps_finish_iteration
        if delay > 0:
            stats.late_apps += 1
            stats.max_delay_iterations = max(stats.max_delay_iterations, delay)

    # ------------------------------------------------------------ state
    def snapshot(self) -> dict[str, Any]:
        out = super().snapshot()
        out["virtual_time"] = self.vtime
        out["iterations"] = self.iterations
        out["gps_active"] = len(self._gps)
        out["predictor"] = self.predictor.state()
        out["prediction"] = self.prediction.state()
        out["delay"] = self.delay.state(float(self.config.kv_capacity_tokens))
        apps = sorted(self._apps.values(), key=lambda a: (a.finish_v, a.seq))
        out["apps_total"] = len(apps)
        out["apps_opened"] = self._seq
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
        return {"apps": self._apps_of_client.get(client, 0)}
