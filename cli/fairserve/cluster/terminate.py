"""``fairserve stop``: ask the supervisor to stop, make sure, verify nothing is left.

SIGTERM first, because the supervisor then drains the router and stops its workers in the
right order. If it has not finished after the timeout, it and every process it started are
killed. Processes are identified by pid *and* creation time (see :mod:`runfile`), and their
children are collected before the first signal, so nothing escapes by being re-parented.
"""

from __future__ import annotations

import contextlib
import signal
import time
from dataclasses import dataclass

import psutil

from fairserve.cluster import runfile
from fairserve.cluster.errors import NotRunning
from fairserve.cluster.paths import run_file_path
from fairserve.cluster.runfile import RunInfo, same_process
from fairserve.core.errors import FairserveError


@dataclass(frozen=True)
class StopResult:
    router_url: str
    pids: list[int]
    killed: list[int]


def stop_run(timeout_s: float = 20.0) -> StopResult:
    """Stop the launch in the run file; raises NotRunning when there is none."""
    info = runfile.read()
    if info is None:
        raise NotRunning(f"nothing is running (no run file at {run_file_path()})")
    procs = _processes(info)
    if not procs:
        runfile.remove()
        raise NotRunning(f"nothing is running (removed the stale run file {run_file_path()})")
    supervisor = same_process(info.supervisor_pid, info.supervisor_create_time)
    _signal([supervisor] if supervisor is not None else procs, signal.SIGTERM)
    alive = _wait_gone(procs, timeout_s)
    _signal(alive, signal.SIGKILL)
    left = _wait_gone(alive, 5.0)
    if left:
        pids = ", ".join(str(p.pid) for p in left)
        raise FairserveError(f"could not stop process(es) {pids}")
    runfile.remove(owner_pid=info.supervisor_pid)
    return StopResult(info.router_url, [p.pid for p in procs], [p.pid for p in alive])


def _processes(info: RunInfo) -> list[psutil.Process]:
    """The supervisor, its workers and all their descendants that are still alive."""
    found: dict[int, psutil.Process] = {}
    roots = [same_process(info.supervisor_pid, info.supervisor_create_time)]
    roots += [same_process(w.pid, w.create_time) for w in info.workers if w.managed]
    for proc in roots:
        if proc is None:
            continue
        found[proc.pid] = proc
        with contextlib.suppress(psutil.Error):
            found.update({c.pid: c for c in proc.children(recursive=True)})
    return list(found.values())


def _wait_gone(procs: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Wait until every process has exited; the ones still alive after ``timeout_s``.

    A zombie counts as gone: it has exited and only waits for its parent (perhaps a shell
    that launched the foreground supervisor) to collect the status, which ``stop`` cannot do
    (``psutil.wait_procs`` would wait for it until the timeout).
    """
    deadline = time.monotonic() + timeout_s
    alive = [p for p in procs if _running(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if _running(p)]
    return alive


def _running(proc: psutil.Process) -> bool:
    try:
        return bool(proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def _signal(procs: list[psutil.Process], sig: int) -> None:
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(sig)
