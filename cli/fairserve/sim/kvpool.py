"""The KV pool of one simulated engine: fixed token capacity shared by a radix prefix cache
and the private KV of running requests.

Memory model (SGLang's, simplified to tokens):

* the radix tree holds cached prefixes; a running request *locks* its matched prefix, so
  what it reads is never evicted; unlocked nodes are evicted LRU when space is needed;
* a running request's newly computed tokens are *private* until its prefill completes
  (then its prompt joins the tree and the lock moves onto it) and its output tokens stay
  private until it finishes (then prompt + output join the tree, SGLang's
  ``cache_finished_req``), so a later call that extends this one hits the cache;
* admission *reserves* ``ceil(ratio · max_output_tokens)`` tokens for future decode (SGLang's
  new-token ratio); with ``ratio < 1`` a decode step can run out of memory, and the engine
  then retracts running requests, as SGLang does. After a retraction the ratio jumps to 1
  and decays back to its base over :data:`RATIO_DECAY_STEPS` steps (SGLang's adaptive
  ratio), so a retracted request is not admitted and retracted again forever.

Decode clock: every decoding request gains one output token per decode step, so instead of
touching each one per step the pool counts the steps (:attr:`KVPool.clock`) and a decoding
slot's fields (``private_tokens``, ``reserved_tokens`` and its request's ``output_tokens``)
are brought up to date only when read (:meth:`KVPool.sync`). The pool's totals stay exact at
every step; reservations running out are found in a heap of the clocks they end at. This is
what makes a step cost O(requests that change) instead of O(running requests).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fairserve.core.errors import ConfigError
from fairserve.core.radix import RadixTree
from fairserve.core.types import TOKEN_BYTES, Request

RATIO_DECAY_STEPS = 600
"""Steps for the reservation ratio to fall from 1 back to its base after a retraction."""


@dataclass(slots=True, eq=False)
class Slot:
    """A running request's KV bookkeeping."""

    req: Request
    lock_key: bytes
    extend_tokens: int
    prefill_left: int
    reserved_tokens: int
    private_tokens: int
    output_key: bytes
    target_tokens: int
    """Output length at which the request finishes."""
    prompt_tokens: int
    """``req.input_tokens``, kept here because the hot loops read it for every step."""
    seq: int = 0
    """Admission order (the engine's running order)."""
    decoding: bool = False
    """Prefill done: the slot grows with the pool's decode clock."""
    synced_clock: int = 0
    """Pool clock the decoding slot's fields (and ``req.output_tokens``) are valid at."""
    reserve_until: int = 0
    """Pool clock at which a decoding slot's reservation is used up."""
    reserving: bool = False
    """Decoding with some reservation left (counted in the pool's ``_reserving``)."""

    @property
    def prefilling(self) -> bool:
        return self.prefill_left > 0


class KVPool:
    """Token-level KV accounting around a :class:`RadixTree`."""

    def __init__(self, capacity_tokens: int, reserve_output_ratio: float = 1.0) -> None:
        if capacity_tokens <= 0:
            raise ConfigError(f"kv_capacity_tokens must be > 0, got {capacity_tokens}")
        if not 0.0 <= reserve_output_ratio <= 1.0:
            raise ConfigError(
                f"reserve_output_ratio must be within 0..1, got {reserve_output_ratio}"
            )
        self.capacity_tokens = capacity_tokens
        self.base_ratio = reserve_output_ratio
        self.reserve_output_ratio = reserve_output_ratio
        self.tree = RadixTree()
        self.private_tokens = 0
        self.reserved_tokens = 0
        self.evicted: list[bytes] = []
        """Eviction events not yet drained (full prefix keys; ``b""`` means everything)."""
        self.last_refused_claim = 0
        """Tokens the last refused admission needed, its cached prefix's new lock included."""
        self.clock = 0
        """Decode tokens every decoding slot has gained so far (see :meth:`sync`)."""
        self.decoding = 0
        """Decoding slots (those that grow with the clock)."""
        self._reserving = 0
        """Decoding slots whose reservation is not used up yet."""
        self._reserve_ends: list[tuple[int, int, Slot]] = []
        """(clock the reservation ends at, seq, slot); entries of departed slots are stale."""
        self._admitted = 0

    # ---------------------------------------------------------------- queries
    @property
    def used_tokens(self) -> int:
        return self.tree.total_tokens + self.private_tokens

    @property
    def free_tokens(self) -> int:
        return self.capacity_tokens - self.used_tokens

    def growable_tokens(self) -> int:
        """Tokens running requests can still add: free plus evictable cache."""
        return self.capacity_tokens - self.private_tokens - self.tree.protected_tokens

    def admission_headroom(self) -> int:
        """Tokens a new admission may claim (prompt plus output reservation)."""
        return (
            self.capacity_tokens
            - self.private_tokens
            - self.reserved_tokens
            - self.tree.protected_tokens
        )

    def cached_prefix(self, req: Request) -> int:
        """Prompt tokens served from cache if admitted now (at least one token is computed,
        as in SGLang, so the last position yields logits)."""
        return self.prefix_matcher({})(req)

    def prefix_matcher(self, memo: dict[Request, int]) -> Callable[[Request], int]:
        """:meth:`cached_prefix` remembered per request in ``memo``: what one batch
        formation asks for every waiting request, answered as the tree was when first asked
        (an admission may evict below a later request's match).

        One call frame per request: under load this is the simulator's most frequent call
        (every waiting request at every decision), so the tree's kept match is read here
        (:attr:`RadixTree.kept_matches`) and the tree is asked only when it has none."""
        tree_match, kept, remembered = self.tree.match_len, self.tree.kept_matches.get, memo.get

        def cached_prefix(req: Request) -> int:
            cached = remembered(req)
            if cached is None:
                key = req.prompt_key
                if key:
                    ticket = kept(key)
                    if ticket is None or not ticket.valid:
                        tokens = tree_match(key)
                    else:
                        tokens = ticket.tokens
                    cached = min(tokens, len(key) // TOKEN_BYTES - 1)
                else:
                    cached = 0
                memo[req] = cached
            return cached

        return cached_prefix

    def reservation(self, req: Request) -> int:
        remaining = max(0, req.max_output_tokens - req.output_tokens)
        return math.ceil(self.reserve_output_ratio * remaining)

    def reservation_of(self, remaining_tokens: int) -> int:
        """The reservation of ``remaining_tokens`` output tokens (monotone in them, so the
        smallest remaining output gives the smallest reservation)."""
        return math.ceil(self.reserve_output_ratio * remaining_tokens)

    # ---------------------------------------------------------------- admission
    def try_admit(
        self, req: Request, output_key: bytes = b"", reserve: int | None = None
    ) -> Slot | None:
        """Lock the request's cached prefix and claim its memory, or claim nothing.

        Locking makes the matched prefix unevictable, so the claim counts those tokens too
        when they were not locked already. A refusal still refreshes the matched prefix in
        the LRU order, as SGLang's lock and unlock of it do (the tree's probe: one walk).

        ``reserve``: :meth:`reservation` of ``req``, where the caller computed it already
        (a batch formation asks about many requests per step, most refused). A caller may
        leave ``output_key`` empty and set the slot's after an admission."""
        tree = self.tree
        key = req.prompt_key
        node, matched, fresh = tree.probe_lock(key)
        prompt_tokens = len(key) // TOKEN_BYTES  # req.input_tokens
        cached = min(matched, max(0, prompt_tokens - 1))
        # A retracted request recomputes the output it had generated (SGLang re-prefills it).
        extend = prompt_tokens - cached + req.output_tokens
        if reserve is None:
            reserve = self.reservation(req)
        claim = self.private_tokens + self.reserved_tokens + tree.protected_tokens + fresh
        if claim + extend + reserve > self.capacity_tokens:
            self.last_refused_claim = extend + reserve + fresh
            tree.release_probe(node)
            return None
        tree.lock_probed(key, node, matched)
        self._make_room(extend)
        self.private_tokens += extend
        self.reserved_tokens += reserve
        req.cached_tokens = cached
        target = req.output_len if req.output_len is not None else req.max_output_tokens
        self._admitted += 1
        return Slot(
            req=req,
            lock_key=key,
            extend_tokens=extend,
            prefill_left=extend,
            reserved_tokens=reserve,
            private_tokens=extend,
            output_key=output_key,
            target_tokens=max(1, min(target, req.max_output_tokens or 1)),
            prompt_tokens=prompt_tokens,
            seq=self._admitted,
        )

    # ---------------------------------------------------------------- running
    def can_grow(self, tokens: int) -> bool:
        """Could running requests add ``tokens`` tokens of KV (evicting cache if needed)?"""
        return tokens <= self.growable_tokens()

    def grow(self, decode_tokens: int, joining: Sequence[Slot] = ()) -> None:
        """Every decoding slot gains ``decode_tokens`` output tokens of KV and every slot in
        ``joining`` (prefill completing now, not decoding yet) one; the caller checked
        :meth:`can_grow`. Costs O(len(joining)) plus the reservations that end."""
        need = self.decoding * decode_tokens + len(joining)
        self._make_room(need)
        self.private_tokens += need
        released = 0
        for slot in joining:
            slot.private_tokens += 1
            if slot.reserved_tokens:
                slot.reserved_tokens -= 1
                released += 1
        if decode_tokens and self._reserving:
            released += self._release_reserves(decode_tokens)
        self.reserved_tokens -= released
        self.clock += decode_tokens

    def _release_reserves(self, decode_tokens: int) -> int:
        """Reserved tokens the decoding slots use up over the next ``decode_tokens`` steps:
        one a step each, until a slot's reservation ends."""
        clock, end = self.clock, self.clock + decode_tokens
        released = 0
        heap = self._reserve_ends
        while heap and heap[0][0] <= end:
            until, _seq, slot = heapq.heappop(heap)
            if slot.reserving and slot.reserve_until == until:
                released += until - clock
                slot.reserving = False
                self._reserving -= 1
        return released + decode_tokens * self._reserving

    def join(self, slot: Slot) -> None:
        """The slot's prefill is done (and its first token counted): it decodes from now on,
        growing with the clock."""
        slot.decoding = True
        slot.synced_clock = self.clock
        self.decoding += 1
        if slot.reserved_tokens:
            slot.reserve_until = until = self.clock + slot.reserved_tokens
            slot.reserving = True
            self._reserving += 1
            if until < self.clock + slot.target_tokens - slot.req.output_tokens:
                # Runs out before the request finishes (a reservation ratio below 1);
                # otherwise the finish releases it.
                heapq.heappush(self._reserve_ends, (until, slot.seq, slot))

    def sync(self, slot: Slot) -> None:
        """Bring a decoding slot's fields and ``req.output_tokens`` up to the clock."""
        if slot.decoding:
            gained = self.clock - slot.synced_clock
            if gained:
                slot.synced_clock = self.clock
                slot.req.output_tokens += gained
                slot.private_tokens += gained
                reserved = slot.reserved_tokens
                slot.reserved_tokens = reserved - gained if reserved > gained else 0

    def after_retraction(self) -> None:
        """Memory ran out: reserve fully again until the ratio has decayed."""
        self.reserve_output_ratio = 1.0

    def decay_ratio(self, steps: int) -> None:
        """Let the reservation ratio fall back towards its base by ``steps`` steps' worth."""
        if self.reserve_output_ratio > self.base_ratio:
            drop = steps * (1.0 - self.base_ratio) / RATIO_DECAY_STEPS
            self.reserve_output_ratio = max(self.base_ratio, self.reserve_output_ratio - drop)

    @property
    def ratio_settled(self) -> bool:
        return self.reserve_output_ratio == self.base_ratio

    def prefill_done(self, slot: Slot) -> None:
        """The prompt is computed: it joins the tree and the lock moves onto all of it."""
        req = slot.req
        self.tree.insert_locked(req.prompt_key, from_lock=slot.lock_key)
        self.tree.unlock(slot.lock_key)
        slot.lock_key = req.prompt_key
        self.private_tokens -= slot.extend_tokens
        slot.private_tokens -= slot.extend_tokens

    def release(self, slot: Slot, cache_output: bool) -> None:
        """A request left the batch: free its KV; on a finish, cache prompt + output."""
        req = slot.req
        if slot.decoding:
            self.sync(slot)
            slot.decoding = False
            self.decoding -= 1
            if slot.reserving:
                slot.reserving = False
                self._reserving -= 1
        if cache_output and not slot.prefilling:
            produced = min(req.output_tokens, len(slot.output_key) // TOKEN_BYTES)
            if produced:
                output = slot.output_key[: produced * TOKEN_BYTES]
                self.tree.insert(req.prompt_key + output, from_lock=slot.lock_key, new_key=True)
        self.private_tokens -= slot.private_tokens
        self.reserved_tokens -= slot.reserved_tokens
        slot.private_tokens = slot.reserved_tokens = 0
        self.tree.unlock(slot.lock_key)
        # Caching the output may have pushed the pool over capacity: evict back under it.
        self._make_room(0)

    def flush(self) -> None:
        """Drop every unlocked cached prefix (``/flush_cache``)."""
        self.tree.evict(self.tree.total_tokens)
        self.evicted.append(b"")

    def drain_evictions(self) -> list[bytes]:
        events, self.evicted = self.evicted, []
        return events

    # ---------------------------------------------------------------- internals
    def _make_room(self, tokens: int) -> None:
        short = tokens + self.tree.total_tokens + self.private_tokens - self.capacity_tokens
        if short > 0:
            self.evicted.extend(self.tree.evict(short))
