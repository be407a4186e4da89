"""Simulator records pinned over configurations that exercise every engine path.

Why: refactors of the simulator (incremental queues, composition instead of mixins, the
shared ledger) must not change what it simulates. Each case hashes the finished-call
records, the program records, the service samples in both views, the queue samples, the
engines' counters and the whole report; a digest that moves means the records moved.

When a change alters the simulated semantics on purpose, say so in its commit and update the
digests (``python tests/sim/test_records_equivalence.py`` prints them).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # runnable as a script, to print the digests
    sys.path.insert(0, str(ROOT))

from fairserve.core.metrics import ServiceSample  # noqa: E402
from fairserve.sim.cluster import SimConfig, simulate  # noqa: E402
from fairserve.sim.engine import EngineConfig  # noqa: E402
from fairserve.sim.profile import resolve_profile  # noqa: E402
from fairserve.sim.recorder import SimResult  # noqa: E402
from fairserve.sim.report import build_report  # noqa: E402
from fairserve.workloads.catalog import resolve_workload  # noqa: E402
from fairserve.workloads.model import Workload  # noqa: E402
from tests.perf.bench_sim import scaled_tot  # noqa: E402

PROFILE = "a100-llama-3-8b"


def _config(
    kv_tokens: int, workers: int = 3, duration_s: float = 20.0, **options: object
) -> SimConfig:
    engine_keys = {"batching", "reserve_output_ratio", "max_running_requests", "max_batch_tokens"}
    profile = resolve_profile(PROFILE)
    engine_options = {k: options.pop(k) for k in list(options) if k in engine_keys}
    engine = EngineConfig(
        kv_capacity_tokens=kv_tokens,
        **{"max_batch_tokens": profile.max_batch_tokens, **engine_options},  # type: ignore[arg-type]
    )
    return SimConfig(
        engine=engine,
        time_model=profile.batch_time(),
        workers=workers,
        duration_s=duration_s,
        **options,  # type: ignore[arg-type]
    )


def _tot_overload() -> Workload:
    """tot-s1 on 8 workers at 1.5x their capacity: the waiting queues grow all run."""
    from fairserve.workloads.synthetic import loads_workload

    return loads_workload(scaled_tot(60.0, 8, 0.75), "<test>/tot.toml")


CASES: dict[str, tuple[Callable[[], Workload], SimConfig, str]] = {
    # DoubleQ's spill off: the waiting queues grow all run (the overload path's records).
    "tot-overload": (
        _tot_overload,
        _config(200_000, workers=8, duration_s=60.0, dispatch_params={"spill_outstanding": 0}),
        "ec9f17b94794428c",
    ),
    # DoubleQ's defaults: the spill moves a backlog onto idle room no other client uses.
    "tot-overload-spill": (
        _tot_overload,
        _config(200_000, workers=8, duration_s=60.0),
        "c79d229cb84db9f7",
    ),
    "chunked-sarathi": (
        lambda: resolve_workload("tot-s1"),
        _config(60_000, max_batch_tokens=300),
        "0154397806d9e6f7",
    ),
    "chunked-orca": (
        lambda: resolve_workload("tot-s1"),
        _config(60_000, max_batch_tokens=300, batching="orca"),
        "803896fffdbae9db",
    ),
    "vtc-one-worker-retracting": (
        lambda: resolve_workload("vtc-poisson-short-long"),
        _config(30_000, workers=1, policy="vtc", reserve_output_ratio=0.2),
        "32c87bc865db8c9c",
    ),
    "vtc-client-rr": (
        lambda: resolve_workload("vtc-constant"),
        _config(60_000, policy="vtc", dispatch="client-rr"),
        "54eb40bfd7067714",
    ),
    "fcfs-step-by-step": (
        lambda: resolve_workload("vtc-constant"),
        _config(60_000, policy="fcfs", dispatch="least-load", fuse_decode=False),
        "f02216ed2046f86b",
    ),
    "dlpm-retracting": (
        lambda: resolve_workload("tot-s1"),
        _config(40_000, reserve_output_ratio=0.3),
        "5b25489b393211a0",
    ),
    "vllm-v0": (
        lambda: resolve_workload("vtc-constant"),
        _config(60_000, batching="vllm-v0", policy="vtc"),
        "236fc3de5ed1a335",
    ),
    "fastertransformer": (
        lambda: resolve_workload("vtc-constant"),
        _config(60_000, batching="fastertransformer"),
        "b374af5b6b5062bc",
    ),
    "justitia": (
        lambda: resolve_workload("justitia-mix"),
        _config(60_000, policy="justitia", duration_s=30.0),
        "56b1ce571d4b5b9a",
    ),
    "lcf-chat-drained": (
        lambda: resolve_workload("multi-turn-chat"),
        _config(50_000, policy="lcf", drain=True),
        "df2b7bcc76c26e08",
    ),
    "max-running": (
        lambda: resolve_workload("long-qa-s1"),
        _config(80_000, workers=2, max_running_requests=8),
        "892894d8b8b2a6cb",
    ),
}


def _samples(samples: Sequence[ServiceSample]) -> list[object]:
    """Samples with their backlogged sets sorted (a frozenset's order follows the hash seed)."""
    return [(s.t_s, list(s.cumulative.items()), sorted(s.backlogged)) for s in samples]


def records_digest(result: SimResult) -> str:
    """sha256 (first 16 hex digits) over everything a run records."""
    digest = hashlib.sha256()
    for part in (
        result.records,
        result.programs,
        _samples(result.samples),
        _samples(result.samples_extend),
        result.queue_samples,
        [dataclasses.asdict(s) for s in result.worker_stats],
    ):
        digest.update(repr(part).encode())
    digest.update(json.dumps(build_report(result), sort_keys=True, default=str).encode())
    return digest.hexdigest()[:16]


@pytest.mark.parametrize("name", sorted(CASES))
def test_records_unchanged(name: str) -> None:
    workload, config, expected = CASES[name]
    assert records_digest(simulate(workload(), config)) == expected


if __name__ == "__main__":
    for case, (make, cfg, _) in sorted(CASES.items()):
        print(f'"{case}": "{records_digest(simulate(make(), cfg))}"')
