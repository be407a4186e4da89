"""``launch --ray`` without a cluster: the placement plan (pure), the options it accepts,
the worker commands it builds for a node, the engine actor's logic, and the error when Ray
is missing (tests/ray runs it all on a real Ray cluster)."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from fairserve.cluster.options import LaunchOptions
from fairserve.cluster.plan import build_plan
from fairserve.cluster.ray_fleet import EngineHost, non_loopback_hosts
from fairserve.cluster.ray_placement import NodeCapacity, NotEnoughGpus, place
from fairserve.cluster.worker_spec import WorkerSpec
from fairserve.commands.app import app
from fairserve.commands.errors import ExitCode, classify
from fairserve.core.errors import ConfigError, FairserveError
from fairserve.sglang.config import config_from_env


def _nodes(*free: float, total: float = 4) -> list[NodeCapacity]:
    return [
        NodeCapacity(f"node{i:02d}" + "0" * 50, f"10.0.0.{i}", total, f) for i, f in enumerate(free)
    ]


def test_workers_spread_over_the_nodes_with_the_most_free_gpus() -> None:
    placements = place(_nodes(2, 4, 4), workers=3, gpus=1)
    assert [p.node.address for p in placements] == ["10.0.0.1", "10.0.0.2", "10.0.0.1"]
    assert [p.name for p in placements] == ["worker-0", "worker-1", "worker-2"]


def test_tensor_parallel_workers_keep_their_gpus_on_one_node() -> None:
    placements = place(_nodes(3, 2, 4), workers=None, gpus=2)
    addresses = sorted(p.node.address for p in placements)
    assert addresses == ["10.0.0.0", "10.0.0.1", "10.0.0.2", "10.0.0.2"]  # 3 free: room for 1
    with pytest.raises(NotEnoughGpus, match="room for 4"):
        place(_nodes(3, 2, 4), workers=5, gpus=2)


def test_shortfall_says_what_is_free_where() -> None:
    with pytest.raises(NotEnoughGpus) as caught:
        place(_nodes(1, 0.5), workers=None, gpus=2)
    message = str(caught.value)
    assert "for a worker of 2 GPU(s) each on one node (room for 0)" in message
    assert "10.0.0.0 (node0000): 1 of 4 free; 10.0.0.1 (node0100): 0 of 4 free" in message


def test_workers_without_gpus_need_a_count_and_spread() -> None:
    with pytest.raises(FairserveError, match="--workers is required"):
        place(_nodes(0, 0), workers=None, gpus=0)
    assert [p.node.address for p in place(_nodes(0, 0), 3, 0)] == ["10.0.0.0", "10.0.0.1"] * 1 + [
        "10.0.0.0"
    ]


@given(
    free=st.lists(st.integers(0, 8), min_size=1, max_size=6),
    workers=st.integers(1, 12),
    gpus=st.integers(1, 4),
)
def test_a_plan_never_overcommits_a_node(free: list[int], workers: int, gpus: int) -> None:
    nodes = _nodes(*free, total=8)
    fits = sum(f // gpus for f in free)
    if fits < workers:
        with pytest.raises(NotEnoughGpus):
            place(nodes, workers, gpus)
        return
    placements = place(nodes, workers, gpus)
    assert len(placements) == workers
    for node in nodes:
        used = sum(p.gpus for p in placements if p.node is node)
        assert used <= node.free_gpus


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (LaunchOptions(ray_address="auto", gpus="0"), "--gpus: on a Ray cluster Ray assigns"),
        (
            LaunchOptions(ray_address="auto", worker_urls=["http://127.0.0.1:9"]),
            "--ray: places the workers itself",
        ),
        (LaunchOptions(gpus_per_worker=1), "--gpus-per-worker: applies to --ray"),
        (
            LaunchOptions(ray_address="auto", model="m", gpus_per_worker=1),
            "SGLang workers get --tp",
        ),
        (LaunchOptions(ray_address="auto", engine="sim", tp=2), "--tp: applies to --engine"),
        (LaunchOptions(ray_address="auto", engine="sglang"), "--model"),
    ],
)
def test_ray_options_are_checked_before_anything_starts(
    options: LaunchOptions, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        build_plan(options)


def test_ray_plan_builds_each_worker_for_its_node() -> None:
    sim = build_plan(LaunchOptions(ray_address="auto", engine="sim", port=0))
    assert sim.workers == () and sim.ray is not None
    assert (sim.ray.engine, sim.ray.workers, sim.ray.gpus_per_worker) == ("sim", 2, 1)
    spec = sim.ray.spec(1, "10.0.0.7", [4001], (3,))
    assert spec.url == "http://10.0.0.7:4001" and spec.gpus == (3,) and spec.name == "worker-1"
    assert spec.argv[spec.argv.index("--host") + 1] == "10.0.0.7"

    sglang = build_plan(LaunchOptions(ray_address="auto", model="org/model", tp=2, port=0))
    assert sglang.ray is not None and sglang.ray.engine == "sglang" and sglang.ray.workers is None
    assert sglang.ray.gpus_per_worker == 2 and sglang.ray.ports_per_worker == 2
    server = sglang.ray.spec(0, "10.0.0.8", [5000, 5001], (2, 3))
    env = dict(server.env)
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert server.extension_url == "http://10.0.0.8:5001"
    plugin = config_from_env(env)
    assert plugin is not None
    assert (plugin.extension_host, plugin.extension_port) == ("10.0.0.8", 5001)


def test_missing_ray_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    result = CliRunner().invoke(app, ["launch", "--ray", "auto", "--engine", "sim", "--dry-run"])
    failure = classify(result.exception or Exception("no error"))
    assert failure.code == ExitCode.ERROR and not failure.internal, failure
    assert "pip install 'fairserve[ray]'" in failure.message


def test_engine_host_restarts_its_engine_and_reports_it(tmp_path: Path) -> None:
    """The actor's logic, run here without Ray: start, a crash seen and restarted with the
    local launch's backoff, the report the supervisor writes to the run file, stop."""
    host = EngineHost(str(tmp_path / "logs"), "token")
    argv = (sys.executable, "-c", "import time; time.sleep(60)")
    started = host.start(WorkerSpec("worker-0", 1, argv, host="10.0.0.9"))
    assert started["state"] == "running" and started["pid"] and started["restarts"] == 0
    assert host.poll() is None
    os.kill(started["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 10.0
    report = host.check()
    messages = list(report["messages"])
    while not (report["state"] == "running" and report["restarts"] == 1):
        assert time.monotonic() < deadline, report
        time.sleep(0.1)
        report = host.check()
        messages += report["messages"]
    assert report["pid"] not in (None, started["pid"])
    assert any("exited with status -9; restarting" in line for line in messages), messages
    assert any("restarted (pid" in line for line in messages), messages
    host.stop(5.0)
    assert host.poll() is not None


def test_workers_beyond_loopback_are_named_for_the_token_warning() -> None:
    specs = [
        WorkerSpec("worker-0", 1, ("x",), host="10.0.0.2"),
        WorkerSpec("worker-1", 2, ("x",), host="127.0.0.1"),
        WorkerSpec("worker-2", 3, ("x",), host="10.0.0.2"),
    ]
    assert non_loopback_hosts(specs) == ["10.0.0.2"]
    assert non_loopback_hosts(specs[1:2]) == []
