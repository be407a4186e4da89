"""Sweep plans sized from a worker's limits."""

from __future__ import annotations

import pytest

from fairserve.core.errors import ConfigError
from fairserve.profiling.plan import WorkerLimits, make_plan


def _info(**changes: object) -> dict[str, object]:
    info: dict[str, object] = {
        "max_total_num_tokens": 100_000,
        "chunked_prefill_size": 4096,
        "max_running_requests": 512,
        "fairserve": {"speed": 20.0},
    }
    info.update(changes)
    return info


def test_limits_come_from_server_info() -> None:
    limits = WorkerLimits.from_server_info(_info())
    assert limits == WorkerLimits(4096, 100_000, 512, 20.0)


def test_a_plain_sglang_worker_runs_at_speed_one() -> None:
    info = _info(fairserve=None, chunked_prefill_size=None, max_prefill_tokens=2048)
    limits = WorkerLimits.from_server_info(info)
    assert (limits.speed, limits.max_batch_tokens) == (1.0, 2048)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"chunked_prefill_size": 0}, "chunked_prefill_size"),
        ({"max_total_num_tokens": None}, "max_total_num_tokens"),
        ({"fairserve": {"speed": -1}}, "fairserve.speed"),
    ],
)
def test_bad_server_info_names_the_field(changes: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        WorkerLimits.from_server_info(_info(**changes))


@pytest.mark.parametrize("quick", [True, False])
def test_points_stay_within_the_worker_limits(quick: bool) -> None:
    limits = WorkerLimits(max_batch_tokens=1024, kv_capacity_tokens=20_000, max_running_requests=64)
    plan = make_plan(limits, quick, client_timing=False)

    assert max(plan.prefill_tokens) == 1024
    assert min(plan.prefill_tokens) >= 1
    assert list(plan.prefill_tokens) == sorted(set(plan.prefill_tokens))
    for point in plan.decode:
        assert point.running <= 64
        assert point.running * point.prompt_tokens <= 0.45 * 20_000
        assert all(point.running + t <= 1024 for t in point.mixed_prefill_tokens)
    assert plan.units == len(plan.warmup_tokens) + len(plan.prefill_tokens) * plan.repetitions + (
        len(plan.decode) * plan.decode_repetitions
    )


def test_quick_is_smaller_and_client_windows_are_longer() -> None:
    limits = WorkerLimits(8192, 200_000, 1024)
    quick, full = make_plan(limits, True, False), make_plan(limits, False, False)
    assert quick.units < full.units and quick.quick and not full.quick
    assert make_plan(limits, True, True).window_wall_s > quick.window_wall_s


def test_a_tiny_worker_drops_the_decode_points_it_cannot_hold() -> None:
    plan = make_plan(WorkerLimits(256, 600, 4), True, False)
    assert all(p.running * (p.prompt_tokens + 32) <= 0.45 * 600 for p in plan.decode)
    assert max(plan.prefill_tokens) <= 256
