"""Ctrl-C during ``bench`` ends the run at once and still reports what was measured: calls
in flight count as still open (not errors) with the interruption as their reason, and the
command exits 130 after printing the report (it printed nothing before)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from typing import Any

from fairserve.bench import BenchOptions, bench_report, run_workload
from tests.bench.helpers import HANGING, scripted_upstream, single, worker_thread, workload
from tests.worker.helpers import run


def test_a_stop_event_ends_the_run_and_keeps_what_was_measured() -> None:
    load = workload(single("alice", 20) + single(HANGING, 5), duration_s=30.0)

    async def body() -> dict[str, Any]:
        async with scripted_upstream() as upstream:
            stop = asyncio.Event()
            asyncio.get_running_loop().call_later(0.5, stop.set)
            result = await run_workload(upstream.url, load, BenchOptions(timeout_s=20), stop=stop)
            return bench_report(result)

    started = time.monotonic()
    report = run(body())
    assert time.monotonic() - started < 5  # not the 30 s of arrivals nor 20 s of drain
    assert report["interrupted_s"] is not None and report["interrupted_s"] < 2
    assert report["clients"]["alice"]["requests"] >= 5
    assert report["errors"]["total"] == 0
    (reason,) = report["unfinished"]["reasons"]
    assert "interrupted" in reason and report["unfinished"]["by_client"][HANGING] >= 1


def test_ctrl_c_prints_the_report_and_exits_130() -> None:
    with worker_thread() as url:
        command = [sys.executable, "-m", "fairserve", "bench", "--url", url, "--workload",
                   "vtc-constant", "--duration", "60", "--json"]  # fmt: skip
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        time.sleep(4)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=30)
    assert process.returncode == 130, err
    assert '"interrupted_s"' in out and "Traceback" not in err
