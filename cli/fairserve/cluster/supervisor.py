"""The supervisor: starts the workers, then the router, keeps the workers alive, stops all.

The router runs *in* the supervisor's process (a :class:`RouterServer` on its event loop),
not as a third kind of subprocess: the router is the service's front door, so if it dies the
service is down whatever a supervisor would do, and one process fewer means one less
thing to restart, signal and leave behind. It also binds its port in-process, so "address
already in use" and ``--port 0`` (the bound port goes straight into the run file) need no
log scraping. Workers are separate processes because they are the parts that crash (real
GPUs, OOMs) and restarting one must not drop the router's state.

Stop order matters: the router drains first (in-flight requests finish on live workers),
then the workers get SIGTERM, then SIGKILL after a timeout, then the run file goes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp

from fairserve.cluster import runfile
from fairserve.cluster.health import wait_healthy
from fairserve.cluster.plan import LaunchPlan
from fairserve.cluster.runfile import RunInfo, WorkerEntry
from fairserve.cluster.worker_spec import WorkerSpec
from fairserve.cluster.workers import ManagedWorker, worker_env
from fairserve.router.server import RouterServer
from fairserve.router.state import snapshot

if TYPE_CHECKING:
    from fairserve.cluster.ray_fleet import RayFleet

WATCH_INTERVAL_S = 0.2
WORKER_STOP_TIMEOUT_S = 10.0

Log = Callable[[str], None]


class Supervisor:
    """One launch: its workers, its router and its run file."""

    def __init__(self, plan: LaunchPlan, run_dir: Path, log: Log, detached: bool = False) -> None:
        self.plan = plan
        self.run_dir = run_dir
        self.log = log
        self.detached = detached
        token = plan.router.admin_token or ""
        self.workers = [
            ManagedWorker(spec, run_dir / f"{spec.name}.log", worker_env(token))
            for spec in plan.workers
        ]
        self.fleet: RayFleet | None = None
        """``--ray``: the workers on the Ray cluster (``workers`` is then empty)."""
        self.router: RouterServer | None = None
        self.info: RunInfo | None = None

    async def start(self) -> RunInfo:
        """Bring everything up and write the run file; on failure nothing is left running."""
        runfile.refuse_if_running()
        try:
            config = self.plan.router
            if self.plan.ray is not None:
                specs = await self._start_ray()
                config = replace(
                    config,
                    worker_urls=tuple(s.url for s in specs),
                    extension_urls={s.url: s.extension_url for s in specs if s.extension_port},
                )
            else:
                await self._start_workers()
            self.router = RouterServer(config)
            url = await self.router.start()
        except BaseException:
            await self.shutdown()
            raise
        self.info = self._run_info(url)
        runfile.write(self.info)
        return self.info

    async def _start_workers(self) -> None:
        for worker in self.workers:
            worker.start()
            self.log(f"{worker.spec.name}: started (pid {worker.pid}, {worker.spec.url})")
        async with aiohttp.ClientSession() as session:
            waits = [
                wait_healthy(
                    session, w.spec.name, w.spec.url, self.plan.ready_timeout_s,
                    w.exit_code, w.log_path,
                )
                for w in self.workers
            ] + [
                wait_healthy(session, url, url, self.plan.ready_timeout_s)
                for url in self.plan.remote_urls
            ]  # fmt: skip
            await asyncio.gather(*waits)

    async def _start_ray(self) -> list[WorkerSpec]:
        """Place and start the workers on the Ray cluster; what they run, with the URLs
        they reported (the router fronts those)."""
        from fairserve.cluster.ray_fleet import RayFleet, non_loopback_hosts

        assert self.plan.ray is not None
        token = self.plan.router.admin_token or ""
        self.fleet = RayFleet(
            self.plan.ray, token, self.run_dir, self.plan.ready_timeout_s, self.log
        )
        await self.fleet.start()
        specs = self.fleet.specs
        if hosts := non_loopback_hosts(specs):
            self.log(
                f"workers listen beyond loopback ({', '.join(hosts)}): every write to them "
                "(quantum, weights, abort, flush) needs the admin token, which only the router "
                "holds"
            )
        return specs

    def _run_info(self, url: str) -> RunInfo:
        cfg = self.plan.router
        pid = os.getpid()
        return RunInfo(
            router_url=url,
            admin_token=cfg.admin_token or "",
            supervisor_pid=pid,
            supervisor_create_time=runfile.process_create_time(pid) or 0.0,
            engine=self.plan.engine,
            policy=cfg.policy,
            dispatch=cfg.dispatch,
            quantum=cfg.quantum,
            worker_quantum=cfg.worker_quantum,
            run_dir=str(self.run_dir),
            workers=self._entries(),
            detached=self.detached,
            ray_address=self.fleet.address if self.fleet is not None else None,
        )

    def _entries(self) -> list[WorkerEntry]:
        remote = [WorkerEntry(name=url, url=url, managed=False) for url in self.plan.remote_urls]
        placed = self.fleet.entries() if self.fleet is not None else []
        return [w.entry() for w in self.workers] + placed + remote

    async def watch(self, stop: asyncio.Event, tick: Callable[[], None] | None = None) -> None:
        """Restart crashed workers until ``stop`` is set; keep the run file current."""
        while not stop.is_set():
            changed = False
            for worker in self.workers:
                changed |= worker.check(time.monotonic(), self.log)
            if self.fleet is not None:
                changed |= await self.fleet.check()
            if changed and self.info is not None:
                self.info.workers = self._entries()
                runfile.write(self.info)
            if tick is not None:
                tick()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), WATCH_INTERVAL_S)

    async def shutdown(self) -> None:
        """Drain the router, stop the workers (SIGTERM, then SIGKILL), drop the run file."""
        if self.router is not None:
            await self.router.stop()
            self.router = None
        for worker in self.workers:
            worker.terminate()
        deadline_s = time.monotonic() + WORKER_STOP_TIMEOUT_S
        await asyncio.gather(*(asyncio.to_thread(w.wait_or_kill, deadline_s) for w in self.workers))
        if self.fleet is not None:
            await self.fleet.stop()
        if self.info is not None:
            runfile.remove(owner_pid=self.info.supervisor_pid)
            self.info = None

    def router_state(self) -> dict[str, Any] | None:
        """The router's state document (what ``/fairserve/v1/state`` serves), read in
        process for the live view; None before the router is up."""
        if self.router is None:
            return None
        return snapshot(self.router.router, self.info.router_url if self.info else None)

    def worker_rows(self) -> list[tuple[str, str, str, int]]:
        """(name, url, state, restarts) for the live view."""
        rows = []
        for w in self.workers:
            state = f"pid {w.pid}" if w.exit_code() is None else "restarting"
            rows.append((w.spec.name, w.spec.url, state, w.restarts))
        rows += self.fleet.rows() if self.fleet is not None else []
        return rows + [(url, url, "remote", 0) for url in self.plan.remote_urls]
