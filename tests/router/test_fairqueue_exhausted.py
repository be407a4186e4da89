"""A worker's slots all taken end the fair queue's decision (issue 23: cost that stays
flat as the queue grows).

The fair queue answers the policy's questions with "a slot is free". Once the last slot is
taken nothing else fits, so it answers ``EXHAUSTED`` and the decision ends; answering "no"
instead made every release ask about every waiting request (thousands under a flood),
for the same releases (``test_fairqueue_fast_path.py`` compares the two over random
sequences, every policy's state included)."""

from __future__ import annotations

import asyncio

from fairserve.core.types import Request, make_request
from fairserve.router.fairqueue import FairQueue
from fairserve.sched.local.base import Answer
from fairserve.sched.registry import make_local_policy
from tests.worker.helpers import run


class CountingQueue(FairQueue):
    """Counts the policy's questions (a slot for this request?), yes-or-no ones included."""

    asked = 0

    def _answer(self, req: Request) -> Answer:
        self.asked += 1
        return super()._answer(req)


def test_a_release_asks_about_what_fits_not_every_waiting_request() -> None:
    async def body() -> None:
        queue = CountingQueue(make_local_policy("dlpm"), max_outstanding=2)
        reqs = [make_request(f"r{i}", "abc"[i % 3], [7, 7, i], 4) for i in range(200)]
        tasks = [asyncio.ensure_future(queue.acquire(req)) for req in reqs]
        await asyncio.sleep(0)
        assert queue.outstanding == 2 and queue.waiting == 198
        released = [r for r, t in zip(reqs, tasks, strict=True) if t.done()]
        queue.asked = 0
        queue.finish(released[0], 3, 0)  # one slot frees: one request goes, the rest wait
        await asyncio.sleep(0)
        assert queue.outstanding == 2 and queue.waiting == 197
        assert queue.asked <= 2, queue.asked  # the one that fits, then the full worker
        for task in tasks:
            task.cancel()
        await asyncio.sleep(0)

    run(body())
