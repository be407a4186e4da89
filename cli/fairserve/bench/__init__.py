"""``fairserve bench``: a workload's clients over real HTTP, reported like a simulation.

In-process use (tests, the end-to-end checks)::

    report = run_bench("http://127.0.0.1:8000", resolve_workload("vtc-constant"),
                       duration_s=10, api="chat")

or, inside a running event loop, ``await run_workload(url, workload, BenchOptions(...))``
then ``bench_report(result)``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fairserve.bench.client import Attempt
from fairserve.bench.prompts import APIS, Api
from fairserve.bench.report import bench_report, to_sim_result
from fairserve.bench.runner import (
    BenchOptions,
    BenchResult,
    ProgressFn,
    ProgressInfo,
    Unreachable,
    run_workload,
)
from fairserve.workloads.model import Workload


def run_bench(
    url: str, workload: Workload, progress: ProgressFn | None = None, **options: Any
) -> dict[str, Any]:
    """Run ``workload`` against ``url`` in a fresh event loop and return the §7 report;
    ``options`` are :class:`BenchOptions` fields."""
    result = asyncio.run(run_workload(url, workload, BenchOptions(**options), progress))
    return bench_report(result)


__all__ = [
    "APIS",
    "Api",
    "Attempt",
    "BenchOptions",
    "BenchResult",
    "ProgressFn",
    "ProgressInfo",
    "Unreachable",
    "bench_report",
    "run_bench",
    "run_workload",
    "to_sim_result",
]
