"""What the SGLang plugin costs per batching step, inside SGLang's real scheduling objects.

    .venv-sglang/bin/python tests/perf/bench_sglang_plugin.py [--json] [--steps 200]

Needs SGLang (the ``.[sglang]`` environment, as ``tests/sglang_real``); no GPU, no model.
The queue is kept at 10, 100 and 1,000 waiting requests (six clients with shared prefixes,
refilled every step) while the engine admits what its KV pool takes and decodes. For each
size it times SGLang's batching decision (``SchedulePolicy.calc_priority`` plus the admission
loop over ``PrefillAdder.add_one_req``) and the whole iteration, with the plugin disabled
(SGLang's own LPM ordering; SGLang switches LPM to FCFS above 128 waiting requests) and
with DLPM and VTC inside it. Medians, best and p99 over the steps that made a decision.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for path in (ROOT, ROOT / "cli"):  # runnable as a script from any directory
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from tests.perf.timing import Result, print_json, print_table, summarize  # noqa: E402

SIZES = (10, 100, 1000)
POLICIES: tuple[tuple[str | None, float | None], ...] = (
    (None, None),
    ("dlpm", 256.0),
    ("vtc", None),
)
CLIENTS = 6
PREFIX_TOKENS = 48
OWN_TOKENS = 16


def bench(size: int, policy: str | None, quantum: float | None, steps: int) -> list[Result]:
    from tests.sglang_real.harness import Engine, Prefill, set_policy

    set_policy(policy, quantum)
    decisions: list[float] = []

    class Timed(Engine):
        def _prefill(self) -> Prefill | None:
            start = time.perf_counter()
            record = super()._prefill()
            if record is not None:
                decisions.append(time.perf_counter() - start)
            return record

    engine = Timed(kv_tokens=2048, max_running=4096)
    sent = 0

    def refill() -> None:
        nonlocal sent
        while len(engine.waiting_queue) < size:
            client = sent % CLIENTS
            prefix = [client * 10_000 + i for i in range(PREFIX_TOKENS)]
            own = [1_000_000 + sent * OWN_TOKENS + i for i in range(OWN_TOKENS)]
            engine.add(f"r{sent}", [*prefix, *own], 2, f"c{client}")
            sent += 1

    iterations: list[float] = []
    warmup = 20
    for step in range(warmup + steps):
        refill()
        if step == warmup:
            decisions.clear()
        start = time.perf_counter()
        engine.step()
        if step >= warmup:
            iterations.append(time.perf_counter() - start)
    name = policy or "off (SGLang LPM)"
    out = []
    for what, samples in (("decision", decisions), ("iteration", iterations)):
        median, best, p99 = summarize([s * 1e6 for s in samples])
        out.append(Result("sglang-plugin", f"{what} {size} waiting, {name}", median, best, p99,
                          "us", note=f"{len(samples)} samples"))  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print results as JSON")
    parser.add_argument("--steps", type=int, default=200, help="timed steps per case")
    args = parser.parse_args(argv)
    if not 1 <= args.steps <= 100_000:
        parser.error("--steps: expected 1..100000")
    from tests.sglang_real.harness import environment_for_plugin

    os.environ.update(environment_for_plugin("dlpm"))
    from sglang.srt.plugins import load_plugins

    load_plugins()
    results: list[Result] = []
    for size in SIZES:
        for policy, quantum in POLICIES:
            results += bench(size, policy, quantum, args.steps)
    if args.json:
        print_json(results)
    else:
        print(f"# {platform.python_implementation()} {platform.python_version()}, "
              f"{os.cpu_count()} CPUs")  # fmt: skip
        print_table(results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
