"""The engine model: one GPU worker with continuous batching, driven step by step.

The same object runs in virtual time (the cluster simulation) and in real time (the
simulated worker): a host calls :meth:`Engine.step` at ``now_s``; the engine forms a batch
under its discipline, asks the local policy (the ``sched`` object, unchanged) which waiting
requests to admit, applies the step and returns what happened and how long the step took
(from the batch-time model). State changes are applied at once; the host treats them as
happening at ``StepResult.end_s``.

Batching disciplines (the throughput-optimal paper's families):

* ``sarathi`` — decode-first, chunked prefill, mixed batches (SGLang's default);
* ``orca`` — prefill-first, mixed batches, whole prompts;
* ``vllm-v0`` — a step is either all prefill (whenever something can be admitted) or all
  decode: not work-conserving, unstable below capacity;
* ``fastertransformer`` — static batching: a new batch only once the previous one drained.

Fused decode: when a step is pure decode and nothing can be admitted until a request
finishes, the following identical steps are applied at once (up to the first finish, the
memory limit or the host's ``horizon_s``). Nothing else can happen in between, so results
equal step-by-step execution while an hour of traffic simulates in seconds.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

from fairserve.core.cost import BatchTimeModel
from fairserve.core.errors import ConfigError
from fairserve.core.types import Request
from fairserve.sched.local.base import LocalPolicy
from fairserve.sim.batching import Batch, BatchFormer
from fairserve.sim.decoding import RunningBatch
from fairserve.sim.engine_types import (
    BATCHING_DISCIPLINES,
    DEFAULT_BATCHING,
    EngineConfig,
    EngineStats,
    StepResult,
)
from fairserve.sim.kvpool import KVPool, Slot
from fairserve.sim.waiting import WaitingQueue

__all__ = [
    "BATCHING_DISCIPLINES",
    "DEFAULT_BATCHING",
    "Engine",
    "EngineConfig",
    "EngineStats",
    "StepResult",
]


@dataclass(slots=True)
class _Span:
    """Fused decode steps planned but not applied yet (see ``Engine.step(defer=True)``)."""

    result: StepResult
    start_s: float
    ends_s: list[float]
    """End time of each planned step, increasing."""
    started: int = 0
    """Planned steps already under way when planned (a cut keeps at least these)."""


class Engine:
    """A waiting queue, a running batch, a KV pool and a local policy; decoding requests
    advance with the pool's decode clock (``sim.decoding``).

    Made of parts that call each other through their methods only: the
    :class:`~fairserve.sim.waiting.WaitingQueue`, the
    :class:`~fairserve.sim.decoding.RunningBatch`, the :class:`~fairserve.sim.kvpool.KVPool`
    and the :class:`~fairserve.sim.batching.BatchFormer` over them; the engine runs steps
    (execute, retract, fused spans) with them."""

    def __init__(self, policy: LocalPolicy, time_model: BatchTimeModel, config: EngineConfig):
        self.policy = policy
        self.time_model = time_model
        self.config = config
        self.pool = KVPool(config.kv_capacity_tokens, config.reserve_output_ratio)
        self.waiting = WaitingQueue()
        self.stats = EngineStats()
        self.running_batch = RunningBatch(self.pool, policy, self.stats, config.cache_outputs)
        self.former = BatchFormer(
            config, policy, self.pool, self.waiting, self.running_batch, self.stats
        )
        self._span: _Span | None = None

    @property
    def track_decoded(self) -> bool:
        """Fill ``StepResult.decoded`` per request and keep every running request's
        ``output_tokens`` current after each step (streaming hosts need it; the cluster
        simulation only needs the per-client sums and turns it off)."""
        return self.running_batch.track_decoded

    @track_decoded.setter
    def track_decoded(self, value: bool) -> None:
        self.running_batch.track_decoded = value

    @property
    def running(self) -> list[Slot]:
        """Running slots in admission order, brought up to date (O(running): for hosts'
        dashboards and tests, not for per-step use)."""
        return self.running_batch.synced()

    # ---------------------------------------------------------------- requests
    def submit(self, req: Request, now_s: float, output_key: bytes = b"") -> None:
        """A request arrives; the policy may refuse it (``RequestRejected`` propagates).

        A request that could never fit the KV pool is refused here with a ConfigError,
        rather than waiting forever."""
        self._settle()
        need = req.input_tokens + max(1, req.max_output_tokens)
        if need > self.config.kv_capacity_tokens:
            raise ConfigError(
                f"request {req.id!r} needs {need} tokens of KV (prompt + max output) but the "
                f"engine holds {self.config.kv_capacity_tokens}"
            )
        req.arrival_s = now_s
        self.policy.on_arrival(req, now_s)
        self.waiting.append(req, output_key)

    def abort(self, rid: str, now_s: float) -> Request | None:
        """Remove a waiting or running request (client gone); None if unknown."""
        self._settle()
        req = self.waiting.find(rid)
        if req is not None:
            self.waiting.remove(req)
            self.former.matches.left(req)
            self.policy.on_abort(req, now_s, was_waiting=True)
            self.stats.aborted += 1
            return req
        slot = self.running_batch.find(rid)
        if slot is None:
            return None
        self.running_batch.leave(slot)
        self.pool.release(slot, cache_output=False)
        self.policy.on_abort(slot.req, now_s, was_waiting=False)
        self.stats.aborted += 1
        return slot.req

    def flush_cache(self) -> bool:
        """Drop the prefix cache; refused (False) while requests run, like SGLang."""
        if self.running_batch:
            return False
        self.pool.flush()
        return True

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running_batch)

    def waiting_by_client(self) -> dict[str, int]:
        return self.waiting.by_client()

    # ---------------------------------------------------------------- stepping
    def step(
        self, now_s: float, horizon_s: float | None = None, defer: bool = False
    ) -> StepResult | None:
        """Run one batching step at ``now_s``; None when there is nothing to do.

        With ``horizon_s`` (the next moment something external can happen), identical
        pure-decode steps that follow are fused into this result. With ``defer`` they are
        only planned: the result ends where they would end, and a host that learns of an
        arrival before then calls :meth:`cut_span` (the steps up to that moment happen) or
        else :meth:`finish_span` at the end. A cluster host does this so that an arrival at
        one worker does not cut every other worker's fused decode."""
        self._settle()
        if not self.has_work:
            return None
        batch = self.former.form(now_s)
        if not batch.chunks and not (batch.decode and self.pool.decoding):
            return None
        if horizon_s is not None and self._decode_only_blocked(batch):
            ends_s = self._plan_span(now_s, horizon_s)
            if ends_s:  # this step and the identical ones after it, planned as one span
                result = StepResult(now_s, ends_s[-1], steps=0)
                self._span = _Span(result, now_s, ends_s, started=1)
                if not defer:
                    self.finish_span()
                return result
        result = self._execute(batch, now_s)
        self.pool.decay_ratio(1)
        self.stats.steps += 1
        self.stats.busy_s += result.duration_s
        if horizon_s is not None and self._admission_blocked(batch, result):
            ends_s = self._plan_span(result.end_s, horizon_s)
            if ends_s:
                self._span = _Span(result, result.end_s, ends_s)
                result.end_s = ends_s[-1]
                if not defer:
                    self.finish_span()
        return result

    @property
    def span_pending(self) -> bool:
        return self._span is not None

    def cut_span(self, now_s: float) -> StepResult:
        """Something arrives at ``now_s`` during the planned steps: the step in progress
        completes (its end is the first planned boundary at or after ``now_s``) and the
        rest is dropped. Returns the step's result with its end moved there."""
        span = self._span
        if span is None:
            raise ConfigError("no planned decode span to cut")
        steps = 0 if now_s <= span.start_s else bisect_left(span.ends_s, now_s) + 1
        return self._commit(span, min(max(steps, span.started), len(span.ends_s)))

    def finish_span(self) -> StepResult | None:
        """Apply all planned steps (the host reached their end); None if none were planned."""
        span = self._span
        return None if span is None else self._commit(span, len(span.ends_s))

    def _settle(self) -> None:
        """A host that forgot to cut: apply the whole planned span before anything else."""
        if self._span is not None:
            self.finish_span()

    def _execute(self, batch: Batch, now_s: float) -> StepResult:
        result = StepResult(now_s, now_s)
        pool = self.pool
        completing = [s for s, chunk in batch.chunks if chunk >= s.prefill_left]
        while not pool.can_grow((pool.decoding if batch.decode else 0) + len(completing)):
            victim = self._retract_one(batch, now_s)
            result.retracted.append(victim.req)
            completing = [s for s in completing if s is not victim]
        decoding = pool.decoding if batch.decode else 0
        prefill_tokens = batch.prefill_tokens
        load = prefill_tokens + decoding
        context = self.running_batch.context_base + decoding * pool.clock if decoding else 0
        for slot, chunk in batch.chunks:
            context += slot.prompt_tokens + slot.req.output_tokens - slot.prefill_left
            slot.prefill_left -= chunk
        end_s = result.end_s = now_s + self.time_model.batch_time_s(load, context)
        running = self.running_batch
        lazy = running.lazy
        before = [s for s in running.slots if s.decoding] if decoding and not lazy else []
        pool.grow(1 if decoding else 0, completing)
        if completing:
            running.prefills_done()
        for slot in completing:
            pool.prefill_done(slot)
            req = slot.req
            req.output_tokens += 1
            if req.first_token_s is None:
                req.first_token_s = end_s
            running.join(slot)
            result.prefilled.append(req)
        result.prefill_tokens = prefill_tokens
        self.stats.prefill_tokens += prefill_tokens
        result.admitted = [s.req for s, _ in batch.chunks if s.req.admit_s == now_s]
        if decoding and lazy:
            running.produce(1, result, None)
        else:
            for slot in before:
                pool.sync(slot)
            running.produce(1, result, before + completing)
        return result

    def _retract_one(self, batch: Batch, now_s: float) -> Slot:
        """Memory ran out mid-decode: send the newest running request back to waiting."""
        if len(self.running_batch) <= 1:
            raise ConfigError(
                "KV capacity is too small for a single request; raise kv_capacity_tokens"
            )
        victim = self.running_batch.newest()
        self.running_batch.leave(victim)
        batch.chunks = [(s, c) for s, c in batch.chunks if s is not victim]
        self.pool.release(victim, cache_output=False)
        self.pool.after_retraction()
        self.waiting.push_front(victim.req, victim.output_key)
        self.policy.on_retract(victim.req, now_s)
        self.stats.retracted += 1
        return victim

    # ---------------------------------------------------------------- fused decode
    def _admission_blocked(self, batch: Batch, result: StepResult) -> bool:
        """True when the next steps are pure decode with nothing admissible before a finish.

        Refusals were decided at the start of the step; a finish or retraction during it
        freed memory, so then the next step must ask the policy again."""
        if not self.running_batch or self.running_batch.prefilling:
            return False
        if result.finished or result.retracted or not self.pool.ratio_settled:
            return False
        if self.config.batching == "fastertransformer":
            return True
        if not self.former.may_fit_any():
            return True
        return batch.refused_all(self.waiting)

    def _decode_only_blocked(self, batch: Batch) -> bool:
        """Before executing: this step is pure decode of every running request, nothing is
        admissible and memory cannot run out, so it starts a span of identical steps (the
        same conditions :meth:`_admission_blocked` checks after a step)."""
        if batch.chunks or not batch.decode or self.running_batch.prefilling:
            return False
        if not self.pool.ratio_settled or self.pool.growable_tokens() < len(self.running_batch):
            return False
        if self.config.batching == "fastertransformer" or not self.former.may_fit_any():
            return True
        return batch.refused_all(self.waiting)

    def _plan_span(self, start_s: float, horizon_s: float) -> list[float]:
        """End times of the identical decode steps that can follow ``start_s``: up to the
        first finish, the memory limit or ``horizon_s``."""
        pool = self.pool
        n = pool.decoding
        max_steps = min(pool.growable_tokens() // n, self.running_batch.steps_to_first_finish())
        context = self.running_batch.context_base + n * pool.clock
        end_s = start_s
        ends_s: list[float] = []
        batch_time_s = self.time_model.batch_time_s
        while len(ends_s) < max_steps:
            step_s = batch_time_s(n, context + len(ends_s) * n)
            if end_s + step_s > horizon_s:
                break
            end_s += step_s
            ends_s.append(end_s)
        return ends_s

    def _commit(self, span: _Span, steps: int) -> StepResult:
        """Apply the first ``steps`` planned steps to the state and to the span's result."""
        self._span = None
        result = span.result
        end_s = span.ends_s[steps - 1] if steps else span.start_s
        result.end_s = end_s
        if steps == 0:
            return result
        self.pool.grow(steps)
        fused = StepResult(span.start_s, end_s, steps=steps)
        running = self.running_batch
        running.produce(steps, fused, None if running.lazy else running.decoding_slots())
        result.steps += steps
        result.decode_tokens += fused.decode_tokens
        self._merge_decoded(result, fused)
        result.finished.extend(fused.finished)
        self.stats.steps += steps
        self.stats.busy_s += end_s - span.start_s
        return result

    @staticmethod
    def _merge_decoded(result: StepResult, fused: StepResult) -> None:
        """Add the fused steps' tokens to the first step's per-request and per-client counts."""
        if result.decoded:
            merged = {id(r): i for i, (r, _) in enumerate(result.decoded)}
            decoded = result.decoded
            for req, tokens in fused.decoded:
                i = merged.get(id(req))
                if i is None:
                    decoded.append((req, tokens))
                else:
                    decoded[i] = (req, decoded[i][1] + tokens)
        else:
            result.decoded = fused.decoded
        by_client = result.decoded_by_client
        for client, tokens in fused.decoded_by_client.items():
            by_client[client] = by_client.get(client, 0) + tokens
