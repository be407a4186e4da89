"""Offline sweep: replay one workload (or a recorded trace) in the simulator for a grid of
quanta, and say which quantum to run.

Every setting sees identical traffic (same workload, seed, profile and cluster size: one
:class:`~fairserve.sim.compare.Bench`), so the rows differ only by the quantum. For each
``Q^u`` (times each ``Q^w`` of ``worker_grid``) a row holds throughput, Jain's index, the
well-behaved clients' p99 latency and the cache hit rate (DESIGN §7 report keys).

* **Pareto front**: rows no other row beats on both throughput and Jain's index: the
  settings worth choosing between (DLPM paper, Figure 1).
* **Recommendation**: the highest throughput among rows with Jain's index ≥ the target
  (ties: the smaller quantum, the tighter bound); when none meets it, the fairest row.

**Well-behaved clients** are those whose offered load (prompt + output tokens of the
workload's calls, divided by their weight) is at most the mean: the clients a fair
scheduler protects. Their worst p99 latency is what a larger quantum costs them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from fairserve.core.errors import ConfigError
from fairserve.sched.registry import load_all
from fairserve.sim.compare import Bench, RunSpec
from fairserve.workloads.model import Workload

Progress = Callable[[int, float, float], None]
"""(index of the run, simulated seconds done, simulated seconds in total)."""


@dataclass(frozen=True, slots=True)
class Setting:
    quantum: float
    worker_quantum: float | None = None


@dataclass(frozen=True, slots=True)
class SweepRow:
    setting: Setting
    tokens_per_s: float
    service_per_s: float
    jain_index: float
    max_service_gap: float
    cache_hit_rate: float
    well_behaved_p99_s: float | None
    pareto: bool = False
    recommended: bool = False
    meets_target: bool = False

    def to_json(self) -> dict[str, Any]:
        qw = self.setting.worker_quantum
        return {
            "quantum": self.setting.quantum,
            "worker_quantum": "inf" if qw is not None and math.isinf(qw) else qw,
            "tokens_per_s": self.tokens_per_s,
            "service_per_s": self.service_per_s,
            "jain_index": self.jain_index,
            "max_service_gap": self.max_service_gap,
            "cache_hit_rate": self.cache_hit_rate,
            "well_behaved_p99_s": self.well_behaved_p99_s,
            "pareto": self.pareto,
            "meets_target": self.meets_target,
            "recommended": self.recommended,
        }


@dataclass
class SweepResult:
    rows: list[SweepRow]
    target_jain: float
    well_behaved: list[str]
    recommended: SweepRow | None
    reason: str
    meta: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        best = self.recommended
        return {
            **self.meta,
            "target_jain": self.target_jain,
            "well_behaved": self.well_behaved,
            "rows": [row.to_json() for row in self.rows],
            "recommended": None if best is None else best.to_json(),
            "reason": self.reason,
        }


# ---------------------------------------------------------------------- grids
def parse_grid(text: str, option: str, allow_inf: bool = False) -> list[float]:
    """``"256,1024,4096"`` → sorted distinct positive numbers (``inf`` where allowed)."""
    values: list[float] = []
    for index, raw in enumerate(text.split(","), start=1):
        item = raw.strip()
        try:
            value = float(item)
        except ValueError:
            value = math.nan
        finite_ok = math.isfinite(value) or (allow_inf and value == math.inf)
        if not (value > 0 and finite_ok):
            kind = "positive numbers (or inf)" if allow_inf else "positive finite numbers"
            raise ConfigError(f"{option}: item {index} {item!r}: expected {kind}, comma-separated")
        if value not in values:
            values.append(value)
    return sorted(values)


def settings(quanta: Sequence[float], worker_quanta: Sequence[float] | None) -> list[Setting]:
    if not worker_quanta:
        return [Setting(q) for q in quanta]
    return [Setting(q, qw) for qw in worker_quanta for q in quanta]


# ---------------------------------------------------------------------- running
def check_spec(spec: RunSpec, worker_grid: bool) -> None:
    load_all()
    if not spec.has_quantum:
        raise ConfigError(f"--policy {spec.policy}: has no quantum to sweep (dlpm has one)")
    if worker_grid and not spec.has_worker_quantum:
        raise ConfigError(f"--worker-grid: dispatcher {spec.dispatch} has no per-worker quantum")


def run_sweep(
    bench: Bench,
    spec: RunSpec,
    grid: Sequence[Setting],
    target_jain: float,
    progress: Progress | None = None,
) -> SweepResult:
    """One simulation per setting, then the Pareto front and the recommendation."""
    check_spec(spec, any(s.worker_quantum is not None for s in grid))
    if not 0 < target_jain <= 1:
        raise ConfigError(f"--target-jain: expected a number in (0, 1], got {target_jain}")
    configs = [bench.config(spec, s.quantum, s.worker_quantum) for s in grid]  # fail early
    well_behaved = well_behaved_clients(bench.workload, bench.seed_used, bench.span_s)
    rows = []
    for index, (setting, config) in enumerate(zip(grid, configs, strict=True)):
        tick = None if progress is None else _bind(progress, index)
        report = bench.report(config, bench.run(config, tick))
        rows.append(_row(setting, report, well_behaved))
    rows = mark(rows, target_jain)
    best = next((row for row in rows if row.recommended), None)
    meta = {
        "workload": bench.workload.name,
        "policy": spec.policy,
        "dispatch": spec.dispatch,
        "workers": bench.workers,
        "profile": bench.profile.name,
        "duration_s": bench.span_s,
        "seed": bench.seed_used,
    }
    reason = _reason(best, target_jain)
    return SweepResult(rows, target_jain, sorted(well_behaved), best, reason, meta)


def _bind(progress: Progress, index: int) -> Callable[[float, float], None]:
    def tick(done_s: float, total_s: float) -> None:
        progress(index, done_s, total_s)

    return tick


def _row(setting: Setting, report: dict[str, Any], well_behaved: set[str]) -> SweepRow:
    p99s = [
        c["latency_p99_s"]
        for name, c in report["clients"].items()
        if name in well_behaved and c["latency_p99_s"] is not None
    ]
    return SweepRow(
        setting=setting,
        tokens_per_s=float(report["throughput"]["tokens_per_s"]),
        service_per_s=float(report["throughput"]["service_per_s"]),
        jain_index=float(report["jain_index"]),
        max_service_gap=float(report["max_service_gap"]),
        cache_hit_rate=float(report["cache_hit_rate"]),
        well_behaved_p99_s=max(p99s) if p99s else None,
    )


def well_behaved_clients(workload: Workload, seed: int, duration_s: float) -> set[str]:
    """Clients whose offered tokens per unit of weight are at most the mean."""
    weights = {c.name: c.weight for c in workload.clients}
    offered = dict.fromkeys(weights, 0.0)
    for program in workload.programs(seed, duration_s):
        tokens = sum(call.input_tokens + call.output_tokens for call in program.calls)
        offered[program.client] = offered.get(program.client, 0.0) + tokens
    per_weight = {c: t / weights.get(c, 1.0) for c, t in offered.items()}
    if not per_weight:
        return set()
    mean = sum(per_weight.values()) / len(per_weight)
    return {c for c, v in per_weight.items() if v <= mean * (1 + 1e-9)}


# ---------------------------------------------------------------------- choosing
def mark(rows: Sequence[SweepRow], target_jain: float) -> list[SweepRow]:
    """The rows with ``pareto``, ``meets_target`` and ``recommended`` filled in."""
    front = pareto_front([(r.tokens_per_s, r.jain_index) for r in rows])
    best = recommend(rows, target_jain)
    return [
        replace(
            row,
            pareto=i in front,
            meets_target=row.jain_index >= target_jain,
            recommended=i == best,
        )
        for i, row in enumerate(rows)
    ]


def pareto_front(points: Sequence[tuple[float, float]]) -> set[int]:
    """Indices of the points no other point matches or beats on both coordinates while
    beating on one (larger is better on both)."""

    def dominated(i: int) -> bool:
        a = points[i]
        return any(b[0] >= a[0] and b[1] >= a[1] and b != a for b in points)

    return {i for i in range(len(points)) if not dominated(i)}


def recommend(rows: Sequence[SweepRow], target_jain: float) -> int | None:
    """The highest throughput meeting the target (smaller quantum on ties), else the
    fairest row (higher throughput on ties); None for no rows."""
    if not rows:
        return None
    meeting = [i for i, r in enumerate(rows) if r.jain_index >= target_jain]
    if meeting:
        return max(meeting, key=lambda i: (rows[i].tokens_per_s, -rows[i].setting.quantum))
    return max(range(len(rows)), key=lambda i: (rows[i].jain_index, rows[i].tokens_per_s))


def _reason(best: SweepRow | None, target_jain: float) -> str:
    if best is None:
        return "no settings"
    if best.jain_index >= target_jain:
        return f"highest throughput with Jain's index ≥ {target_jain:g}"
    return f"no setting reaches Jain's index {target_jain:g}: the fairest one"
