"""Issue 22: ``fairserve launch --ray`` places simulated workers on a multi-node Ray cluster.

One cluster (head + two nodes of two logical GPUs, all on 127.0.0.1) serves the module;
each test launches its own service with ``--detach`` and stops it. The lost-node test
adds a third node and removes it, so it runs last.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import psutil
import pytest

from fairserve.bench import run_bench
from fairserve.cluster.options import LaunchOptions
from fairserve.cluster.plan import RayPlan, build_plan
from fairserve.cluster.ray_fleet import NodeLost
from fairserve.cluster.supervisor import Supervisor
from fairserve.cluster.worker_spec import WorkerSpec
from fairserve.core.errors import FairserveError
from fairserve.core.openai_api import CLIENT_HEADER
from fairserve.workloads.synthetic import loads_workload
from tests.e2e.helpers import SPEED, router_state, write_profile
from tests.e2e.test_fairness_e2e import (
    JAIN_TOLERANCE,
    LIGHT,
    LIGHT_P99_BOUND_S,
    TIMEOUT_S,
    WORKLOAD_TOML,
    _check_complete,
    _light_p99_s,
)
from tests.ray.conftest import require_ray
from tests.ray.rig import (
    NODE_GPUS,
    RayRig,
    engine_processes,
    fairserve,
    run_info,
    status,
    wait_for,
)
from tests.worker.processes import free_port

UNANSWERED = -1
UNCLEAR = -2
"""An error answer without an error document."""
LAUNCH = ("launch", "--engine", "sim", "--port", "0", "--detach")


def _launch(rig: RayRig, *args: str) -> dict[str, Any]:
    done = fairserve(*LAUNCH, "--ray", rig.address, "--json", *args)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert isinstance(data, dict)
    return data


def _stop_and_check_nothing_left(rig: RayRig) -> None:
    """``stop``, then Ray's state API and the process table: nothing of the run remains."""
    info = run_info()
    run_id = Path(info.run_dir).name
    urls = [w.url for w in info.workers]
    done = fairserve("stop")
    assert done.returncode == 0, done.stderr
    wait_for(lambda: not any(rig.leftovers(run_id).values()), 20.0, f"{run_id} left in Ray")
    assert rig.leftovers(run_id) == {"actors": [], "placement_groups": []}
    wait_for(lambda: not engine_processes(urls), 10.0, "engine processes gone")
    assert not psutil.pid_exists(info.supervisor_pid) or (
        psutil.Process(info.supervisor_pid).status() == psutil.STATUS_ZOMBIE
    )
    assert fairserve("status").returncode == 3  # nothing runs: status says so


def test_dry_run_shows_the_placement_and_starts_nothing(rig: RayRig) -> None:
    done = fairserve("launch", "--ray", rig.address, "--engine", "sim", "--dry-run", "--json")
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    workers = plan["workers"]
    assert [w["name"] for w in workers] == ["worker-0", "worker-1"]
    assert len({w["node"] for w in workers}) == 2, "spread over the two GPU nodes"
    assert {w["node"] for w in workers} == {n.node_id for n in rig.nodes}
    assert all(w["gpus"] == 1 and w["node_address"] == "127.0.0.1" for w in workers)
    assert all(w["argv"][3:6] == ["worker", "--host", "127.0.0.1"] for w in workers)
    assert all("FAIRSERVE_ADMIN_TOKEN" in w["env"] for w in workers)
    assert plan["ray"]["ray_address"] == rig.address
    assert sorted(n["free_gpus"] for n in plan["ray"]["nodes"]) == [0, NODE_GPUS, NODE_GPUS]

    text = fairserve("launch", "--ray", rig.address, "--engine", "sim", "--dry-run")
    assert text.returncode == 0, text.stderr
    assert text.stdout.startswith(f"# Ray cluster {rig.address}\n")
    assert text.stdout.count(", 1 GPU(s), http://127.0.0.1:0") == 2
    assert rig.live_actors() == [], "the dry run started an actor"
    assert fairserve("status").returncode == 3


def test_dry_run_of_sglang_workers_shows_their_gpus_and_plugin(rig: RayRig) -> None:
    done = fairserve(
        "launch", "--ray", rig.address, "--model", "org/m", "--tp", "2", "--dry-run", "--json"
    )
    assert done.returncode == 0, done.stderr
    workers = json.loads(done.stdout)["workers"]
    assert len(workers) == len(rig.nodes) and all(w["gpus"] == 2 for w in workers)
    assert {w["node"] for w in workers} == {n.node_id for n in rig.nodes}
    for worker in workers:
        assert worker["env"]["CUDA_VISIBLE_DEVICES"] == "<the GPU ids Ray assigns on the node>"
        assert worker["env"]["SGLANG_PLUGINS"] == "fairserve"
        assert worker["argv"][worker["argv"].index("--tp-size") + 1] == "2"


def test_a_killed_supervisor_leaves_nothing_on_the_cluster(rig: RayRig) -> None:
    """Ray removes the actors and placement groups of a driver that died, and each engine
    dies with its actor: nothing outlives even a SIGKILL-ed launch."""
    _launch(rig)
    info = run_info()
    run_id, urls = Path(info.run_dir).name, [w.url for w in info.workers]
    assert len(rig.leftovers(run_id)["actors"]) == 2 and len(engine_processes(urls)) == 2
    psutil.Process(info.supervisor_pid).send_signal(signal.SIGKILL)
    wait_for(lambda: not any(rig.leftovers(run_id).values()), 60.0, f"{run_id} left in Ray")
    wait_for(lambda: not engine_processes(urls), 20.0, "engine processes gone")
    assert fairserve("stop").returncode == 3  # nothing runs (the stale run file is removed)


def test_too_few_gpus_is_refused_with_what_is_free_where(rig: RayRig) -> None:
    done = fairserve("launch", "--ray", rig.address, "--engine", "sim", "--workers", "5")
    assert done.returncode == 1, done.stderr
    assert "not enough GPUs on the Ray cluster for 5 workers of 1 GPU(s)" in done.stderr
    assert "(room for 4)" in done.stderr
    for node in rig.nodes:
        assert f"127.0.0.1 ({node.node_id[:8]}): 2 of 2 free" in done.stderr
    sglang = fairserve("launch", "--ray", rig.address, "--model", "m", "--tp", "3", "--dry-run")
    assert sglang.returncode == 1, sglang.stderr
    assert "for a worker of 3 GPU(s) each on one node" in sglang.stderr


def test_unreachable_cluster_exits_3(monkeypatch: pytest.MonkeyPatch) -> None:
    require_ray()
    address = f"127.0.0.1:{free_port()}"
    for extra in ((), ("--dry-run",)):
        done = fairserve("launch", "--ray", address, "--engine", "sim", *extra, timeout_s=60)
        assert done.returncode == 3, done.stderr
        assert f"no Ray cluster at {address}" in done.stderr
    monkeypatch.setenv("RAY_ADDRESS", address)  # auto: RAY_ADDRESS first
    done = fairserve("launch", "--ray", "auto", "--engine", "sim", "--dry-run", timeout_s=60)
    assert done.returncode == 3, done.stderr
    assert f"no Ray cluster at {address}" in done.stderr


def _complete(url: str, client: str = "c0", prompt: str = "hello there") -> int:
    """One completion as ``client``; its HTTP status (an error answer is a status too)."""
    body = json.dumps({"model": "m", "prompt": prompt, "max_tokens": 4}).encode()
    headers = {"Content-Type": "application/json", CLIENT_HEADER: client}
    request = urllib.request.Request(url + "/v1/completions", data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30.0) as resp:
            json.loads(resp.read())
            return int(resp.status)
    except urllib.error.HTTPError as exc:  # a clear error: OpenAI's {"error": {...}} body
        try:
            clear = "message" in json.loads(exc.read())["error"]
        except (ValueError, KeyError, TypeError):
            clear = False
        return int(exc.code) if clear else UNCLEAR


def _burst(url: str, count: int) -> list[int]:
    """``count`` requests from eight clients, eight at a time."""
    with ThreadPoolExecutor(max_workers=8) as pool:
        return list(
            pool.map(lambda i: _complete(url, f"c{i % 8}", f"request {i} " * 50), range(count))
        )


def test_workers_on_two_nodes_serve_restart_and_stop_cleanly(rig: RayRig) -> None:
    # Round-robin so that light traffic reaches both workers (DoubleQ keeps a client on one
    # worker until its worker quantum is spent; the fairness test below saturates both).
    launched = _launch(rig, "--dispatch", "round-robin")
    url = launched["router_url"]
    data = status()
    assert data["ray_address"] == rig.address
    nodes = {w["node"] for w in data["workers"]}
    assert nodes == {n.node_id for n in rig.nodes}, "one worker on each GPU node"
    assert all(w["healthy"] and w["state"] == "running" and w["pid"] for w in data["workers"])
    assert all(len(w["gpus"]) == 1 for w in data["workers"])

    assert _burst(url, 40) == [200] * 40
    served = {w["url"]: w["finished"] for w in router_state(url)["workers"]}
    assert all(count > 0 for count in served.values()), served  # through both nodes

    victim = data["workers"][0]
    psutil.Process(victim["pid"]).send_signal(signal.SIGKILL)

    def restarted() -> dict[str, Any] | None:
        now = {w["name"]: w for w in status()["workers"]}[victim["name"]]
        fresh = now["restarts"] == 1 and now["pid"] not in (None, victim["pid"])
        return now if fresh and now["healthy"] and now["state"] == "running" else None

    back = wait_for(restarted, 20.0, "the killed worker restarted on its node")
    assert back["url"] == victim["url"] and back["node"] == victim["node"]
    routed = wait_for(
        lambda: all(w["routed"] for w in status()["workers"]), 20.0, "the router reinstated it"
    )
    assert routed
    assert _burst(url, 16) == [200] * 16
    _stop_and_check_nothing_left(rig)


def test_fairness_end_to_end_through_workers_on_ray(rig: RayRig, tmp_path: Path) -> None:
    """The e2e fairness test's fair half (doubleq + dlpm), its workers on two Ray nodes."""
    profile = write_profile(tmp_path)
    launched = _launch(rig, "--speed", f"{SPEED:g}", "--profile", str(profile), "--policy", "dlpm")
    url = launched["router_url"]
    try:
        workload = loads_workload(WORKLOAD_TOML, "e2e-flood.toml")
        report = run_bench(url, workload, timeout_s=TIMEOUT_S, max_in_flight=1024)
        state = router_state(url)
    finally:
        _stop_and_check_nothing_left(rig)
    assert state["router"]["dispatch"] == "doubleq"
    assert all(w["finished"] > 0 for w in state["workers"]), state["workers"]  # both nodes
    _check_complete(report, state)
    assert _light_p99_s(report) < LIGHT_P99_BOUND_S, report["clients"]
    assert state["jain_index"] == pytest.approx(
        report["fairness"]["jain_index"], abs=JAIN_TOLERANCE
    )
    for name in LIGHT:
        assert state["clients"][name]["finished"] == report["clients"][name]["requests"]


SILENT_MARKER = f"fairserve-silent-engine-{uuid.uuid4().hex}"


@dataclass(frozen=True)
class SilentRayPlan(RayPlan):
    """Workers whose engine never answers ``/health`` (``sleep``): the start waits on them
    for as long as the test needs to remove a node under it."""

    def spec(
        self, index: int, host: str, ports: Sequence[int], gpus: tuple[int, ...]
    ) -> WorkerSpec:
        argv = (sys.executable, "-c", "import time; time.sleep(120)", SILENT_MARKER)
        return replace(super().spec(index, host, ports, gpus), argv=argv)


def test_node_lost_during_start_fails_the_launch_and_leaves_nothing(
    rig: RayRig, tmp_path: Path
) -> None:
    extra = rig.add_node(NODE_GPUS)
    try:
        options = LaunchOptions(ray_address=rig.address, engine="sim", workers=3, port=0)
        plan = build_plan(options)
        assert plan.ray is not None
        plan = replace(plan, ray=SilentRayPlan(**vars(plan.ray)), ready_timeout_s=90.0)
        run_id = "lost-at-start"
        supervisor = Supervisor(plan, tmp_path / run_id, lambda line: None)

        async def start_and_remove() -> BaseException:
            start = asyncio.create_task(supervisor.start())

            def alive() -> bool:
                return sum(a.endswith("ALIVE") for a in rig.leftovers(run_id)["actors"]) == 3

            await asyncio.to_thread(wait_for, alive, 60.0, "three actors alive")
            await asyncio.to_thread(rig.remove_node, extra)
            try:
                await asyncio.wait_for(start, 60.0)
            except FairserveError as exc:
                return exc
            raise AssertionError("the start succeeded without its node")

        error = asyncio.run(start_and_remove())
    finally:
        if extra in rig.nodes:
            rig.remove_node(extra)
    assert isinstance(error, NodeLost), error
    assert f"node 127.0.0.1 ({extra.node_id[:8]}) was lost while starting" in str(error)
    wait_for(lambda: not any(rig.leftovers(run_id).values()), 30.0, "nothing left in Ray")

    def silent() -> list[psutil.Process]:
        procs = psutil.process_iter(["cmdline"])
        return [p for p in procs if SILENT_MARKER in (p.info["cmdline"] or [])]

    wait_for(lambda: not silent(), 10.0, "the engines of the failed start gone")


def test_lost_node_is_reported_and_no_request_is_lost(rig: RayRig) -> None:
    extra = rig.add_node(NODE_GPUS)
    launched = _launch(rig, "--workers", "3")
    url = launched["router_url"]
    workers = {w["node"]: w for w in status()["workers"]}
    assert set(workers) == {n.node_id for n in rig.nodes}, "one worker per node"
    doomed = workers[extra.node_id]

    codes: Counter[int] = Counter()
    stop = threading.Event()

    def load(client: str) -> None:  # one request at a time per client, until ``stop``
        while not stop.is_set():
            try:
                codes[_complete(url, client)] += 1
            except OSError:  # no answer at all (refused, reset, timed out): a lost request
                codes[UNANSWERED] += 1

    threads = [threading.Thread(target=load, args=(f"c{i}",)) for i in range(3)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(1.0)
        rig.remove_node(extra)

        def lost() -> dict[str, Any] | None:
            now = {w["name"]: w for w in status()["workers"]}
            gone = now[doomed["name"]]
            ejected = not gone["healthy"] and not gone["routed"]  # the router ejected it
            return now if gone["state"] == "lost" and ejected else None

        now = wait_for(lost, 60.0, "the worker on the removed node reported lost and ejected")
        assert now[doomed["name"]]["pid"] is None
        others = [w for name, w in now.items() if name != doomed["name"]]
        assert all(w["state"] == "running" and w["healthy"] for w in others)
        time.sleep(1.0)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
    # Requests in flight on the lost worker are retried elsewhere or answered with an error
    # status (at most one per client: each has one request in flight); none goes unanswered.
    assert all(not thread.is_alive() for thread in threads)
    assert codes[UNANSWERED] == codes[UNCLEAR] == 0 and codes[200] > 0, codes
    assert sum(n for code, n in codes.items() if code != 200) <= len(threads), codes
    assert _burst(url, 16) == [200] * 16
    _stop_and_check_nothing_left(rig)
