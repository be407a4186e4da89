"""``launch --ray``: the workers on a Ray cluster, one placement group and one actor each.

fairserve does not grow its own remote process manager: Ray already knows the nodes and
their GPUs. For each worker of the plan (:mod:`ray_placement`) the supervisor creates a
placement group pinned to the planned node with the worker's GPUs, and in it a small actor,
:class:`EngineHost`, which starts the engine process on that node (``fairserve worker``, or
SGLang with the plugin's environment exactly as a local launch builds it), with
``CUDA_VISIBLE_DEVICES`` set from the GPUs Ray assigned the actor, listening on the node's
address, and reports the URL. The router keeps running where ``launch`` runs.

Supervision is one mechanism, the supervisor's, as for local workers: every tick it asks
each actor to :meth:`EngineHost.check` its process, and the actor restarts a crashed one
with the same :class:`ManagedWorker` backoff a local launch uses. Ray's own actor restart
is off (``max_restarts=0``): a restarted actor would come back on another node with another
URL the router does not know. So when a *node* dies, its workers are reported lost (the run
file, ``status``) and the router ejects them; they are not moved. If the supervisor itself
dies, Ray removes its actors and placement groups (they belong to its job), and each engine
process dies with its actor (``PR_SET_PDEATHSIG``).

Ray is imported only in this module, and only when a function here runs: a host without
it gets an error naming the extra to install.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import logging
import os
import socket
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from fairserve.cluster.health import wait_healthy
from fairserve.cluster.paths import ensure_private_dir
from fairserve.cluster.plan import RayPlan
from fairserve.cluster.ray_placement import NodeCapacity, Placement, place
from fairserve.cluster.runfile import WorkerEntry
from fairserve.cluster.worker_spec import WorkerSpec, free_ports
from fairserve.cluster.workers import ManagedWorker, worker_env
from fairserve.core.errors import FairserveError

NAMESPACE = "fairserve"
"""Ray namespace of every actor a launch creates (their names start with the run's id)."""
RAY_INSTALL = "pip install 'fairserve[ray]'"
PROBE_TIMEOUT_S = 5.0
PLACEMENT_TIMEOUT_S = 60.0
CALL_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 10.0
ACTOR_CPUS = 0.01
"""The actor only starts and watches a process: it must not take a CPU a node has for work."""
NODE_ID_LABEL = "ray.io/node-id"

Log = Callable[[str], None]


class RayMissing(FairserveError):
    """Ray is not installed where ``launch --ray`` runs."""


class RayUnreachable(ConnectionError):
    """No Ray cluster answers at the address (a ConnectionError: exit code 3)."""


class NodeLost(FairserveError):
    """A node died while its worker was starting."""


def import_ray() -> Any:
    """The ``ray`` module, or :class:`RayMissing` saying which extra to install."""
    return _module("ray")


def _module(name: str) -> Any:
    """A module of Ray, imported by name: typed ``Any`` so that the type checker passes
    on hosts without Ray (it is an optional extra)."""
    try:
        return importlib.import_module(name)
    except ImportError:
        raise RayMissing(f"--ray needs Ray on this host and on every node: {RAY_INSTALL}") from None


def connect(address: str) -> Any:
    """Join the cluster at ``address`` (``auto``: ``RAY_ADDRESS`` or the cluster started on
    this host) as a driver; :class:`RayUnreachable` when none answers.

    An explicit ``HOST:PORT`` is probed first: ``ray.init`` would retry an address nobody
    listens on for minutes."""
    ray = import_ray()
    if ray.is_initialized():
        return ray
    target = os.environ.get("RAY_ADDRESS", "auto") if address == "auto" else address
    _probe(target)
    try:
        ray.init(
            address=address,
            namespace=NAMESPACE,
            log_to_driver=False,
            logging_level=logging.ERROR,
        )
    except ConnectionError as exc:
        raise RayUnreachable(f"no Ray cluster at {address}: {exc}") from None
    return ray


def _probe(address: str) -> None:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or "://" in address:
        return
    try:
        socket.create_connection((host, int(port)), timeout=PROBE_TIMEOUT_S).close()
    except OSError as exc:
        raise RayUnreachable(f"no Ray cluster at {address}: {exc}") from None


def cluster_address(ray: Any) -> str:
    """The cluster's GCS address, as later commands reach it (the run file records it)."""
    return str(ray.get_runtime_context().gcs_address)


def cluster_nodes(ray: Any) -> list[NodeCapacity]:
    """The live nodes with their total and free GPUs, in Ray's order."""
    free: dict[str, dict[str, float]] = {}
    with contextlib.suppress(RayMissing, AttributeError):  # a Ray without it: the totals
        free = _module("ray._private.state").available_resources_per_node()
    nodes = []
    for node in ray.nodes():
        if not node.get("Alive"):
            continue
        total = float(node.get("Resources", {}).get("GPU", 0.0))
        available = free.get(node["NodeID"], {}).get("GPU", total) if free else total
        nodes.append(
            NodeCapacity(node["NodeID"], node["NodeManagerAddress"], total, float(available))
        )
    return nodes


def plan_workers(plan: RayPlan) -> tuple[Any, list[Placement]]:
    """Connect and place the workers (``--dry-run`` stops here)."""
    ray = connect(plan.address)
    return ray, place(cluster_nodes(ray), plan.workers, plan.gpus_per_worker)


class EngineHost:
    """The actor on a worker's node: starts the engine process there, watches it, stops it.

    Its methods run on the node, in the actor's process, so ``os.environ`` here is the
    node's environment (with ``CUDA_VISIBLE_DEVICES`` as Ray assigned it)."""

    def __init__(self, log_dir: str, admin_token: str) -> None:
        self.log_dir = Path(log_dir)
        self.admin_token = admin_token
        self.worker: ManagedWorker | None = None
        self.messages: list[str] = []

    def locate(self, port_count: int) -> dict[str, Any]:
        """Where the engine will run: the node, its address, free ports there, the GPUs."""
        ray = import_ray()
        host = str(ray.util.get_node_ip_address())
        return {
            "node_id": ray.get_runtime_context().get_node_id(),
            "host": host,
            "ports": free_ports(port_count, host),
            "gpus": [_gpu_id(g) for g in ray.get_gpu_ids()],
        }

    def start(self, spec: WorkerSpec) -> dict[str, Any]:
        log_path = ensure_private_dir(self.log_dir) / f"{spec.name}.log"
        self.worker = ManagedWorker(spec, log_path, worker_env(self.admin_token))
        self.worker.start()
        return self.report(changed=True)

    def poll(self) -> int | None:
        """The engine's exit status if it ended (no restart: during start a crash fails)."""
        return None if self.worker is None else self.worker.exit_code()

    def check(self) -> dict[str, Any]:
        """Restart a crashed engine with backoff (the local launch's rule)."""
        assert self.worker is not None
        changed = self.worker.check(time.monotonic(), self.messages.append)
        return self.report(changed)

    def report(self, changed: bool) -> dict[str, Any]:
        worker = self.worker
        assert worker is not None
        entry = worker.entry()
        messages, self.messages = self.messages, []
        restarting = worker.restart_at_s is not None
        return {
            "changed": changed,
            "messages": messages,
            "state": "restarting" if restarting else "running",
            "pid": None if restarting else entry.pid,
            "create_time": None if restarting else entry.create_time,
            "restarts": entry.restarts,
            "log": entry.log,
        }

    def stop(self, timeout_s: float) -> None:
        if self.worker is not None:
            self.worker.terminate()
            self.worker.wait_or_kill(time.monotonic() + timeout_s)


def _gpu_id(value: object) -> int:
    try:
        return int(str(value))
    except ValueError:
        return -1  # a GPU named by UUID: shown as -1, CUDA_VISIBLE_DEVICES keeps Ray's value


@dataclass
class RayWorker:
    """One placed worker as the supervisor sees it."""

    placement: Placement
    group: Any
    actor: Any = None
    spec: WorkerSpec | None = None
    report: dict[str, Any] = field(default_factory=dict)
    state: str = "starting"

    def entry(self) -> WorkerEntry:
        spec, report = self.spec, self.report
        return WorkerEntry(
            name=self.placement.name,
            url=spec.url if spec else "",
            pid=report.get("pid") if self.state == "running" else None,
            create_time=report.get("create_time"),
            log=report.get("log"),
            restarts=int(report.get("restarts", 0)),
            node=self.placement.node.node_id,
            gpus=list(spec.gpus) if spec else [],
            state=self.state,
        )


class RayFleet:
    """The workers of one ``launch --ray``: place, start, watch, stop."""

    def __init__(
        self, plan: RayPlan, admin_token: str, run_dir: Path, ready_timeout_s: float, log: Log
    ) -> None:
        self.plan = plan
        self.admin_token = admin_token
        self.run_dir = run_dir
        self.ready_timeout_s = ready_timeout_s
        self.log = log
        self.workers: list[RayWorker] = []
        self.address = plan.address
        self._ray: Any = None
        self._joined = False

    @property
    def specs(self) -> list[WorkerSpec]:
        return [w.spec for w in self.workers if w.spec is not None]

    async def start(self) -> None:
        """Place every worker, start its engine, wait until all answer ``/health``; on any
        failure everything started is removed again."""
        self._joined = not import_ray().is_initialized()  # else: this process's connection
        ray, placements = await asyncio.to_thread(plan_workers, self.plan)
        self._ray = ray
        self.address = cluster_address(ray)
        self.workers = [RayWorker(p, self._group(p)) for p in placements]
        await self._call_all(lambda w: w.group.ready(), PLACEMENT_TIMEOUT_S, "placing")
        for worker in self.workers:
            worker.actor = self._actor(worker)
        located = await self._call_all(
            lambda w: w.actor.locate.remote(self.plan.ports_per_worker), CALL_TIMEOUT_S, "starting"
        )
        for worker, where in zip(self.workers, located, strict=True):
            worker.spec = self.plan.spec(
                worker.placement.index, where["host"], where["ports"], tuple(where["gpus"])
            )
        reports = await self._call_all(
            lambda w: w.actor.start.remote(w.spec), CALL_TIMEOUT_S, "starting"
        )
        for worker, report in zip(self.workers, reports, strict=True):
            worker.report, worker.state = report, "running"
            self.log(
                f"{worker.placement.name}: started on node {worker.placement.node.label} "
                f"(GPUs {_gpus(worker)}, {_url(worker)}, pid {report['pid']} there)"
            )
        await self._wait_healthy()

    def _group(self, placement: Placement) -> Any:
        placement_group = _module("ray.util.placement_group").placement_group
        bundle = {"CPU": ACTOR_CPUS, **({"GPU": float(placement.gpus)} if placement.gpus else {})}
        name = f"{self.run_dir.name}-{placement.name}"
        try:
            return placement_group(
                [bundle],
                strategy="STRICT_PACK",
                name=name,
                bundle_label_selector=[{NODE_ID_LABEL: placement.node.node_id}],
            )
        except TypeError:  # a Ray before label selectors: the node as a soft target
            return placement_group(
                [bundle], strategy="STRICT_PACK", name=name,
                _soft_target_node_id=placement.node.node_id,
            )  # fmt: skip

    def _actor(self, worker: RayWorker) -> Any:
        """The worker's :class:`EngineHost`, in its placement group, with its GPUs; named
        after the run, so Ray's state API shows whose it is."""
        strategies = _module("ray.util.scheduling_strategies")
        placement, group = worker.placement, worker.group
        return (
            self._ray.remote(EngineHost)
            .options(
                name=f"{self.run_dir.name}-{placement.name}",
                namespace=NAMESPACE,
                num_cpus=ACTOR_CPUS,
                num_gpus=placement.gpus,
                max_restarts=0,
                scheduling_strategy=strategies.PlacementGroupSchedulingStrategy(group, 0),
            )
            .remote(str(self.run_dir), self.admin_token)
        )

    async def _call_all(
        self, call: Callable[[RayWorker], Any], timeout_s: float, doing: str
    ) -> list[Any]:
        """One remote call per worker, awaited together; a dead actor is a lost node."""

        async def one(worker: RayWorker) -> Any:
            try:
                return await asyncio.wait_for(_awaited(call(worker)), timeout_s)
            except TimeoutError:
                raise FairserveError(
                    f"{worker.placement.name}: Ray did not answer within {timeout_s:g} s while "
                    f"{doing} it on node {worker.placement.node.label}"
                ) from None
            except self._ray.exceptions.RayActorError as exc:
                raise NodeLost(
                    f"{worker.placement.name}: node {worker.placement.node.label} was lost "
                    f"while {doing} the worker ({_first_line(exc)})"
                ) from None

        return list(await asyncio.gather(*(one(w) for w in self.workers)))

    async def _wait_healthy(self) -> None:
        """Every worker answers ``/health``; a worker whose engine exits, or whose node is
        lost, fails the start at once."""
        exits: dict[str, int | None] = {}

        async def watch_exits() -> None:
            while True:
                codes = await self._call_all(
                    lambda w: w.actor.poll.remote(), CALL_TIMEOUT_S, "starting"
                )
                exits.update(
                    {w.placement.name: c for w, c in zip(self.workers, codes, strict=True)}
                )
                await asyncio.sleep(0.5)

        async with aiohttp.ClientSession() as session:
            waits = [
                wait_healthy(
                    session, w.placement.name, _url(w), self.ready_timeout_s,
                    functools.partial(exits.get, w.placement.name),
                    Path(str(w.report.get("log"))),
                )
                for w in self.workers
            ]  # fmt: skip
            await _first_failure(asyncio.gather(*waits), watch_exits())

    async def check(self) -> bool:
        """Ask every actor to check its engine; True when the run file needs rewriting."""
        live = [w for w in self.workers if w.state != "lost" and w.actor is not None]
        results = await asyncio.gather(
            *(asyncio.wait_for(_awaited(w.actor.check.remote()), CALL_TIMEOUT_S) for w in live),
            return_exceptions=True,
        )
        changed = False
        for worker, result in zip(live, results, strict=True):
            changed |= self._apply(worker, result)
        return changed

    def _apply(self, worker: RayWorker, result: object) -> bool:
        name = worker.placement.name
        dead = self._ray.exceptions.RayActorError
        if isinstance(result, dead) and not isinstance(
            result, self._ray.exceptions.ActorUnavailableError
        ):
            worker.state = "lost"
            self.log(
                f"{name}: lost with node {worker.placement.node.label} ({_first_line(result)}); "
                "not restarted (its URL would change); the router ejects it"
            )
            return True
        if isinstance(result, BaseException):  # no answer now (a timeout, a node unreachable)
            if worker.state == "unknown":
                return False  # said once; asked again every tick
            worker.state = "unknown"
            self.log(f"{name}: its actor does not answer ({_first_line(result)}); asking again")
            return True
        assert isinstance(result, dict)
        for message in result["messages"]:
            self.log(f"{message} (node {worker.placement.node.label})")
        state_changed = result["state"] != worker.state
        worker.report, worker.state = result, result["state"]
        return bool(result["changed"]) or state_changed

    def entries(self) -> list[WorkerEntry]:
        return [w.entry() for w in self.workers]

    def rows(self) -> list[tuple[str, str, str, int]]:
        """(name, url, state, restarts) for the live view."""
        rows = []
        for w in self.workers:
            where = f"node {w.placement.node.address}"
            state = f"pid {w.report.get('pid')} on {where}" if w.state == "running" else w.state
            rows.append((w.placement.name, _url(w), state, int(w.report.get("restarts", 0))))
        return rows

    async def stop(self) -> None:
        """Stop every engine (SIGTERM, then SIGKILL), kill the actors, remove the
        placement groups, leave the cluster: nothing of this launch stays on any node."""
        if self._ray is None:
            return
        ray = self._ray
        stops = [
            asyncio.wait_for(_awaited(w.actor.stop.remote(STOP_TIMEOUT_S)), STOP_TIMEOUT_S + 5)
            for w in self.workers
            if w.actor is not None and w.state != "lost"
        ]
        await asyncio.gather(*stops, return_exceptions=True)
        remove_placement_group = _module("ray.util.placement_group").remove_placement_group
        for worker in self.workers:
            if worker.actor is not None:
                ray.kill(worker.actor)
            remove_placement_group(worker.group)
        if self._joined:
            ray.shutdown()
        self._ray = None


async def _awaited(ref: Any) -> Any:
    return await ref


async def _first_failure(
    main: Coroutine[Any, Any, Any] | asyncio.Future[Any], side: Coroutine[Any, Any, None]
) -> None:
    """Run ``main`` to its end while ``side`` runs; ``side`` raising fails ``main``."""
    main_task = asyncio.ensure_future(main)
    side_task = asyncio.ensure_future(side)
    try:
        done, _ = await asyncio.wait({main_task, side_task}, return_when=asyncio.FIRST_COMPLETED)
        if side_task in done:
            side_task.result()
        await main_task
    finally:
        for task in (main_task, side_task):
            task.cancel()
        await asyncio.gather(main_task, side_task, return_exceptions=True)


def _url(worker: RayWorker) -> str:
    return worker.spec.url if worker.spec is not None else "-"


def _gpus(worker: RayWorker) -> str:
    gpus = worker.spec.gpus if worker.spec is not None else ()
    return ",".join(map(str, gpus)) or "none"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def non_loopback_hosts(specs: list[WorkerSpec]) -> list[str]:
    """The worker addresses beyond loopback (there every write needs the admin token)."""
    from fairserve.api.auth import is_loopback_host

    return sorted({s.host for s in specs if not is_loopback_host(s.host)})


PORT_AT_START = 0
"""``--dry-run`` shows port 0: each port is picked free on its node when the worker starts."""
GPUS_AT_START = "<the GPU ids Ray assigns on the node>"


def describe_placement(plan: RayPlan) -> dict[str, Any]:
    """``launch --ray --dry-run``: the cluster's nodes and, per worker, its node, GPU
    count, command and environment; reads the cluster, starts nothing on it."""
    from fairserve.cluster.ray_placement import describe_nodes
    from fairserve.cluster.workers import describe

    joined = not import_ray().is_initialized()
    ray = connect(plan.address)
    try:
        nodes = cluster_nodes(ray)
        placements = place(nodes, plan.workers, plan.gpus_per_worker)
        address = cluster_address(ray)
    finally:
        if joined:
            ray.shutdown()
    workers = []
    for p in placements:
        ports = [PORT_AT_START] * plan.ports_per_worker
        shown = describe(plan.spec(p.index, p.node.address, ports, ()))
        env = shown["env"]
        assert isinstance(env, dict)
        if "CUDA_VISIBLE_DEVICES" in env:
            env["CUDA_VISIBLE_DEVICES"] = GPUS_AT_START
        workers.append(
            {**shown, "node": p.node.node_id, "node_address": p.node.address, "gpus": p.gpus}
        )
    return {"ray_address": address, "nodes": describe_nodes(nodes), "workers": workers}
