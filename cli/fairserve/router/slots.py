"""Worker slots: how many requests the router lets into each worker, and who waits.

A worker runs at most ``max_running_requests`` at once (SGLang's bound, which the simulated
worker applies too; the router reads it from ``/get_server_info``). Without a bound here the
router sent every request at once: under overload the dispatcher's cached worker (every chat
prompt shares its template's first bytes) took everything while the others idled, and a
tenant's flood sat in the worker's queue, where light clients' requests took minutes and
some got no answer before their clients gave up (issue 18: the soak). So, for each worker:

* while fewer than its bound are outstanding there, any request may go to it;
* when it is full, a client still below its fair share of the bound (the bound over the
  clients with requests there) may go too: it waits in the worker's queue, whose fair
  policy admits it at the next free slot, ahead of the clients holding more;
* otherwise the request waits in the router until a slot frees (a worker released a
  request), woken least-in-flight client first, or fails after ``queue_timeout_s`` with
  503 and ``Retry-After`` (a clear answer, never a client's own timeout).

The dispatcher then chooses among the workers that may take the request, so a full worker
spills to the others and the batch of every worker stays full (throughput is kept, unlike a
small fixed cap per worker). Workers that report no bound are never limited here.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable, Sequence

from fairserve.router.lifecycle import Call, Subscriber

Bound = Callable[[str], int | None]
"""A worker's running bound (None: unknown, no limit)."""

POLL_S = 1.0
"""A waiting request looks again this often (a worker that came up, a bound learnt)."""


class WorkerSlots(Subscriber):
    """Outstanding requests per worker and per client there; the requests that wait."""

    def __init__(self, bound: Bound) -> None:
        self.bound = bound
        self.outstanding: dict[str, int] = {}
        self.by_client: dict[str, dict[str, int]] = {}
        """Worker -> client -> requests outstanding there (no zero entries)."""
        self.in_flight: dict[str, int] = {}
        """Client -> requests outstanding on any worker (no zero entries)."""
        self.waiting: dict[str, deque[asyncio.Future[None]]] = {}
        """Client -> the wake-ups of its waiting requests, oldest first."""
        self.waited = 0
        self.timed_out = 0

    def view(self) -> dict[str, int]:
        """What the state shows: requests waiting for room now, and so far."""
        waiting = sum(len(queue) for queue in self.waiting.values())
        return {"waiting": waiting, "waited": self.waited, "timed_out": self.timed_out}

    # ------------------------------------------------------------------ decisions
    def open_for(self, client: str, workers: Sequence[str], waited: bool = False) -> list[str]:
        """The workers of ``workers`` that may take a request of ``client`` now.

        While requests wait, a worker's free room goes to them (``waited``) first: a new
        request over its share everywhere waits too, so no newcomer jumps the queue."""
        queued = bool(self.waiting) and not waited
        room: list[str] = []
        share: list[str] = []
        for worker in workers:
            bound = self.bound(worker)
            if bound is None:
                room.append(worker)
                continue
            outstanding = self.outstanding.get(worker, 0)
            if outstanding < bound and not queued:
                room.append(worker)
            elif self._below_share(client, worker, bound):
                share.append(worker)
        return room + share

    def _below_share(self, client: str, worker: str, bound: int) -> bool:
        clients = self.by_client.get(worker, {})
        mine = clients.get(client, 0)
        sharing = len(clients) + (0 if mine else 1)
        return mine * sharing < bound

    async def wait(self, client: str, timeout_s: float) -> bool:
        """Wait until a slot may have freed (at most ``POLL_S``) or ``timeout_s`` passed;
        False when the time is up. Cancellation leaves no trace."""
        if timeout_s <= 0:
            return False
        wake: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue = self.waiting.setdefault(client, deque())
        queue.append(wake)
        self.waited += 1
        try:
            await asyncio.wait_for(asyncio.shield(wake), min(POLL_S, timeout_s))
        except TimeoutError:
            pass
        finally:
            self._forget(client, wake)
        return True

    def _forget(self, client: str, wake: asyncio.Future[None]) -> None:
        queue = self.waiting.get(client)
        if queue is None:
            return
        with contextlib.suppress(ValueError):  # woken: already taken off
            queue.remove(wake)
        if not queue:
            del self.waiting[client]

    def _wake_one(self) -> None:
        """The oldest waiting request of the client with the fewest requests in flight."""
        if not self.waiting:
            return
        client = min(self.waiting, key=lambda c: self.in_flight.get(c, 0))
        queue = self.waiting[client]
        wake = queue.popleft()
        if not queue:
            del self.waiting[client]
        if not wake.done():
            wake.set_result(None)

    # ------------------------------------------------------------------ lifecycle
    def dispatched(self, call: Call, worker: str) -> None:
        self.outstanding[worker] = self.outstanding.get(worker, 0) + 1
        clients = self.by_client.setdefault(worker, {})
        clients[call.client] = clients.get(call.client, 0) + 1
        self.in_flight[call.client] = self.in_flight.get(call.client, 0) + 1

    def released(self, call: Call, worker: str, usage: object) -> None:
        _decrement(self.outstanding, worker)
        clients = self.by_client.get(worker)
        if clients is not None:
            _decrement(clients, call.client)
            if not clients:
                del self.by_client[worker]
        _decrement(self.in_flight, call.client)
        self._wake_one()


def _decrement(counts: dict[str, int], key: str) -> None:
    left = counts.get(key, 0) - 1
    if left > 0:
        counts[key] = left
    else:
        counts.pop(key, None)
