"""Justitia: virtual time, virtual-finish order of applications, predictors."""

from __future__ import annotations

import json
from typing import Any

import pytest

from fairserve.core.cost import kv_token_time
from fairserve.core.errors import ConfigError
from fairserve.core.types import Request
from fairserve.sched.local.justitia import Justitia
from fairserve.sched.local.predictor import MovingAveragePredictor, OraclePredictor
from fairserve.sched.registry import make_local_policy
from tests.fakes.engine import StepEngine, by_step
from tests.fakes.factories import unique_request


def app_request(rid: str, app: str, output: int, **extra: object) -> Request:
    return unique_request(rid, f"client-{app}", 50, output, app=app, **extra)


def test_virtual_time_advances_at_capacity_over_active_applications() -> None:
    policy = Justitia(kv_capacity_tokens=100, clock="seconds", steps_per_s=1.0)
    policy.on_arrival(app_request("a", "A", 1, meta={"app_cost": 1000.0}), 0.0)
    policy.on_arrival(app_request("b", "B", 1, meta={"app_cost": 100.0}), 2.0)
    assert policy.vtime == pytest.approx(200.0)  # one active application: rate M
    finish = {a["app"]: a["virtual_finish"] for a in policy.snapshot()["apps"]}
    assert finish == {"A": 1000.0, "B": 300.0}
    assert policy.advance(4.0) == pytest.approx(300.0)  # two active: rate M/2; B retires
    assert policy.snapshot()["gps_active"] == 1
    assert policy.advance(5.0) == pytest.approx(400.0)  # A alone again: rate M
    # A retires at 11 s; with nobody active V keeps moving at M (N_t taken as 1)
    assert policy.advance(20.0) == pytest.approx(1000.0 + 100.0 * 9)


def run_apps(policy_name: str, **params: Any) -> dict[str, float]:
    """A large application at step 0 and a small one at step 3; when does each finish?"""
    large = [
        (0, app_request(f"L{i}", "large", 20, meta={"app_cost": 10 * kv_token_time(50, 20)}))
        for i in range(10)
    ]
    small = [
        (3, app_request(f"S{i}", "small", 20, meta={"app_cost": 2 * kv_token_time(50, 20)}))
        for i in range(2)
    ]
    policy = make_local_policy(policy_name, **params)
    engine = StepEngine(policy, capacity_tokens=150)  # two requests at a time
    engine.run(by_step(large + small), 10_000)
    assert len(engine.finished) == 12
    done: dict[str, float] = {}
    for req in engine.finished:
        assert req.app is not None and req.finish_s is not None
        done[req.app] = max(done.get(req.app, 0.0), req.finish_s)
    return done


def test_a_small_application_arriving_later_finishes_first() -> None:
    justitia, fcfs = run_apps("justitia", kv_capacity_tokens=150), run_apps("fcfs")
    assert justitia["small"] < justitia["large"]
    assert fcfs["small"] > fcfs["large"]  # the order Justitia fixes


def test_requests_in_ascending_virtual_finish_then_arrival() -> None:
    policy = Justitia(kv_capacity_tokens=10)
    late_small = app_request("s", "S", 1, meta={"app_cost": 5.0}, arrival_s=9.0)
    early_big = app_request("b", "B", 1, meta={"app_cost": 1e6}, arrival_s=0.0)
    own = unique_request("own", "c", 1, 1, arrival_s=1.0)  # its own application
    policy.on_arrival(early_big, 0.0)
    policy.on_arrival(own, 1.0)
    policy.on_arrival(late_small, 9.0)
    order = policy.select([early_big, own, late_small], lambda r: True, lambda r: 0, 9.0)
    assert order == [own, late_small, early_big]


def test_oracle_uses_the_host_given_cost_else_the_request_itself() -> None:
    oracle = OraclePredictor()
    assert oracle.predict(app_request("a", "A", 7, meta={"app_cost": 123.0})) == 123.0
    assert oracle.predict(app_request("b", "B", 7)) == kv_token_time(50, 7)
    with pytest.raises(ConfigError, match="app_cost"):
        oracle.predict(app_request("c", "C", 7, meta={"app_cost": -1}))


def test_moving_average_learns_per_type_from_finished_applications() -> None:
    policy = Justitia(predictor="moving-average", prior_cost=1e6, predictor_window=4)
    predictor = policy.predictor
    assert isinstance(predictor, MovingAveragePredictor)
    arrivals = []
    for n in range(8):  # applications of two calls each, one after the other
        for i in range(2):
            req = app_request(f"q{n}-{i}", f"qa{n}", 10, app_type="qa")
            arrivals.append((n * 30, req))
    arrivals.append((0, app_request("other", "o", 3, app_type="judge")))
    engine = StepEngine(policy, capacity_tokens=10_000)
    engine.run(by_step(arrivals), 1000)
    assert len(engine.finished) == len(arrivals)
    true_cost = 2 * kv_token_time(50, 10)
    assert predictor.estimate("qa") == pytest.approx(true_cost)
    assert predictor.estimate("judge") == pytest.approx(kv_token_time(50, 3))
    assert predictor.estimate("unseen") == 1e6
    json.dumps(policy.snapshot())


def test_moving_average_is_the_mean_of_the_last_window() -> None:
    predictor = MovingAveragePredictor(prior_cost=50.0, window=3)
    estimates = []
    for cost in (10.0, 20.0, 30.0, 40.0, 40.0, 40.0):
        predictor.observe("t", cost)
        estimates.append(predictor.estimate("t"))
    assert estimates == pytest.approx([10.0, 15.0, 20.0, 30.0, 110 / 3, 40.0])


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"predictor": "mlp"}, "predictor"),
        ({"predictor": 1.0}, "predictor"),
        ({"kv_capacity_tokens": 0}, "kv_capacity_tokens"),
        ({"predictor_window": 0}, "predictor_window"),
        ({"prior_cost": -1.0}, "prior_cost"),
        ({"steps_per_s": 0.0}, "steps_per_s"),
    ],
)
def test_bad_parameters_are_refused(params: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        make_local_policy("justitia", **params)


def test_snapshot_lists_applications_and_virtual_time() -> None:
    policy = Justitia()
    policy.on_arrival(app_request("a", "A", 4), 0.0)
    snap = json.loads(json.dumps(policy.snapshot()))
    assert snap["cost"] == "kv-token-time"
    assert snap["apps"][0]["app"] == "A" and snap["apps"][0]["outstanding"] == 1
    assert snap["predictor"]["predictor"] == "oracle"
    assert snap["clients"]["client-A"]["apps"] == 1


def test_an_application_keeps_its_finish_between_its_calls() -> None:
    """A program's second call, arriving after its first finished, is the same application
    (same F_j), not a new one opened at a later V."""
    policy = Justitia(kv_capacity_tokens=100, clock="seconds", steps_per_s=1.0)
    first = app_request("a1", "A", 1, meta={"app_cost": 500.0})
    policy.on_arrival(first, 0.0)
    policy.select([first], lambda r: True, lambda r: 0, 0.0)
    policy.on_finish(first, 1.0)
    second = app_request("a2", "A", 1, meta={"app_cost": 500.0})
    policy.on_arrival(second, 3.0)
    snap = policy.snapshot()
    assert snap["apps_opened"] == 1
    assert snap["apps"][0]["virtual_finish"] == pytest.approx(500.0)
    assert snap["apps"][0]["outstanding"] == 1


def test_an_application_ends_when_the_host_says_or_after_idling() -> None:
    policy = Justitia(kv_capacity_tokens=100, app_idle_s=10.0)
    for rid, app in (("a", "A"), ("b", "B")):
        req = app_request(rid, app, 1, app_type="t")
        policy.on_arrival(req, 0.0)
        policy.select([req], lambda r: True, lambda r: 0, 0.0)
        req.output_tokens = 1
        policy.on_finish(req, 1.0)
    assert policy.snapshot()["apps_total"] == 2  # waiting for their next calls
    policy.end_app("A", 2.0)
    assert [a["app"] for a in policy.snapshot()["apps"]] == ["B"]
    policy.on_arrival(app_request("c", "C", 1), 11.5)  # B idle for 10.5 s: ended
    assert [a["app"] for a in policy.snapshot()["apps"]] == ["C"]
    assert policy.snapshot()["prediction"]["apps"] == 2


def test_end_app_with_calls_outstanding_waits_for_them() -> None:
    policy = Justitia(kv_capacity_tokens=100)
    req = app_request("a", "A", 1)
    policy.on_arrival(req, 0.0)
    policy.end_app("A", 0.5)
    assert policy.snapshot()["apps_total"] == 1
    policy.select([req], lambda r: True, lambda r: 0, 0.5)
    policy.on_finish(req, 1.0)
    assert policy.snapshot()["apps_total"] == 0


def test_steps_clock_counts_the_engine_iterations() -> None:
    """V gains M/N_t per decode iteration the host reports, whatever the seconds."""
    policy = Justitia(kv_capacity_tokens=100)
    req = app_request("a", "A", 5, meta={"app_cost": 10_000.0})
    policy.on_arrival(req, 0.0)
    policy.select([req], lambda r: True, lambda r: 0, 0.0)
    policy.on_arrival(app_request("b", "B", 5, meta={"app_cost": 10_000.0}), 50.0)
    assert policy.vtime == 0.0  # no iteration yet, however many seconds
    req.output_tokens = 3
    policy.on_decode_steps([req], 3, 50.1)
    assert policy.iterations == 3
    assert policy.vtime == pytest.approx(3 * 100 / 2)  # two applications active in GPS


def test_admission_waits_for_the_first_call_that_does_not_fit() -> None:
    policy = Justitia(kv_capacity_tokens=100)
    big = app_request("big", "A", 1, meta={"app_cost": 10.0})
    small = app_request("small", "B", 1, meta={"app_cost": 20.0})
    for req in (big, small):
        policy.on_arrival(req, 0.0)
    assert policy.select([big, small], lambda r: r is small, lambda r: 0, 0.0) == []
    skipping = Justitia(kv_capacity_tokens=100, memory_patience=3)
    for req in (big, small):
        skipping.on_arrival(req, 0.0)
    assert skipping.select([big, small], lambda r: r is small, lambda r: 0, 0.0) == [small]


def test_delay_against_gps_is_measured() -> None:
    """Two equal applications at once: GPS finishes both at 2C/M; served one after the
    other, the first ends early and the second at about the same time: small delays."""
    done = run_apps("justitia", kv_capacity_tokens=150)
    assert done["small"] < done["large"]
    policy = Justitia(kv_capacity_tokens=150)
    engine = StepEngine(policy, capacity_tokens=150)
    cost = 2 * kv_token_time(50, 20)
    arrivals = [
        (0, app_request(f"{app}{i}", app, 20, meta={"app_cost": cost}))
        for app in ("X", "Y")
        for i in range(2)
    ]
    engine.run(by_step(arrivals), 10_000)
    for app in ("X", "Y"):
        policy.end_app(app, float(engine.now))
    delay = policy.snapshot()["delay"]
    assert delay["apps"] == 2
    assert delay["max_app_cost"] == pytest.approx(cost)
    assert delay["max_delay_iterations"] <= delay["bound_iterations"]
