"""Typed parameter objects: a policy's dataclass fields are its declarations (issue 21)."""

from __future__ import annotations

import math
from dataclasses import FrozenInstanceError, dataclass
from typing import Literal

import pytest

from fairserve.core.errors import ConfigError
from fairserve.sched import registry
from fairserve.sched.local.base import LocalPolicy
from fairserve.sched.local.dlpm import DLPM, DLPMParams
from fairserve.sched.params import QUANTUM, Param, Params, param


@dataclass(frozen=True, slots=True)
class DemoParams(Params):
    quantum: float = QUANTUM.field()
    mode: Literal["fast", "slow"] = param("fast", "how it runs")
    count: int = param(3, "how many", minimum=1)


def test_fields_are_the_declarations_in_field_order() -> None:
    declared = DemoParams.declared()
    assert [p.name for p in declared] == ["quantum", "mode", "count"]
    assert declared[0] is QUANTUM
    assert declared[1] == Param("mode", str, "fast", "how it runs", choices=("fast", "slow"))
    assert declared[2] == Param("count", int, 3, "how many", minimum=1)


def test_resolve_validates_and_types() -> None:
    config = DemoParams.resolve("demo", {"count": "4", "mode": "slow"})
    assert config == DemoParams(quantum=512.0, mode="slow", count=4)
    assert config.as_dict() == {"quantum": 512.0, "mode": "slow", "count": 4}
    with pytest.raises(ConfigError, match="must be one of: fast, slow"):
        DemoParams.resolve("demo", {"mode": "medium"})
    with pytest.raises(ConfigError, match="unknown parameter"):
        DemoParams.resolve("demo", {"counts": 2})
    with pytest.raises(FrozenInstanceError):
        config.count = 5  # type: ignore[misc]


def test_a_shared_declaration_must_match_its_field() -> None:
    @dataclass(frozen=True, slots=True)
    class Misnamed(Params):
        quanta: float = QUANTUM.field()

    with pytest.raises(TypeError, match="declared as 'quantum'"):
        Misnamed.declared()


def test_policies_take_params_from_their_config_annotation() -> None:
    assert DLPM.config_type is DLPMParams
    assert DLPM.params == DLPMParams.declared()
    policy = registry.make_local_policy("dlpm", quantum=64)
    assert isinstance(policy.config, DLPMParams) and policy.config.quantum == 64.0
    policy.set_quantum(128)
    assert policy.config.quantum == 128.0 and policy.snapshot()["params"]["quantum"] == 128.0
    doubleq = registry.make_dispatcher("doubleq", ["w0"], worker_quantum="inf")
    assert doubleq.quantum == math.inf and doubleq.snapshot()["params"]["worker_quantum"] == "inf"


def test_a_params_tuple_on_a_policy_is_refused() -> None:
    with pytest.raises(TypeError, match="declare parameters as the fields"):

        class Old(LocalPolicy):
            name = "old"
            description = "declares a tuple"
            params = (QUANTUM,)
