"""The supervisor with real processes: start errors name the worker and its log; crashed
workers come back with backoff."""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from fairserve.cluster import runfile
from fairserve.cluster.health import WorkerUnreachable
from fairserve.cluster.options import LaunchOptions
from fairserve.cluster.plan import build_plan
from fairserve.cluster.supervisor import Supervisor
from fairserve.cluster.worker_spec import WorkerSpec
from fairserve.cluster.workers import ManagedWorker, backoff_s, worker_env
from fairserve.core.errors import FairserveError

CRASH = (sys.executable, "-c", "import sys; print('boom: no GPU'); sys.exit(3)")
SILENT = (sys.executable, "-c", "import time; time.sleep(30)")


def test_backoff_doubles_up_to_a_cap() -> None:
    assert [backoff_s(n) for n in (1, 2, 3, 4)] == [0.5, 1.0, 2.0, 4.0]
    assert backoff_s(50) == 30.0


def _plan_with(argv: tuple[str, ...], timeout_s: float = 10.0):  # type: ignore[no-untyped-def]
    plan = build_plan(LaunchOptions(engine="sim", port=0, workers=1))
    spec = replace(plan.workers[0], argv=argv)
    return replace(plan, workers=(spec,), ready_timeout_s=timeout_s)


def test_worker_that_exits_at_start_is_named_with_its_log(tmp_path: Path) -> None:
    supervisor = Supervisor(_plan_with(CRASH), tmp_path, log=lambda _: None)
    with pytest.raises(FairserveError) as caught:
        asyncio.run(supervisor.start())
    message = str(caught.value)
    assert "worker-0" in message and "status 3" in message
    assert str(tmp_path / "worker-0.log") in message and "boom: no GPU" in message
    assert runfile.read() is None


def test_silent_worker_times_out_as_unreachable_and_is_stopped(tmp_path: Path) -> None:
    supervisor = Supervisor(_plan_with(SILENT, timeout_s=0.5), tmp_path, log=lambda _: None)
    with pytest.raises(WorkerUnreachable, match=r"worker-0 .* did not answer /health"):
        asyncio.run(supervisor.start())
    assert supervisor.workers[0].exit_code() is not None  # stopped, not leaked


def test_crashed_worker_restarts_with_backoff(tmp_path: Path) -> None:
    spec = WorkerSpec("worker-0", 1, CRASH)
    worker = ManagedWorker(spec, tmp_path / "w.log", worker_env("t"))
    events: list[str] = []
    worker.start()
    assert worker.proc is not None and worker.proc.wait(timeout=10) == 3
    start = time.monotonic()
    assert not worker.check(start, events.append)  # notices the exit, schedules
    assert worker.restart_at_s == pytest.approx(start + 0.5)
    assert not worker.check(start + 0.1, events.append)  # too early
    assert worker.check(start + 0.6, events.append)  # restarts
    assert worker.restarts == 1 and worker.proc.wait(timeout=10) == 3
    worker.check(time.monotonic(), events.append)
    assert "restarting in 1 s" in events[-1]  # second crash in a row: doubled
    assert "exited with status 3" in events[0] and "restarted" in events[1]
    assert (tmp_path / "w.log").read_text().count("boom") == 2
