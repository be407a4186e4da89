"""Running a launch: in the foreground, or as the detached background supervisor.

Both paths share :func:`supervise`, so ``launch`` and ``launch --detach`` start, restart and
stop processes identically; they differ only in where the status goes (the terminal, or the
run directory's ``supervisor.log``).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable
from pathlib import Path

from fairserve.cluster import runfile
from fairserve.cluster.options import LaunchOptions
from fairserve.cluster.paths import new_run_dir
from fairserve.cluster.plan import LaunchPlan, build_plan
from fairserve.cluster.supervisor import Supervisor
from fairserve.cluster.view import StatusView

OPTIONS_FILE = "launch.json"


def run_foreground(options: LaunchOptions, note: Callable[[str], None]) -> None:
    """``fairserve launch``: validate, start, show status until Ctrl-C/SIGTERM, stop."""
    runfile.refuse_if_running()
    plan = build_plan(options)
    if plan.notice:
        note(plan.notice)
    with StatusView() as view:
        asyncio.run(supervise(plan, new_run_dir(), view, detached=False))


def run_detached_child(run_dir: Path) -> None:
    """``fairserve launch --supervise RUNDIR``: the background supervisor of ``--detach``."""
    options = LaunchOptions.load(run_dir / OPTIONS_FILE)
    plan = build_plan(options)
    with StatusView(live=False) as view:
        asyncio.run(supervise(plan, run_dir, view, detached=True))


async def supervise(plan: LaunchPlan, run_dir: Path, view: StatusView, detached: bool) -> None:
    """Start, watch until SIGINT/SIGTERM, stop; a signal during start aborts the start."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    supervisor = Supervisor(plan, run_dir, view.log, detached)
    try:
        if not await _start_or_stop(supervisor, stop):
            view.log("stopped before the service was up")
            return
        info = supervisor.info
        assert info is not None
        view.log(
            f"router listening on {info.router_url} ({len(info.workers)} workers, "
            f"engine {info.engine}, policy {info.policy}, dispatch {info.dispatch}, "
            f"identity {_auth_mode(plan)}; logs in {run_dir})"
        )
        if (exposed := plan.router.exposure_warning()) is not None:
            view.log(f"warning: {exposed}")
        view.ready(supervisor, info.router_url)
        await supervisor.watch(stop, view.tick)
        view.log("stopping")
    finally:
        await supervisor.shutdown()


async def _start_or_stop(supervisor: Supervisor, stop: asyncio.Event) -> bool:
    """Start, unless a stop signal comes first (then cancel the start: it cleans up)."""
    start = asyncio.create_task(supervisor.start())
    stopped = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait({start, stopped}, return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    if start in done:
        start.result()
        return True
    start.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await start
    return False


def _auth_mode(plan: LaunchPlan) -> str:
    """Which identities the router honours (``router.identity``), said at launch."""
    from fairserve.router.identity import auth_mode

    return auth_mode(plan.router.clients, plan.router.trust_identity_header)
