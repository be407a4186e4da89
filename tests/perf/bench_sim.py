"""Simulator speed: one hour of 8-worker tree-of-thought traffic (DESIGN §8: under a minute).

    python tests/perf/bench_sim.py [--duration-s 3600] [--workers 8] [--load 1.0] [--json]

The built-in ``tot-s1`` workload is sized for 2 workers; its program rates are scaled by
``workers / 2`` so every worker sees the same load. Prints simulated seconds, CPU seconds
and their ratio, plus the report's headline numbers, so the speed is read next to the
amount of work simulated.

``--load`` multiplies the offered rate: tot-s1 as shipped (``--load 1``) offers about twice
what the workers serve, so ``--load 0.3`` keeps up and ``--load 0.75`` (1.5x capacity) is
the overload case, where the waiting queues grow for the whole run (``queue_end``, and a
second-half mean queue above the first half's, say so).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for path in (ROOT, ROOT / "cli"):  # runnable as a script from any directory
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from fairserve.sim.cluster import SimConfig, simulate  # noqa: E402
from fairserve.sim.engine import EngineConfig  # noqa: E402
from fairserve.sim.profile import DEFAULT_PROFILE, resolve_profile  # noqa: E402
from fairserve.sim.report import build_report  # noqa: E402
from fairserve.workloads.catalog import builtin_text  # noqa: E402
from fairserve.workloads.synthetic import loads_workload  # noqa: E402


def scaled_tot(duration_s: float, workers: int, load: float = 1.0) -> str:
    """tot-s1 with its duration replaced and its program rates scaled to ``workers`` and
    multiplied by ``load`` (tot-s1 as shipped offers about twice what 2 workers serve)."""
    text = builtin_text("tot-s1")
    text = re.sub(r"(?m)^duration_s = .*$", f"duration_s = {duration_s}", text)
    scale = workers / 2 * load

    def rate(match: re.Match[str]) -> str:
        return f"rate_per_s = {float(match.group(1)) * scale}"

    return re.sub(r"(?m)^rate_per_s = ([0-9.]+)$", rate, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration-s", type=float, default=3600.0)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument(
        "--load", type=float, default=1.0, help="Multiply tot-s1's rates (1: as shipped)."
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    workload = loads_workload(
        scaled_tot(args.duration_s, args.workers, args.load), "<bench>/tot.toml"
    )
    profile = resolve_profile(DEFAULT_PROFILE)
    engine = EngineConfig(
        kv_capacity_tokens=profile.kv_capacity_tokens, max_batch_tokens=profile.max_batch_tokens
    )
    config = SimConfig(engine=engine, time_model=profile.batch_time(), workers=args.workers)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    result = simulate(workload, config)
    cpu_s, wall_s = time.process_time() - cpu0, time.perf_counter() - wall0
    report = build_report(result)
    out = {
        "simulated_s": result.end_s,
        "workers": args.workers,
        "load": args.load,
        "cpu_s": cpu_s,
        "wall_s": wall_s,
        "simulated_per_cpu_s": result.end_s / cpu_s,
        "requests": len(result.records),
        "tokens_per_s": report["throughput"]["tokens_per_s"],
        "cache_hit_rate": report["cache_hit_rate"],
        "steps": sum(w["steps"] for w in report["workers"]),
        "queue_end": report["queue"]["end"],
        "queue_first_half_mean": report["queue"]["first_half_mean"],
        "queue_second_half_mean": report["queue"]["second_half_mean"],
    }
    if args.json:
        print(json.dumps(out))
    else:
        for key, value in out.items():
            print(f"{key:>20}: {value:,.2f}" if isinstance(value, float) else f"{key:>20}: {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
