"""Batch formation of the engine model: which running prefills and waiting requests enter
the next step under each batching discipline, with admissions decided by the local policy.

Kept apart from the step mechanics in ``engine.py`` (execute, produce, fused spans): this is
where the disciplines differ, and where the ``sched`` policy's decision meets the KV pool.
:class:`BatchFormer` is one of the engine's parts: it reads the waiting queue and the running
batch through their methods and starts the slots it admits in the running batch.
"""

from __future__ import annotations

from math import ceil
from typing import Protocol

from fairserve.core.types import TOKEN_BYTES, Request
from fairserve.sched.local.base import (
    EXHAUSTED,
    FIT,
    NO_FIT,
    Answer,
    LocalPolicy,
    answer_all,
)
from fairserve.sim.engine_types import EngineConfig, EngineStats
from fairserve.sim.kvpool import KVPool, Slot
from fairserve.sim.match_feed import FeedMatchLen, MatchFeed
from fairserve.sim.waiting import WaitingQueue

NEVER = 1 << 62
"""A refusal limit no claim reaches: every request is asked about."""


class PredictedRefusals:
    """The refusals a batch formation can give without being asked
    (:class:`~fairserve.sched.local.dlpm_pass.Refusals`): a held request whose claim is at
    or above the smallest claim refused so far, or any held request once the running cap
    is reached, is refused without touching the tree (the answer's own shortcuts). Under
    overload that is nearly every request the fill offers, so a decision that reads this
    skips thousands of questions per step; the records stay the same."""

    __slots__ = ("_batch", "_feed", "_match_len", "_waiting", "admitted", "limit")

    def __init__(
        self, match_len: FeedMatchLen, feed: MatchFeed, batch: Batch, waiting: WaitingQueue
    ) -> None:
        self._match_len = match_len
        self._feed = feed
        self._batch = batch
        self._waiting = waiting
        self.admitted: set[Request] = set()
        """Admitted in this decision (still held until the decision ends)."""
        self.limit = NEVER
        """Claims at or above this are refused (kept current by the batch formation)."""

    @property
    def needs(self) -> dict[Request, int] | None:
        """The held requests' claims (:attr:`MatchFeed.needs`), once the decision read the
        moved matches (None before: no prediction)."""
        return self._match_len.needs

    @property
    def floor(self) -> int:
        """The smallest claim of a request still waiting and not admitted in this decision,
        when every waiting request is held (the feed holds only waiting requests, so then
        it holds as many as wait); -1 otherwise. Once :attr:`limit` is at or below it,
        every request left would be refused."""
        needs = self._match_len.needs
        if not needs or len(needs) != len(self._waiting):
            return -1
        smallest = self._feed.smallest_need(self.admitted)
        return -1 if smallest is None else smallest

    def refused(self, count: int) -> None:
        """Counted beside the refusals the answer recorded (:meth:`Batch.refused_all`)."""
        self._batch.predicted_refusals += count


class Running(Protocol):
    """What batch formation needs of the running batch
    (:class:`~fairserve.sim.decoding.RunningBatch`): the prefills in progress, how many run,
    and a place to start the slots it admits."""

    @property
    def prefilling(self) -> list[Slot]: ...

    def __len__(self) -> int: ...

    def start(self, slot: Slot) -> None: ...


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
        """``id`` of the requests admission asked about and refused."""
        self.predicted_refusals = 0
        """Requests the policy did not ask about because the answer would have been a
        refusal (:class:`PredictedRefusals`): each a waiting request, none asked too."""

    def refused_all(self, waiting: WaitingQueue) -> bool:
        """Whether admission refused every request left waiting (asked or predicted).

        With predicted refusals the ids are not at hand, but every refusal, asked or not,
        is of a distinct request that is still waiting, so counting them answers it."""
        if not self.predicted_refusals:
            return waiting.all_in(self.refused)
        return len(self.refused) + self.predicted_refusals >= len(waiting)

    @property
    def prefill_tokens(self) -> int:
        return sum(chunk for _, chunk in self.chunks)


class BatchFormer:
    """Forms one step's batch from the running prefills and the waiting queue."""

    def __init__(
        self,
        config: EngineConfig,
        policy: LocalPolicy,
        pool: KVPool,
        waiting: WaitingQueue,
        running: Running,
        stats: EngineStats,
    ) -> None:
        self.config = config
        self.policy = policy
        self.pool = pool
        self.waiting = waiting
        self.running = running
        self.stats = stats
        self.matches = MatchFeed(pool.tree, pool.base_ratio)
        """The waiting requests' matches across steps, and the moved-match feed."""

    def form(self, now_s: float) -> Batch:
        """The batch of the step starting at ``now_s``; admitted slots already run."""
        kind = self.config.batching
        budget = self.config.max_batch_tokens
        if kind == "fastertransformer":
            batch = Batch(budget)
            if len(self.running):
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
        for slot in self.running.prefilling:
            if batch.budget_tokens <= 0:
                break
            chunk = min(slot.prefill_left, batch.budget_tokens)
            batch.chunks.append((slot, chunk))
            batch.budget_tokens -= chunk
        self._admit(batch, now_s, chunked=True)
        return batch

    def may_fit_any(self) -> bool:
        """Cheap pre-check: could even the smallest waiting request get memory now?"""
        smallest = self.waiting.min_remaining_output()
        if smallest is None:
            return False
        return 1 + self.pool.reservation_of(smallest) <= self.pool.admission_headroom()

    def _admit(self, batch: Batch, now_s: float, chunked: bool) -> None:
        if not self.waiting or not self.may_fit_any():
            self.matches.settle()
            return
        cap = self.config.max_running_requests
        pool, waiting, running = self.pool, self.waiting, self.running
        # Memory only gets tighter within a step, so once an admission claiming ``c`` tokens
        # was refused, a request needing at least ``c`` without any lock is refused without
        # touching the tree.
        refused_need = [pool.capacity_tokens + 1]
        ratio = pool.reserve_output_ratio  # fixed while a batch forms
        # A refused claim this low refuses the smallest waiting request too (every one needs
        # a prompt token besides its reservation): every later answer would be the refusal
        # above, so the decision ends there (EXHAUSTED). Memory stays too tight until a
        # finish, so the engine's "nothing admissible" checks read ``may_fit_any``, not the
        # requests left unasked (under overload most of the queue).
        smallest = waiting.min_remaining_output()
        floor_need = 0
        if chunked and smallest is not None and waiting.all_keyed():
            floor_need = 1 + pool.reservation_of(smallest)
        match_len = self.matches.begin()  # the matches at the decision's start
        # With the reservation ratio at its base, a request the decision reads from the
        # feed has its claim kept there (``needs``): one at or above a refused claim is
        # refused with one look-up (the refusal below, without recomputing it).
        settled = chunked and ratio == pool.base_ratio
        refuse = batch.refused.add
        predicted = PredictedRefusals(match_len, self.matches, batch, waiting) if settled else None
        match_len.refusals = predicted

        def relimit() -> None:
            """The claim from which ``answer`` refuses a held request at once (its first
            two checks), after something it depends on changed."""
            if predicted is None:
                return
            if batch.budget_tokens <= 0 or refused_need[0] <= floor_need:
                predicted.limit = NEVER  # the next answer ends the decision: ask it
            elif cap is not None and len(running) >= cap:
                predicted.limit = 0  # every held request is refused without a lock
            else:
                predicted.limit = refused_need[0]

        def answer(req: Request) -> Answer:
            budget = batch.budget_tokens
            if budget <= 0 and (chunked or budget < 0):
                # Nothing fits the step's token budget any more (a non-chunked batch below
                # 0 refuses even an empty extend): every later answer would be a refusal
                # without side effects, so the decision ends here (EXHAUSTED's contract).
                return EXHAUSTED
            if settled and match_len.needs is not None:
                need = match_len.needs.get(req)
                if need is not None and need >= refused_need[0] > floor_need:
                    refuse(id(req))
                    return NO_FIT
            remaining = req.max_output_tokens - req.output_tokens
            reserve = ceil(ratio * remaining) if remaining > 0 else 0  # pool.reservation
            key = req.prompt_key
            if chunked and reserve + 1 >= refused_need[0] and key:
                # needs at least one prompt token besides its reservation: refused below
                # without a lock whatever its match (the same answer, without matching)
                batch.refused.add(id(req))
                return NO_FIT
            matched = match_len(req)
            extend = len(key) // TOKEN_BYTES - matched + req.output_tokens
            if not chunked and extend > budget and batch.chunks:
                return NO_FIT  # the budget frees up next step: not a memory refusal
            slot = None
            if extend + reserve < refused_need[0] and (cap is None or len(running) < cap):
                slot = pool.try_admit(req, reserve=reserve)
                if slot is None:
                    refused_need[0] = min(refused_need[0], pool.last_refused_claim)
                    relimit()
            if slot is None:
                batch.refused.add(id(req))
                return EXHAUSTED if refused_need[0] <= floor_need else NO_FIT
            slot.output_key = waiting.output_key(req)  # read for an admission only
            self._start(slot, batch, now_s, chunked)
            if predicted is not None:
                predicted.admitted.add(req)
            relimit()
            return FIT

        relimit()
        decision = self.policy.decide(waiting.requests(), match_len, now_s)
        admitted = answer_all(decision, answer)
        match_len.refusals = None  # the two refer to each other: no cycle outlives the step
        waiting.remove_all(admitted)
        left = self.matches.left
        for req in admitted:
            left(req)

    def _start(self, slot: Slot, batch: Batch, now_s: float, chunked: bool) -> None:
        req = slot.req
        self.running.start(slot)
        if req.admit_s is None:
            req.admit_s = now_s
            self.stats.prompt_tokens += req.input_tokens
            self.stats.cached_tokens += req.cached_tokens
        self.stats.admitted += 1
        chunk = min(slot.prefill_left, batch.budget_tokens) if chunked else slot.prefill_left
        batch.budget_tokens -= chunk
        batch.chunks.append((slot, chunk))
