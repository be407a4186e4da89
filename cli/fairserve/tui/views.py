"""Rows of the clients and workers tables, and their sort orders: pure functions of a frame.

Kept apart from the widgets so that what the dashboard says (a client's share, who is
queued where, which GPU a worker runs on) is tested without a terminal.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from rich.text import Text

from fairserve.tui import format as fmt
from fairserve.tui.history import Frame
from fairserve.tui.model import ClientView, GpuView, Snapshot, WorkerView

Cell = str | Text

CLIENT_COLUMNS: tuple[tuple[str, str], ...] = (
    ("client", "client"),
    ("weight", "w"),
    ("load", "q/run"),
    ("rate", "svc/s"),
    ("share", "share"),
    ("deficit", "deficit"),
    ("strip", "workers"),
    ("latency", "lat p50/p99"),
    ("ttft", "ttft p50/p99"),
    ("rejected", "rej"),
)
WORKER_COLUMNS: tuple[tuple[str, str], ...] = (
    ("worker", "worker"),
    ("health", "health"),
    ("load", "run/queue"),
    ("hit", "hit total"),
    ("kv", "KV"),
    ("tokens", "tok/s"),
    ("gpu", "GPU"),
    ("gpu_mem", "GPU mem"),
    ("power", "power"),
)


@dataclass(frozen=True, slots=True)
class ClientLoadView:
    queued: int
    running: int


def client_load(snapshot: Snapshot, client: ClientView) -> ClientLoadView:
    """Queued (router queue + workers' waiting queues) and running requests of a client.

    Workers with the fairserve extension say who waits and who runs inside them; without
    any, the router only knows what it sent (in flight) and what it holds (queued)."""
    probes = [w.probe for w in snapshot.workers if w.probe is not None and w.probe.per_client]
    if not probes:
        return ClientLoadView(client.queued, client.in_flight)
    waiting = running = 0
    for probe in probes:
        for load in probe.clients:
            if load.name == client.name:
                waiting += load.waiting
                running += load.running
    return ClientLoadView(client.queued + waiting, running)


# ---------------------------------------------------------------- sorting
@dataclass(frozen=True, slots=True)
class SortOrder:
    label: str
    column: str
    """The clients table's column key this order sorts by (its header gets the marker)."""
    key: Callable[[Snapshot, ClientView], tuple[float, str]]


def _by(value: Callable[[Snapshot, ClientView], float]) -> Callable[..., tuple[float, str]]:
    return lambda snapshot, client: (value(snapshot, client), client.name)


def _none_last(value: float | None, descending: bool) -> float:
    if value is None:
        return math.inf
    return -value if descending else value


def _lowest_deficit(client: ClientView) -> float:
    return min((d for _, d in client.deficits), default=math.inf)


SORT_ORDERS: tuple[SortOrder, ...] = (
    SortOrder("service rate", "rate", _by(lambda s, c: -c.service_rate)),
    SortOrder("name", "client", lambda s, c: (0.0, c.name)),
    SortOrder("deficit", "deficit", _by(lambda s, c: _lowest_deficit(c))),
    SortOrder("p99 latency", "latency", _by(lambda s, c: _none_last(c.latency_p99_s, True))),
    SortOrder("queued", "load", _by(lambda s, c: -client_load(s, c).queued)),
    SortOrder("rejected", "rejected", _by(lambda s, c: -c.rejected)),
)


def sorted_clients(snapshot: Snapshot, order: SortOrder) -> list[ClientView]:
    return sorted(snapshot.clients, key=lambda c: order.key(snapshot, c))


# ---------------------------------------------------------------- clients
def client_row(snapshot: Snapshot, client: ClientView) -> tuple[Cell, ...]:
    total = sum(c.service_rate for c in snapshot.clients)
    share = client.service_rate / total if total > 0 else None
    deficits = [d for _, d in _ordered_deficits(snapshot, client)]
    low = min(deficits, default=None)
    load = client_load(snapshot, client)
    deficit = fmt.pair(fmt.si(low), fmt.si(max(deficits, default=None))) if deficits else "-"
    return (
        client.name,
        f"{client.weight:g}",
        f"{load.queued}/{load.running}",
        fmt.si(client.service_rate),
        fmt.pct(share),
        Text(deficit, style="bold red" if low is not None and low < 0 else ""),
        fmt.deficit_strip(deficits, snapshot.quanta.worker_quantum) if deficits else Text("-"),
        fmt.pair(fmt.seconds(client.latency_p50_s), fmt.seconds(client.latency_p99_s)),
        fmt.pair(fmt.seconds(client.ttft_p50_s), fmt.seconds(client.ttft_p99_s)),
        Text(str(client.rejected), style="yellow" if client.rejected else ""),
    )


def _ordered_deficits(snapshot: Snapshot, client: ClientView) -> list[tuple[str, float]]:
    """Deficits in the workers table's order (the strip lines up with it)."""
    order = {w.url: i for i, w in enumerate(snapshot.workers)}
    return sorted(client.deficits, key=lambda item: (order.get(item[0], len(order)), item[0]))


# ---------------------------------------------------------------- workers
def short_url(url: str) -> str:
    return url.removeprefix("http://").removeprefix("https://").rstrip("/")


def gpu_of(worker: WorkerView, gpus: tuple[GpuView, ...]) -> GpuView | None:
    """The local GPU a worker says it runs on (by UUID, else index), if NVML sees it here."""
    probe = worker.probe
    if probe is None:
        return None
    for gpu in gpus:
        if probe.gpu_uuid is not None and gpu.uuid == probe.gpu_uuid:
            return gpu
    if probe.gpu_uuid is None and probe.gpu_index is not None:
        return next((g for g in gpus if g.index == probe.gpu_index), None)
    return None


def worker_rows(frame: Frame) -> list[tuple[str, tuple[Cell, ...]]]:
    """(row key, cells) for each worker, then one row per local GPU no worker claimed."""
    snapshot = frame.snapshot
    rows: list[tuple[str, tuple[Cell, ...]]] = []
    claimed: set[int] = set()
    rates = frame.worker_tokens_per_s or (None,) * len(snapshot.workers)
    for worker, rate in zip(snapshot.workers, rates, strict=False):
        gpu = gpu_of(worker, snapshot.gpus)
        if gpu is not None:
            claimed.add(gpu.index)
        rows.append((worker.url, _worker_cells(worker, rate, gpu)))
    for gpu in snapshot.gpus:
        if gpu.index not in claimed:
            rows.append((f"gpu:{gpu.index}", _gpu_cells(gpu)))
    return rows


def _worker_cells(worker: WorkerView, rate: float | None, gpu: GpuView | None) -> tuple[Cell, ...]:
    probe = worker.probe
    health = Text("● up", style="green") if worker.healthy else Text("✖ down", style="bold red")
    if probe is not None and probe.running is not None:
        load = f"{probe.running}/{probe.waiting if probe.waiting is not None else '?'}"
    else:
        load = f"{worker.outstanding} out"
    kv = probe.kv_fraction if probe is not None else None
    return (
        short_url(worker.url),
        health,
        load,
        fmt.pct(worker.cache_hit_rate if worker.prompt_tokens else None),
        fmt.pct(kv),
        fmt.si(rate),
        *_gpu_columns(gpu),
    )


def _gpu_columns(gpu: GpuView | None) -> tuple[Cell, ...]:
    if gpu is None:
        return (fmt.NA, fmt.NA, fmt.NA)
    util = fmt.NA if gpu.utilization_pct is None else f"{gpu.utilization_pct:.0f}%"
    return (util, fmt.mib(gpu.memory_used_mib, gpu.memory_total_mib), fmt.watts(gpu.power_w))


def _gpu_cells(gpu: GpuView) -> tuple[Cell, ...]:
    model = gpu.name.removeprefix("NVIDIA ").split(" ", 1)[0]
    name = f"gpu{gpu.index} {model}"
    return (name, Text("local", style="dim"), "-", "-", "-", "-", *_gpu_columns(gpu))
