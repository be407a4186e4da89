"""Timing helpers and the result table shared by the benchmarks.

Machines are noisy (shared CI runners, 2-core containers): every figure is a median over
repetitions, tails are p99 of per-operation samples, and comparisons are ratios taken in
the same run. Nothing here asserts a speed: these are benchmarks, not timed tests.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass

from fairserve.core.metrics import percentile


@dataclass(frozen=True, slots=True)
class Result:
    """One benchmark figure in ``unit``: the median, the best (minimum: the least disturbed
    by other load on the machine) and the p99 where per-operation samples exist."""

    bench: str
    case: str
    median: float
    best: float | None
    p99: float | None
    unit: str
    target: str = ""
    note: str = ""


def summarize(samples: list[float]) -> tuple[float, float, float]:
    """Median, minimum and p99 of per-operation samples."""
    return statistics.median(samples), min(samples), percentile(samples, 99)


def print_table(results: list[Result]) -> None:
    """A plain aligned table (no rich: tests/perf depends on nothing but the core)."""
    header = ("bench", "case", "median", "best", "p99", "unit", "target", "note")
    rows = [
        (
            r.bench,
            r.case,
            _fmt(r.median),
            "" if r.best is None else _fmt(r.best),
            "" if r.p99 is None else _fmt(r.p99),
            r.unit,
            r.target,
            r.note,
        )
        for r in results
    ]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]
    for row in (header, *rows):
        print("  ".join(str(x).ljust(w) for x, w in zip(row, widths, strict=True)).rstrip())


def print_json(results: list[Result]) -> None:
    print(json.dumps([asdict(r) for r in results], indent=2))


def _fmt(value: float) -> str:
    if value >= 100_000:
        return f"{value:,.0f}"
    if value >= 100:
        return f"{value:.0f}"
    return f"{value:.2f}"
