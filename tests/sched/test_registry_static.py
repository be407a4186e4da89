"""The registry imports every implementation module statically: a module that registers a
policy or dispatcher but is missing from the registry's list would register only when
something else happened to import it, and its name would come and go with import order."""

from __future__ import annotations

import importlib
import pkgutil

import fairserve.sched.dispatch
import fairserve.sched.local
from fairserve.sched import registry


def _import_every_submodule() -> None:
    for package in (fairserve.sched.local, fairserve.sched.dispatch):
        for info in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
            importlib.import_module(info.name)


def test_every_registering_module_is_imported_by_the_registry() -> None:
    _import_every_submodule()
    for family in (registry.LOCAL_POLICIES, registry.DISPATCHERS):
        listed = {module.__name__ for module in family.modules}
        for name in family.names():
            module = family.lookup(name).__module__
            if module.startswith("fairserve."):
                assert module in listed, f"{family.kind} {name!r} is defined in {module}"


def test_canonical_order_follows_the_module_list() -> None:
    assert registry.local_policies() == [
        "fcfs",
        "lpm",
        "vtc",
        "lcf",
        "dlpm",
        "rpm",
        "justitia",
        "preble",
    ]
    assert registry.dispatchers() == [
        "round-robin",
        "least-load",
        "cache-aware",
        "client-rr",
        "doubleq",
        "preble-e2",
    ]
