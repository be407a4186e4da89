"""Windows of live traffic from state snapshots, and the bounds a quantum implies."""

from __future__ import annotations

import math
from typing import Any

import pytest

from fairserve.tuning.bounds import (
    ASSUMED_REQUEST_COST,
    RequestCost,
    gap_bounds,
    quantum_report,
    request_cost,
    state_capacities,
)
from fairserve.tuning.observe import observe


def snapshot(
    uptime_s: float, clients: dict[str, tuple[float, int, float]], cached: int = 0
) -> dict[str, Any]:
    """Clients as name → (service, queue depth, weight); one worker with ``cached`` of every
    1000 prompt tokens."""
    return {
        "router": {"uptime_s": uptime_s},
        "clients": {
            name: {
                "service": service,
                "queue_depth": depth,
                "weight": weight,
                "prompt_tokens": int(service),
                "output_tokens": 0,
            }
            for name, (service, depth, weight) in clients.items()
        },
        "workers": [{"url": "w", "prompt_tokens": 1000 * int(uptime_s), "cached_tokens": cached}],
    }


def test_jain_and_gap_over_the_window_with_weights() -> None:
    before = snapshot(10.0, {"a": (100.0, 3, 1.0), "b": (50.0, 2, 2.0), "idle": (7.0, 0, 1.0)})
    middle = snapshot(12.0, {"a": (200.0, 1, 1.0), "b": (150.0, 4, 2.0), "idle": (7.0, 0, 1.0)})
    after = snapshot(15.0, {"a": (400.0, 5, 1.0), "b": (650.0, 1, 2.0), "idle": (9.0, 0, 1.0)})
    obs = observe([before, middle, after])
    # a got 300, b 600 at weight 2 (300 per unit of weight): perfectly fair.
    assert obs.backlogged == ("a", "b")
    assert obs.jain_index == pytest.approx(1.0)
    assert obs.service_gap == pytest.approx(0.0)
    assert obs.window_s == pytest.approx(5.0)
    assert obs.service_per_s == pytest.approx((300 + 600 + 2) / 5.0)


def test_a_starved_client_counts_and_an_intermittent_one_does_not() -> None:
    before = snapshot(0.0, {"hog": (0.0, 9, 1.0), "starved": (0.0, 3, 1.0), "light": (0.0, 1, 1.0)})
    middle = snapshot(
        1.0, {"hog": (500.0, 9, 1.0), "starved": (0.0, 3, 1.0), "light": (10.0, 0, 1.0)}
    )
    after = snapshot(
        2.0, {"hog": (900.0, 9, 1.0), "starved": (0.0, 3, 1.0), "light": (20.0, 1, 1.0)}
    )
    obs = observe([before, middle, after])
    assert obs.backlogged == ("hog", "starved")
    assert obs.jain_index == pytest.approx(0.5)
    assert obs.service_gap == pytest.approx(900.0)


def test_no_contention_and_cache_hits() -> None:
    before = snapshot(1.0, {"only": (0.0, 2, 1.0)}, cached=100)
    after = snapshot(3.0, {"only": (10.0, 2, 1.0)}, cached=1600)
    obs = observe([before, after])
    assert obs.jain_index is None and not obs.contended
    assert obs.cache_hit_rate == pytest.approx(1500 / 2000)
    with pytest.raises(ValueError, match="at least 2"):
        observe([before])


def test_bounds_in_tokens_and_seconds() -> None:
    cost = RequestCost(1000.0, "given")
    bounds = gap_bounds(512.0, cost, [("w0", 10_000.0), ("w1", 5_000.0)])
    assert bounds.per_worker_tokens == 2 * (1000 + 512)
    assert bounds.across_tokens == 2 * 2 * (1000 + 512)
    assert bounds.per_worker_s == pytest.approx(3024 / 5_000)  # the slowest worker
    assert bounds.across_s == pytest.approx(6048 / 15_000)
    assert [w.gap_s for w in bounds.workers] == pytest.approx([0.3024, 0.6048])


def test_unknown_capacity_is_not_applicable() -> None:
    bounds = gap_bounds(100.0, RequestCost(10.0, "given"), [("w0", 1000.0), ("w1", None)])
    assert bounds.per_worker_s is None and bounds.across_s is None
    assert bounds.workers[1].gap_s is None and bounds.workers[0].gap_s == pytest.approx(0.22)
    with pytest.raises(ValueError):
        gap_bounds(math.inf, RequestCost(10.0, "given"), [])


def test_request_cost_sources_and_the_report() -> None:
    assert request_cost({}, 50.0).source == "given"
    assert request_cost({"max_request_cost": 1234.0}).value == 1234.0
    assumed = request_cost({"max_request_cost": 0.0})
    assert (assumed.value, assumed.source) == (ASSUMED_REQUEST_COST, "assumed")
    state = {
        "max_request_cost": 100.0,
        "workers": [
            {"url": "up", "healthy": True, "capacity_tokens_per_s": 400.0},
            {"url": "down", "healthy": False, "capacity_tokens_per_s": 1.0},
        ],
    }
    assert state_capacities(state) == [("up", 400.0)]
    view = {"policy": "dlpm", "dispatch": "doubleq", "quantum": 300.0, "worker_quantum": "inf"}
    report = quantum_report("http://r", view, state)
    assert report["bounds"]["per_worker"] == {"tokens": 800.0, "seconds": 2.0}
    assert quantum_report("http://r", {**view, "quantum": None}, state)["bounds"] is None


def _printed(report: dict[str, object]) -> str:
    import io

    from rich.console import Console

    from fairserve.tuning.render import quantum_view

    stream = io.StringIO()
    console = Console(file=stream, width=300)
    for renderable in quantum_view(report):
        console.print(renderable)
    return stream.getvalue()


EQUAL_STATE: dict[str, list[dict[str, Any]]] = {
    "workers": [
        {"url": "w0", "healthy": True, "capacity_tokens_per_s": 400.0},
        {"url": "w1", "healthy": True, "capacity_tokens_per_s": 400.0},
    ],
}


def test_an_infinite_worker_quantum_makes_the_across_bound_unbounded() -> None:
    # Theorem A.5: with Q^w = inf the gap across workers has no bound; a finite figure lied.
    view = {"policy": "dlpm", "dispatch": "doubleq", "quantum": 300.0, "worker_quantum": "inf"}
    report = quantum_report("http://r", view, EQUAL_STATE, max_request_cost=100.0)
    across = report["bounds"]["across_workers"]
    assert across["unbounded"] is True and across["tokens"] is None and across["seconds"] is None
    text = _printed(report)
    (line,) = [line for line in text.splitlines() if "gap bound across workers" in line]
    assert "unbounded: Q^w = inf" in line and "Theorem A.5" in line
    finite = quantum_report("http://r", {**view, "worker_quantum": 4096.0}, EQUAL_STATE, 100.0)
    assert finite["bounds"]["across_workers"]["tokens"] == 2 * 2 * (100 + 300)


def test_equal_seconds_say_why_units_are_service_units_and_assumed_once() -> None:
    view = {"policy": "dlpm", "dispatch": "doubleq", "quantum": 300.0, "worker_quantum": 4096}
    report = quantum_report("http://r", view, EQUAL_STATE)
    bounds = report["bounds"]
    assert bounds["per_worker"]["seconds"] == bounds["across_workers"]["seconds"]
    assert "equal capacity" in bounds["seconds_equal_why"]
    text = _printed(report)
    assert "equal because the workers have equal capacity" in text
    assert "service units" in text and " tokens =" not in text
    assert "assumed: 4096 prompt" in text and "assumed: assumed:" not in text
    slow = {"url": "w1", "healthy": True, "capacity_tokens_per_s": 100.0}
    unequal = {"workers": [EQUAL_STATE["workers"][0], slow]}
    assert quantum_report("http://r", view, unequal)["bounds"]["seconds_equal_why"] is None
