"""Full garbage collections in the router's process under load with many clients (issue 18).

A full (generation-2) collection walks every container object the collector tracks and holds
the event loop meanwhile: with 10,000 clients' state, tens of ms. This builds a real
:class:`~fairserve.router.service.Router`, settles the collector as ``fairserve router``
does after start-up (``commands.router._settle_gc``), lets ``--clients`` clients arrive
(a minute of history), then drives ``--rate`` requests per second for ``--seconds`` of the
ledger's clock (each arrives, streams a few deliveries, finishes; the periodic sample every
second; a window read every ``READ_EVERY_S``), and prints how many collections of each
generation ran and how long each held the thread (CPU ms), then what one full collection
costs at the end (the least and the median of ``--repeat`` collections in a row) and how
many objects the collector tracks, with the share of the per-client state: the accounting's
client records (``router/client_stats.py``) and the ledger's histories (``core/ledger*``),
as tracked objects and the references they hold (a full collection visits each reference
twice). ``--young`` collects the young generations with every sample, as the router's
sampling task does (``Router._sample``). No server, no worker. Example::

    python -m tests.perf.bench_gc --clients 10000 --rate 300 --seconds 700 --young

Issue 18, this command at load ~3: a full collection 124-144 ms CPU with ~113k objects
tracked (~8 a client in the accounting: deques of floats, a list per second of rates);
55-72 ms with ~42k once a client's history is packed (1 object a client in the accounting;
the rest is the ledger's: 3 objects and ~65 references a client); 4-8 ms with ~21k once the
ledger's points and runs are packed too and a sample's backlogged names are a tuple (1
object and 6 references a client in the ledger; load ~2.4, the load's CPU unchanged).
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time
from collections.abc import Iterable
from typing import Any

from fairserve.commands.router import _settle_gc as settle_gc
from fairserve.router.accounting import Totals, Usage
from fairserve.router.config import RouterConfig
from fairserve.router.service import Router
from tests.perf.bench_state import fill

READ_EVERY_S = 5.0
DELIVERIES = 6
"""Streamed deliveries per request (the first with the prompt)."""


class Collections:
    """The CPU time of each collection while installed (``gc.callbacks``), by generation."""

    def __init__(self) -> None:
        self.held_ms: dict[int, list[float]] = {0: [], 1: [], 2: []}
        self._started_s = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started_s = time.thread_time()
        else:
            self.held_ms[info["generation"]].append((time.thread_time() - self._started_s) * 1000)


def owned(roots: Iterable[object]) -> tuple[int, int]:
    """The tracked objects reachable from ``roots`` (them included) through tracked
    objects only, not entering types or label totals (shared by many clients), and the
    references they hold."""
    seen: set[int] = set()
    todo = list(roots)
    objects = references = 0
    while todo:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, (type, Totals)) or not gc.is_tracked(obj):
            continue
        seen.add(id(obj))
        referents = gc.get_referents(obj)
        objects += 1
        references += len(referents)
        todo.extend(referents)
    return objects, references


def load(
    router: Router, clients: int, rate: float, seconds: float, young: bool, seed: int = 1
) -> None:
    """``rate`` requests a second for ``seconds`` from the present of the ledger's clock,
    spread over ``clients`` clients, each lasting 10 ms to 1 s. ``young``: a collection of
    the young generations with each sample (what the router's sampling task does)."""
    rng = random.Random(seed)
    acc = router.accounting
    start_s = time.monotonic()
    events: list[tuple[float, int, str]] = []
    for _ in range(int(rate * seconds)):
        client, t_s = f"client-{rng.randrange(clients)}", start_s + rng.uniform(0, seconds)
        span_s = rng.uniform(0.01, 1.0)
        events.append((t_s, 0, client))
        events += [(t_s + span_s * k / DELIVERIES, 1, client) for k in range(1, DELIVERIES)]
        events.append((t_s + span_s, 2, client))
    events.sort()
    next_sample_s, next_read_s = start_s, start_s + READ_EVERY_S
    for t_s, kind, client in events:
        while next_sample_s <= t_s:
            acc.sample(next_sample_s)
            if young:
                gc.collect(1)
            next_sample_s += 1.0
        if next_read_s <= t_s:
            acc.window(t_s)
            next_read_s += READ_EVERY_S
        if kind == 0:
            acc.arrived(client, 30.0, t_s)
            acc.delivered(client, "w", 10, 1, t_s)
        elif kind == 1:
            acc.delivered(client, "w", 0, 1, t_s)
        else:
            usage = Usage(10, 0, DELIVERIES)
            acc.finished(client, "w", 30.0, usage, 0.3, 0.05, t_s, usage)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=10_000)
    parser.add_argument("--rate", type=float, default=300.0)
    parser.add_argument("--seconds", type=float, default=700.0)
    parser.add_argument("--plain-gc", action="store_true", help="skip the start-up settling")
    parser.add_argument("--young", action="store_true", help="gc.collect(1) every sample")
    parser.add_argument("--repeat", type=int, default=5, help="full collections at the end")
    args = parser.parse_args()
    router = Router(RouterConfig(worker_urls=("http://127.0.0.1:9",)))
    if not args.plain_gc:
        settle_gc()  # what `fairserve router` does once it listens
    fill(router, args.clients, 3)
    collections = Collections()
    gc.callbacks.append(collections)
    started_s = time.process_time()
    load(router, args.clients, args.rate, args.seconds, args.young)
    cpu_s = time.process_time() - started_s
    gc.callbacks.remove(collections)
    print(
        f"clients={len(router.accounting.clients)} rate={args.rate:g}/s "
        f"seconds={args.seconds:g} thresholds={gc.get_threshold()} "
        f"frozen={gc.get_freeze_count()} tracked={len(gc.get_objects())} "
        f"load CPU {cpu_s:.1f} s"
    )
    full_ms = []
    for _ in range(max(1, args.repeat)):
        full_started_s = time.thread_time()
        gc.collect()
        full_ms.append((time.thread_time() - full_started_s) * 1000)
    tracked = len(gc.get_objects())
    print(
        f"full collections at the end: the first {full_ms[0]:.1f} ms CPU; least "
        f"{min(full_ms):.1f} median {statistics.median(full_ms):.1f} of {len(full_ms)}; "
        f"tracked then {tracked} ({tracked / args.clients:.1f} a client)"
    )
    acc = router.accounting
    for part, roots in (
        ("accounting", acc.clients.values()),
        ("ledger", acc.ledger.clients.values()),
    ):
        objects, references = owned(roots)
        print(
            f"{part} per client: {objects / args.clients:.2f} tracked objects holding "
            f"{references / args.clients:.1f} references"
        )
    for generation, held in collections.held_ms.items():
        print(
            f"generation {generation} collections: {len(held)}, CPU ms median "
            f"{statistics.median(held) if held else 0.0:.2f} max {max(held, default=0.0):.2f}, "
            f"total {sum(held):.0f} ms"
        )


if __name__ == "__main__":
    main()
