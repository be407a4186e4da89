"""A multi-node Ray cluster on one host, and the ``fairserve`` commands run against it.

Everything here is real: raylets started by Ray's test utility, ``fairserve launch --ray``
as the operator runs it (a subprocess, ``--detach``), the run file it writes, Ray's state
API (through the head node's dashboard) and the process table for what is left behind.
Ray is imported by name (``importlib``) so that the type checker passes without it.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import psutil

from fairserve.cluster.runfile import RunInfo
from tests.worker.processes import free_port

NODE_GPUS = 2
NODES = 2
COMMAND_TIMEOUT_S = 120.0


@dataclass
class RayRig:
    """The cluster (``ray.cluster_utils.Cluster``), its GPU nodes, and this test process
    connected to it as a driver (for the state API)."""

    ray: Any
    cluster: Any
    nodes: list[Any] = field(default_factory=list)

    @classmethod
    @contextmanager
    def start(cls) -> Iterator[RayRig]:
        ray = importlib.import_module("ray")
        utils = importlib.import_module("ray.cluster_utils")
        head = {"num_cpus": 1, "include_dashboard": True, "dashboard_port": free_port()}
        cluster = utils.Cluster(initialize_head=True, head_node_args=head)
        rig = cls(ray, cluster)
        try:
            for _ in range(NODES):
                rig.add_node(NODE_GPUS)
            ray.init(address=cluster.address, log_to_driver=False, logging_level="error")
            yield rig
        finally:
            ray.shutdown()
            cluster.shutdown()

    @property
    def address(self) -> str:
        return str(self.cluster.address)

    def add_node(self, gpus: int) -> Any:
        node = self.cluster.add_node(num_cpus=1, num_gpus=gpus)
        self.cluster.wait_for_nodes()
        self.nodes.append(node)
        return node

    def remove_node(self, node: Any) -> None:
        self.cluster.remove_node(node)
        self.nodes.remove(node)

    def node_of(self, node_id: str) -> Any:
        return next(n for n in self.nodes if n.node_id == node_id)

    def live_actors(self) -> list[str]:
        """Every actor not dead, in any namespace (Ray's state API)."""
        state = importlib.import_module("ray.util.state")
        return [f"{a.name} {a.state}" for a in state.list_actors(limit=1000) if a.state != "DEAD"]

    def leftovers(self, run_id: str) -> dict[str, list[str]]:
        """This run's live actors and placement groups (Ray's state API), and any of its
        engine processes still in the process table."""
        state = importlib.import_module("ray.util.state")
        actors = [
            f"{a.name} {a.state}"
            for a in state.list_actors(limit=1000)
            if (a.name or "").startswith(run_id) and a.state != "DEAD"
        ]
        groups = [
            f"{g.name} {g.state}"
            for g in state.list_placement_groups(limit=1000)
            if (g.name or "").startswith(run_id) and g.state != "REMOVED"
        ]
        return {"actors": actors, "placement_groups": groups}


def fairserve(*args: str, timeout_s: float = COMMAND_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """Run the CLI as an operator would (the environment carries the XDG directories)."""
    env = {**os.environ, "NO_COLOR": "1"}
    env.pop("FAIRSERVE_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "fairserve", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
        check=False,
    )


def status() -> dict[str, Any]:
    done = fairserve("status", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert isinstance(data, dict)
    return data


def run_info() -> RunInfo:
    from fairserve.cluster import runfile

    info = runfile.read()
    assert info is not None, "no run file"
    return info


def engine_processes(urls: list[str]) -> list[psutil.Process]:
    """Live ``fairserve worker`` processes listening on the ports of ``urls``."""
    ports = {str(urlsplit(u).port) for u in urls}
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmdline = proc.info["cmdline"] or []
        if proc.info["status"] == psutil.STATUS_ZOMBIE or "worker" not in cmdline:
            continue
        if "fairserve" in cmdline and ports & set(cmdline):
            found.append(proc)
    return found


def wait_for(condition: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """Poll ``condition`` until it returns something true; fail naming ``what``."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = condition()
        if last:
            return last
        time.sleep(0.25)
    raise AssertionError(f"{what}: not within {timeout_s:g} s (last: {last!r})")
