"""Decode bookkeeping of the engine model: the running batch, the decode clock, finishes and
the policy's decode charge.

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

:class:`RunningBatch` is one of the engine's parts (with the waiting queue, the KV pool and
the batch former): it owns the running slots and everything derived from them; the others
reach them through its methods only.
"""

from __future__ import annotations

import heapq

from fairserve.core.types import Request
from fairserve.sched.local.base import LocalPolicy
from fairserve.sim.engine_types import EngineStats, StepResult
from fairserve.sim.kvpool import KVPool, Slot


class RunningBatch:
    """Who runs and decodes, and what decoding yields: the engine's running batch."""

    def __init__(
        self, pool: KVPool, policy: LocalPolicy, stats: EngineStats, cache_outputs: bool
    ) -> None:
        self.pool = pool
        self.policy = policy
        self.stats = stats
        self.cache_outputs = cache_outputs
        self.slots: dict[Slot, None] = {}
        """Running slots in admission order (the newest is retracted first)."""
        self.prefilling: list[Slot] = []
        """Running slots whose prefill is not done, in admission order."""
        self.groups: dict[str, list[Request]] = {}
        """Decoding requests by client (what a uniform decode charge needs: each client's
        count, and any one of its requests; their order within a group means nothing)."""
        self._group_index: dict[Request, int] = {}
        """Each decoding request's position in its group, so that leaving is O(1) (a group
        holds hundreds of requests of one client; ``list.remove`` scanned them)."""
        self.context_base = 0
        """Σ over decoding slots of prompt + output − synced clock: the decode batch reads
        ``context_base + decoding · clock`` context tokens."""
        self._finish_at: list[tuple[int, int, Slot]] = []
        """(clock the slot reaches its length at, seq, slot); departed slots are stale."""
        self._charge_by_group = charges_by_group(policy)
        self.track_decoded = True
        """Fill ``StepResult.decoded`` per request and keep every running request's
        ``output_tokens`` current after each step (streaming hosts need it; the cluster
        simulation only needs the per-client sums and turns it off)."""

    # ---------------------------------------------------------------- reading
    def __len__(self) -> int:
        return len(self.slots)

    def __bool__(self) -> bool:
        return bool(self.slots)

    def synced(self) -> list[Slot]:
        """Running slots in admission order, brought up to date (O(running): for hosts'
        dashboards and tests, not for per-step use)."""
        for slot in self.slots:
            self.pool.sync(slot)
        return list(self.slots)

    @property
    def lazy(self) -> bool:
        """Charge and count decode per client without touching each running request."""
        return self._charge_by_group and not self.track_decoded

    def decoding_slots(self) -> list[Slot]:
        """Decoding slots in running order, brought up to date."""
        sync = self.pool.sync
        slots = [s for s in self.slots if s.decoding]
        for slot in slots:
            sync(slot)
        return slots

    def steps_to_first_finish(self) -> int:
        """Decode steps until the first decoding request reaches its length."""
        heap = self._finish_at
        while not heap[0][2].decoding:
            heapq.heappop(heap)  # stale: left the batch
        return heap[0][0] - self.pool.clock

    def find(self, rid: str) -> Slot | None:
        """The running slot of request ``rid`` (linear: aborts are rare)."""
        for slot in self.slots:
            if slot.req.id == rid:
                return slot
        return None

    # ---------------------------------------------------------------- changes
    def start(self, slot: Slot) -> None:
        """An admitted slot runs from now on; its prefill starts."""
        self.slots[slot] = None
        self.prefilling.append(slot)

    def prefills_done(self) -> None:
        """Some prefills completed in this step: keep only the unfinished ones."""
        self.prefilling = [s for s in self.prefilling if s.prefill_left > 0]

    def join(self, slot: Slot) -> None:
        """A slot's prefill completed (its first token counted): it decodes from now on."""
        pool = self.pool
        pool.join(slot)
        req = slot.req
        self.context_base += slot.prompt_tokens + req.output_tokens - pool.clock
        group = self.groups.get(req.client)
        if group is None:
            group = self.groups[req.client] = []
        self._group_index[req] = len(group)
        group.append(req)
        due = pool.clock + slot.target_tokens - req.output_tokens
        heapq.heappush(self._finish_at, (due, slot.seq, slot))

    def leave(self, slot: Slot) -> None:
        """A slot leaves the running batch (finish, retraction, abort); its request is
        brought up to date. The pool is released by the caller."""
        del self.slots[slot]
        if not slot.decoding:
            self.prefilling.remove(slot)
            return
        pool = self.pool
        pool.sync(slot)
        req = slot.req
        self.context_base -= slot.prompt_tokens + req.output_tokens - pool.clock
        self._leave_group(req)

    def _leave_group(self, req: Request) -> None:
        """Take ``req`` out of its client's group: the group's last request takes its place."""
        group = self.groups[req.client]
        at = self._group_index.pop(req)
        last = group.pop()
        if last is not req:
            group[at] = last
            self._group_index[last] = at
        elif not group:
            del self.groups[req.client]

    def newest(self) -> Slot:
        """The slot admitted last (what a retraction sends back)."""
        return next(reversed(self.slots))

    def produce(self, tokens: int, result: StepResult, slots: list[Slot] | None) -> None:
        """``slots`` (None: every decoding slot, lazily) produced ``tokens`` output tokens
        by ``result.end_s`` (already applied to the pool and the requests): count them,
        charge the policy once per client, then finish the requests that reached their
        length."""
        end_s = result.end_s
        by_client = result.decoded_by_client
        if slots is None:
            groups = self.groups
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
            self.leave(slot)
            req.finish_s = end_s
            self.pool.release(slot, cache_output=self.cache_outputs)
            self.policy.on_finish(req, end_s)
            self.stats.finished += 1
            result.finished.append(req)


def charges_by_group(policy: LocalPolicy) -> bool:
    """True when the policy's decode charge needs only each client's request count: the
    base ``on_decode_groups`` with a cost that is the same for every request."""
    inherited = type(policy).on_decode_groups is LocalPolicy.on_decode_groups
    return inherited and not getattr(policy.cost, "per_request_decode", True)
