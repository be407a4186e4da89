"""The auto-tuner's decisions (pure): searches, bounds, step limits, bad inputs."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fairserve.core.errors import ConfigError
from fairserve.tuning.controller import Decision, Target, TunerConfig, TunerState, decide
from tests.tuning.plant import jain_at, largest_meeting, observation


def search(config: TunerConfig, start: float, knee: float = 5000.0) -> list[Decision]:
    """Run the controller against the synthetic plant until it is done."""
    state = TunerState.start(start)
    decisions = []
    while not state.done:
        decision = decide(state, config, observation(jain_at(state.quantum, knee)))
        decisions.append(decision)
        state = decision.state
        assert len(decisions) <= config.max_steps, "the step limit did not stop the search"
    return decisions


def test_raises_while_the_target_holds_then_settles_below_the_break() -> None:
    config = TunerConfig(Target(jain=0.9), min_quantum=64, max_quantum=1 << 20)
    decisions = search(config, start=256)
    final = decisions[-1]
    best = largest_meeting(0.9)
    assert final.action == "settle"
    assert jain_at(final.next_quantum) >= 0.9
    assert best / config.resolution <= final.next_quantum <= best
    raises = [d for d in decisions if d.action == "raise"]
    assert raises and all(d.next_quantum <= d.quantum * config.step_factor for d in raises)
    assert len(decisions) <= 12


def test_lowers_from_an_unfair_start_and_reports_why() -> None:
    config = TunerConfig(Target(jain=0.9), min_quantum=64, max_quantum=1 << 20)
    decisions = search(config, start=1 << 20)
    assert decisions[0].action == "lower" and decisions[0].met is False
    assert decisions[0].next_quantum == (1 << 20) / config.step_factor
    assert jain_at(decisions[-1].next_quantum) >= 0.9
    assert decisions[-1].state.bad is not None


def test_met_at_the_upper_bound_settles_there() -> None:
    config = TunerConfig(Target(jain=0.5), min_quantum=64, max_quantum=4096)
    decisions = search(config, start=1024)
    assert [d.action for d in decisions] == ["raise", "raise", "settle"]
    assert decisions[-1].next_quantum == 4096


def test_broken_at_the_lower_bound_stops_on_the_fairest_tried() -> None:
    config = TunerConfig(Target(jain=0.95), min_quantum=64, max_quantum=1 << 16)
    decisions = search(config, start=1 << 14, knee=1.0)  # unfair everywhere
    assert decisions[-1].action == "stop"
    assert "lower bound" in decisions[-1].reason
    assert decisions[-1].next_quantum == 64
    assert all(d.met is False for d in decisions)


def test_the_step_limit_falls_back_to_the_last_good_quantum() -> None:
    config = TunerConfig(Target(jain=0.9), min_quantum=64, max_quantum=1 << 30, max_steps=3)
    decisions = search(config, start=128)
    assert len(decisions) == 3
    assert decisions[-1].action == "stop" and "step limit" in decisions[-1].reason
    assert decisions[-1].next_quantum == decisions[-1].state.good == 512


def test_windows_without_contention_hold_the_quantum() -> None:
    config = TunerConfig(Target(jain=0.9), max_steps=4)
    state = TunerState.start(1000)
    decision = decide(state, config, observation(None))
    assert (decision.action, decision.next_quantum, decision.met) == ("hold", 1000, None)


def test_a_stale_bracket_end_is_dropped() -> None:
    """The load changed: a quantum that broke the target before now meets it."""
    config = TunerConfig(Target(jain=0.9))
    state = TunerState(quantum=4000, initial=1000, lowest=1000, good=1000, bad=2000)
    decision = decide(state, config, observation(0.99))
    assert decision.state.bad is None and decision.state.good == 4000
    assert decision.action == "raise" and decision.next_quantum == 8000


def test_the_gap_target() -> None:
    target = Target(max_gap=500.0)
    assert target.met(observation(1.0, gap=400.0)) is True
    assert target.met(observation(1.0, gap=600.0)) is False
    both = Target(jain=0.9, max_gap=500.0)
    assert both.met(observation(0.8, gap=100.0)) is False
    assert both.describe() == "Jain ≥ 0.9 and gap ≤ 500"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "a target is required"),
        ({"jain": 1.5}, "--target-jain"),
        ({"jain": 0.0}, "--target-jain"),
        ({"max_gap": -1.0}, "--max-gap"),
        ({"max_gap": math.inf}, "--max-gap"),
    ],
)
def test_bad_targets(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Target(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"min_quantum": 0.0}, "positive finite"),
        ({"max_quantum": math.inf}, "positive finite"),
        ({"min_quantum": 100.0, "max_quantum": 10.0}, "above --max-quantum"),
        ({"step_factor": 1.0}, "--max-step"),
        ({"max_steps": 0}, "--max-steps"),
    ],
)
def test_bad_configs(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        TunerConfig(Target(jain=0.9), **kwargs)  # type: ignore[arg-type]


def test_a_settled_tuner_refuses_more_windows() -> None:
    config = TunerConfig(Target(jain=0.5), min_quantum=64, max_quantum=64)
    decision = decide(TunerState.start(64), config, observation(1.0))
    assert decision.state.done
    with pytest.raises(ConfigError, match="already settled"):
        decide(decision.state, config, observation(1.0))


@given(
    start=st.floats(min_value=64, max_value=1 << 20),
    knee=st.floats(min_value=100, max_value=1 << 18),
    target=st.floats(min_value=0.55, max_value=0.99),
)
def test_every_search_ends_within_its_bounds(start: float, knee: float, target: float) -> None:
    config = TunerConfig(Target(jain=target), min_quantum=64, max_quantum=1 << 20)
    decisions = search(config, start, knee)
    final = decisions[-1].next_quantum
    assert 64 <= final <= 1 << 20 or final == start
    if any(d.met for d in decisions):
        assert jain_at(final, knee) >= target, "stopped on a quantum never seen meeting it"
