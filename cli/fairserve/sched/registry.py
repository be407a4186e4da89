"""One place that loads every policy and dispatcher and answers by name.

CLI choices, ``fairserve policies``, man pages and completions are built from here, never
from hand-written lists.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Generic, TypeVar

from fairserve.core.cost import CostModel
from fairserve.core.errors import ConfigError
from fairserve.sched.dispatch import (
    cache_aware,
    client_rr,
    doubleq,
    least_load,
    round_robin,
)
from fairserve.sched.dispatch import preble as preble_e2
from fairserve.sched.dispatch.base import Dispatcher, dispatcher_class, dispatcher_names
from fairserve.sched.local import dlpm, fcfs, justitia, lpm, preble, rpm, vtc
from fairserve.sched.local.base import LocalPolicy, local_policy_class, local_policy_names
from fairserve.sched.params import Param

T = TypeVar("T", LocalPolicy, Dispatcher)


@dataclass(frozen=True)
class Registry(Generic[T]):
    """One family of named implementations (local policies or dispatchers).

    The implementation modules are imported above, statically, so that importing this
    module registers every class and static tools see every implementation; ``modules``
    gives the canonical order, which must not depend on which test or command imported a
    module first."""

    kind: str
    """How messages name a member ("policy", "dispatcher")."""
    modules: tuple[ModuleType, ...]
    lookup: Callable[[str], type[T]]
    registered: Callable[[], list[str]]

    def names(self) -> list[str]:
        """Registered names in canonical order (module order, then registration)."""
        order = [m.__name__ for m in self.modules]

        def rank(item: tuple[int, str]) -> tuple[int, int]:
            module = self.lookup(item[1]).__module__
            return (order.index(module) if module in order else len(order), item[0])

        return [name for _, name in sorted(enumerate(self.registered()), key=rank)]

    def describe(self) -> list[dict[str, Any]]:
        """Every member with description and parameters (JSON-able), in canonical order."""
        return [_describe(self.lookup(name)) for name in self.names()]

    def declared_params(self) -> dict[str, tuple[str, tuple[Param, ...]]]:
        """``{name: (kind, declared parameters)}`` for every member."""
        return {name: (self.kind, self.lookup(name).params) for name in self.names()}


LOCAL_POLICIES: Registry[LocalPolicy] = Registry(
    "policy",
    (fcfs, lpm, vtc, dlpm, rpm, justitia, preble),
    local_policy_class,
    local_policy_names,
)
DISPATCHERS: Registry[Dispatcher] = Registry(
    "dispatcher",
    (round_robin, least_load, cache_aware, client_rr, doubleq, preble_e2),
    dispatcher_class,
    dispatcher_names,
)


def load_all() -> None:
    """Every implementation is registered once this module is imported (its imports are
    static); kept so that callers can say that they need the registrations."""


def local_policies() -> list[str]:
    """Registered local policies in canonical order (module order, then registration)."""
    return LOCAL_POLICIES.names()


def dispatchers() -> list[str]:
    """Registered dispatchers in canonical order (module order, then registration)."""
    return DISPATCHERS.names()


def make_local_policy(
    name: str,
    *,
    cost: CostModel | None = None,
    weights: Mapping[str, float] | None = None,
    **params: Any,
) -> LocalPolicy:
    """Build a local policy by name; unknown names and bad parameters raise ConfigError."""
    return LOCAL_POLICIES.lookup(name)(cost=cost, weights=weights, **params)


def make_dispatcher(
    name: str,
    workers: Collection[str] = (),
    *,
    cost: CostModel | None = None,
    weights: Mapping[str, float] | None = None,
    **params: Any,
) -> Dispatcher:
    """Build a dispatcher by name; unknown names and bad parameters raise ConfigError."""
    return DISPATCHERS.lookup(name)(list(workers), cost=cost, weights=weights, **params)


def describe_all() -> dict[str, list[dict[str, Any]]]:
    """Every registered policy and dispatcher with description and parameters (JSON-able)."""
    return {
        "local_policies": LOCAL_POLICIES.describe(),
        "dispatchers": DISPATCHERS.describe(),
    }


def _describe(cls: type[LocalPolicy] | type[Dispatcher]) -> dict[str, Any]:
    return {
        "name": cls.name,
        "description": cls.description,
        "params": [p.describe() for p in cls.params],
    }


PARAM_SYNTAX = "POLICY.NAME=VALUE, e.g. dlpm.fill_patience=4"


def parse_param_settings(texts: Collection[str]) -> dict[str, dict[str, Any]]:
    """``["dlpm.fill_patience=4", "doubleq.worker_quantum=inf"]`` → ``{owner: {name:
    value}}``, every owner a registered local policy or dispatcher and every value
    validated against its declared :class:`Param`, so that nothing runs with a setting
    that was silently dropped or mistyped. Messages start with the offending text."""
    owners = {**LOCAL_POLICIES.declared_params(), **DISPATCHERS.declared_params()}
    settings: dict[str, dict[str, Any]] = {}
    for text in texts:
        target, sep, value = text.partition("=")
        owner, dot, name = target.strip().partition(".")
        if not sep or not dot or not owner or not name.strip():
            raise ConfigError(f"{text!r}: expected {PARAM_SYNTAX}")
        name = name.strip()
        if owner not in owners:
            raise ConfigError(
                f"{text!r}: unknown policy or dispatcher {owner!r}; expected one of: "
                + ", ".join(owners)
            )
        kind, declared = owners[owner]
        label = f"{kind} {owner}"
        param = next((p for p in declared if p.name == name), None)
        if param is None:
            expected = ", ".join(p.name for p in declared) or "no parameters"
            raise ConfigError(f"{label}: unknown parameter(s) {name}; expected {expected}")
        values = settings.setdefault(owner, {})
        if name in values:
            raise ConfigError(f"{text!r}: {owner}.{name} is given twice")
        values[name] = param.parse(label, value.strip())
    return settings
