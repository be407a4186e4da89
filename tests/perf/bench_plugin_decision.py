"""What one DLPM batching decision costs inside the SGLang plugin, per waiting-queue size.

    .venv-sglang/bin/python tests/perf/bench_plugin_decision.py [--sizes 1000,10000]
        [--steps 60] [--rounds 3] [--clock cpu|wall] [--profile] [--json]

Needs SGLang (the ``.[sglang]`` environment, as ``tests/sglang_real``); no GPU, no model.
The case of issue 23 from ``bench_sglang_plugin.py`` (DLPM, kept matches, bounded offers),
alone, repeated ``--rounds`` times: the queue is kept at each size (six clients with shared
prefixes, refilled every step) while SGLang's real objects admit what the KV pool takes,
decode, and retract when the pool runs out. Per step that made a decision it times the
plugin's part (``PolicyHost.begin_decision``: reading the waiting requests' matches and
the policy's LPM order up to its first question) and the whole decision (SGLang's
``calc_priority`` plus the admission loop, the policy's passes included). The note gives
what the policy's kept order did over the run: full sorts (``LPMIndex.rebuilds``) against
decisions, requests re-keyed, and SGLang's retractions, which made the plugin's list one
the order did not predict before the host kept it (issue 23). ``--profile`` prints where
``begin_decision``'s time goes at the last size instead. The same queue without the plugin
(SGLang's own ordering, FCFS above 128 waiting) gives the floor: SGLang's ``calc_priority``
and admission loop, and the harness's per-decision record of every waiting request.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import platform
import pstats
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for path in (ROOT, ROOT / "cli"):  # runnable as a script from any directory
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from tests.perf.bench_sglang_plugin import CLOCKS, bench  # noqa: E402
from tests.perf.timing import Result, print_json, print_table  # noqa: E402

SIZES = (1000, 10_000)
QUANTUM = 256.0


def one_round(size: int, steps: int, clock_name: str) -> list[Result]:
    """One run of the DLPM case at ``size`` waiting (the policy's counters in the note),
    and one without the plugin: SGLang's own decision and the harness's bookkeeping, what
    the plugin's decision cannot go below."""
    from fairserve.sched.local.dlpm import DLPM
    from fairserve.sglang import hooks

    floor = bench(size, None, None, None, steps, CLOCKS[clock_name], True)
    results = bench(size, "dlpm", QUANTUM, "kept", steps, CLOCKS[clock_name], True)
    host = hooks.PLUGIN.host
    assert host is not None and isinstance(host.policy, DLPM)
    index = host.policy.lpm_index
    note = (
        f"{index.rebuilds} full sorts, {index.rekeyed} re-keyed, "
        f"{host.counters.retracted} retracted over the run"
    )
    return [
        Result(r.bench, r.case, r.median / 1000, r.best / 1000 if r.best else None,
               r.p99 / 1000 if r.p99 else None, "ms", note=f"{r.note}; {note}")
        for r in results if not r.case.startswith("iteration")
    ] + [
        Result(r.bench, r.case, r.median / 1000, r.best / 1000 if r.best else None,
               r.p99 / 1000 if r.p99 else None, "ms", note=r.note)
        for r in floor if r.case.startswith("decision")
    ]  # fmt: skip


def profile(size: int, steps: int) -> None:
    """cProfile of ``begin_decision`` over ``steps`` decisions at ``size`` waiting."""
    from fairserve.sglang.host import PolicyHost

    profiler = cProfile.Profile()
    original = PolicyHost.begin_decision

    def profiled(self: PolicyHost, waiting: list[object], cache: object = None) -> None:
        profiler.enable()
        try:
            original(self, waiting, cache)
        finally:
            profiler.disable()

    PolicyHost.begin_decision = profiled  # type: ignore[method-assign]
    try:
        bench(size, "dlpm", QUANTUM, "kept", steps, time.thread_time, True)
    finally:
        PolicyHost.begin_decision = original  # type: ignore[method-assign]
    pstats.Stats(profiler).sort_stats("tottime").print_stats(20)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--steps", type=int, default=60, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=3, help="runs per size (interleaved)")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="cpu")
    parser.add_argument("--profile", action="store_true", help="profile begin_decision")
    parser.add_argument("--json", action="store_true", help="print results as JSON")
    args = parser.parse_args(argv)
    try:
        sizes = [int(x) for x in args.sizes.split(",")]
    except ValueError:
        parser.error("--sizes: expected comma-separated integers")
    if not all(1 <= size <= 100_000 for size in sizes):
        parser.error("--sizes: expected 1..100000 each")
    if not 1 <= args.steps <= 10_000 or not 1 <= args.rounds <= 100:
        parser.error("--steps: 1..10000, --rounds: 1..100")
    from tests.sglang_real.harness import environment_for_plugin

    os.environ.update(environment_for_plugin("dlpm"))
    from sglang.srt.plugins import load_plugins

    load_plugins()
    if args.profile:
        profile(sizes[-1], args.steps)
        return 0
    rounds: dict[tuple[int, str], list[Result]] = {}
    for _ in range(args.rounds):
        for size in sizes:
            for result in one_round(size, args.steps, args.clock):
                rounds.setdefault((size, result.case), []).append(result)
    results = [
        Result("plugin-decision", case, statistics.median(r.median for r in runs),
               min(r.best for r in runs if r.best is not None), None, "ms",
               note=f"medians of {len(runs)} rounds: "
               + ", ".join(f"{r.median:.2f}" for r in runs) + f"; last: {runs[-1].note}")
        for (_, case), runs in rounds.items()
    ]  # fmt: skip
    if args.json:
        print_json(results)
    else:
        load = os.getloadavg()[0]
        print(f"# {platform.python_implementation()} {platform.python_version()}, "
              f"{os.cpu_count()} CPUs, {args.clock} time, load {load:.2f}")  # fmt: skip
        print_table(results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
