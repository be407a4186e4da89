"""Discrete-event simulation of N workers behind a dispatcher, in virtual time.

Every worker is an :class:`~fairserve.sim.engine.Engine` running a ``sched`` local policy;
arriving calls go through a ``sched`` dispatcher, exactly the objects the router and the
SGLang plugin run. Programs are released by the workload; a call whose parents finished is
released then (closed loop), so tree-of-thought and chat traffic react to the schedule.

Justitia's view of a program: it is one application (``req.app``) from its start until its
last call ended, when every engine's policy that tracks applications hears ``end_app``; its
oracle cost, the true sum of its calls' KV token-time ``p·d + d²/2``, rides on every call
as ``meta["app_cost"]``. Each program that ended is recorded (:mod:`fairserve.sim.programs`).

Determinism: one event heap ordered by (time, sequence number); no wall clock, no hash
ordering. The same workload, configuration and seed give the same result.
"""

from __future__ import annotations

import contextlib
import gc
import heapq
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from fairserve.core.cost import BatchTimeModel, kv_token_time
from fairserve.core.errors import ConfigError, RequestRejected
from fairserve.core.types import Request
from fairserve.sched.local.base import LocalPolicy, local_policy_class
from fairserve.sched.local.predictor import APP_COST_KEY
from fairserve.sched.registry import load_all, make_dispatcher, make_local_policy
from fairserve.sim.engine import Engine, EngineConfig, StepResult
from fairserve.sim.programs import ProgramRecord
from fairserve.sim.recorder import Recorder, SimResult
from fairserve.workloads.model import Call, Program, Workload

Progress = Callable[[float, float], None]
"""Called with (simulated seconds done, simulated seconds in total)."""

_START, _RELEASE, _STEP_DONE = 0, 1, 2

GC_YOUNG_THRESHOLD = 100_000
"""Allocations between young-generation collections while the event loop runs."""


@contextlib.contextmanager
def _relaxed_gc() -> Iterator[None]:
    """Collect cycles rarely while simulating, restoring the thresholds after.

    The loop creates no reference cycles (radix trees unlink their nodes when dropped),
    but it allocates and keeps many objects: with the default thresholds the collector's
    young collections, each promoting survivors into ever larger older generations, took
    about a tenth of a simulated hour's CPU. A young generation of 100,000 objects still
    bounds what cyclic garbage other code may leave."""
    thresholds = gc.get_threshold()
    if thresholds[0]:  # 0: collection switched off by the host; leave it so
        gc.set_threshold(max(thresholds[0], GC_YOUNG_THRESHOLD), *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)


@dataclass(frozen=True)
class SimConfig:
    """What to simulate besides the workload: policies, workers, their engine model."""

    engine: EngineConfig
    time_model: BatchTimeModel
    policy: str = "dlpm"
    dispatch: str = "doubleq"
    workers: int = 2
    quantum: float | None = None
    worker_quantum: float | None = None
    policy_params: Mapping[str, Any] = field(default_factory=dict)
    dispatch_params: Mapping[str, Any] = field(default_factory=dict)
    duration_s: float | None = None
    seed: int | None = None
    drain: bool = False
    """Keep simulating after ``duration_s`` until every released call finished."""
    sample_interval_s: float | None = None
    w_e: float = 1.0
    w_q: float = 2.0
    fuse_decode: bool = True
    """Apply runs of identical decode steps at once (exact; off only to test that)."""

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ConfigError(f"workers must be >= 1, got {self.workers}")
        if self.duration_s is not None and not (0 < self.duration_s < math.inf):
            raise ConfigError(f"duration_s must be a positive number, got {self.duration_s}")


@dataclass(slots=True)
class _ProgramState:
    program: Program
    calls: dict[str, Call]
    pending_parents: dict[str, int]
    children: dict[str, list[str]]
    app_cost: float = 0.0
    """The oracle: the true KV token-time of all the program's calls."""
    open_calls: int = 0
    """Calls not yet ended (finished or rejected); the program ends at 0."""
    rejected_calls: int = 0


def program_cost(program: Program) -> float:
    """Justitia's application cost (eq. 1 summed over the calls): ``Σ p·d + d²/2``."""
    return sum(kv_token_time(c.input_tokens, c.output_tokens) for c in program.calls)


class ClusterSim:
    """The event loop; use :func:`simulate` unless you need to step it yourself."""

    def __init__(self, workload: Workload, config: SimConfig) -> None:
        self.workload = workload
        self.config = config
        self.end_s = config.duration_s or workload.duration_s
        self.worker_ids = [f"w{i}" for i in range(config.workers)]
        weights = {c.name: c.weight for c in workload.clients}
        self.dispatcher = make_dispatcher(
            config.dispatch, self.worker_ids, weights=weights, **self._dispatch_params()
        )
        self.engines = [
            Engine(self._make_policy(weights), config.time_model, config.engine)
            for _ in self.worker_ids
        ]
        for engine in self.engines:
            engine.track_decoded = False
        interval = config.sample_interval_s or max(0.05, self.end_s / 2000)
        self.recorder = Recorder(
            [c.name for c in workload.clients], weights, interval, config.w_e, config.w_q
        )
        self._heap: list[tuple[float, int, int, Any]] = []
        self._seq = 0
        self._busy = [False] * len(self.engines)
        self._step_version = [0] * len(self.engines)  # a cut step's old end event is stale
        self._index = {w: i for i, w in enumerate(self.worker_ids)}
        self._horizon = self._horizon_s()
        self._source: Iterator[Program] = workload.programs(config.seed, self.end_s)
        self.now_s = 0.0
        self.program_records: list[ProgramRecord] = []
        self._open_programs: dict[str, _ProgramState] = {}

    # ---------------------------------------------------------------- setup
    def _make_policy(self, weights: Mapping[str, float]) -> LocalPolicy:
        load_all()
        params = dict(self.config.policy_params)
        declared = {p.name for p in local_policy_class(self.config.policy).params}
        if self.config.quantum is not None:
            params["quantum"] = self.config.quantum
        if "kv_capacity_tokens" in declared:
            params.setdefault("kv_capacity_tokens", self.config.engine.kv_capacity_tokens)
        if "app_idle_s" in declared:  # the simulator says when a program ends
            params.setdefault("app_idle_s", math.inf)
        return make_local_policy(self.config.policy, weights=weights, **params)

    def _dispatch_params(self) -> dict[str, Any]:
        params = dict(self.config.dispatch_params)
        if self.config.worker_quantum is not None:
            params["worker_quantum"] = self.config.worker_quantum
        return params

    # ---------------------------------------------------------------- loop
    def run(self, progress: Progress | None = None) -> SimResult:
        with _relaxed_gc():
            return self._run(progress)

    def _run(self, progress: Progress | None) -> SimResult:
        self._next_program()
        report_every = max(1, len(self.engines) * 200)
        count = 0
        heap, recorder, end_s, drain = self._heap, self.recorder, self.end_s, self.config.drain
        while heap:
            t_s, _seq, kind, data = heapq.heappop(heap)
            if t_s > end_s and not (drain and kind != _START):
                break
            if t_s >= recorder.next_sample_s:
                recorder.sample_until(t_s, self.engines)
            self.now_s = t_s
            if kind == _STEP_DONE:
                self._step_done(*data)
            else:
                self._handle(kind, data)
            count += 1
            if progress is not None and count % report_every == 0:
                progress(min(t_s, end_s), end_s)
        finish_s = max(self.end_s, self.now_s) if self.config.drain else self.end_s
        self.recorder.sample_until(finish_s, self.engines)
        if progress is not None:
            progress(self.end_s, self.end_s)
        result = self.recorder.result(finish_s, self.engines, self.worker_ids, self.dispatcher)
        result.programs = self.program_records
        result.programs_unfinished = self._unfinished_programs()
        return result

    def _unfinished_programs(self) -> dict[str, int]:
        """Programs started but not ended by the end of the run, per client."""
        out = {c.name: 0 for c in self.workload.clients}
        for state in self._open_programs.values():
            out[state.program.client] = out.get(state.program.client, 0) + 1
        return out

    def _handle(self, kind: int, data: Any) -> None:
        if kind == _START:
            self._start_program(data)
            self._next_program()
        elif kind == _RELEASE:
            self._release(*data)
        else:
            self._step_done(*data)

    def _push(self, t_s: float, kind: int, data: Any) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t_s, self._seq, kind, data))

    def _horizon_s(self) -> float | None:
        """Where fused decode steps must stop: the end of the run (arrivals cut them)."""
        if not self.config.fuse_decode:
            return None
        return math.inf if self.config.drain else self.end_s

    # ---------------------------------------------------------------- programs
    def _next_program(self) -> None:
        program = next(self._source, None)
        if program is not None:
            self._push(program.start_s, _START, program)

    def _start_program(self, program: Program) -> None:
        calls = {c.id: c for c in program.calls}
        state = _ProgramState(program, calls, {}, {}, program_cost(program), len(calls))
        self._open_programs[program.app] = state
        for call in program.calls:
            state.pending_parents[call.id] = len(call.after)
            for parent in call.after:
                state.children.setdefault(parent, []).append(call.id)
        for call in program.calls:
            if not call.after:
                self._push(self.now_s + call.delay_s, _RELEASE, (state, call))

    def _release(self, state: _ProgramState, call: Call) -> None:
        program = state.program
        req = Request(
            id=call.id,
            client=program.client,
            prompt_key=call.prompt_key,
            max_output_tokens=call.max_output_tokens,
            arrival_s=self.now_s,
            app=program.app,
            app_type=program.app_type,
            output_len=call.output_tokens,
        )
        req.meta["program"] = state
        req.meta[APP_COST_KEY] = state.app_cost
        worker = self.dispatcher.dispatch(req)
        index = self._index[worker]
        self._cut_span(index)
        try:
            self.engines[index].submit(req, self.now_s, call.output_key)
        except RequestRejected:
            self.dispatcher.on_abort(req, worker)
            self.recorder.rejected(req)
            state.rejected_calls += 1
            self._call_ended(state, call.id)
            return
        self.recorder.arrived(req)
        if not self._busy[index]:
            self._run_worker(index)

    def _call_ended(self, state: _ProgramState, call_id: str) -> None:
        for child_id in state.children.get(call_id, ()):
            state.pending_parents[child_id] -= 1
            if state.pending_parents[child_id] == 0:
                child = state.calls[child_id]
                self._push(self.now_s + child.delay_s, _RELEASE, (state, child))
        state.open_calls -= 1
        if state.open_calls == 0:
            self._program_ended(state)

    def _program_ended(self, state: _ProgramState) -> None:
        """Record the program and tell the policies that track applications it ended."""
        program = state.program
        del self._open_programs[program.app]
        self.program_records.append(
            ProgramRecord(
                program.client, program.app, program.app_type, program.start_s, self.now_s,
                len(state.calls), state.rejected_calls,
            )
        )  # fmt: skip
        for engine in self.engines:
            end_app = getattr(engine.policy, "end_app", None)
            if end_app is not None:
                end_app(program.app, self.now_s)

    # ---------------------------------------------------------------- workers
    def _run_worker(self, index: int) -> None:
        result = self.engines[index].step(self.now_s, self._horizon, defer=True)
        if result is None:
            self._busy[index] = False
            return
        self._busy[index] = True
        self._schedule_step_done(index, result)

    def _schedule_step_done(self, index: int, result: StepResult) -> None:
        self._step_version[index] += 1
        self._push(result.end_s, _STEP_DONE, (index, result, self._step_version[index]))

    def _cut_span(self, index: int) -> None:
        """A call is about to reach worker ``index``: its planned decode steps stop at the
        step in progress, so the call is considered at the next step boundary."""
        engine = self.engines[index]
        if engine.span_pending:
            self._schedule_step_done(index, engine.cut_span(self.now_s))

    def _step_done(self, index: int, result: StepResult, version: int) -> None:
        if version != self._step_version[index]:
            return  # the step was cut; its new end event comes later
        engine = self.engines[index]
        engine.finish_span()
        worker = self.worker_ids[index]
        for key in engine.pool.drain_evictions():
            self.dispatcher.on_evict(worker, key)
        self.recorder.step(index, result)
        for req in result.finished:
            self.dispatcher.on_finish(req, worker, req.output_tokens)
            state: _ProgramState = req.meta.pop("program")  # type: ignore[assignment]
            self._call_ended(state, req.id)
        self._run_worker(index)


def simulate(workload: Workload, config: SimConfig, progress: Progress | None = None) -> SimResult:
    """Run ``workload`` through a simulated cluster and return its metrics."""
    return ClusterSim(workload, config).run(progress)
