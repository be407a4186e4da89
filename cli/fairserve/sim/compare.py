"""Side-by-side runs: several policy/dispatch pairs on one workload, seed and profile.

The papers' claims are comparisons ("DLPM keeps ≥ 95 % of LPM's throughput", "DoubleQ beats
VTC + client round-robin"), so the simulator answers them directly: parse a list of pairs,
run each on identical traffic, and reduce every report to one row. Parsing lives here, not
in the command, so that ``bench`` can accept the same ``POLICY/DISPATCH,...`` syntax.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fairserve.core.errors import ConfigError
from fairserve.sched.registry import dispatchers, local_policies

PAIR_SYNTAX = "POLICY or POLICY/DISPATCH, separated by commas"


@dataclass(frozen=True, slots=True)
class RunSpec:
    """One run of a comparison: a local policy behind a dispatcher."""

    policy: str
    dispatch: str

    @property
    def label(self) -> str:
        return f"{self.policy}/{self.dispatch}"


def parse_runs(text: str, default_dispatch: str) -> list[RunSpec]:
    """``"lpm/round-robin,vtc/client-rr,dlpm"`` → run specs (a bare policy gets
    ``default_dispatch``).

    Messages name the offending item by position and text, because a typo in the fifth of
    six pairs is otherwise hard to spot; names are checked here so that no run starts
    before every pair is known to be valid.
    """
    known_policies, known_dispatchers = local_policies(), dispatchers()
    runs: list[RunSpec] = []
    for index, raw in enumerate(text.split(","), start=1):
        item = raw.strip()
        where = f"item {index} {item!r}"
        parts = [part.strip() for part in item.split("/")]
        if not item or len(parts) > 2 or not all(parts):
            raise ConfigError(f"{where}: expected {PAIR_SYNTAX}")
        policy = parts[0]
        dispatch = parts[1] if len(parts) == 2 else default_dispatch
        if policy not in known_policies:
            expected = ", ".join(known_policies)
            raise ConfigError(f"{where}: unknown policy {policy!r}; expected one of: {expected}")
        if dispatch not in known_dispatchers:
            expected = ", ".join(known_dispatchers)
            raise ConfigError(
                f"{where}: unknown dispatcher {dispatch!r}; expected one of: {expected}"
            )
        spec = RunSpec(policy, dispatch)
        if spec in runs:
            raise ConfigError(f"{where}: {spec.label} is listed twice")
        runs.append(spec)
    return runs


@dataclass(frozen=True, slots=True)
class ComparisonRow:
    """The headline numbers of one run's report (DESIGN §7 keys)."""

    label: str
    tokens_per_s: float
    service_per_s: float
    requests_per_s: float
    cache_hit_rate: float
    jain_index: float
    max_service_gap: float
    latency_p99_s: Mapping[str, float | None]
    """Per client; None where the client finished no request."""


def comparison_row(label: str, report: Mapping[str, Any]) -> ComparisonRow:
    """Reduce a ``build_report`` object to its comparison row."""
    throughput = report["throughput"]
    return ComparisonRow(
        label=label,
        tokens_per_s=float(throughput["tokens_per_s"]),
        service_per_s=float(throughput["service_per_s"]),
        requests_per_s=float(throughput["requests_per_s"]),
        cache_hit_rate=float(report["cache_hit_rate"]),
        jain_index=float(report["jain_index"]),
        max_service_gap=float(report["max_service_gap"]),
        latency_p99_s={name: c["latency_p99_s"] for name, c in report["clients"].items()},
    )


def best_indices(values: Sequence[float], rel_tol: float = 1e-9) -> set[int]:
    """Indices of the largest value; every run that ties with it (within ``rel_tol``).

    Runs often tie exactly (a saturated cluster has one throughput whatever the order), and
    marking only the first of equals would suggest a difference that is not there.
    """
    if not values:
        return set()
    top = max(values)
    return {i for i, v in enumerate(values) if math.isclose(v, top, rel_tol=rel_tol)}
