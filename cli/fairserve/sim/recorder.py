"""What a simulation measures while it runs, from the clients' point of view.

Service is credited as the client sees it (DESIGN §7): ``w_e`` per prompt token once the
prompt was processed and ``w_q`` per output token when it is produced. Samples of the
cumulative service and of who is backlogged (has a call waiting in some queue) are taken on
a fixed grid of simulated time; the fairness metrics read them.

The service is kept by the one ledger of the project,
:class:`~fairserve.core.ledger.ServiceLedger`, fed as the router feeds it: credit as tokens
are delivered, a client busy from a call's arrival to its finish
(``tests/core/test_ledger_replay.py`` replays one trace through both hosts' event sequences
and requires equal ledgers). A second ledger keeps the system's view (extend tokens, every
time a prompt is computed). The run keeps its whole history (``max_window_s = inf``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fairserve.core.ledger import ServiceLedger
from fairserve.core.metrics import ServiceSample
from fairserve.core.types import Request
from fairserve.sched.dispatch.base import Dispatcher
from fairserve.sim.engine import Engine, EngineStats, StepResult
from fairserve.sim.programs import ProgramRecord


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One finished call."""

    client: str
    worker: int
    arrival_s: float
    first_token_s: float
    finish_s: float
    input_tokens: int
    cached_tokens: int
    output_tokens: int

    @property
    def latency_s(self) -> float:
        return self.finish_s - self.arrival_s

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.arrival_s


@dataclass(slots=True)
class ClientCounters:
    submitted: int = 0
    rejected: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    first_arrival_s: float | None = None
    last_arrival_s: float | None = None


@dataclass(slots=True)
class _Progress:
    """What one engine looked like at the previous sample (for its parked requests)."""

    steps: int = 0
    clock: int = 0
    decoding: int = 0
    stalled: bool = False
    """Its latest sample interval with a step start had no decode step although requests
    were decoding: they are parked until an interval shows otherwise."""


@dataclass
class SimResult:
    """Everything a report or a plot needs from one run."""

    end_s: float
    clients: list[str]
    weights: dict[str, float]
    counters: dict[str, ClientCounters]
    service: dict[str, float]
    samples: list[ServiceSample]
    records: list[RequestRecord]
    worker_ids: list[str]
    worker_stats: list[EngineStats]
    worker_finished: list[int]
    dispatcher: dict[str, Any] = field(default_factory=dict)
    unfinished: dict[str, int] = field(default_factory=dict)
    queue_samples: list[tuple[float, int]] = field(default_factory=list)
    """(t_s, requests queued) on the sample grid: is the queue bounded? Queued = waiting
    for admission in any engine, plus admitted requests parked in a running set (they hold
    KV but get no token: see :meth:`Recorder.sample_until`)."""
    samples_extend: list[ServiceSample] = field(default_factory=list)
    """The same grid in the system's view: ``w_e`` per *extend* (uncached) prompt token
    computed, ``w_q`` per output token (what DLPM and DoubleQ bound)."""
    bound_inputs: dict[str, Any] = field(default_factory=dict)
    """What the fairness theorems' bounds depend on (policy, dispatcher, workers, quantum,
    ``w_e``, ``w_q``, ``M`` = KV tokens per worker, ``L_input`` = longest prompt)."""
    programs: list[ProgramRecord] = field(default_factory=list)
    """Programs that ended within the run (the cluster records them; :mod:`.programs`)."""
    programs_unfinished: dict[str, int] = field(default_factory=dict)


class Recorder:
    """Accumulates service, samples and finished-request records."""

    def __init__(
        self,
        clients: Sequence[str],
        weights: Mapping[str, float],
        interval_s: float,
        w_e: float,
        w_q: float,
    ) -> None:
        self.clients = list(clients)
        self.weights = dict(weights)
        self.interval_s = interval_s
        self.w_e, self.w_q = w_e, w_q
        self.ledger = ServiceLedger(max_window_s=math.inf)
        """Service as the client sees it (prompt tokens once, output tokens)."""
        self.ledger_extend = ServiceLedger(max_window_s=math.inf)
        """The system's view: extend tokens each time a prompt is computed, output tokens."""
        for name in self.clients:
            self._add_client(name, 0.0)
        for ledger in (self.ledger, self.ledger_extend):
            ledger.sample(0.0, (), every_client=True)
        self.longest_input_tokens = 0
        self.counters: dict[str, ClientCounters] = {c: ClientCounters() for c in clients}
        self.records: list[RequestRecord] = []
        self.queue_samples: list[tuple[float, int]] = [(0.0, 0)]
        self.next_sample_s = interval_s
        """When the next sample is due (the event loop checks it before calling in)."""
        self._progress: list[_Progress] = []
        self._worker_finished: dict[int, int] = {}
        self._credited: set[int] = set()
        self._open: dict[int, str] = {}
        """Accepted calls not seen finished yet (id → client): what is unfinished at the
        end, including calls an engine finished in a step that ends after the run does."""

    def _add_client(self, name: str, now_s: float) -> None:
        weight = self.weights.get(name, 1.0)
        self.ledger.add_client(name, weight, now_s)
        self.ledger_extend.add_client(name, weight, now_s)

    def _client(self, name: str, now_s: float) -> ClientCounters:
        if name not in self.counters:
            self.counters[name] = ClientCounters()
            self._add_client(name, now_s)
            self.clients.append(name)
        return self.counters[name]

    def arrived(self, req: Request) -> None:
        counters = self._client(req.client, req.arrival_s)
        counters.submitted += 1
        self._open[id(req)] = req.client
        self.ledger.busy(req.client, req.arrival_s)
        self.longest_input_tokens = max(self.longest_input_tokens, req.input_tokens)
        if counters.first_arrival_s is None:
            counters.first_arrival_s = req.arrival_s
        counters.last_arrival_s = req.arrival_s

    def rejected(self, req: Request) -> None:
        """A refused call was submitted too: ``finished + unfinished + rejected =
        submitted``."""
        counters = self._client(req.client, req.arrival_s)
        counters.submitted += 1
        counters.rejected += 1

    def step(self, worker: int, result: StepResult) -> None:
        w_e, w_q, counters, end_s = self.w_e, self.w_q, self.counters, result.end_s
        credited = self._credited
        credit, credit_extend = self.ledger.credit, self.ledger_extend.credit
        for req in result.prefilled:
            # computed again after a retraction: the system did that work twice
            credit_extend(req.client, w_e * (req.input_tokens - req.cached_tokens), end_s)
            if id(req) not in credited:
                credited.add(id(req))
                tokens = req.input_tokens
                credit(req.client, w_e * tokens, end_s)
                counters[req.client].input_tokens += tokens
        for client, tokens in result.decoded_by_client.items():
            credit(client, w_q * tokens, end_s)
            credit_extend(client, w_q * tokens, end_s)
            counters[client].output_tokens += tokens
        if not result.finished:
            return
        self._worker_finished[worker] = self._worker_finished.get(worker, 0) + len(result.finished)
        for req in result.finished:
            credited.discard(id(req))
            self._open.pop(id(req), None)
            self.ledger.idle(req.client, req.finish_s if req.finish_s is not None else end_s)
            self.records.append(
                RequestRecord(
                    req.client,
                    worker,
                    req.arrival_s,
                    req.first_token_s if req.first_token_s is not None else req.arrival_s,
                    req.finish_s if req.finish_s is not None else result.end_s,
                    req.input_tokens,
                    req.cached_tokens,
                    req.output_tokens,
                )
            )

    def sample_until(self, t_s: float, engines: Sequence[Engine]) -> None:
        """Take the samples due at or before ``t_s`` (state as of the last event)."""
        if self.next_sample_s > t_s:
            return
        backlogged: set[str] = set()
        for engine in engines:
            backlogged.update(engine.waiting.clients())
        queued = sum(len(engine.waiting) for engine in engines) + self._parked(engines)
        while self.next_sample_s <= t_s:
            for ledger in (self.ledger, self.ledger_extend):
                ledger.sample(self.next_sample_s, backlogged, every_client=True)
            self.queue_samples.append((self.next_sample_s, queued))
            self.next_sample_s += self.interval_s

    def _parked(self, engines: Sequence[Engine]) -> int:
        """Admitted requests that hold KV but make no progress: the decoding requests of an
        engine that started steps since the previous sample without a decode step among
        them (vLLM-v0's prefill-only steps; the throughput-optimal paper's decode queue
        that builds up). Counted from the requests already decoding at the previous sample
        (a prefill completing now decodes next), and carried over the sample intervals in
        which the engine starts no step (one long step in flight). Every other discipline
        decodes all running requests in every step: it parks none."""
        while len(self._progress) < len(engines):
            self._progress.append(_Progress())
        parked = 0
        for engine, seen in zip(engines, self._progress, strict=False):
            steps, clock, decoding = engine.stats.steps, engine.pool.clock, engine.pool.decoding
            if steps != seen.steps:
                seen.stalled = clock == seen.clock and seen.decoding > 0
            if seen.stalled:
                parked += min(decoding, seen.decoding)
            seen.steps, seen.clock, seen.decoding = steps, clock, decoding
        return parked

    def result(
        self,
        end_s: float,
        engines: Sequence[Engine],
        worker_ids: Sequence[str],
        dispatcher: Dispatcher,
    ) -> SimResult:
        # Not only what the engines still hold: a step in flight at the end already took
        # its finished calls out of the engine, but the clients have not seen them finish.
        unfinished: dict[str, int] = {}
        for client in self._open.values():
            unfinished[client] = unfinished.get(client, 0) + 1
        return SimResult(
            end_s=end_s,
            clients=list(self.clients),
            weights=dict(self.weights),
            counters=self.counters,
            service=self.ledger.cumulatives(),
            samples=list(self.ledger.samples),
            records=self.records,
            worker_ids=list(worker_ids),
            worker_stats=[e.stats for e in engines],
            worker_finished=[self._worker_finished.get(i, 0) for i in range(len(engines))],
            dispatcher=dispatcher.snapshot(),
            unfinished=unfinished,
            queue_samples=self.queue_samples,
            samples_extend=list(self.ledger_extend.samples),
            bound_inputs=self._bound_inputs(engines, dispatcher),
        )

    def _bound_inputs(self, engines: Sequence[Engine], dispatcher: Dispatcher) -> dict[str, Any]:
        """Read off the objects that ran, so that every host of the simulator (simulate,
        bench, tune) reports the bound of what it actually ran."""
        policy = engines[0].policy if engines else None
        return {
            "policy": policy.name if policy is not None else None,
            "policy_params": policy.config.as_dict() if policy is not None else {},
            "quantum": policy.quantum if policy is not None else None,
            "dispatch": dispatcher.name,
            "workers": len(engines),
            "w_e": self.w_e,
            "w_q": self.w_q,
            "kv_capacity_tokens": engines[0].config.kv_capacity_tokens if engines else 0,
            "longest_input_tokens": self.longest_input_tokens,
        }
