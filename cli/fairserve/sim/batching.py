"""Batch formation of the engine model: which running prefills and waiting requests enter
the next step under each batching discipline, with admissions decided by the local policy.

Kept apart from the step mechanics in ``engine.py`` (execute, produce, fused spans): this is
where the disciplines differ, and where the ``sched`` policy's ``select``/``can_fit`` meet
the KV pool.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from fairserve.core.types import Request
from fairserve.sched.local.base import EXHAUSTED, FIT, NO_FIT, Answer, Decision, LocalPolicy
from fairserve.sim.kvpool import KVPool, Slot
from fairserve.sim.waiting import WaitingQueue

if TYPE_CHECKING:
    from fairserve.sim.engine_types import EngineConfig, EngineStats


def answer_all(decision: Decision, answer: Callable[[Request], Answer]) -> list[Request]:
    """Run a policy's decision to its end with ``answer`` for each candidate; returns the
    admitted requests (``sched``'s ``drive`` with the third answer, ``EXHAUSTED``)."""
    try:
        req = next(decision)
        while True:
            req = decision.send(answer(req))
    except StopIteration as end:
        admitted: list[Request] = end.value
        return admitted


class Batch:
    """The step being formed: prefill chunks, whether the decoding requests decode, and
    what admission refused."""

    def __init__(self, budget_tokens: int) -> None:
        self.budget_tokens = budget_tokens
        self.chunks: list[tuple[Slot, int]] = []
        self.decode = False
        """Every decoding request produces a token in this step (no discipline decodes only
        some of them)."""
        self.refused: set[int] = set()

    @property
    def prefill_tokens(self) -> int:
        return sum(chunk for _, chunk in self.chunks)


class BatchFormation:
    """Mixin of :class:`~fairserve.sim.engine.Engine`: forms one step's batch."""

    config: EngineConfig
    policy: LocalPolicy
    pool: KVPool
    waiting: WaitingQueue
    _running: dict[Slot, None]
    _prefilling: list[Slot]
    stats: EngineStats
    _output_keys: dict[int, bytes]

    def _form_batch(self, now_s: float) -> Batch:
        kind = self.config.batching
        budget = self.config.max_batch_tokens
        if kind == "fastertransformer":
            batch = Batch(budget)
            if self._running:
                batch.decode = True
            else:
                self._admit(batch, now_s, chunked=False)
            return batch
        if kind == "vllm-v0":
            batch = Batch(budget)
            self._admit(batch, now_s, chunked=False)
            batch.decode = not batch.chunks
            return batch
        if kind == "orca":
            batch = Batch(budget)
            self._admit(batch, now_s, chunked=False)
            batch.decode = True
            return batch
        batch = Batch(max(0, budget - self.pool.decoding))
        batch.decode = True
        for slot in self._prefilling:
            if batch.budget_tokens <= 0:
                break
            chunk = min(slot.prefill_left, batch.budget_tokens)
            batch.chunks.append((slot, chunk))
            batch.budget_tokens -= chunk
        self._admit(batch, now_s, chunked=True)
        return batch

    def _admit(self, batch: Batch, now_s: float, chunked: bool) -> None:
        if not self.waiting or not self._may_fit_any():
            return
        cap = self.config.max_running_requests
        pool = self.pool
        matches: dict[int, int] = {}
        # Memory only gets tighter within a step, so once an admission claiming ``c`` tokens
        # was refused, a request needing at least ``c`` without any lock is refused without
        # touching the tree.
        refused_need = [pool.capacity_tokens + 1]
        reservation, running, output_keys = pool.reservation, self._running, self._output_keys

        def match_len(req: Request) -> int:
            cached = matches.get(id(req))
            if cached is None:
                cached = matches[id(req)] = pool.cached_prefix(req)
            return cached

        def answer(req: Request) -> Answer:
            budget = batch.budget_tokens
            if budget <= 0 and (chunked or budget < 0):
                # Nothing fits the step's token budget any more (a non-chunked batch below
                # 0 refuses even an empty extend): every later answer would be a refusal
                # without side effects, so the decision ends here (EXHAUSTED's contract).
                return EXHAUSTED
            reserve = reservation(req)
            if chunked and reserve + 1 >= refused_need[0] and req.prompt_key:
                # needs at least one prompt token besides its reservation: refused below
                # without a lock whatever its match (the same answer, without matching)
                batch.refused.add(id(req))
                return NO_FIT
            extend = req.input_tokens - match_len(req) + req.output_tokens
            if not chunked and extend > budget and batch.chunks:
                return NO_FIT  # the budget frees up next step: not a memory refusal
            slot = None
            if extend + reserve < refused_need[0] and (cap is None or len(running) < cap):
                slot = pool.try_admit(req, output_keys.get(id(req), b""))
                if slot is None:
                    refused_need[0] = min(refused_need[0], pool.last_refused_claim)
            if slot is None:
                batch.refused.add(id(req))
                return NO_FIT
            self._start(slot, batch, now_s, chunked)
            return FIT

        decision = self.policy.decide(self.waiting.requests(), match_len, now_s)
        self.waiting.remove_all(answer_all(decision, answer))

    def _may_fit_any(self) -> bool:
        """Cheap pre-check: could even the smallest waiting request get memory now?"""
        smallest = self.waiting.min_remaining_output()
        if smallest is None:
            return False
        return 1 + self.pool.reservation_of(smallest) <= self.pool.admission_headroom()

    def _start(self, slot: Slot, batch: Batch, now_s: float, chunked: bool) -> None:
        req = slot.req
        self._running[slot] = None
        self._prefilling.append(slot)
        if req.admit_s is None:
            req.admit_s = now_s
            self.stats.prompt_tokens += req.input_tokens
            self.stats.cached_tokens += req.cached_tokens
        self.stats.admitted += 1
        chunk = min(slot.prefill_left, batch.budget_tokens) if chunked else slot.prefill_left
        batch.budget_tokens -= chunk
        batch.chunks.append((slot, chunk))
