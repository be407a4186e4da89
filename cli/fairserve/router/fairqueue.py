"""The router-side fair queue: fairness in front of a worker that has none inside.

A stock engine (SGLang without the plugin, vLLM, any OpenAI-compatible server) admits
requests in its own order (FCFS, LPM), so a flooding client starves the others however the
dispatcher spreads them. For such a worker the router keeps at most
``max_outstanding`` requests in flight and holds the excess here; a ``sched`` local policy
(DLPM by default) decides which waiting request is released next, driven through the same
event contract as inside an engine (``on_arrival``, ``decide`` answered one request at a
time, ``on_admit``, decode charges, ``on_finish``/``on_abort``).

``can_fit`` is "a slot is free" (and reserves it: a True answer is final); once every slot
is taken the queue answers ``EXHAUSTED``, which ends the decision. ``match_len``
is the worker's share of the fleet's one cache model
(:class:`~fairserve.sched.dispatch.cache_model.CacheModel`), the dispatcher's own: the
router's worker feed hands it over (:meth:`FairQueue.attach`), so the queue and the
dispatcher read the same prompts, the same evictions from the worker's feed and the same
bound. The queue records a prompt when it releases it to the worker, never while it waits
(a waiting request would match itself). A queue built on its own (tests) models its worker
alone, bounded LRU by ``cache_tokens``. Output tokens are charged when a request ends (the
router does not see the engine's decode steps).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from fairserve.core.types import Request
from fairserve.sched.dispatch.cache_model import CacheModel
from fairserve.sched.local.base import EXHAUSTED, FIT, Answer, LocalPolicy, answer_all

DEFAULT_CACHE_TOKENS = 1 << 20


class FairQueue:
    """Admission control of one worker by a local policy."""

    def __init__(
        self,
        policy: LocalPolicy,
        max_outstanding: int,
        cache_tokens: int = DEFAULT_CACHE_TOKENS,
        clock: Callable[[], float] = time.monotonic,
        *,
        cache: CacheModel | None = None,
        worker: str = "worker",
    ) -> None:
        """``cache``: the fleet's model, of which this queue reads and records ``worker``'s
        share (None: a model of this worker alone, bounded by ``cache_tokens``)."""
        self.policy = policy
        self.max_outstanding = max_outstanding
        self.cache_tokens = cache_tokens
        if cache is None:
            cache = CacheModel()
            cache.bound(worker, cache_tokens)
        self.cache = cache
        self.worker = worker
        self.outstanding = 0
        self.released = 0
        self._clock = clock
        self._waiting: list[Request] = []
        self._futures: dict[int, asyncio.Future[None]] = {}
        self._admitted: set[int] = set()

    def attach(self, cache: CacheModel, worker: str) -> None:
        """Read and record ``worker``'s share of ``cache`` from now on: the fleet's model,
        which the dispatcher reads and the worker's eviction feed and bound trim."""
        self.cache = cache
        self.worker = worker

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    async def acquire(self, req: Request) -> None:
        """Wait until the policy releases ``req`` to the worker.

        May raise :class:`~fairserve.core.errors.RequestRejected` (e.g. ``rpm``). If the
        caller is cancelled while waiting, the request leaves the queue."""
        if not self.offer(req):
            await self.wait(req)

    def offer(self, req: Request) -> bool:
        """``req`` arrives: whether the policy released it at once (no wait; most requests
        of a worker that keeps up). If not, it waits in the queue: :meth:`wait` for it.

        Why apart from :meth:`acquire`: the router serves a request released at once
        without a coroutine of its own and without telling its lifecycle that it queued
        and left the queue in the same instant. May raise
        :class:`~fairserve.core.errors.RequestRejected`."""
        now = self._clock()
        if self._waiting or self.outstanding >= self.max_outstanding:
            self.policy.on_arrival(req, now)
            self._waiting.append(req)
            self._pump(now)
            return id(req) in self._admitted
        return self._alone(req, now)

    async def wait(self, req: Request) -> None:
        """Wait until the policy releases ``req``, which :meth:`offer` left waiting. If the
        caller is cancelled while waiting, the request leaves the queue."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._futures[id(req)] = future
        try:
            await future
        except asyncio.CancelledError:
            self._leave(req)
            raise

    def finish(self, req: Request, output_tokens: int, cached_tokens: int) -> None:
        """``req`` ended at the worker: charge its output, correct its prompt charge, free
        its slot and release the next requests."""
        if id(req) not in self._admitted:
            return
        now = self._clock()
        req.output_tokens = output_tokens
        if output_tokens > 0:  # on_decode_steps([req], ...), without grouping a list of one
            self.policy.on_decode_groups({req.client: (req,)}, output_tokens, now)
        self.policy.correct_extend(req, max(0, req.input_tokens - cached_tokens))
        self.policy.on_finish(req, now)
        self._free(req, now)

    def abort(self, req: Request) -> None:
        """``req`` left without finishing (worker failure, client gone)."""
        if id(req) in self._admitted:
            now = self._clock()
            self.policy.on_abort(req, now, was_waiting=False)
            self._free(req, now)
        elif id(req) in self._futures:
            self._leave(req)

    def snapshot(self) -> dict[str, Any]:
        return {
            "waiting": len(self._waiting),
            "outstanding": self.outstanding,
            "max_outstanding": self.max_outstanding,
            "released": self.released,
            "cache_tokens": self.cache.worker_tokens(self.worker),
            "policy": self.policy.snapshot(),
        }

    # ------------------------------------------------------------------ internals
    def _leave(self, req: Request) -> None:
        future = self._futures.pop(id(req), None)
        if future is None:
            return
        if id(req) in self._admitted:  # released just before the cancellation landed
            self.abort(req)
            return
        self._waiting.remove(req)
        self.cache.done_asking(req.prompt_key, self.worker)
        self.policy.on_abort(req, self._clock(), was_waiting=True)

    def _free(self, req: Request, now: float) -> None:
        self._admitted.discard(id(req))
        self._futures.pop(id(req), None)
        self.outstanding -= 1
        self._pump(now)

    def _can_fit(self, req: Request) -> bool:
        """:meth:`_answer` as yes or no (a policy's ``arrive_alone`` asks so)."""
        return self._answer(req) is FIT

    def _alone(self, req: Request, now: float) -> bool:
        """The uncontended case (nothing waits, a slot is free): ``req``'s arrival and the
        decision :meth:`_pump` would take over a queue of ``req`` alone, in one call into
        the policy (``arrive_alone``: ``on_arrival`` then ``select``, unless the policy has
        a cheaper path to the same state), without the queue's list work; and ``req``'s
        match is not kept, since it stops waiting in this call if released. Whether it was
        released; if not, it waits like any other.

        Why: most requests of a worker that keeps up arrive to an empty queue, and the
        policy's decision is already cheap for one request (DLPM's ``_decide_one``).
        ``tests/router/test_fairqueue_fast_path.py`` checks that it leaves the same
        admissions and policy state as the full path."""
        if not self.policy.arrive_alone(req, self._can_fit, self._peek_len, now):
            self._waiting.append(req)
            return False
        self._release(req)
        return True

    def _pump(self, now: float) -> None:
        if not self._waiting or self.outstanding >= self.max_outstanding:
            return
        admitted = self._decide(now)
        if not admitted:
            return
        if len(admitted) == len(self._waiting):  # all of them (one request: the common case)
            self._waiting = []
        else:
            chosen = {id(r) for r in admitted}
            self._waiting = [r for r in self._waiting if id(r) not in chosen]
        for req in admitted:
            self._release(req)
            future = self._futures.get(id(req))
            if future is not None and not future.done():
                future.set_result(None)

    def _decide(self, now: float) -> list[Request]:
        """The policy's decision over the waiting requests, answered by :meth:`_answer`."""
        decision = self.policy.decide(self._waiting, self._match_len, now)
        return answer_all(decision, self._answer)

    def _answer(self, req: Request) -> Answer:
        """A slot for ``req`` (taken: ``FIT`` is final), or ``EXHAUSTED`` once every slot is
        taken: nothing later fits either, so the decision ends there instead of asking
        about every waiting request (the same releases and policy state as answering
        ``NO_FIT`` to each, ``sched``'s contract for ``EXHAUSTED``)."""
        if self.outstanding >= self.max_outstanding:
            return EXHAUSTED
        self.outstanding += 1
        return FIT

    def _release(self, req: Request) -> None:
        """``req`` goes to the worker: counted, and its prompt recorded on the worker."""
        self._admitted.add(id(req))
        self.released += 1
        self.cache.released(req.prompt_key, self.worker)
        self.cache.done_asking(req.prompt_key, self.worker)

    def _match_len(self, req: Request) -> int:
        return self.cache.match_len(req.prompt_key, self.worker)

    def _peek_len(self, req: Request) -> int:
        """:meth:`_match_len` for a request that stops waiting when released: not kept."""
        return self.cache.peek_len(req.prompt_key, self.worker)
