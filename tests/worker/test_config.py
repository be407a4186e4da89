"""Worker configuration: parameters from the command line, policies and engines."""

from __future__ import annotations

import pytest

from fairserve.core.errors import ConfigError, UnknownNameError
from fairserve.sim.profile import DEFAULT_PROFILE, Profile, resolve_profile, shipped_profiles
from fairserve.sim.running_bound import (
    FULL_STEP_FACTOR,
    MAX_RUNNING_REQUESTS,
    MIN_RUNNING_REQUESTS,
    STEP_TOKENS_PER_REQUEST,
)
from fairserve.sim.running_bound import default_running_requests as max_running_requests
from fairserve.worker.config import build_engine, parse_params
from tests.worker.helpers import make_config


def test_params_parse_to_booleans_numbers_and_text() -> None:
    parsed = parse_params(["w_q=3", "quantum=12.5", "work_conserving=false", "predictor=oracle"])
    assert parsed == {"w_q": 3, "quantum": 12.5, "work_conserving": False, "predictor": "oracle"}


@pytest.mark.parametrize("item", ["w_q", "=3", ""])
def test_params_without_key_and_value_are_refused(item: str) -> None:
    with pytest.raises(ConfigError, match="expected key=value"):
        parse_params([item])


def test_quantum_and_params_reach_the_policy() -> None:
    config = make_config(policy="dlpm", quantum=64.0, policy_params={"w_q": 3.0})
    policy = build_engine(config).policy
    assert policy.quantum == 64.0
    assert policy.config.as_dict()["w_q"] == 3.0


def test_quantum_for_a_policy_without_one_is_refused() -> None:
    with pytest.raises(ConfigError, match="policy vtc has no quantum"):
        make_config(policy="vtc", quantum=10.0)


def test_bad_values_fail_at_startup() -> None:
    with pytest.raises(UnknownNameError, match="nope"):
        make_config(policy="nope")
    with pytest.raises(ConfigError, match="w_q"):
        make_config(policy_params={"w_q": -1})
    with pytest.raises(ConfigError, match="--speed"):
        make_config(speed=0)
    with pytest.raises(ConfigError, match="batching"):
        make_config(batching="nope")


def test_justitia_gets_the_kv_capacity_of_the_profile() -> None:
    config = make_config(policy="justitia")
    assert build_engine(config).policy.config.as_dict()["kv_capacity_tokens"] == 4096


@pytest.mark.parametrize("profile", shipped_profiles(), ids=lambda p: p.name)
def test_default_running_bound_is_the_largest_batch_within_the_step_target(
    profile: Profile,
) -> None:
    """Under overload a full chunked-prefill step (the bound's requests, each bringing
    STEP_TOKENS_PER_REQUEST tokens) takes at most FULL_STEP_FACTOR one-token steps, and one
    request more would take longer: the bound is set by the latency target, not by
    throughput."""
    if profile.max_running_requests is not None:
        pytest.skip("the profile sets its own bound")
    bound = max_running_requests(profile)
    batch = profile.batch_time()
    one_token_s = batch.batch_time_s(1, 0)
    target_s = FULL_STEP_FACTOR * one_token_s
    if MIN_RUNNING_REQUESTS < bound < MAX_RUNNING_REQUESTS:
        half = (STEP_TOKENS_PER_REQUEST + 1) // 2  # the bound is rounded to the nearest request
        assert batch.batch_time_s(bound * STEP_TOKENS_PER_REQUEST - half, 0) <= target_s
        assert batch.batch_time_s((bound + 1) * STEP_TOKENS_PER_REQUEST, 0) > target_s


def test_default_profile_running_bound_is_52() -> None:
    """The figure the docs quote (README, operator guide): 52 for a100-llama-3-8b."""
    assert max_running_requests(resolve_profile(DEFAULT_PROFILE)) == 52
