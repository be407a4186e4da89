"""Issue 18: with 10,000 tracked clients, neither a state read nor a ``/metrics`` scrape
holds the router's event loop for more than a few milliseconds at a time (requests on the
same loop would wait that long), and both still answer one consistent snapshot.

The router is served on 127.0.0.1 in this process, so a probe task on the same loop sees
every turn of it (:class:`~tests.perf.bench_state.LoopHolds`, in the loop thread's CPU
time: a loaded machine taking the CPU away does not count)."""

from __future__ import annotations

import gc
import json
import time

import aiohttp
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from fairserve.core.ledger_view import finish, view_steps
from fairserve.router.config import RouterConfig
from fairserve.router.server import RouterServer
from fairserve.router.service import Router
from fairserve.router.state import json_safe, snapshot
from tests.perf.bench_state import LoopHolds, fill
from tests.router.helpers import router_config
from tests.worker.helpers import run

CLIENTS = 10_000
HOLD_BOUND_S = 0.025
"""The longest one turn of the loop may take during the reads. Before the reads were
sliced, a state read held it ~15 ms and a scrape ~30 ms (2-core VM); sliced, ~2 ms when
this file runs alone, but 9.6 and 12.8 ms in two runs of the README's whole test command
(one process holding every earlier test's objects; the collector off made no difference),
so the bound is set to fail the unsliced scrape, not to pin the sliced figure."""
READS = 3
SAMPLES = 2
"""The router's periodic fairness samples the probe must see at least (at the default
``sample_interval_s``): the reads go on until they have run."""
SAMPLES_WAIT_S = 10.0


async def _get(session: aiohttp.ClientSession, path: str) -> bytes:
    async with session.get(path) as resp:
        assert resp.status == 200, path
        return await resp.read()  # parsed after the probe: the client's work is not the router's


def _counters(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        if family.type in ("counter", "histogram")
        for s in family.samples
    }


async def _read(server: RouterServer, session: aiohttp.ClientSession) -> None:
    await _get(session, "/fairserve/v1/state")  # the first read builds the window cache
    samples = server.router.accounting.ledger.samples
    first_sample_s = samples[-1].t_s
    states: list[bytes] = []
    scrapes: list[bytes] = []
    async with LoopHolds() as holds:
        deadline_s = time.monotonic() + SAMPLES_WAIT_S
        while len(states) < READS or sum(s.t_s > first_sample_s for s in samples) < SAMPLES:
            assert time.monotonic() < deadline_s, "the router did not sample"
            states.append(await _get(session, "/fairserve/v1/state"))
            scrapes.append(await _get(session, "/metrics"))
    worst_ms = holds.worst_s * 1000
    assert holds.worst_s < HOLD_BOUND_S, f"a read or a sample held the loop {worst_ms:.1f} ms"
    stats = server.router.accounting.clients  # nothing changed since the reads
    ranked = sorted((s.in_flight, s.service, name) for name, s in stats.items())
    busiest = {name for _, _, name in ranked[-100:]}
    for raw in states:
        state = json.loads(raw)
        assert state["clients_total"] == CLIENTS and state["clients_shown"] == 100
        assert set(state["clients"]) == busiest
        assert state["fairness"]["clients_judged"] > CLIENTS / 2
        assert 0 < state["jain_index"] <= 1
    before: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for raw in scrapes:
        after = _counters(raw.decode())
        assert all(after[key] >= value for key, value in before.items())  # monotonic
        before = after
    assert before, "the scrape has the client counters"


def test_reads_and_samples_with_10000_clients_hold_the_loop_a_few_ms_at_most() -> None:
    async def body() -> None:
        # The router's periodic fairness sample runs at its default interval meanwhile: it
        # must be as short as a read's turns (it walked every client, ~13 ms at 10,000).
        interval_s = RouterConfig(worker_urls=("http://127.0.0.1:9",)).sample_interval_s
        server = RouterServer(router_config(["http://127.0.0.1:9"], sample_interval_s=interval_s))
        fill(server.router, CLIENTS, 2)  # a minute of history, before the router samples
        gc.collect()  # the full collection the fill's 10**5 new objects are owed: not a read's
        url = await server.start()
        try:
            async with aiohttp.ClientSession(base_url=url) as session:
                await _read(server, session)
        finally:
            await server.stop(drain_timeout_s=1.0)

    run(body())


def test_sliced_exposition_is_prometheus_clients_text_byte_for_byte() -> None:
    router = Router(RouterConfig(worker_urls=("http://127.0.0.1:9",), metrics_max_clients=300))
    fill(router, 400, 2)  # 300 labels and "other": families of several slices each
    state = json_safe(snapshot(router))
    sliced = router.metrics.render(state)  # the steps run at once; gauges now set
    assert sliced == generate_latest(router.metrics.registry)
    assert sliced.count(b"# TYPE") == 12  # one header per family, none per slice


def test_a_settled_window_reads_what_the_full_computation_does() -> None:
    router = Router(RouterConfig(worker_urls=("http://127.0.0.1:9",)))
    fill(router, 2_000, 2)
    ledger, now_s = router.accounting.ledger, time.monotonic()
    steps = 0
    while ledger.settle(60.0, now_s, names=100):  # a cold cache, in slices
        steps += 1
    assert steps > 20
    weights = ledger.weights_copy(60.0)
    router.accounting.set_weight("client-7", 3.0)  # between the copy and the read
    view = finish(view_steps(ledger.window_parts(60.0, now_s, weights=weights)))
    full = ledger.window_full(60.0, now_s)
    assert view.rates == full.rates and view.jain_index == full.jain_index
    assert view.service_gap == full.service_gap and view.start_s == full.start_s
