"""One place that loads every policy and dispatcher and answers by name.

CLI choices, ``fairserve policies``, man pages and completions are built from here, never
from hand-written lists.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Collection, Mapping
from typing import Any

from fairserve.core.cost import CostModel
from fairserve.core.errors import ConfigError
from fairserve.sched.dispatch.base import Dispatcher, dispatcher_class, dispatcher_names
from fairserve.sched.local.base import LocalPolicy, local_policy_class, local_policy_names
from fairserve.sched.params import Param

LOCAL_MODULES = ("fcfs", "lpm", "vtc", "dlpm", "rpm", "justitia")
DISPATCH_MODULES = ("round_robin", "least_load", "cache_aware", "client_rr", "doubleq")

_loaded = False


def load_all() -> None:
    """Import every implementation module so that its classes register themselves."""
    global _loaded
    if _loaded:
        return
    for module in LOCAL_MODULES:
        importlib.import_module(f"fairserve.sched.local.{module}")
    for module in DISPATCH_MODULES:
        importlib.import_module(f"fairserve.sched.dispatch.{module}")
    _loaded = True


def local_policies() -> list[str]:
    """Registered local policies in canonical order (module order, then registration)."""
    load_all()
    return _canonical(local_policy_names(), LOCAL_MODULES, local_policy_class)


def dispatchers() -> list[str]:
    """Registered dispatchers in canonical order (module order, then registration)."""
    load_all()
    return _canonical(dispatcher_names(), DISPATCH_MODULES, dispatcher_class)


def _canonical(
    names: list[str], modules: tuple[str, ...], lookup: Callable[[str], type]
) -> list[str]:
    """Order that does not depend on which test or command imported a module first."""

    def rank(item: tuple[int, str]) -> tuple[int, int]:
        module = lookup(item[1]).__module__.rsplit(".", 1)[-1]
        return (modules.index(module) if module in modules else len(modules), item[0])

    return [name for _, name in sorted(enumerate(names), key=rank)]


def make_local_policy(
    name: str,
    *,
    cost: CostModel | None = None,
    weights: Mapping[str, float] | None = None,
    **params: Any,
) -> LocalPolicy:
    """Build a local policy by name; unknown names and bad parameters raise ConfigError."""
    load_all()
    return local_policy_class(name)(cost=cost, weights=weights, **params)


def make_dispatcher(
    name: str,
    workers: Collection[str] = (),
    *,
    cost: CostModel | None = None,
    weights: Mapping[str, float] | None = None,
    **params: Any,
) -> Dispatcher:
    """Build a dispatcher by name; unknown names and bad parameters raise ConfigError."""
    load_all()
    return dispatcher_class(name)(list(workers), cost=cost, weights=weights, **params)


def describe_all() -> dict[str, list[dict[str, Any]]]:
    """Every registered policy and dispatcher with description and parameters (JSON-able)."""
    load_all()
    return {
        "local_policies": [_describe(local_policy_class(n)) for n in local_policies()],
        "dispatchers": [_describe(dispatcher_class(n)) for n in dispatchers()],
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
    load_all()
    owners: dict[str, tuple[str, tuple[Param, ...]]] = {
        **{n: ("policy", local_policy_class(n).params) for n in local_policies()},
        **{n: ("dispatcher", dispatcher_class(n).params) for n in dispatchers()},
    }
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
