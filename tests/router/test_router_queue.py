"""The router-side fair queue in front of a stock upstream (no fairness inside)."""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import aiohttp

from fairserve.core.types import make_request
from fairserve.router.fairqueue import FairQueue
from fairserve.sched.registry import make_local_policy
from tests.router.helpers import chat, get_json, routed
from tests.router.stock import StockUpstream
from tests.worker.helpers import run

SERVICE_S = 0.01
SLOTS = 2


async def _light_latencies(mode: str) -> tuple[list[float], dict[str, Any]]:
    """One flooding client (24 requests always outstanding), one light client sending one
    request at a time; the light client's latencies."""
    stock = StockUpstream(slots=SLOTS, service_s=SERVICE_S)
    await stock.start()
    try:
        async with routed(
            [stock.url], router_queue=mode, max_outstanding_per_worker=SLOTS, quantum=64.0
        ) as (_, session):
            stop = asyncio.Event()

            async def flood() -> None:
                while not stop.is_set():
                    await _call(session, "flood")

            floods = [asyncio.create_task(flood()) for _ in range(24)]
            await asyncio.sleep(0.1)  # the flood's backlog builds up
            latencies = []
            for _ in range(8):
                t0 = time.monotonic()
                await _call(session, "light")
                latencies.append(time.monotonic() - t0)
            stop.set()
            await asyncio.gather(*floods)
            _, state = await get_json(session, "/fairserve/v1/state")
        return latencies, state
    finally:
        await stock.stop()


async def _call(session: aiohttp.ClientSession, client: str) -> None:
    headers = {"X-Fairserve-Client": client}
    async with session.post("/v1/chat/completions", json=chat(), headers=headers) as resp:
        answer = await resp.json()
        assert resp.status == 200, answer
        assert answer["usage"]["completion_tokens"] == 3  # estimated by the router: 11 bytes


def test_flooding_client_does_not_starve_a_light_one() -> None:
    async def body() -> None:
        fair, state = await _light_latencies("auto")
        unfair, _ = await _light_latencies("off")
        worker = state["workers"][0]
        assert worker["fairness"] == "router" and worker["extension"] is False
        assert worker["router_queue"]["max_outstanding"] == SLOTS
        # FCFS behind 24 flood requests: ~12 service times; fair: about one or two.
        assert statistics.median(fair) < 5 * SERVICE_S, fair
        assert statistics.median(unfair) > 2 * statistics.median(fair), (fair, unfair)

    run(body())


def test_stock_upstream_gets_routing_key_and_usage_request() -> None:
    async def body() -> None:
        stock = StockUpstream()
        await stock.start()
        try:
            async with routed([stock.url]) as (_, session):
                headers = {"X-Fairserve-Client": "zed"}
                async with session.post(
                    "/v1/chat/completions", json=chat(stream=True), headers=headers
                ) as resp:
                    text = await resp.text()
                assert text.endswith("data: [DONE]\n\n") and "usage" not in text
                wanted = chat(stream=True, stream_options={"include_usage": True})
                async with session.post("/v1/chat/completions", json=wanted) as resp:
                    text = await resp.text()
                assert '"usage"' in text  # synthesised: the stock upstream sends none
        finally:
            await stock.stop()
        assert stock.seen[0]["routing_key"] == "zed" and stock.clients[0] == "zed"
        assert stock.seen[0]["stream_options"] == {"include_usage": True}

    run(body())


def test_fair_queue_releases_by_policy_and_frees_slots() -> None:
    async def body() -> None:
        queue = FairQueue(make_local_policy("dlpm", quantum=10.0), max_outstanding=1)
        reqs = [make_request(f"f{i}", "flood", [1, 2, 3], 4) for i in range(6)]
        light = make_request("l0", "light", [7, 8, 9], 4)
        order: list[str] = []

        async def wait(req: Any) -> None:
            await queue.acquire(req)
            order.append(req.id)

        tasks = [asyncio.create_task(wait(r)) for r in reqs]
        await asyncio.sleep(0.01)
        assert queue.outstanding == 1 and queue.waiting == 5 and order == ["f0"]
        tasks.append(asyncio.create_task(wait(light)))
        await asyncio.sleep(0.01)
        for _ in range(3):
            done = next(r for r in [*reqs, light] if r.id == order[-1])
            queue.finish(done, output_tokens=4, cached_tokens=0)
            await asyncio.sleep(0.01)
        # Each flood request costs 3 + 2*4 = 11 > Q^u: the light client gets in after at
        # most one more flood request, not after the whole flood backlog.
        assert order.index("l0") <= 2, order
        assert queue.outstanding == 1
        tasks[-2].cancel()  # a waiting request that leaves frees nothing but its place
        await asyncio.sleep(0.01)
        assert queue.waiting == 2
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        snap = queue.snapshot()
        assert snap["policy"]["policy"] == "dlpm" and snap["waiting"] == 0

    run(body())


def test_rate_limited_request_is_refused_and_leaves_nothing_held() -> None:
    """A request the queue's policy refuses on arrival (``rpm``) gets 429 with a
    ``Retry-After``, and neither it nor the ones released at once stay counted as held or
    queued (they never waited: the router offers each request to the queue first)."""

    async def body() -> None:
        stock = StockUpstream()
        await stock.start()
        try:
            async with routed([stock.url], policy="rpm", policy_params={"limit_per_min": 2}) as (
                server,
                session,
            ):
                headers = {"X-Fairserve-Client": "limited"}
                statuses = []
                for _ in range(3):
                    async with session.post(
                        "/v1/chat/completions", json=chat(), headers=headers
                    ) as resp:
                        statuses.append(resp.status)
                        if resp.status == 429:
                            assert int(resp.headers["Retry-After"]) >= 1
                assert statuses == [200, 200, 429]
                acc = server.router.accounting
                stats = acc.clients["limited"]
                assert (stats.in_flight, stats.queued, acc.held) == (0, 0, 0)
                assert (stats.finished, stats.rejected) == (2, 1)
        finally:
            await stock.stop()

    run(body())
