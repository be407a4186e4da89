"""The router holds a bounded number of requests over all clients (``total_cap``), so its
memory and sockets stay flat under sustained overload; at the cap, a client already holding
its fair share (cap / clients with requests held) gets 429, and one below it is still
admitted, so a flood cannot lock the others out."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from fairserve.core.errors import ConfigError
from fairserve.router.config import RouterConfig
from tests.router.helpers import chat, poll, post, sim_router
from tests.worker.helpers import run

CAP = 6


async def _hold(session: aiohttp.ClientSession, client: str, stop: asyncio.Event) -> int:
    """One slow streamed request held open until ``stop``; returns its status."""
    body = chat(max_tokens=400, stream=True)
    headers = {"X-Fairserve-Client": client}
    async with session.post("/v1/chat/completions", json=body, headers=headers) as resp:
        if resp.status == 200:
            await stop.wait()
        else:
            await resp.read()
        return resp.status


def test_at_the_total_cap_a_flood_is_refused_and_others_still_get_in() -> None:
    async def body() -> None:
        async with sim_router(worker={"speed": 5.0}, total_cap=CAP) as (server, session, _):
            stop = asyncio.Event()
            flood = [asyncio.create_task(_hold(session, "flood", stop)) for _ in range(CAP)]
            acc = server.router.accounting

            async def all_held() -> bool:
                return acc.held >= CAP

            await poll(all_held, what="the flood held")
            assert acc.held == CAP
            headers = {"X-Fairserve-Client": "flood"}
            status, error, answer_headers = await post(
                session, "/v1/chat/completions", chat(), headers=headers
            )
            assert status == 429 and answer_headers["Retry-After"] == "1"
            message: Any = error["error"]["message"]
            assert f"holds {CAP} requests" in message and "fair share" in message
            # A light client is below its share (CAP / 2 busy clients): admitted and served.
            status, answer, _ = await post(
                session, "/v1/chat/completions", chat(), headers={"X-Fairserve-Client": "light"}
            )
            assert status == 200, answer
            stop.set()
            assert await asyncio.gather(*flood) == [200] * CAP

            async def none_held() -> bool:  # the flood's streams closed: the router lets go
                return acc.held == 0

            await poll(none_held, what="the flood let go")
            assert (acc.held, acc.busy) == (0, 0)

    run(body())


def test_the_total_cap_is_validated() -> None:
    with pytest.raises(ConfigError, match="--total-cap"):
        RouterConfig(worker_urls=("http://a:1",), total_cap=0)
