"""The auto-tuner's loop against a scripted router: applying, dry runs, Ctrl-C."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from fairserve.core.errors import ConfigError
from fairserve.tuning.auto import AutoTuner
from fairserve.tuning.controller import Target, TunerConfig
from tests.tuning.plant import jain_at


class ScriptedRouter:
    """A router whose clients' service splits as ``jain_at(Q)`` says: client ``a`` gets
    ``share`` of each second's service, ``b`` the rest, both always backlogged."""

    def __init__(self, quantum: float | None, knee: float = 5000.0) -> None:
        self.q = quantum
        self.knee = knee
        self.clock_s = 0.0
        self.service = {"a": 0.0, "b": 0.0}
        self.puts: list[float] = []
        self.interrupt_at_put: int | None = None

    def sleep(self, seconds: float) -> None:
        assert self.q is not None
        jain = jain_at(self.q, self.knee)
        # Two clients with shares s and 1-s: Jain = 1 / (1 + (2s - 1)²), s >= 1/2.
        share = 0.5 + 0.5 * (1.0 / jain - 1.0) ** 0.5
        self.service["a"] += 1000.0 * seconds * share
        self.service["b"] += 1000.0 * seconds * (1 - share)
        self.clock_s += seconds

    def state(self) -> dict[str, Any]:
        clients = {
            name: {"service": s, "queue_depth": 5, "weight": 1.0}
            for name, s in self.service.items()
        }
        return {"router": {"uptime_s": self.clock_s}, "clients": clients, "workers": []}

    def quantum(self) -> dict[str, Any]:
        return {"quantum": self.q}

    def set_quantum(
        self, quantum: float | None = None, worker_quantum: float | None = None
    ) -> dict[str, Any]:
        assert quantum is not None
        if self.interrupt_at_put is not None and len(self.puts) == self.interrupt_at_put:
            self.interrupt_at_put = None
            raise KeyboardInterrupt
        self.puts.append(quantum)
        self.q = quantum
        return {"quantum": quantum, "worker_errors": []}


def tuner(router: ScriptedRouter, **kw: Any) -> AutoTuner:
    config = TunerConfig(Target(jain=0.9), min_quantum=64, max_quantum=1 << 20)
    return AutoTuner(router, config, window_s=4.0, settle_s=1.0, sleep=router.sleep, **kw)


def test_the_share_model_matches_the_plant() -> None:
    router = ScriptedRouter(40000.0)
    router.sleep(1.0)
    a, b = router.service["a"], router.service["b"]
    assert (a + b) ** 2 / (2 * (a * a + b * b)) == pytest.approx(jain_at(40000.0))


def test_applies_every_move_and_ends_on_a_quantum_meeting_the_target() -> None:
    router = ScriptedRouter(1 << 20)
    seen: list[Any] = []
    result = tuner(router, on_decision=seen.append).run()
    assert seen == result.decisions
    assert router.q == result.final and result.applied
    assert router.puts == [d.next_quantum for d in result.decisions if d.next_quantum != d.quantum]
    assert jain_at(result.final) >= 0.9
    assert result.decisions[0].action == "lower"
    assert result.to_json()["settled"] is True


def test_a_dry_run_changes_nothing() -> None:
    router = ScriptedRouter(1 << 20)
    result = tuner(router, dry_run=True).run()
    assert router.puts == [] and not result.applied
    assert result.final == 1 << 20
    assert all(d.quantum == 1 << 20 for d in result.decisions)
    assert result.decisions[0].next_quantum < 1 << 20  # what it would have done


def test_ctrl_c_puts_the_last_good_quantum_back() -> None:
    router = ScriptedRouter(1000.0)
    router.interrupt_at_put = 2  # 1000 met -> 2000 met -> 4000 met -> Ctrl-C on the 3rd move
    result = tuner(router).run()
    assert result.interrupted
    good = result.decisions[-1].state.good
    assert good is not None and router.q == good == result.final


def test_ctrl_c_before_anything_was_good_restores_the_start() -> None:
    router = ScriptedRouter(1 << 20)
    calls = 0

    def sleep(seconds: float) -> None:
        nonlocal calls
        calls += 1
        if calls == 5:  # inside the second window, after one move down
            raise KeyboardInterrupt
        router.sleep(seconds)

    config = TunerConfig(Target(jain=0.9), min_quantum=64, max_quantum=1 << 20)
    result = AutoTuner(router, config, window_s=1.0, settle_s=0.1, samples=2, sleep=sleep).run()
    assert result.interrupted and router.q == 1 << 20 == result.final


def test_a_policy_without_a_quantum_is_refused() -> None:
    with pytest.raises(ConfigError, match="no quantum to tune"):
        tuner(ScriptedRouter(None)).run()


@pytest.mark.parametrize(
    ("kw", "message"), [({"window_s": 0.0}, "--window"), ({"samples": 0}, "samples")]
)
def test_bad_timing(kw: dict[str, float], message: str) -> None:
    router = ScriptedRouter(100.0)
    config = TunerConfig(Target(jain=0.9))
    args: dict[str, Any] = {"window_s": 1.0, "settle_s": 0.0, **kw}
    make: Callable[[], AutoTuner] = lambda: AutoTuner(router, config, **args)  # noqa: E731
    with pytest.raises(ConfigError, match=message):
        make()
