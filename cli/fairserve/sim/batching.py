"""Batch formation of the engine model: which running prefills and waiting requests enter
the next step under each batching discipline, with admissions decided by the local policy.

Kept apart from the step mechanics in ``engine.py`` (execute, produce, fused spans): this is
where the disciplines differ, and where the ``sched`` policy's ``select``/``can_fit`` meet
the KV pool.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fairserve.core.types import Request
from fairserve.sched.local.base import LocalPolicy
from fairserve.sim.kvpool import KVPool, Slot

if TYPE_CHECKING:
    from fairserve.sim.engine_types import EngineConfig, EngineStats


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
    waiting: list[Request]
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

        def match_len(req: Request) -> int:
            cached = matches.get(id(req))
            if cached is None:
                cached = matches[id(req)] = pool.cached_prefix(req)
            return cached

        def can_fit(req: Request) -> bool:
            extend = req.input_tokens - match_len(req) + req.output_tokens
            if chunked:
                fits_budget = batch.budget_tokens > 0
            else:
                fits_budget = extend <= batch.budget_tokens or not batch.chunks
            if not fits_budget:
                return False  # the budget frees up next step: not a memory refusal
            need = extend + pool.reservation(req)
            slot = None
            if need < refused_need[0] and (cap is None or len(self._running) < cap):
                slot = pool.try_admit(req, self._output_keys.get(id(req), b""))
                if slot is None:
                    refused_need[0] = min(refused_need[0], pool.last_refused_claim)
            if slot is None:
                batch.refused.add(id(req))
                return False
            self._start(slot, batch, now_s, chunked)
            return True

        admitted = self.policy.select(list(self.waiting), can_fit, match_len, now_s)
        if admitted:
            gone = {id(r) for r in admitted}
            self.waiting = [r for r in self.waiting if id(r) not in gone]

    def _may_fit_any(self) -> bool:
        """Cheap pre-check: could even the smallest waiting request get memory now?"""
        headroom = self.pool.admission_headroom()
        return any(1 + self.pool.reservation(r) <= headroom for r in self.waiting)

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
