"""Decode bookkeeping of the engine model: the decode clock, finishes and the policy's
decode charge.

Every decoding request gains one output token per decode step, so the KV pool counts steps
(its decode *clock*, see ``sim.kvpool``) and a request's tokens are brought up to date only
when read. What a step needs from the running batch is kept as requests join the decode
(prefill done) and leave it (finish, retraction, abort): the context tokens the batch reads,
the requests of each client (the policy charges each client once per step) and a heap of
the clocks at which requests reach their length. A step then costs O(requests that join or
leave) instead of O(running requests), which is what lets an hour of 8-worker traffic
simulate in under a minute of CPU.

A policy whose decode charge depends on each request (a per-request cost, an overridden
``on_decode_groups``) and a host that wants per-request tokens (``track_decoded``, the
simulated worker streaming them) take the straightforward path instead: every running
request is brought up to date and grouped at every step.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

from fairserve.core.errors import ConfigError
from fairserve.core.types import Request
from fairserve.sched.local.base import LocalPolicy
from fairserve.sim.batching import Batch
from fairserve.sim.kvpool import KVPool, Slot
from fairserve.sim.waiting import WaitingQueue

if TYPE_CHECKING:
    from fairserve.sim.engine_types import EngineConfig, EngineStats, StepResult


class DecodeBook:
    """Mixin of :class:`~fairserve.sim.engine.Engine`: who decodes, and what that yields."""

    config: EngineConfig
    policy: LocalPolicy
    pool: KVPool
    waiting: WaitingQueue
    stats: EngineStats
    track_decoded: bool
    _running: dict[Slot, None]
    _prefilling: list[Slot]
    _groups: dict[str, list[Request]]
    _context_base: int
    _finish_at: list[tuple[int, int, Slot]]
    _lazy_charge: bool
    _output_keys: dict[int, bytes]

    @property
    def running(self) -> list[Slot]:
        """Running slots in admission order, brought up to date (O(running): for hosts'
        dashboards and tests, not for per-step use)."""
        for slot in self._running:
            self.pool.sync(slot)
        return list(self._running)

    @property
    def _lazy(self) -> bool:
        """Charge and count decode per client without touching each running request."""
        return self._lazy_charge and not self.track_decoded

    def _decoding_slots(self) -> list[Slot]:
        """Decoding slots in running order, brought up to date."""
        sync = self.pool.sync
        slots = [s for s in self._running if s.decoding]
        for slot in slots:
            sync(slot)
        return slots

    def _produce(self, tokens: int, result: StepResult, slots: list[Slot] | None) -> None:
        """``slots`` (None: every decoding slot, lazily) produced ``tokens`` output tokens
        by ``result.end_s`` (already applied to the pool and the requests): count them,
        charge the policy once per client, then finish the requests that reached their
        length."""
        end_s = result.end_s
        by_client = result.decoded_by_client
        if slots is None:
            groups = self._groups
            count = self.pool.decoding
        else:
            groups = {}
            for slot in slots:
                req = slot.req
                group = groups.get(req.client)
                if group is None:
                    groups[req.client] = [req]
                else:
                    group.append(req)
            count = len(slots)
            if self.track_decoded:
                result.decoded.extend((s.req, tokens) for s in slots)
        for client, group in groups.items():
            by_client[client] = by_client.get(client, 0) + tokens * len(group)
        self.stats.decode_tokens += tokens * count
        result.decode_tokens += tokens * count
        if groups:
            self.policy.on_decode_groups(groups, tokens, end_s)
        heap = self._finish_at
        if heap and heap[0][0] <= self.pool.clock:
            self._finish_due(end_s, result)

    def _finish_due(self, end_s: float, result: StepResult) -> None:
        """Finish every decoding request that reached its length, in running order (all of
        them reached it at this clock: finishes are applied after every advance)."""
        heap, clock = self._finish_at, self.pool.clock
        while heap and heap[0][0] <= clock:
            slot = heapq.heappop(heap)[2]
            if not slot.decoding:
                continue  # retracted or aborted since
            req = slot.req
            self._leave(slot)
            req.finish_s = end_s
            self.pool.release(slot, cache_output=self.config.cache_outputs)
            self._forget(req)
            self.policy.on_finish(req, end_s)
            self.stats.finished += 1
            result.finished.append(req)

    def _join(self, slot: Slot) -> None:
        """A slot's prefill completed (its first token counted): it decodes from now on."""
        pool = self.pool
        pool.join(slot)
        req = slot.req
        self._context_base += slot.prompt_tokens + req.output_tokens - pool.clock
        group = self._groups.get(req.client)
        if group is None:
            self._groups[req.client] = [req]
        else:
            group.append(req)
        due = pool.clock + slot.target_tokens - req.output_tokens
        heapq.heappush(self._finish_at, (due, slot.seq, slot))

    def _leave(self, slot: Slot) -> None:
        """A slot leaves the running batch (finish, retraction, abort); its request is
        brought up to date. The pool is released by the caller."""
        del self._running[slot]
        if not slot.decoding:
            self._prefilling.remove(slot)
            return
        pool = self.pool
        pool.sync(slot)
        req = slot.req
        self._context_base -= slot.prompt_tokens + req.output_tokens - pool.clock
        group = self._groups[req.client]
        group.remove(req)
        if not group:
            del self._groups[req.client]

    def _retract_one(self, batch: Batch, now_s: float) -> Slot:
        """Memory ran out mid-decode: send the newest running request back to waiting."""
        if len(self._running) <= 1:
            raise ConfigError(
                "KV capacity is too small for a single request; raise kv_capacity_tokens"
            )
        victim = next(reversed(self._running))
        self._leave(victim)
        batch.chunks = [(s, c) for s, c in batch.chunks if s is not victim]
        self.pool.release(victim, cache_output=False)
        self.pool.after_retraction()
        self.waiting.push_front(victim.req)
        self.policy.on_retract(victim.req, now_s)
        self.stats.retracted += 1
        return victim

    def _forget(self, req: Request) -> None:
        self._output_keys.pop(id(req), None)


def charges_by_group(policy: LocalPolicy) -> bool:
    """True when the policy's decode charge needs only each client's request count: the
    base ``on_decode_groups`` with a cost that is the same for every request."""
    inherited = type(policy).on_decode_groups is LocalPolicy.on_decode_groups
    return inherited and not getattr(policy.cost, "per_request_decode", True)
