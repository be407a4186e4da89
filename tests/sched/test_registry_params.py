"""The registries and parameter validation: names, descriptions, and loud errors."""

from __future__ import annotations

import json
import math

import pytest

from fairserve.core.errors import ConfigError, UnknownNameError
from fairserve.sched import registry
from fairserve.sched.params import Param, resolve_params

LOCAL = {"fcfs", "lpm", "vtc", "lcf", "dlpm", "rpm", "justitia", "preble"}
DISPATCH = {"round-robin", "least-load", "cache-aware", "client-rr", "doubleq", "preble-e2"}


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


def _as_text(value: object) -> str:
    """How a user writes a value on the command line."""
    if isinstance(value, bool):
        return str(value).lower()
    return "inf" if isinstance(value, float) and math.isinf(value) else str(value)


def test_every_registered_parameter_can_be_set_by_text() -> None:
    """``simulate --param OWNER.NAME=VALUE`` reaches every declared parameter: its default,
    written as text, parses back to itself and builds the policy or dispatcher."""
    described = registry.describe_all()
    texts = [
        f"{entry['name']}.{p['name']}={_as_text(p['default'])}"
        for entry in described["local_policies"] + described["dispatchers"]
        for p in entry["params"]
    ]
    settings = registry.parse_param_settings(texts)
    for owner, values in settings.items():
        if owner in LOCAL:
            policy = registry.make_local_policy(owner, **values)
            assert policy.config.as_dict() == {**policy.config.as_dict(), **values}
        else:
            dispatcher = registry.make_dispatcher(owner, ["w0"], **values)
            assert dispatcher.config.as_dict() == {**dispatcher.config.as_dict(), **values}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("dlpm.quantum", "expected POLICY.NAME=VALUE"),
        ("quantum=5", "expected POLICY.NAME=VALUE"),
        (".quantum=5", "expected POLICY.NAME=VALUE"),
        ("dlpm.=5", "expected POLICY.NAME=VALUE"),
        ("nope.quantum=5", "unknown policy or dispatcher 'nope'"),
        ("lpm.quantum=5", "policy lpm: unknown parameter(s) quantum; expected no parameters"),
        ("dlpm.quantum=abc", "parameter 'quantum' must be a number, got 'abc'"),
        ("dlpm.quantum=nan", "must be a number, got NaN"),
        ("dlpm.fill_patience=1.5", "parameter 'fill_patience' must be an integer"),
        ("dlpm.work_conserving=yes", "must be true or false, got 'yes'"),
        ("justitia.predictor=magic", "must be one of: oracle, moving-average"),
        ("doubleq.worker_quantum=-1", "dispatcher doubleq: parameter 'worker_quantum' must be"),
    ],
)
def test_param_settings_refuse_bad_text_precisely(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        registry.parse_param_settings([text])
    assert message in str(caught.value)


def test_a_parameter_given_twice_is_an_error() -> None:
    with pytest.raises(ConfigError, match="given twice"):
        registry.parse_param_settings(["dlpm.quantum=5", "dlpm.quantum=6"])
