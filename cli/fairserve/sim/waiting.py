"""The waiting queue of one simulated engine, with what a step asks of it kept as it changes.

Why: under overload the queue grows for the whole run, and every batching step asked it the
same questions by scanning it: could the smallest request get memory at all, who is
backlogged (the recorder's samples), how many wait per client, and, after admitting a few,
a rebuilt list without them. Those scans made a simulated hour of overload cost CPU
minutes. Here each answer is kept up to date as requests join and leave, so a step costs
O(requests that join or leave) besides the policy's own decision.

Order is the engine's: arrivals at the back, a retracted request at the front (it was
admitted before everything still waiting), admitted requests leave wherever they are.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator

from fairserve.core.types import Request


def remaining_output(req: Request) -> int:
    """Output tokens a waiting request may still produce (what its reservation covers)."""
    return max(0, req.max_output_tokens - req.output_tokens)


class WaitingQueue:
    """Waiting requests in order, with per-client counts and the smallest remaining output.

    A waiting request's ``output_tokens`` does not change while it waits (it changes only
    while running), so its remaining output is fixed from ``append`` to ``remove``."""

    __slots__ = ("_by_client", "_keyless", "_min_heap", "_output_keys", "_remaining", "_reqs")

    def __init__(self) -> None:
        self._reqs: dict[int, Request] = {}
        self._by_client: dict[str, int] = {}
        self._output_keys: dict[int, bytes] = {}
        """The output a waiting request will produce, where the host knows it (what its
        prompt + output caches as when it finishes)."""
        self._remaining: dict[int, int] = {}
        """remaining output -> waiting requests with it."""
        self._min_heap: list[int] = []
        """The keys of ``_remaining``; a key whose count fell to 0 is dropped lazily."""
        self._keyless = 0
        """Waiting requests with an empty prompt key (they need no prompt token)."""

    # ---------------------------------------------------------------- reading
    def __len__(self) -> int:
        return len(self._reqs)

    def __bool__(self) -> bool:
        return bool(self._reqs)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._reqs.values())

    def __contains__(self, req: object) -> bool:
        return id(req) in self._reqs

    def requests(self) -> list[Request]:
        """A copy in order (what a policy decision reads while the queue changes)."""
        return list(self._reqs.values())

    def all_in(self, ids: set[int]) -> bool:
        """True when every waiting request's ``id`` is in ``ids`` (C-speed set check)."""
        return len(self._reqs) <= len(ids) and ids.issuperset(self._reqs.keys())

    def by_client(self) -> dict[str, int]:
        """Waiting requests per client (clients with none are absent)."""
        return dict(self._by_client)

    def clients(self) -> Iterable[str]:
        """Clients with a request waiting (a live view: do not change the queue meanwhile)."""
        return self._by_client.keys()

    def min_remaining_output(self) -> int | None:
        """The smallest remaining output among waiting requests; None when empty."""
        heap, counts = self._min_heap, self._remaining
        while heap:
            top = heap[0]
            if counts.get(top):
                return top
            heapq.heappop(heap)
            counts.pop(top, None)
        return None

    def all_keyed(self) -> bool:
        """True when every waiting request has a prompt (needs at least one prompt token)."""
        return not self._keyless

    def output_key(self, req: Request) -> bytes:
        return self._output_keys.get(id(req), b"")

    def find(self, rid: str) -> Request | None:
        """The waiting request with id ``rid`` (linear: aborts are rare)."""
        for req in self._reqs.values():
            if req.id == rid:
                return req
        return None

    # ---------------------------------------------------------------- changes
    def append(self, req: Request, output_key: bytes = b"") -> None:
        self._reqs[id(req)] = req
        self._joined(req, output_key)

    def push_front(self, req: Request, output_key: bytes = b"") -> None:
        """A retracted request goes back ahead of everything waiting (O(waiting): rare)."""
        self._reqs = {id(req): req, **self._reqs}
        self._joined(req, output_key)

    def remove(self, req: Request) -> None:
        """``req`` leaves the queue (admitted or aborted), its output key with it."""
        del self._reqs[id(req)]
        self._output_keys.pop(id(req), None)
        client = req.client
        left = self._by_client[client] - 1
        if left:
            self._by_client[client] = left
        else:
            del self._by_client[client]
        self._remaining[remaining_output(req)] -= 1
        if not req.prompt_key:
            self._keyless -= 1

    def remove_all(self, reqs: Iterable[Request]) -> None:
        for req in reqs:
            self.remove(req)

    def _joined(self, req: Request, output_key: bytes) -> None:
        if output_key:
            self._output_keys[id(req)] = output_key
        if not req.prompt_key:
            self._keyless += 1
        client = req.client
        self._by_client[client] = self._by_client.get(client, 0) + 1
        remaining = remaining_output(req)
        count = self._remaining.get(remaining)
        if not count:
            if count is None:
                heapq.heappush(self._min_heap, remaining)
            count = 0
        self._remaining[remaining] = count + 1
