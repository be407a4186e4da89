"""Per-client round robin: each client's requests cycle over the workers on their own.

Every backlogged client then has work queued on every worker, which is the premise of the
per-worker fairness bounds (DoubleQ paper, Appendix A.3): with local VTC on each worker this
is the distributed VTC baseline. It ignores cache locality entirely.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from fairserve.core.types import Request
from fairserve.sched.dispatch.base import Dispatcher, register_dispatcher, shown_clients
from fairserve.sched.dispatch.round_robin import (
    cursor_after,
    cursor_after_removal,
    next_in_cycle,
)


@register_dispatcher
class ClientRoundRobin(Dispatcher):
    """One round-robin cursor per client."""

    name = "client-rr"
    description = "round robin per client: spread each client's requests over all workers"

    def _init_state(self) -> None:
        self._next: dict[str, int] = {}
        self._fresh = 0

    def _choose(self, req: Request, candidates: list[str]) -> str:
        # A new client starts where the global cycle stands, so that many one-request
        # clients do not all land on the first worker.
        start = self._next.get(req.client, self._fresh)
        return next_in_cycle(self.workers, start, candidates)

    def _dispatched(self, req: Request, worker: str) -> None:
        after = cursor_after(self.workers, worker)
        self._next[req.client] = after
        self._fresh = after

    def remove_worker(self, worker: str) -> None:
        self._known(worker)
        index = self.workers.index(worker)
        super().remove_worker(worker)
        self._fresh = cursor_after_removal(self._fresh, index)
        for client, cursor in self._next.items():
            self._next[client] = cursor_after_removal(cursor, index)

    def _worker_at(self, cursor: int) -> str | None:
        return self.workers[cursor % len(self.workers)] if self.workers else None

    def _extra_state(self, clients: Collection[str] | None) -> dict[str, Any]:
        return {
            "clients": {
                client: {"next_worker": self._worker_at(self._next[client])}
                for client in shown_clients(self._next, clients)
            }
        }
