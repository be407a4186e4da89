"""The router's fairness settings, owned once: client weights, Q^w and Q^u.

Before, ``Router.set_weight`` updated ``weights``, ``live_weights``, the accounting, the
client stats, the dispatcher and every fair queue by hand, and the state recomputed which
Q^u wins from four places on every read. Now :class:`FairnessSettings` holds the values
and a version, and whoever applies them (the dispatcher, the accounting, the router-side
queues, the settings file, the workers) is a listener told of each change, in order; the
state, the pushes to workers and persistence read the values here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from fairserve.core.types import validate_weight
from fairserve.router.persist import LiveSettings
from fairserve.sched.local.base import local_policy_class
from fairserve.sched.registry import load_all

WeightListener = Callable[[str, float], None]
QuantumListener = Callable[[float], None]


class FairnessSettings:
    """Weights, Q^w and Q^u of one router; ``version`` counts the changes."""

    def __init__(
        self,
        weights: Mapping[str, float],
        quantum: float | None,
        worker_quantum: float | None,
        queue_quantum: float | None,
        default_quantum: float | None,
    ) -> None:
        self.version = 0
        self.weights: dict[str, float] = dict(weights)
        """Every weight in force: the clients file's, then live changes."""
        self.live_weights: dict[str, float] = {}
        """Weights changed through the admin API: pushed again to workers that come up,
        and saved."""
        self.quantum = quantum
        """Q^u set on the command line or through the admin API (None: never set)."""
        self.worker_quantum = worker_quantum
        """Q^w of the dispatcher (None: it has none)."""
        self.queue_quantum = queue_quantum
        """Q^u the router-side queues' policy is built with (None: it has none)."""
        self.default_quantum = default_quantum
        """The policy's declared default Q^u (None: it has no quantum)."""
        self.worker_quanta: dict[str, float | None] = {}
        """Q^u each worker with the extension reports (read when it comes up, and after
        every change): what ``GET /fairserve/v1/quantum`` shows before anyone set one."""
        self._weight_listeners: list[WeightListener] = []
        self._quantum_listeners: list[QuantumListener] = []
        self._worker_quantum_listeners: list[QuantumListener] = []

    # ------------------------------------------------------------------ listeners
    def on_weight(self, listener: WeightListener) -> None:
        self._weight_listeners.append(listener)

    def on_quantum(self, listener: QuantumListener) -> None:
        self._quantum_listeners.append(listener)

    def on_worker_quantum(self, listener: QuantumListener) -> None:
        self._worker_quantum_listeners.append(listener)

    # ------------------------------------------------------------------ reads
    def weight(self, client: str) -> float:
        return self.weights.get(client, 1.0)

    def effective_quantum(
        self, routed: Callable[[str], bool], queues: bool
    ) -> tuple[float | None, str | None]:
        """The Q^u in force and where it comes from: the one set, else what a routed worker
        reports (``routed(url)``), else the router queues' (``queues``: any exists), else
        the policy's default (source None: a policy without a quantum)."""
        if self.quantum is not None:
            return self.quantum, "set"
        for url, quantum in self.worker_quanta.items():
            if quantum is not None and routed(url):
                return quantum, "workers"
        if queues and self.queue_quantum is not None:
            return self.queue_quantum, "router-queue"
        return self.default_quantum, None if self.default_quantum is None else "default"

    def live(self) -> LiveSettings:
        """What persistence saves."""
        return LiveSettings(
            weights=dict(self.live_weights),
            quantum=self.quantum,
            worker_quantum=self.worker_quantum,
        )

    def view(self) -> dict[str, Any]:
        return {"version": self.version, "live_weights": dict(sorted(self.live_weights.items()))}

    # ------------------------------------------------------------------ writes
    def set_weight(self, client: str, weight: float) -> float:
        """Set ``client``'s weight everywhere it applies; returns the previous one."""
        validate_weight(client, weight)
        previous = self.weight(client)
        self.weights[client] = self.live_weights[client] = weight
        self.version += 1
        for listener in self._weight_listeners:
            listener(client, weight)
        return previous

    def set_quantum(self, quantum: float) -> None:
        """Q^u (listeners validate first: a refusal raises before anything changed)."""
        for listener in self._quantum_listeners:
            listener(quantum)
        self.quantum = quantum
        self.version += 1

    def set_worker_quantum(self, quantum: float) -> None:
        """Q^w (the dispatcher, a listener, may refuse it)."""
        for listener in self._worker_quantum_listeners:
            listener(quantum)
        self.worker_quantum = quantum
        self.version += 1

    def reported(self, url: str, quantum: float | None) -> None:
        """A worker's own Q^u, as it reported it (None: its policy has none)."""
        self.worker_quanta[url] = quantum

    def forget(self, url: str) -> None:
        """A worker's Q^u is not known (it restarted, or refused a change)."""
        self.worker_quanta.pop(url, None)


def default_quantum(policy: str) -> float | None:
    """The declared default ``Q^u`` of ``policy`` (None: it has no quantum)."""
    load_all()
    for param in local_policy_class(policy).params:
        if param.name == "quantum":
            return float(param.default)
    return None
