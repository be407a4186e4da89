"""The registries and parameter validation: names, descriptions, and loud errors."""

from __future__ import annotations

import json
import math

import pytest

from fairserve.core.errors import ConfigError, UnknownNameError
from fairserve.sched import registry
from fairserve.sched.params import Param, resolve_params

LOCAL = {"fcfs", "lpm", "vtc", "lcf", "dlpm", "rpm", "justitia"}
DISPATCH = {"round-robin", "least-load", "cache-aware", "client-rr", "doubleq"}


def test_every_named_policy_and_dispatcher_is_registered() -> None:
    assert set(registry.local_policies()) == LOCAL
    assert set(registry.dispatchers()) == DISPATCH


def test_descriptions_are_json_and_complete() -> None:
    described = registry.describe_all()
    json.dumps(described)
    for entry in described["local_policies"] + described["dispatchers"]:
        assert entry["description"].strip(), entry["name"]
        assert "\n" not in entry["description"], "one-line descriptions only"
        for param in entry["params"]:
            assert param["description"].strip()


@pytest.mark.parametrize("name", sorted(LOCAL))
def test_each_local_policy_builds_with_defaults_and_snapshots(name: str) -> None:
    policy = registry.make_local_policy(name)
    assert policy.name == name
    json.dumps(policy.snapshot())


@pytest.mark.parametrize("name", sorted(DISPATCH))
def test_each_dispatcher_builds_with_defaults_and_snapshots(name: str) -> None:
    dispatcher = registry.make_dispatcher(name, ["w0", "w1"])
    assert dispatcher.name == name
    json.dumps(dispatcher.snapshot())


def test_unknown_names_list_the_known_ones() -> None:
    with pytest.raises(UnknownNameError) as err:
        registry.make_local_policy("dlmp")
    assert "dlmp" in str(err.value) and "dlpm" in str(err.value)
    with pytest.raises(ConfigError, match="unknown dispatcher 'double-q'"):
        registry.make_dispatcher("double-q", ["w0"])


@pytest.mark.parametrize("bad", [-1, 0, "x", math.nan, -math.inf])
def test_bad_quantum_is_refused_not_defaulted(bad: object) -> None:
    with pytest.raises(ConfigError, match="quantum"):
        registry.make_local_policy("dlpm", quantum=bad)


def test_unknown_parameter_is_refused() -> None:
    with pytest.raises(ConfigError, match="unknown parameter"):
        registry.make_local_policy("fcfs", quantum=10)


@pytest.mark.parametrize("name", sorted(LOCAL))
def test_zero_weight_is_refused(name: str) -> None:
    with pytest.raises(ConfigError, match="weight"):
        registry.make_local_policy(name, weights={"alice": 0})
    policy = registry.make_local_policy(name)
    with pytest.raises(ConfigError, match="weight"):
        policy.set_weight("bob", -2)


def test_policies_without_a_quantum_say_so() -> None:
    with pytest.raises(ConfigError, match="has no quantum"):
        registry.make_local_policy("fcfs").set_quantum(10)
    with pytest.raises(ConfigError, match="has no quantum"):
        registry.make_dispatcher("round-robin", ["w0"]).set_quantum(10)


def test_param_conversion_and_bounds() -> None:
    declared = (
        Param("n", int, 3, "a count", minimum=1),
        Param("x", float, 1.5, "a ratio", minimum=0.0, exclusive_minimum=True),
    )
    assert resolve_params("t", declared, {}) == {"n": 3, "x": 1.5}
    assert resolve_params("t", declared, {"n": "4", "x": "2"}) == {"n": 4, "x": 2.0}
    with pytest.raises(ConfigError, match="whole number"):
        resolve_params("t", declared, {"n": 2.5})
    with pytest.raises(ConfigError, match="must be >= 1"):
        resolve_params("t", declared, {"n": 0})
    with pytest.raises(ConfigError, match="must be > 0"):
        resolve_params("t", declared, {"x": 0})
    with pytest.raises(ConfigError, match="must be an integer"):
        resolve_params("t", declared, {"n": True})
