"""In-process cost of one state read (and one ``/metrics`` render) with many clients.

Issue 18: no single read may block the router's event loop for more than a few ms. This
fills a real :class:`~fairserve.router.service.Router`'s accounting with ``--clients``
clients over a minute of history (arrivals, streamed credit, finishes, the periodic
samples), then times ``snapshot`` (what ``GET /fairserve/v1/state`` serves) and the
``/metrics`` text, ``--reads`` times each, and prints the median and the worst in ms; then
runs them as the router's handlers do, in turns of an event loop, and prints the largest
single hold of that loop (:class:`LoopHolds`), the first (cold) read's apart. Last, the
router's periodic fairness sample (one turn of the loop every ``sample_interval_s``), timed
``--samples`` times a second apart in the ledger's clock (by default until the filled
minute has fallen out of the ledger's longest window: the samples that drop it included).
No server, no worker: only the reads. Bounded in count and time. Example::

    python -m tests.perf.bench_state --clients 10000
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import random
import statistics
import time
from collections.abc import Awaitable, Callable
from types import TracebackType

from fairserve.core.ledger import MAX_WINDOW_S
from fairserve.router.accounting import PRUNE_VISITS, Usage
from fairserve.router.config import RouterConfig
from fairserve.router.service import Router
from fairserve.router.state import in_turns, json_safe, read, snapshot

HISTORY_S = 60.0


def fill(router: Router, clients: int, requests_per_client: int, seed: int = 0) -> None:
    """``clients`` clients, each with ``requests_per_client`` requests spread over the last
    ``HISTORY_S`` seconds, each lasting 10 ms to 1 s (those not over by now still in
    flight), sampled every second as the router is."""
    rng = random.Random(seed)
    acc = router.accounting
    start_s = time.monotonic() - HISTORY_S
    events: list[tuple[float, int, str, int]] = []
    for c in range(clients):
        for r in range(requests_per_client):
            t = start_s + rng.uniform(0, HISTORY_S)
            events.append((t, 0, f"client-{c}", r))
            end_s = t + rng.uniform(0.01, 1.0)
            if end_s < start_s + HISTORY_S:
                events.append((end_s, 1, f"client-{c}", r))
    events.sort()
    next_sample_s = start_s
    for t, kind, client, _ in events:
        while next_sample_s <= t:
            acc.sample(next_sample_s)
            next_sample_s += 1.0
        if kind == 0:
            acc.arrived(client, 30.0, t)
            acc.delivered(client, "w", 10, 1, t)
        else:
            acc.finished(client, "w", 30.0, Usage(10, 2, 5), 0.3, 0.05, t, Usage(10, 0, 1))


class LoopHolds:
    """The longest the event loop's thread ran without coming back to a probe task that
    yields (``sleep(0)``) at every turn of the loop: the longest one turn took, i.e. how
    long a request on that loop could have waited for it (issue 18).

    Measured in the loop thread's CPU time, not wall time, so a shared, loaded machine
    that takes the CPU away from the process does not count as a hold (only work done on
    the loop does). ``wall_s`` keeps the wall-clock worst beside it for reports."""

    def __init__(self) -> None:
        self.worst_s = 0.0
        self.wall_s = 0.0
        self._stopping = False
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> LoopHolds:
        self._task = asyncio.create_task(self._probe())
        await asyncio.sleep(0)  # the probe takes its first reading now
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:  # fmt: skip
        self._stopping = True
        if self._task is not None:
            await self._task

    async def _probe(self) -> None:
        cpu_s, wall_s = time.thread_time(), time.perf_counter()
        while not self._stopping:
            await asyncio.sleep(0)
            now_cpu_s, now_wall_s = time.thread_time(), time.perf_counter()
            self.worst_s = max(self.worst_s, now_cpu_s - cpu_s)
            self.wall_s = max(self.wall_s, now_wall_s - wall_s)
            cpu_s, wall_s = now_cpu_s, now_wall_s


def timed(what: Callable[[], object], reads: int) -> tuple[float, float, float]:
    """Median and worst wall ms, and median CPU ms (the VM may be shared: CPU time is what
    the read itself costs)."""
    times, cpu = [], []
    for _ in range(reads):
        started, started_cpu = time.perf_counter(), time.process_time()
        what()
        cpu.append((time.process_time() - started_cpu) * 1000)
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times), max(times), statistics.median(cpu)


async def holds(what: Callable[[], Awaitable[object]], reads: int) -> tuple[float, float]:
    """The largest single hold of the event loop (loop-thread CPU ms) over ``reads`` reads
    run on it, and the median CPU ms of one whole read (all its turns together)."""
    cpu = []
    async with LoopHolds() as probe:
        for _ in range(reads):
            started = time.process_time()
            await what()
            cpu.append((time.process_time() - started) * 1000)
    return probe.worst_s * 1000, statistics.median(cpu)


async def scrape(router: Router) -> bytes:
    """What ``GET /metrics`` does: a state read, then the text, both in turns."""
    state = json_safe(await read(router))
    return await in_turns(router.metrics.render_steps(state))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=10_000)
    parser.add_argument("--requests-per-client", type=int, default=3)
    parser.add_argument("--reads", type=int, default=20)
    parser.add_argument("--samples", type=int, default=int(MAX_WINDOW_S + 2 * HISTORY_S))
    args = parser.parse_args()
    router = Router(RouterConfig(worker_urls=("http://127.0.0.1:9",)))
    fill(router, args.clients, args.requests_per_client)
    gc.collect()  # the fill's objects: not a read's collection
    cold = asyncio.run(holds(lambda: read(router), 1))
    print(f"clients={len(router.accounting.clients)} first (cold) state read on the loop: "
          f"largest hold {cold[0]:.2f} ms, CPU {cold[1]:.2f} ms")  # fmt: skip
    state_ms = timed(lambda: json_safe(snapshot(router)), args.reads)
    print(
        f"state read at once: median {state_ms[0]:.2f} ms, "
        f"max {state_ms[1]:.2f} ms, CPU median {state_ms[2]:.2f} ms"
    )
    metrics_ms = timed(lambda: router.metrics.render(json_safe(snapshot(router))), args.reads)
    print(
        f"/metrics render at once: median {metrics_ms[0]:.2f} ms, max {metrics_ms[1]:.2f} ms, "
        f"CPU median {metrics_ms[2]:.2f} ms"
    )
    state_hold = asyncio.run(holds(lambda: read(router), args.reads))
    print(f"state read on the loop: largest hold {state_hold[0]:.2f} ms, "
          f"CPU median {state_hold[1]:.2f} ms per read")  # fmt: skip
    metrics_hold = asyncio.run(holds(lambda: scrape(router), args.reads))
    print(f"/metrics on the loop: largest hold {metrics_hold[0]:.2f} ms, "
          f"CPU median {metrics_hold[1]:.2f} ms per scrape")  # fmt: skip
    busy = len(router.accounting.ledger.samples[-1].backlogged)
    sample_cpu_ms = sample_holds(router, args.samples)
    print(f"periodic sample ({args.samples}, {len(sample_cpu_ms)} turns): CPU per turn median "
          f"{statistics.median(sample_cpu_ms):.3f} ms, max {max(sample_cpu_ms):.3f} ms; "
          f"{busy} busy clients")  # fmt: skip


def sample_holds(router: Router, samples: int) -> list[float]:
    """The CPU ms of each turn of ``samples`` periodic samples as the router's sampling
    task runs them (``Accounting.sample``, then ``prune`` a slice per turn), a second
    apart in the ledger's clock, so the window's horizon moves as it does live and the
    history drops."""
    acc = router.accounting
    now_s = time.monotonic()
    cpu_ms = []
    for _ in range(samples):
        now_s += 1.0
        started_s = time.thread_time()
        more = acc.sample(now_s, PRUNE_VISITS)
        cpu_ms.append((time.thread_time() - started_s) * 1000)
        while more:
            started_s = time.thread_time()
            more = acc.prune(PRUNE_VISITS)
            cpu_ms.append((time.thread_time() - started_s) * 1000)
    return cpu_ms


if __name__ == "__main__":
    main()
