"""The auto-tuner's loop: measure a window of live traffic, decide, apply, repeat.

Each step lets the last change settle (``settle_s``: requests admitted under the old
quantum drain), then snapshots the router's state ``samples`` + 1 times across
``window_s``; :func:`~fairserve.tuning.observe.observe` turns them into an observation and
:func:`~fairserve.tuning.controller.decide` into the next quantum, which is set through the
admin API (unless ``dry_run``). The loop ends when the controller settles or stops; the
quantum it ends on is in force when :meth:`AutoTuner.run` returns.

Ctrl-C (``KeyboardInterrupt``) during a step puts the last good quantum back (or the one the
tuner started from when none was good yet) before the interrupt goes on, so an abandoned
search never leaves an untested value in place.

Time and the router are injected (``sleep``, ``client``), so tests can drive the loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from fairserve.core.errors import ConfigError
from fairserve.tuning.controller import Decision, TunerConfig, TunerState, decide
from fairserve.tuning.observe import observe


class Router(Protocol):
    """What the loop needs of :class:`~fairserve.api.admin_client.AdminClient` (read-only
    views of its typed documents, ``fairserve.api.router_schema``)."""

    def state(self) -> Mapping[str, Any]: ...

    def quantum(self) -> Mapping[str, Any]: ...

    def set_quantum(
        self, quantum: float | None = None, worker_quantum: float | None = None
    ) -> Mapping[str, Any]: ...


@dataclass
class TuneResult:
    initial: float
    final: float
    decisions: list[Decision] = field(default_factory=list)
    applied: bool = False
    """Whether ``final`` is in force on the router (False in a dry run)."""
    interrupted: bool = False
    worker_errors: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        last = self.decisions[-1] if self.decisions else None
        return {
            "initial_quantum": self.initial,
            "final_quantum": self.final,
            "applied": self.applied,
            "interrupted": self.interrupted,
            "settled": bool(last and last.action == "settle"),
            "steps": len(self.decisions),
            "worker_errors": self.worker_errors,
            "decisions": [d.to_json() for d in self.decisions],
        }


class AutoTuner:
    def __init__(
        self,
        client: Router,
        config: TunerConfig,
        *,
        window_s: float,
        settle_s: float,
        dry_run: bool = False,
        samples: int = 4,
        sleep: Callable[[float], None] = time.sleep,
        on_decision: Callable[[Decision], None] | None = None,
    ) -> None:
        if samples < 1:
            raise ConfigError(f"samples: expected at least 1, got {samples}")
        if not window_s > 0 or settle_s < 0:
            raise ConfigError(
                f"--window must be positive and --settle non-negative, got {window_s}, {settle_s}"
            )
        self.client = client
        self.config = config
        self.window_s = window_s
        self.settle_s = settle_s
        self.dry_run = dry_run
        self.samples = samples
        self.sleep = sleep
        self.on_decision = on_decision

    def current_quantum(self) -> float:
        value = self.client.quantum().get("quantum")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(
                f"the router's policy has no quantum to tune (Q^u is {value!r}); "
                "start it with a policy that has one (dlpm)"
            )
        return float(value)

    def run(self) -> TuneResult:
        initial = self.current_quantum()
        # A dry run measures what is in force; a real one first brings Q into the bounds.
        state = TunerState.start(initial if self.dry_run else self.config.clamp(initial))
        result = TuneResult(initial, initial, applied=not self.dry_run)
        if state.quantum != initial:
            self._apply(state.quantum, result)
        try:
            while not state.done:
                decision = self._step(state)
                result.decisions.append(decision)
                state = decision.state
                if self.on_decision is not None:
                    self.on_decision(decision)
                if self.dry_run:
                    state = TunerState(
                        decision.quantum,
                        initial,
                        lowest=decision.quantum,
                        steps=decision.step,
                        done=decision.state.done,
                    )
                elif decision.next_quantum != decision.quantum:
                    self._apply(decision.next_quantum, result)
        except KeyboardInterrupt:
            result.interrupted = True
            safe = state.good if state.good is not None else initial
            if not self.dry_run and result.final != safe:
                self._apply(safe, result)
            return result
        return result

    def _step(self, state: TunerState) -> Decision:
        self.sleep(self.settle_s)
        snapshots = [self.client.state()]
        for _ in range(self.samples):
            self.sleep(self.window_s / self.samples)
            snapshots.append(self.client.state())
        return decide(state, self.config, observe(snapshots))

    def _apply(self, quantum: float, result: TuneResult) -> None:
        if self.dry_run:
            return
        view = self.client.set_quantum(quantum=quantum)
        result.final = quantum
        result.worker_errors.extend(str(e) for e in view.get("worker_errors") or [])
