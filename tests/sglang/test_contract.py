"""The contract with the pinned SGLang: every hook target and every field the plugin reads
exists in the wheel's source, with the parameters the hooks rely on.

The list checked is ``fairserve.sglang.targets`` — the very list the plugin registers — so a
hook cannot be added without being checked here. Changing the pin re-runs all of it against
the new release: a moved method or a renamed parameter fails here, loudly, instead of
leaving a worker without fairness.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

import pytest

from fairserve.sglang import hooks, targets
from tests.sglang.wheel import (
    Unreachable,
    WheelSource,
    class_attributes,
    method,
    pinned_wheel,
    positional_params,
)


@pytest.fixture(scope="module")
def source() -> Iterator[WheelSource]:
    try:
        wheel = pinned_wheel()
    except Unreachable as exc:
        pytest.skip(f"cannot check the SGLang contract: {exc}")
    src = WheelSource(wheel)
    yield src
    src.zip.close()


def test_the_wheel_is_the_pinned_release(source: WheelSource) -> None:
    metadata = f"sglang-{targets.SGLANG_VERSION}.dist-info/METADATA"
    assert metadata in source.names
    text = source.zip.read(metadata).decode()
    assert f"\nVersion: {targets.SGLANG_VERSION}\n" in text


@pytest.mark.parametrize("target", targets.HOOKS, ids=[t.qualname for t in targets.HOOKS])
def test_every_hook_target_exists_with_its_parameters(
    source: WheelSource, target: targets.HookTarget
) -> None:
    cls_name, method_name = target.qualname.split(".")
    chain = source.class_chain(target.module, cls_name)
    assert chain, f"{target.module}.{cls_name} is gone"
    found = [(where, method(cls, method_name)) for where, cls in chain]
    defined = [(where, func) for where, func in found if func is not None]
    assert defined, f"{target.dotted} is gone (hook {target.handler}: {target.why})"
    where, func = defined[0]
    assert func is not None
    params = positional_params(func)
    assert tuple(params[: len(target.params)]) == target.params, (
        f"{target.dotted} (in {where}) takes {params}, the hook relies on {target.params}"
    )
    decorators = {d.id for d in func.decorator_list if isinstance(d, ast.Name)}
    assert not decorators & {"staticmethod", "classmethod", "property"}
    assert callable(getattr(hooks, target.handler))


@pytest.mark.parametrize("contract", targets.CLASSES, ids=[c.cls for c in targets.CLASSES])
def test_the_fields_the_adapters_read_exist(
    source: WheelSource, contract: targets.ClassContract
) -> None:
    chain = source.class_chain(contract.module, contract.cls)
    assert chain, f"{contract.module}.{contract.cls} is gone"
    available: set[str] = set()
    for _, cls in chain:
        available |= class_attributes(cls)
    missing = sorted(set(contract.attributes) - available)
    assert not missing, f"{contract.module}.{contract.cls} has no {missing}"


@pytest.mark.parametrize(("module", "enum", "members"), targets.ENUMS)
def test_enum_members(source: WheelSource, module: str, enum: str, members: tuple[str]) -> None:
    found = source.find_class(module, enum)
    assert found is not None, f"{module}.{enum} is gone"
    assert set(members) <= class_attributes(found[1])


def test_abort_reason_and_registry_signature(source: WheelSource) -> None:
    module, name = targets.FINISH_ABORT
    assert source.find_class(module, name) is not None
    registry = source.find_class("sglang.srt.plugins.hook_registry", "HookRegistry")
    assert registry is not None
    register = method(registry[1], "register")
    assert register is not None
    assert tuple(positional_params(register)[:4]) == targets.REGISTER_PARAMS


def test_schedulers_load_plugins_from_our_group(source: WheelSource) -> None:
    plugins = source.module("sglang.srt.plugins")
    groups = {
        t.id: node.value.value
        for node in plugins.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
        for t in node.targets
        if isinstance(t, ast.Name)
    }
    assert groups.get("GENERAL_PLUGINS_GROUP") == targets.PLUGIN_GROUP
    scheduler = source.module(targets.SCHEDULER)
    run = next(
        n for n in scheduler.body
        if isinstance(n, ast.FunctionDef) and n.name == "run_scheduler_process"
    )  # fmt: skip
    calls = {
        n.func.id for n in ast.walk(run) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
    }
    assert "load_plugins" in calls, "scheduler processes no longer load plugins"


def test_launch_flags_exist(source: WheelSource) -> None:
    assert source.has(targets.LAUNCH_MODULE)
    fields: dict[str, ast.AnnAssign] = {}
    for module in source.modules_under(targets.SERVER_FIELDS_PACKAGE):
        for node in ast.walk(source.module(module)):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                fields.setdefault(node.target.id, node)
    for name in targets.LAUNCH_FIELDS:
        assert name in fields, f"ServerArgs has no field {name} ({targets.launch_flag(name)})"
        renamed = [
            k.value.value
            for k in ast.walk(fields[name].annotation)
            if isinstance(k, ast.keyword)
            and k.arg == "cli_name"
            and isinstance(k.value, ast.Constant)
        ]
        assert renamed in ([], [targets.launch_flag(name)]), f"{name} is now {renamed}"
    choices = {
        c.value
        for c in ast.walk(fields["schedule_policy"].annotation)
        if isinstance(c, ast.Constant)
    }
    assert "lpm" in choices


def test_the_python_tree_core_can_be_selected(source: WheelSource) -> None:
    environ = source.module(targets.ENVIRON_MODULE)
    declared = {
        t.id
        for node in ast.walk(environ)
        if isinstance(node, ast.Assign)
        for t in node.targets
        if isinstance(t, ast.Name)
    }
    assert targets.TREE_CORE_ENV in declared
    registry = source.module(targets.TREE_CORE_REGISTRY)
    backends = {
        node.args[0].value
        for node in ast.walk(registry)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "register_tree_core_backend"
        and node.args
        and isinstance(node.args[0], ast.Constant)
    }
    assert targets.TREE_CORE_BACKEND in backends
