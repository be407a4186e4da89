"""Run every scheduler benchmark and print one table (or JSON with ``--json``).

    python tests/perf/bench_sched.py [--json] [--only radix|dispatch|select]

The same benchmarks run under pytest, explicitly (``python -m pytest tests/perf -s``);
CI ignores tests/perf. Figures are medians over repetitions plus the best (least
disturbed) run; compare ratios within one run, not numbers across machines.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for path in (ROOT, ROOT / "cli"):  # runnable as a script from any directory
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from tests.perf import test_dispatch_perf, test_local_perf, test_radix_perf  # noqa: E402
from tests.perf.timing import Result, print_json, print_table  # noqa: E402

BENCHES: dict[str, Callable[[], list[Result]]] = {
    "radix": test_radix_perf.run,
    "dispatch": test_dispatch_perf.run,
    "select": test_local_perf.run,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print results as JSON")
    parser.add_argument("--only", choices=sorted(BENCHES), action="append", help="run only these")
    args = parser.parse_args(argv)
    results: list[Result] = []
    for name in args.only or list(BENCHES):
        results += BENCHES[name]()
    if args.json:
        print_json(results)
    else:
        cpus = os.cpu_count()
        print(f"# {platform.python_implementation()} {platform.python_version()}, {cpus} CPUs")
        print_table(results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
