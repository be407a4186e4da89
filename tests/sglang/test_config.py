"""The launcher writes the plugin's environment, the plugin reads it back; bad values name
the variable."""

from __future__ import annotations

import pytest

from fairserve.core.errors import ConfigError
from fairserve.sched.registry import local_policies
from fairserve.sglang.config import (
    PluginConfig,
    build_policy,
    config_from_env,
    plugin_env,
    plugin_policies,
)
from fairserve.sglang.requests import EngineCounters


def test_unset_policy_means_inactive() -> None:
    assert config_from_env({}) is None
    assert config_from_env({"FAIRSERVE_POLICY": "  "}) is None


def test_round_trip_through_the_environment() -> None:
    config = PluginConfig(policy="dlpm", quantum=256.0, params={"w_q": 3.0}, extension_port=31001)
    env = plugin_env(config)
    assert env["SGLANG_PLUGINS"] == "fairserve"
    assert config_from_env({**env, "FAIRSERVE_ADMIN_TOKEN": "t"}) == PluginConfig(
        policy="dlpm", quantum=256.0, params={"w_q": 3.0}, extension_port=31001,
        admin_token="t",
    )  # fmt: skip
    assert "FAIRSERVE_ADMIN_TOKEN" not in env


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"FAIRSERVE_POLICY": "nope"}, "unknown local policy 'nope'"),
        ({"FAIRSERVE_POLICY": "rpm"}, "cannot run inside SGLang"),
        ({"FAIRSERVE_POLICY": "vtc", "FAIRSERVE_QUANTUM": "5"}, "vtc has no quantum"),
        ({"FAIRSERVE_POLICY": "dlpm", "FAIRSERVE_QUANTUM": "-5"}, "FAIRSERVE_QUANTUM"),
        ({"FAIRSERVE_POLICY": "dlpm", "FAIRSERVE_POLICY_PARAMS": "[1]"}, "JSON object"),
        ({"FAIRSERVE_POLICY": "dlpm", "FAIRSERVE_POLICY_PARAMS": '{"w_q": -1}'}, "w_q"),
        ({"FAIRSERVE_POLICY": "dlpm", "FAIRSERVE_EXTENSION_PORT": "http"}, "EXTENSION_PORT"),
    ],
)
def test_bad_values_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config_from_env(env)


def test_policies_come_from_the_registry() -> None:
    assert plugin_policies() == [p for p in local_policies() if p != "rpm"]
    assert {"dlpm", "vtc", "lcf", "justitia"} <= set(plugin_policies())


def test_justitia_gets_the_engines_kv_capacity() -> None:
    policy = build_policy(PluginConfig(policy="justitia"), kv_capacity_tokens=12345)
    assert policy.config.as_dict()["kv_capacity_tokens"] == 12345
    explicit = PluginConfig(policy="justitia", params={"kv_capacity_tokens": 99})
    assert (
        build_policy(explicit, kv_capacity_tokens=12345).config.as_dict()["kv_capacity_tokens"]
        == 99
    )


def test_busy_time_counts_overlapping_steps_once() -> None:
    counters = EngineCounters()
    counters.busy(10.0, 10.5)
    counters.busy(10.4, 11.0)  # launched before the previous step's results were read
    counters.busy(12.0, 12.25)  # after an idle gap
    assert counters.busy_s == 1.25 and counters.as_json()["busy_s"] == 1.25
