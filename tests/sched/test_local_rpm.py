"""The requests-per-minute baseline: rejects over the cap with a useful Retry-After."""

from __future__ import annotations

import pytest

from fairserve.core.errors import ConfigError, RequestRejected
from fairserve.core.types import Request
from fairserve.sched.local.rpm import RPM
from fairserve.sched.registry import make_local_policy
from tests.fakes.engine import StepEngine
from tests.fakes.factories import unique_request


def fits_all(req: Request) -> bool:
    return True


def test_rejects_over_the_limit_with_retry_after_until_the_oldest_expires() -> None:
    policy = RPM(limit_per_min=3)
    for i, t in enumerate((0.0, 10.0, 20.0)):
        policy.on_arrival(unique_request(f"a{i}", "a", 5, 1), t)
    with pytest.raises(RequestRejected) as err:
        policy.on_arrival(unique_request("a3", "a", 5, 1), 30.0)
    assert err.value.client == "a"
    assert err.value.retry_after_s == pytest.approx(30.0)  # the 0 s request expires at 60 s
    assert "3 requests per minute" in str(err.value)
    assert policy.waiting["a"] == 3  # the rejected one is not waiting
    # other clients have their own window
    policy.on_arrival(unique_request("b0", "b", 5, 1), 30.0)
    # once the oldest left the window, one more is accepted, and the next refused again
    policy.on_arrival(unique_request("a4", "a", 5, 1), 60.0)
    with pytest.raises(RequestRejected) as again:
        policy.on_arrival(unique_request("a5", "a", 5, 1), 61.0)
    assert again.value.retry_after_s == pytest.approx(9.0)
    snap = policy.snapshot()["clients"]["a"]
    assert snap["rejected"] == 2 and snap["waiting"] == 4


def test_a_refused_client_still_shows_in_the_snapshot() -> None:
    policy = RPM(limit_per_min=1)
    policy.on_arrival(unique_request("a0", "a", 5, 1), 0.0)
    policy.on_arrival(unique_request("b0", "b", 5, 1), 0.0)
    with pytest.raises(RequestRejected):
        policy.on_arrival(unique_request("a1", "a", 5, 1), 1.0)
    assert policy.snapshot()["clients"]["a"]["rejected"] == 1


def test_accepted_requests_are_served_first_come_first_served() -> None:
    policy = RPM(limit_per_min=100)
    reqs = [unique_request(f"r{i}", f"c{i % 2}", 5, 1, arrival_s=float(10 - i)) for i in range(6)]
    for req in reqs:
        policy.on_arrival(req, 0.0)
    assert policy.select(reqs, fits_all, lambda r: 0, 0.0) == sorted(
        reqs, key=lambda r: r.arrival_s
    )


def test_engine_counts_rejections_and_the_rest_finishes() -> None:
    engine = StepEngine(make_local_policy("rpm", limit_per_min=5))
    engine.run({0: [unique_request(f"a{i}", "a", 5, 2) for i in range(8)]}, 1000)
    assert len(engine.rejected) == 3 and len(engine.finished) == 5
    assert all(exc.retry_after_s == pytest.approx(60.0) for _, exc in engine.rejected)


@pytest.mark.parametrize("bad", [0, -1, 2.5, "many", True])
def test_bad_limits_are_refused(bad: object) -> None:
    with pytest.raises(ConfigError, match="limit_per_min"):
        make_local_policy("rpm", limit_per_min=bad)
