"""Round robin: the next available worker after the last one dispatched to.

With local LPM this is SGLang's default data-parallel setup (the "RR + LPM" baseline of the
DoubleQ paper): perfect request-count balance, no cache locality, no fairness.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from fairserve.core.types import Request
from fairserve.sched.dispatch.base import Dispatcher, register_dispatcher


def next_in_cycle(workers: Sequence[str], start: int, candidates: Sequence[str]) -> str:
    """First of ``candidates`` met walking ``workers`` cyclically from index ``start``.

    Shared by the global and the per-client cycles, so that skipping an unavailable worker
    does not lose the position in the cycle."""
    allowed = set(candidates)
    count = len(workers)
    for offset in range(count):
        worker = workers[(start + offset) % count]
        if worker in allowed:
            return worker
    return candidates[0]  # unreachable: candidates are a non-empty subset of workers


def cursor_after(workers: Sequence[str], worker: str) -> int:
    """The cycle position just after ``worker``.

    Not wrapped modulo the worker count: a worker added at the end is then next in line
    after the last worker, as in a real cycle (``next_in_cycle`` wraps when it reads)."""
    return workers.index(worker) + 1


def cursor_after_removal(cursor: int, removed_index: int) -> int:
    """Keep a cycle position on the same next worker when the one at ``removed_index`` left."""
    return cursor - 1 if removed_index < cursor else cursor


@register_dispatcher
class RoundRobin(Dispatcher):
    """Cycle over the workers, skipping unavailable ones."""

    name = "round-robin"
    description = "cycle over the available workers (SGLang's default; no locality, no fairness)"

    _next: int = 0

    def _choose(self, req: Request, candidates: list[str]) -> str:
        return next_in_cycle(self.workers, self._next, candidates)

    def _dispatched(self, req: Request, worker: str) -> None:
        # Advance on dispatch, not on choose: a host may ask ``choose`` and then place the
        # request elsewhere; the cycle follows where requests really went.
        self._next = cursor_after(self.workers, worker)

    def remove_worker(self, worker: str) -> None:
        self._known(worker)
        index = self.workers.index(worker)
        super().remove_worker(worker)
        self._next = cursor_after_removal(self._next, index)

    def _extra_state(self, clients: Collection[str] | None) -> dict[str, Any]:
        return {
            "next_worker": self.workers[self._next % len(self.workers)] if self.workers else None
        }
