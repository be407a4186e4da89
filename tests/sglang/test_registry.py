"""The plugin applied by SGLang's own ``HookRegistry`` (from the pinned wheel) to classes
shaped like SGLang's: the calling conventions of BEFORE, AFTER and AROUND are SGLang's,
not the test's idea of them.

``hook_registry.py`` imports only the standard library, so it runs here without SGLang's
dependencies; everything it patches is a fake from ``tests.fakes.sglang``.
"""

from __future__ import annotations

import sys
import types
import zipfile
from collections.abc import Iterator

import pytest

from fairserve.sglang import hooks, plugin, targets
from tests.fakes import sglang as fake
from tests.sglang.test_admission import STEPS, run_reference, workload
from tests.sglang.wheel import Unreachable, pinned_wheel

REGISTRY_SOURCE = "sglang/srt/plugins/hook_registry.py"


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    try:
        wheel = pinned_wheel()
    except Unreachable as exc:
        pytest.skip(f"cannot load SGLang's HookRegistry: {exc}")
    with zipfile.ZipFile(wheel) as archive:
        source = archive.read(REGISTRY_SOURCE).decode()
    for dotted in fake.FAKE_CLASSES:
        module_name, cls_name = dotted.rsplit(".", 1)
        parts = module_name.split(".")
        for i in range(1, len(parts) + 1):
            name = ".".join(parts[:i])
            if name not in sys.modules or not getattr(sys.modules[name], "_fake", False):
                module = types.ModuleType(name)
                module._fake = True  # type: ignore[attr-defined]
                monkeypatch.setitem(sys.modules, name, module)
        setattr(sys.modules[module_name], cls_name, fake.FAKE_CLASSES[dotted])
    sys.modules["sglang.srt.managers.schedule_policy"].AddReqResult = fake.AddReqResult  # type: ignore[attr-defined]
    module = types.ModuleType("sglang.srt.plugins.hook_registry")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    exec(compile(source, REGISTRY_SOURCE, "exec"), module.__dict__)
    for target in targets.HOOKS:  # restore the fake classes after the test
        cls = fake.FAKE_CLASSES[target.dotted.rsplit(".", 1)[0]]
        name = target.qualname.split(".")[1]
        monkeypatch.setattr(cls, name, cls.__dict__[name])
    yield module
    hooks.install_host(None)
    hooks.PLUGIN.config = None
    hooks.PLUGIN.scheduler = None


def test_sglangs_registry_applies_the_plugin(
    registry: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAIRSERVE_POLICY", "dlpm")
    monkeypatch.setenv("FAIRSERVE_QUANTUM", "60")
    monkeypatch.setenv(targets.TREE_CORE_ENV, "python")  # restored after the test
    plugin.register()
    registry.HookRegistry.apply_hooks()
    assert registry.HookRegistry._patched == {t.dotted for t in targets.HOOKS}

    jobs = workload(seed=11, steps=25)
    sched = fake.FakeScheduler(kv_tokens=1200)  # Scheduler.__init__ builds the host
    host = hooks.PLUGIN.host
    assert host is not None and host.results is fake.AddReqResult
    targets_out = {j.rid: j.output for j in jobs}
    decisions = []
    for step in range(STEPS):
        for job in (j for j in jobs if j.step == step):
            req = fake.Req(job.rid, list(job.tokens), job.max_new, job.client)
            req.host_hit = job.host_hit
            sched.add_request(req)
        decisions.append(sched.prefill().admitted)
        sched.forward(targets_out)
    reference, reference_state = run_reference(("dlpm", 60.0, {}), jobs)
    assert decisions == reference
    assert host.policy.snapshot() == reference_state

    message, applied = host.controls.submit(90.0)
    received = sched.iteration_inputs()
    assert received == [message] and sched.inputs == [] and applied.is_set()
    assert host.policy.quantum == 90

    leaf = fake.TreeNode([5, 6], fake.TreeNode([1, 2, 3], fake.TreeNode([])))
    own = fake.KVCacheEventRecorder()
    sched.tree_cache = types.SimpleNamespace(kv_events=own)  # type: ignore[attr-defined]
    assert hooks.PLUGIN.scheduler is sched
    own.record_remove(leaf, None)
    fake.KVCacheEventRecorder().record_all_cleared()  # another tree's recorder: ignored
    own.record_all_cleared()
    events = host.evictions.read(0, 10)["events"]
    assert [e["tokens"] for e in events] == [[1, 2, 3, 5, 6], []]
