"""Per-program (application) completion times: what Justitia and the DLPM paper's program
latency measure, and what per-call latency hides.

A program's completion time runs from its start to the end of its last call; a tree of
thought whose calls are each fast can still finish late if its calls were interleaved with
everybody else's. The cluster records one :class:`ProgramRecord` per program that ended
within the run; programs still running at the end are counted per client, so a policy that
finishes fewer programs cannot look better by leaving its slow ones out unnoticed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fairserve.core.metrics import percentile

PERCENTILES = (50, 90, 99)


@dataclass(frozen=True, slots=True)
class ProgramRecord:
    """One program that ended: every call finished (or was rejected) by ``end_s``."""

    client: str
    app: str
    app_type: str
    start_s: float
    end_s: float
    calls: int
    rejected_calls: int = 0

    @property
    def completion_s(self) -> float:
        return self.end_s - self.start_s


def completion_summary(records: Sequence[ProgramRecord], unfinished: int) -> dict[str, Any]:
    """Count, mean and percentiles of the completion times of ``records``."""
    times = [r.completion_s for r in records]
    out: dict[str, Any] = {
        "finished": len(times),
        "unfinished": unfinished,
        "completion_mean_s": sum(times) / len(times) if times else None,
    }
    for q in PERCENTILES:
        value = percentile(times, q)
        out[f"completion_p{q}_s"] = None if math.isnan(value) else value
    return out


def programs_report(
    records: Sequence[ProgramRecord], unfinished_by_client: Mapping[str, int]
) -> dict[str, Any]:
    """The report's ``programs`` key: all programs, then per client and per program kind."""
    by_client: dict[str, list[ProgramRecord]] = {c: [] for c in unfinished_by_client}
    by_type: dict[str, list[ProgramRecord]] = {}
    for record in records:
        by_client.setdefault(record.client, []).append(record)
        by_type.setdefault(record.app_type, []).append(record)
    out = completion_summary(records, sum(unfinished_by_client.values()))
    out["clients"] = {
        c: completion_summary(rs, unfinished_by_client.get(c, 0))
        for c, rs in sorted(by_client.items())
    }
    out["types"] = {  # unfinished programs are counted per client only
        t: {k: v for k, v in completion_summary(rs, 0).items() if k != "unfinished"}
        for t, rs in sorted(by_type.items())
    }
    return out
