"""The dashboard against a real router in front of simulated workers (all in-process on
loopback): live tables at 80×24, the quantum keys changing the router, and the router
going away mid-run and coming back."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
from textual.pilot import Pilot

from fairserve.router.server import RouterServer
from fairserve.tui.app import TopApp
from fairserve.tui.source import HttpStateSource
from fairserve.tui.widgets import Banner, ClientsTable, HeaderPanel, RateChart, WorkersTable
from tests.router.helpers import chat, get_json, post, router_config, sim_router, sim_workers
from tests.tui.fakes import GPUS
from tests.tui.helpers import until
from tests.worker.helpers import run

TOKEN = "top-secret"


@asynccontextmanager
async def dashboard(
    url: str, size: tuple[int, int] = (120, 40)
) -> AsyncIterator[tuple[TopApp, Pilot[None]]]:
    source = HttpStateSource(url, TOKEN, timeout_s=1.0, gpu_reader=lambda: GPUS[2:])  # GPU 7 only
    app = TopApp(source, interval_s=0.05)
    async with app.run_test(size=size) as pilot:
        yield app, pilot


async def traffic(session: aiohttp.ClientSession, requests: int = 6) -> None:
    for i in range(requests):
        headers = {"X-Fairserve-Client": ("batch", "chat")[i % 2]}
        status, _, _ = await post(session, "/v1/chat/completions", chat(f"q{i}"), headers=headers)
        assert status == 200


def test_live_router_fills_the_dashboard_at_80x24() -> None:
    async def body() -> None:
        async with (
            sim_router(2, admin_token=TOKEN) as (server, session, workers),
            dashboard(server.url, size=(80, 24)) as (app, pilot),
        ):
            await traffic(session)
            clients, table = app.query_one(ClientsTable), app.query_one(WorkersTable)
            await until(pilot, lambda: clients.row_count == 2 and table.row_count == 3)
            assert sorted(str(clients.get_row_at(i)[0]) for i in range(2)) == ["batch", "chat"]
            rows = [table.get_row_at(i) for i in range(3)]
            assert [str(r[0]) for r in rows] == [
                *(w.url.removeprefix("http://") for w in server.router.upstreams.values()),
                "gpu7 H100",  # a local GPU that no worker claims
            ]
            assert {w.url for w in workers} == set(server.router.upstreams)
            kv = table.get_column_index("kv")
            assert all(str(r[1]) == "● up" and r[kv] != "n/a" for r in rows[:2])
            header = str(app.query_one(HeaderPanel).render())
            assert "dlpm + " in header and "Q^u 512" in header
            for widget in (clients, table, *app.query(RateChart)):
                assert widget.region.height > 0
                assert app.screen.region.contains_region(widget.region)

    run(body())


def test_plus_and_W_change_the_quanta_on_the_router() -> None:
    async def body() -> None:
        async with (
            sim_router(2, admin_token=TOKEN, dispatch="doubleq") as (server, session, workers),
            dashboard(server.url) as (app, pilot),
        ):
            await until(pilot, lambda: app.frame is not None)
            _, before = await get_json(session, "/fairserve/v1/quantum")
            assert app.frame is not None and app.frame.snapshot.local_quantum == 512.0
            await pilot.press("plus")
            await until(pilot, lambda: _shown_quantum(app) == 1024.0)
            _, after = await get_json(session, "/fairserve/v1/quantum")
            assert after["quantum"] == 1024.0
            async with session.get(workers[0].url + "/fairserve/worker/quantum") as resp:
                assert (await resp.json())["quantum"] == 1024.0  # forwarded to the workers
            await pilot.press("W")
            expected_qw = before["worker_quantum"] * 2
            await until(pilot, lambda: _shown_worker_quantum(app) == expected_qw)
            _, last = await get_json(session, "/fairserve/v1/quantum")
            assert last["worker_quantum"] == expected_qw and last["quantum"] == 1024.0

    run(body())


def _shown_quantum(app: TopApp) -> float | None:
    return app.frame.snapshot.local_quantum if app.frame is not None else None


def _shown_worker_quantum(app: TopApp) -> float | None:
    return app.frame.snapshot.quanta.worker_quantum if app.frame is not None else None


def test_router_stopped_mid_run_shows_a_banner_then_recovers() -> None:
    async def body() -> None:
        async with sim_workers(1) as workers:
            urls = [w.url for w in workers]
            first = RouterServer(router_config(urls, admin_token=TOKEN))
            await first.start()
            try:
                async with dashboard(first.url) as (app, pilot):
                    await until(pilot, lambda: app.frame is not None)
                    await first.stop(drain_timeout_s=0.5)
                    banner = app.query_one(Banner)
                    await until(pilot, lambda: app.failures >= 2)
                    assert banner.has_class("-shown") and "connection lost" in str(banner.render())
                    assert app.query_one(WorkersTable).row_count == 2  # last data kept
                    second = RouterServer(router_config(urls, port=first.port))
                    await second.start()
                    try:
                        await until(pilot, lambda: app.lost is None, timeout_s=10.0)
                        assert not banner.has_class("-shown") and app.is_running
                    finally:
                        await second.stop(drain_timeout_s=0.5)
            finally:
                await first.stop(drain_timeout_s=0.5)

    run(body())


def test_long_generations_show_on_screen_while_they_decode() -> None:
    """Service, tokens/s and load are credited as tokens stream, so the dashboard shows 8
    long generations before any of them ends."""

    async def stream(session: aiohttp.ClientSession, client: str) -> None:
        body = chat(f"a long story for {client}", stream=True, max_tokens=4000)
        headers = {"X-Fairserve-Client": client}
        async with session.post("/v1/chat/completions", json=body, headers=headers) as resp:
            async for _ in resp.content.iter_any():
                pass

    async def body() -> None:
        async with (
            sim_router(2, worker={"speed": 4.0}, admin_token=TOKEN) as (server, session, _),
            dashboard(server.url) as (app, pilot),
        ):
            tasks = [asyncio.create_task(stream(session, f"team-{i % 4}")) for i in range(8)]
            try:

                def decoding() -> bool:
                    frame = app.frame
                    if frame is None or len(frame.snapshot.clients) != 4:
                        return False
                    s = frame.snapshot
                    return s.throughput.tokens_per_s > 0 and (frame.load_fraction or 0) > 0

                await until(pilot, decoding, timeout_s=20.0)
                assert app.frame is not None
                assert all(c.finished == 0 for c in app.frame.snapshot.clients)
                header = str(app.query_one(HeaderPanel).render())
                assert "tok/s 0 " not in header and "wtd/1m00s" in header and " su/1m00s" in header
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

    run(body())
