"""Plugin registration, the hooks' calling conventions, live quantum across ranks, evictions."""

from __future__ import annotations

import os
import sys
import threading
import tomllib
from importlib.metadata import entry_points
from pathlib import Path
from types import SimpleNamespace

import pytest

import fairserve.sglang
from fairserve.sglang import hooks, plugin, targets
from fairserve.sglang.control import PolicyChange
from tests.fakes.sglang import (
    AddReqResult,
    FakeScheduler,
    HookRegistry,
    HookType,
    PrefillAdder,
    Req,
    StorageMedium,
    TreeNode,
    install_fake_sglang,
)
from tests.sglang.conftest import MakeHost, make_host

ROOT = Path(__file__).resolve().parents[2]


def fake_sglang(monkeypatch: pytest.MonkeyPatch) -> type[HookRegistry]:
    return install_fake_sglang(lambda name, module: monkeypatch.setitem(sys.modules, name, module))


def test_inactive_without_a_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = fake_sglang(monkeypatch)
    monkeypatch.delenv("FAIRSERVE_POLICY", raising=False)
    plugin.register()
    assert registry.registered == [] and hooks.PLUGIN.config is None


def test_registers_every_target_with_its_handler(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = fake_sglang(monkeypatch)
    monkeypatch.setenv("FAIRSERVE_POLICY", "dlpm")
    monkeypatch.setenv("FAIRSERVE_QUANTUM", "128")
    monkeypatch.setenv(targets.TREE_CORE_ENV, "unset")  # recorded, so the test restores it
    monkeypatch.delenv(targets.TREE_CORE_ENV)
    try:
        plugin.register()
        assert [(t, h, k) for t, h, k in registry.registered] == [
            (t.dotted, getattr(hooks, t.handler), HookType[t.kind.upper()]) for t in targets.HOOKS
        ]
        config = hooks.PLUGIN.config
        assert config is not None and config.policy == "dlpm" and config.quantum == 128
        assert os.environ[targets.TREE_CORE_ENV] == "python"  # before any cache is built
        scheduler = SimpleNamespace(
            max_total_num_tokens=5000, server_args=SimpleNamespace(model_path="m"), waiting_queue=[]
        )
        hooks.scheduler_ready(None, scheduler, "server_args", "port_args")
        host = hooks.PLUGIN.host
        assert host is not None and host.kv_capacity_tokens == 5000 and host.model_name == "m"
        assert host.policy.quantum == 128 and host.results is AddReqResult
    finally:
        hooks.install_host(None)
        hooks.PLUGIN.config = None


def test_a_bad_configuration_stops_the_process(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_sglang(monkeypatch)
    monkeypatch.setenv("FAIRSERVE_POLICY", "vtc")
    monkeypatch.setenv("FAIRSERVE_QUANTUM", "64")
    with pytest.raises(SystemExit, match="FAIRSERVE_QUANTUM: policy vtc has no quantum"):
        plugin.register()


def test_the_entry_point_is_declared_and_resolves() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    group = project["entry-points"][targets.PLUGIN_GROUP]
    assert group == {targets.PLUGIN_NAME: targets.PLUGIN_OBJECT}
    module, _, name = targets.PLUGIN_OBJECT.partition(":")
    assert getattr(sys.modules[module], name) is plugin.register
    assert project["optional-dependencies"]["sglang"] == [f"sglang=={targets.SGLANG_VERSION}"]
    assert fairserve.sglang.__doc__


def test_sglang_discovers_the_installed_plugin() -> None:
    """What SGLang's ``load_plugins`` does: entry points of the group, by name, loaded."""
    found = {ep.name: ep for ep in entry_points(group=targets.PLUGIN_GROUP)}
    assert targets.PLUGIN_NAME in found, "reinstall: pip install -e '.[dev]'"
    assert found[targets.PLUGIN_NAME].load() is plugin.register


def test_without_a_host_every_hook_leaves_sglang_alone() -> None:
    hooks.install_host(None)
    adder, req = PrefillAdder(100), Req("r", [1, 2, 3], 4, "a")
    req.full_untruncated_fill_ids = req.origin_input_ids
    result = hooks.admit_one(PrefillAdder.add_one_req, adder, req, has_chunked_req=False)
    assert result is AddReqResult.CONTINUE and adder.can_run_list == [req]
    assert hooks.apply_controls(object(), [PolicyChange(1.0, 1)]) is None
    assert hooks.leader_poll([], object()) is None


def test_a_quantum_change_reaches_every_rank_in_the_same_iteration(install: MakeHost) -> None:
    leader = install("dlpm", quantum=100)
    follower = make_host("dlpm", quantum=100)  # another tensor-parallel rank's host
    message, applied = leader.controls.submit(250.0)
    assert hooks.leader_poll([], object()) == [message]  # with this iteration's aborts
    assert hooks.leader_poll([], object()) == [message]  # SGLang skipped receiving: again
    other = object()
    received = ["req", message, other]
    args = hooks.apply_controls("scheduler", received)
    assert args == (("scheduler", ["req", other]), {})
    assert leader.policy.quantum == 250 and applied.is_set()
    assert hooks.leader_poll([], object()) is None  # applied on the leader: done
    hooks.install_host(follower)
    assert hooks.apply_controls(scheduler="s", recv_reqs=received) == (
        (),
        {"scheduler": "s", "recv_reqs": ["req", other]},
    )
    assert follower.policy.quantum == 250


def test_a_message_applies_once_and_never_after_a_newer_one(install: MakeHost) -> None:
    host = install("dlpm", quantum=100)
    older, _ = host.controls.submit(200.0)
    newer, _ = host.controls.submit(300.0)
    host.apply_controls([newer])
    host.apply_controls([older, newer])  # held back across a pause, sent again
    assert host.policy.quantum == 300 and host.controls.pending() == []


def test_quantum_check_refuses_bad_values(install: MakeHost) -> None:
    host = install("dlpm", quantum=100)
    for bad in (0, -1, True, "x", float("nan")):
        with pytest.raises(ValueError):
            host.check_quantum(bad)
    assert host.check_quantum(64) == 64.0
    with pytest.raises(ValueError, match="vtc has no quantum"):
        make_host("vtc").check_quantum(64)


def own_recorder() -> object:
    """Make a recorder the scheduler's own cache's (as ``scheduler_ready`` sees it)."""
    recorder = object()
    hooks.PLUGIN.scheduler = SimpleNamespace(tree_cache=SimpleNamespace(kv_events=recorder))
    return recorder


def test_evictions_are_prefixes_from_the_root(install: MakeHost) -> None:
    host = install("vtc")
    recorder = own_recorder()
    root = TreeNode([])
    root.parent = None
    mid = TreeNode([1, 2, 3], root)
    leaf = TreeNode([4, 5], mid)
    hooks.node_evicted(recorder, leaf, None)
    hooks.node_evicted(recorder, mid, StorageMedium("GPU"))
    hooks.node_evicted(recorder, mid, StorageMedium("CPU"))  # still in host memory
    hooks.cache_cleared(recorder)
    assert host.evictions.read(0, 10) == {
        "next": 3,
        "events": [
            {"seq": 0, "tokens": [1, 2, 3, 4, 5]},
            {"seq": 1, "tokens": [1, 2, 3]},
            {"seq": 2, "tokens": []},
        ],
        "dropped": False,
    }
    assert host.evictions.read(2, 10)["events"] == [{"seq": 2, "tokens": []}]
    behind = host.evictions.read(7, 10)  # a reader of an earlier process: start over
    assert behind["dropped"] is True and behind["next"] == 3 and len(behind["events"]) == 3


def test_only_the_schedulers_own_cache_reports_evictions(install: MakeHost) -> None:
    """SGLang's other radix trees (``SchedulePolicy``'s in-batch tree of the waiting queue,
    reset at every LPM ordering) report through recorders of the same class: no events."""
    host = install("vtc")
    unified = SimpleNamespace(kv_events=None, tree_core=SimpleNamespace(kv_events=object()))
    hooks.PLUGIN.scheduler = SimpleNamespace(tree_cache=unified)
    leaf = TreeNode([7], TreeNode([]))
    hooks.cache_cleared(object())  # the waiting queue's tree was reset
    hooks.node_evicted(object(), leaf, None)
    assert host.evictions.next_seq == 0
    hooks.node_evicted(unified.tree_core.kv_events, leaf, None)
    hooks.cache_cleared(unified.tree_core.kv_events)
    assert [e["tokens"] for e in host.evictions.read(0, 10)["events"]] == [[7], []]
    hooks.PLUGIN.scheduler = None  # no scheduler yet: nothing is the scheduler's
    hooks.cache_cleared(unified.tree_core.kv_events)
    assert host.evictions.next_seq == 2


def test_a_refused_arrival_is_not_counted(install: MakeHost) -> None:
    host = install("vtc")
    sched = FakeScheduler(kv_tokens=100)
    refused = Req("refused", [1, 2], 3, "a")
    hooks.request_queued(None, sched, refused, False)  # not in the queue: SGLang refused it
    assert host.state_json()["waiting"] == 0
    sched.add_request(Req("ok", [1, 2], 3, "a"))
    assert host.state_json()["clients"] == {"a": {"waiting": 1, "running": 0}}


def test_state_while_the_scheduler_decides(install: MakeHost) -> None:
    """Snapshots from the HTTP thread never see the policy mid-change."""
    host = install("dlpm", quantum=40)
    sched = FakeScheduler(kv_tokens=10_000)
    stop = threading.Event()
    errors: list[BaseException] = []

    def read() -> None:
        while not stop.is_set():
            try:
                host.state_json()
            except BaseException as exc:  # pragma: no cover - the failure being tested
                errors.append(exc)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for step in range(60):
            sched.add_request(Req(f"r{step}", list(range(step % 7, 30)), 3, f"c{step % 3}"))
            sched.prefill()
            sched.forward({f"r{i}": 3 for i in range(60)})
    finally:
        stop.set()
        reader.join()
    assert not errors
    assert host.state_json()["engine"]["finished"] >= 55
