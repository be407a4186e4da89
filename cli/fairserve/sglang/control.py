"""Live policy changes (quantum, client weights) that reach every tensor-parallel rank in
the same iteration.

With ``--tp N`` SGLang runs one scheduler per GPU, each with its own copy of the policy, and
they must make identical decisions or their collective operations hang. So a
``PUT /fairserve/worker/quantum`` or ``/weights`` (answered by the leader rank) is not
applied where it arrives: it becomes a :class:`PolicyChange` message that rides SGLang's own
broadcast of the leader's per-iteration aborts to every rank, and each rank applies it before
it processes that iteration's requests. With one rank it is the same path, only without the
broadcast.

A message stays pending on the leader until the leader itself applied it: SGLang may skip
receiving in an iteration (and drop that iteration's aborts with it), so it is sent again
next time. Tickets increase, and a rank applies a ticket only once and never an older one
after a newer, so a message sent twice (or held back across a pause) changes nothing.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass

from fairserve.sched.local.base import LocalPolicy


@dataclass(frozen=True, slots=True)
class PolicyChange:
    """Set the local policy's ``Q^u`` (``quantum``) or one client's weight (``weight``:
    client and weight); picklable: it crosses process boundaries."""

    quantum: float | None
    ticket: int
    weight: tuple[str, float] | None = None

    def apply(self, policy: LocalPolicy) -> None:
        if self.quantum is not None:
            policy.set_quantum(self.quantum)
        if self.weight is not None:
            policy.set_weight(*self.weight)


class ControlChannel:
    """Messages waiting for the leader's next iteration, and waiters for their application."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: list[PolicyChange] = []
        self._waiters: dict[int, threading.Event] = {}
        self._tickets = itertools.count(1)

    def submit(self, quantum: float) -> tuple[PolicyChange, threading.Event]:
        """Queue a quantum change (any thread); the event is set once this process applied
        it."""
        return self._queue(float(quantum), None)

    def submit_weight(self, client: str, weight: float) -> tuple[PolicyChange, threading.Event]:
        """Queue one client's weight change, like :meth:`submit`."""
        return self._queue(None, (client, float(weight)))

    def _queue(
        self, quantum: float | None, weight: tuple[str, float] | None
    ) -> tuple[PolicyChange, threading.Event]:
        with self._lock:
            message = PolicyChange(quantum, next(self._tickets), weight)
            self._pending.append(message)
            event = threading.Event()
            self._waiters[message.ticket] = event
            return message, event

    def pending(self) -> list[PolicyChange]:
        """Messages not applied here yet, to send with this iteration (leader thread)."""
        with self._lock:
            return list(self._pending)

    def applied(self, message: PolicyChange) -> None:
        """A message was applied here: no longer pending; wakes its waiter (leader only)."""
        with self._lock:
            self._pending = [m for m in self._pending if m.ticket > message.ticket]
            event = self._waiters.pop(message.ticket, None)
        if event is not None:
            event.set()

    def forget(self, message: PolicyChange) -> None:
        """A waiter gave up (timeout): its message still applies, nobody waits for it."""
        with self._lock:
            self._waiters.pop(message.ticket, None)
