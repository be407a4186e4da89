"""Hostile generation bodies at scale (issue 18 items 6 and 12): ``--cases`` bodies from the
fuzz test's strategy (``tests/router/test_fuzz.py``, derandomised, so every run sends the
same bodies) through a router with the lean front and one without, both in front of a real
simulated worker on 127.0.0.1, and to that worker directly. Prints how many cases ran, how
long they took and the statuses seen; stops with an error at the first case that fails the
test's checks (a 5xx, a leaked internal error, a missing message, fronts that disagree).
Run::

    python tests/perf/fuzz_bodies.py [--cases 10000]
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

from hypothesis import HealthCheck, given, settings

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.router.test_fuzz import check_hostile, hostile_bodies, two_routers


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=10_000)
    args = parser.parse_args()
    statuses: collections.Counter[int] = collections.Counter()
    with two_routers() as routers:

        @settings(
            max_examples=args.cases,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(case=hostile_bodies())
        def run_case(case: tuple[str, bytes]) -> None:
            statuses[check_hostile(routers, *case)] += 1

        started = time.monotonic()
        run_case()
        elapsed_s = time.monotonic() - started
    cases = sum(statuses.values())
    shown = ", ".join(f"{status}: {count}" for status, count in sorted(statuses.items()))
    print(
        f"{cases} hostile bodies, each through both fronts and to the worker, in {elapsed_s:.0f} s"
    )
    print(f"statuses (lean front): {shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
