"""Worker configuration: parameters from the command line, policies and engines."""

from __future__ import annotations

import pytest

from fairserve.core.errors import ConfigError, UnknownNameError
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
