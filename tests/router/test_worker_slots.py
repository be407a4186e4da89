"""Isolation under overload by default (issue 18): the router sends a worker at most its
running bound (``max_running_requests``, from ``/get_server_info``) plus the requests of
clients below their fair share of that bound. So a full worker spills to the others (the
cached one no longer takes everything), a tenant over its share waits in the router, where
the next free slot goes to the client with the fewest requests in flight, not in the
worker's queue ahead of the others, and a request that waits longer than
``--queue-timeout`` gets a clear 503 with ``Retry-After`` instead of no answer."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from fairserve.core.errors import ConfigError
from fairserve.router.config import RouterConfig
from fairserve.router.server import RouterServer
from fairserve.worker.server import WorkerServer
from tests.router.helpers import chat, poll, post, sim_router
from tests.worker.helpers import run

BOUND = 2
SLOW = {"speed": 1.0, "max_running_requests": BOUND}


async def _hold(session: aiohttp.ClientSession, client: str, stop: asyncio.Event) -> int:
    """One long streamed request, held open until ``stop``; its status."""
    body = chat(max_tokens=3000, stream=True)
    async with session.post(
        "/v1/chat/completions", json=body, headers={"X-Fairserve-Client": client}
    ) as resp:
        if resp.status == 200:
            await stop.wait()
        else:
            await resp.read()
        return resp.status


async def _fill(
    server: RouterServer, session: aiohttp.ClientSession, stop: asyncio.Event
) -> list[asyncio.Task[int]]:
    """The one worker's bound of heavy requests, held until ``stop``, once the router holds
    them all."""
    held = [asyncio.create_task(_hold(session, "heavy", stop)) for _ in range(BOUND)]

    async def full() -> bool:
        return server.router.accounting.held >= BOUND

    await poll(full, what="the worker full")
    return held


def _at_worker(workers: list[WorkerServer], client: str) -> list[int]:
    """Requests of ``client`` running or waiting in each worker."""
    counts = []
    for worker in workers:
        assert worker.runtime is not None
        clients = worker.runtime.state()["clients"]
        entry = clients.get(client, {"running": 0, "waiting": 0})
        counts.append(entry["running"] + entry["waiting"])
    return counts


def test_a_full_worker_spills_and_a_tenant_over_its_share_waits_in_the_router() -> None:
    async def body() -> None:
        async with sim_router(worker=SLOW) as (server, session, workers):
            stop = asyncio.Event()
            heavy = [asyncio.create_task(_hold(session, "heavy", stop)) for _ in range(6)]
            acc = server.router.accounting

            async def all_held() -> bool:
                return acc.held >= 6 and sum(_at_worker(workers, "heavy")) >= 2 * BOUND

            await poll(all_held, what="the heavy requests in")
            await asyncio.sleep(0.3)  # nothing more reaches the workers
            # Identical prompts: the dispatcher's cached worker, but each takes its bound only.
            assert _at_worker(workers, "heavy") == [BOUND, BOUND]
            # A light client is below its share of a full worker: sent at once, and the
            # worker's own policy admits it at the next free slot, ahead of the heavy ones.
            light = asyncio.create_task(_hold(session, "light", stop))

            async def light_at_worker() -> bool:
                return sum(_at_worker(workers, "light")) == 1

            await poll(light_at_worker, what="the light request at a worker")
            assert _at_worker(workers, "heavy") == [BOUND, BOUND]
            stop.set()
            assert await asyncio.gather(*heavy, light) == [200] * 7

    run(body())


def test_a_request_waiting_past_the_queue_timeout_gets_503_with_retry_after() -> None:
    async def body() -> None:
        async with sim_router(1, worker=SLOW, queue_timeout_s=0.5) as (server, session, _):
            stop = asyncio.Event()
            held = await _fill(server, session, stop)
            started = time.monotonic()
            status, error, headers = await post(
                session, "/v1/chat/completions", chat(), headers={"X-Fairserve-Client": "heavy"}
            )
            waited_s = time.monotonic() - started
            assert status == 503 and headers["Retry-After"] == "1", error
            assert "--queue-timeout" in error["error"]["message"]
            assert 0.4 <= waited_s < 3.0
            stop.set()
            assert await asyncio.gather(*held) == [200] * BOUND

            async def none_held() -> bool:
                return server.router.accounting.held == 0

            await poll(none_held, what="the router let go")

    run(body())


def test_the_queue_timeout_is_validated() -> None:
    with pytest.raises(ConfigError, match="--queue-timeout"):
        RouterConfig(worker_urls=("http://a:1",), queue_timeout_s=0)


def test_the_state_shows_requests_waiting_for_room_and_timed_out() -> None:
    async def body() -> None:
        async with sim_router(1, worker=SLOW, queue_timeout_s=0.5) as (server, session, _):
            stop = asyncio.Event()
            held = await _fill(server, session, stop)
            heavy = {"X-Fairserve-Client": "heavy"}
            late = asyncio.create_task(post(session, "/v1/chat/completions", chat(), headers=heavy))

            async def one_waits() -> bool:
                state = await (await session.get("/fairserve/v1/state")).json()
                return bool(state["router"]["slots"]["waiting"] == 1)

            await poll(one_waits, what="the late request waiting for room")
            status, _, _ = await late
            assert status == 503
            state = await (await session.get("/fairserve/v1/state")).json()
            assert state["router"]["slots"] == {"waiting": 0, "waited": 1, "timed_out": 1}
            stop.set()
            assert await asyncio.gather(*held) == [200] * BOUND

    run(body())
